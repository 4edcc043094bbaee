package main

// End-to-end test of an operator resolving operations whose outcome is
// unknown and whose first send is older than the provider keeps keys, with
// the real binary and its records resolve subcommand, on both stores.

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

func TestResolveUnknownPastRetention(t *testing.T) { onStores(t, testResolveUnknownPastRetention) }

func testResolveUnknownPastRetention(t *testing.T, shared bool) {
	const retention = time.Second
	held, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	gw := newGatewayProvider(t, sandbox.Config{ExecuteHook: func(op sandbox.Operation) {
		if op.OrderID == "order-held" {
			held <- struct{}{}
			<-release
		}
	}})
	up := httptest.NewServer(gw)
	t.Cleanup(func() { once.Do(func() { close(release) }); up.Close() })
	env := append(fastRetry(), "IDEMPROXY_ADMIN_TOKEN="+adminToken, "IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())
	var p, adm *opsProc // the app's requests go to p, the operator's calls to adm
	if shared {
		env = sharedEnv(up.URL, pgtest.Database(t), env...)
		p, adm = launch(t, launchSpec{env: env}), launch(t, launchSpec{env: env})
	} else {
		p = launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir(), env...)})
		adm = p
	}
	pay := func(order string) reply {
		t.Helper()
		return send(t, "POST", "http://"+p.proxy+"/payments", `{"order_id":"`+order+`","amount":"10.00","currency":"EUR"}`)
	}
	resolve := func(body string) reply {
		t.Helper()
		return send(t, "POST", "http://"+adm.admin+"/admin/v1/records/resolve", body, "Authorization", "Bearer "+adminToken)
	}
	cli := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(binPath, append([]string{"records", "resolve"}, args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "IDEMPROXY_ADMIN_ADDR=" + adm.admin, "IDEMPROXY_ADMIN_TOKEN=" + adminToken}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}

	// Two payments end unknown: the first never reached the provider, the
	// second was executed; neither answer came back.
	gw.set(1, false, "pay_none")
	lost := pay("order-lost")
	gw.set(1, true, "")
	done := pay("order-done")
	sent := time.Now()
	if lost.status != http.StatusBadGateway || done.status != http.StatusBadGateway {
		t.Fatalf("first POSTs = %d %s and %d %s, want 502 and 502", lost.status, lost.body, done.status, done.body)
	}
	lostKey, doneKey := lost.header.Get("Idempotency-Key"), done.header.Get("Idempotency-Key")
	// The app comes back after the provider's key retention: refused, nothing sent.
	time.Sleep(time.Until(sent.Add(retention + 100*time.Millisecond)))
	for _, order := range []string{"order-lost", "order-done"} {
		r := pay(order)
		if r.status != http.StatusConflict || !strings.Contains(r.body, `"idempotency_key_expired"`) ||
			!strings.Contains(r.body, "idemproxy records resolve") {
			t.Fatalf("retry of %s past the retention = %d %s, want 409 idempotency_key_expired naming the command", order, r.status, r.body)
		}
	}
	if posts := mustPosts(gw); posts[lostKey] != 1 || posts[doneKey] != 1 || gw.sb.Ledger().Executions != 1 {
		t.Fatalf("provider saw %v and executed %d, want one POST per key and one execution", posts, gw.sb.Ledger().Executions)
	}

	// Refused: a record in flight, and one that does not exist.
	heldDone := goSend("POST", "http://"+p.proxy+"/payments", `{"order_id":"order-held","amount":"10.00","currency":"EUR"}`)
	<-held
	heldKey := ""
	for k := range mustPosts(gw) {
		if k != lostKey && k != doneKey {
			heldKey = k
		}
	}
	if r := resolve(`{"key":"` + heldKey + `","outcome":"not_executed"}`); r.status != http.StatusConflict ||
		!strings.Contains(r.body, `"resolve_refused"`) || r.header.Get("Idemproxy-Admin") != "v1" {
		t.Fatalf("resolve of an in-flight record = %d %s, want 409 resolve_refused", r.status, r.body)
	}
	if r := resolve(`{"key":"no-such-key","outcome":"not_executed"}`); r.status != http.StatusNotFound || !strings.Contains(r.body, `"not_found"`) {
		t.Fatalf("resolve of a missing record = %d %s, want 404 not_found", r.status, r.body)
	}
	once.Do(func() { close(release) })
	if r := <-heldDone; r.err != nil {
		t.Fatal(r.err)
	}

	// Not executed: the next request is sent again, once, with the same key.
	out, code := cli(lostKey, "--outcome", "not_executed")
	if code != 0 || !strings.Contains(out, "not executed") {
		t.Fatalf("records resolve --outcome not_executed = %d\n%s", code, out)
	}
	line := adm.waitLine(t, `"outcome":"not_executed"`)
	if !strings.Contains(line, `"msg":"admin: operation whose outcome was unknown resolved by an operator"`) ||
		jsonField(line, "key") != lostKey || jsonField(line, "who") == "" || !strings.Contains(line, `"attempts":1`) {
		t.Fatalf("resolve log line = %s, want who, the key %s and its attempts", line, lostKey)
	}
	r := pay("order-lost")
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after not_executed = %d %s (replayed %q), want the provider's 201", r.status, r.body, r.header.Get("Idempotent-Replayed"))
	}
	if again := pay("order-lost"); again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || again.body != r.body {
		t.Fatalf("repeat = %d %s, want the stored 201 replayed", again.status, again.body)
	}
	if n := mustPosts(gw)[lostKey]; n != 2 || gw.sb.Ledger().ByOrder["order-lost"] != 1 {
		t.Fatalf("provider saw %s %d times and executed order-lost %d times, want 2 and 1", lostKey, n, gw.sb.Ledger().ByOrder["order-lost"])
	}

	// Executed: the answer given is replayed, and the provider sees nothing.
	answer := `{"id":"pay_by_hand","status":"succeeded"}`
	out, code = cli(doneKey, "--outcome", "executed", "--status", "201", "--body", answer)
	if code != 0 || !strings.Contains(out, "executed") || !strings.Contains(out, "201") {
		t.Fatalf("records resolve --outcome executed = %d\n%s", code, out)
	}
	// The record printed is marked reconciled by the operator's answer: the
	// line must not credit the status probe alone, which never ran here.
	if line := lineOf(out, "reconciled"); !strings.Contains(line, "records resolve") {
		t.Fatalf("records resolve --outcome executed printed the reconciled line %q, want it to name the operator's records resolve\n%s", line, out)
	}
	if line := adm.waitLine(t, `"outcome":"executed"`); jsonField(line, "key") != doneKey || !strings.Contains(line, `"status":201`) {
		t.Fatalf("resolve log line = %s, want the key %s and status 201", line, doneKey)
	}
	r = pay("order-done")
	if r.status != http.StatusCreated || r.body != answer || r.header.Get("Idempotent-Replayed") != "true" ||
		r.header.Get("Idemproxy-Reconciled") != "true" || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("retry after executed = %d %v %s, want the given 201 replayed, reconciled", r.status, r.header, r.body)
	}
	if n := mustPosts(gw)[doneKey]; n != 1 || gw.sb.Ledger().ByOrder["order-done"] != 1 {
		t.Fatalf("provider saw %s %d times and executed order-done %d times, want 1 and 1", doneKey, n, gw.sb.Ledger().ByOrder["order-done"])
	}

	// A final record is not resolved again, by the API or the command.
	if r := resolve(`{"key":"` + doneKey + `","outcome":"executed","status":200,"body":"{}"}`); r.status != http.StatusConflict || !strings.Contains(r.body, `"resolve_refused"`) {
		t.Fatalf("resolve of a final record = %d %s, want 409 resolve_refused", r.status, r.body)
	}
	if out, code := cli(lostKey, "--outcome", "not_executed"); code != 1 || !strings.Contains(out, "resolve_refused") {
		t.Fatalf("records resolve of a final record = %d\n%s, want exit 1 with resolve_refused", code, out)
	}
}

// lineOf returns the first line of out that starts with prefix, or "".
func lineOf(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
