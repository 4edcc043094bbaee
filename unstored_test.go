package main

// End-to-end test of an operation the provider answered while the shared
// store could not take the answer, with the real binary, a real PostgreSQL
// and the payments sandbox.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// TestUnstoredAnswerKeptUnknown: the provider holds a payment while
// PostgreSQL is stopped, then executes it and answers 201; the answer
// cannot be stored and the app gets 503 store_unavailable saying the
// payment may have run. Once the database is back the record is unknown,
// with its first send, its attempt and the provider's status in last_error
// (the replica parks it as soon as the database answers), not deleted. The
// app retries after the provider has forgotten the key: with no status
// probe it gets 409 idempotency_key_expired and nothing is sent; with one,
// the probe finds the payment by the id in the answer that could not be
// stored, and that is the answer. Either way the payment runs once. Before,
// the record was deleted once the database answered, and the retry was sent
// as a first send: the sandbox, past its key retention, charged twice.
func TestUnstoredAnswerKeptUnknown(t *testing.T) {
	for _, probe := range []bool{false, true} {
		name := map[bool]string{false: "retention guard", true: "status probe"}[probe]
		t.Run(name, func(t *testing.T) { testUnstoredAnswerKeptUnknown(t, probe) })
	}
}

func testUnstoredAnswerKeptUnknown(t *testing.T, probe bool) {
	const retention = time.Second
	gw, up, held, release := heldPayments(t, retention)
	c, url := pgtest.Own(t, pgtest.Options{})
	env := sharedEnv(up.URL, url, "IDEMPROXY_RETRY_MAX_ATTEMPTS=1", "IDEMPROXY_ATTEMPT_TIMEOUT=30s",
		"IDEMPROXY_RETRY_BUDGET=1m", "IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())
	if probe {
		env = append(env, "IDEMPROXY_STATUS_PROBE=GET /payments/{resp.id}")
	}
	p := launch(t, launchSpec{env: env})

	type answer struct {
		r   reply
		err error
	}
	first := make(chan answer, 1)
	go func() {
		r, err := trySend("POST", "http://"+p.proxy+"/payments", paymentBody)
		first <- answer{r, err}
	}()
	<-held // the payment is at the provider
	sent := time.Now()
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	release()
	a := <-first
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.r.status != http.StatusServiceUnavailable || !strings.Contains(a.r.body, `"store_unavailable"`) ||
		!strings.Contains(a.r.body, "may have been executed") {
		t.Fatalf("answer with the database down = %d %s, want 503 store_unavailable saying it may have run", a.r.status, a.r.body)
	}
	key := a.r.header.Get("Idempotency-Key")
	if l := gw.sb.Ledger(); l.Executions != 1 {
		t.Fatalf("sandbox executed %d payments, want 1", l.Executions)
	}

	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, "the database came back", p)
	var rec struct {
		State       string  `json:"state"`
		Attempts    int     `json:"attempts"`
		FirstSentAt *string `json:"first_sent_at"`
		LastError   string  `json:"last_error"`
	}
	got := reply{}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got = send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+key, "")
		rec.State = ""
		if got.status == http.StatusOK && json.Unmarshal([]byte(got.body), &rec) == nil && rec.State == "unknown" {
			break
		}
		if time.Now().After(deadline) {
			break
		}
	}
	if rec.State != "unknown" {
		t.Errorf("record 15 s after the database came back = %d %s, want it unknown", got.status, got.body)
	} else {
		var first time.Time
		if rec.FirstSentAt != nil {
			first, _ = time.Parse(time.RFC3339Nano, *rec.FirstSentAt)
		}
		if first.IsZero() || first.After(sent) || rec.Attempts != 1 ||
			!strings.Contains(rec.LastError, "status 201") || !strings.Contains(rec.LastError, "could not be stored") {
			t.Errorf("unknown record = %s, want first_sent_at before %v, attempts 1 and last_error naming status 201 unstored",
				got.body, sent.UTC())
		}
		if !strings.Contains(p.text(), "is parked now that the database answers") {
			t.Errorf("no log line says the record was parked once the database answered:\n%s", p.text())
		}
	}

	// The app retries once the provider has forgotten the key.
	time.Sleep(time.Until(sent.Add(retention + 100*time.Millisecond)))
	r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	posts, gets := gw.postCounts()
	executions := gw.sb.Ledger().Executions
	if probe {
		if r.status != http.StatusOK || r.header.Get("Idemproxy-Reconciled") != "true" || !strings.Contains(r.body, `"order_id":"order-77"`) {
			t.Errorf("retry past the retention = %d %s (reconciled %q), want the payment the probe found",
				r.status, r.body, r.header.Get("Idemproxy-Reconciled"))
		}
		if gets != 1 {
			t.Errorf("provider saw %d status probes, want 1", gets)
		}
	} else if r.status != http.StatusConflict || !strings.Contains(r.body, `"idempotency_key_expired"`) {
		t.Errorf("retry past the retention = %d %s, want 409 idempotency_key_expired with nothing sent", r.status, r.body)
	}
	if k, n := onlyKey(t, posts); k != key || n != 1 || executions != 1 {
		t.Fatalf("provider saw %v and executed %d payments, want 1 POST under %s, executed once", posts, executions, key)
	}
}

// TestUnstoredAnswerOnFullDisk: on Badger, the provider answers a payment
// while the data directory's disk has filled up. The answer cannot be
// stored, nor can the record be parked as unknown (both are writes the
// free-space reserve refuses): the app gets 503 store_unavailable saying the
// payment may have run, and the record stays in flight, not deleted. Once
// the space is back and the lease has run out, the app's retry takes it
// over as an operation whose outcome is unknown, first sent when it was
// claimed: past the provider's key retention it gets 409
// idempotency_key_expired and nothing is sent. Before, the record was
// deleted at once and the retry was a first send, which the sandbox, past
// its retention, executed a second time.
func TestUnstoredAnswerOnFullDisk(t *testing.T) {
	mnt := smallDisk(t)
	const retention = time.Second
	gw, up, held, release := heldPayments(t, retention)
	// The attempt must still be waiting for the provider's answer once the
	// disk is full and /readyz says so: with 5 s, a run on a loaded host
	// got 504 (the attempt's timeout, as the contract says) before the
	// provider answered. A lease of 40 s (budget + attempt timeout + 10 s);
	// the retry waits it out.
	const attemptTimeout = 15 * time.Second
	p := launch(t, launchSpec{env: baseEnv(up.URL, filepath.Join(mnt, "data"), "IDEMPROXY_RETRY_MAX_ATTEMPTS=1",
		"IDEMPROXY_ATTEMPT_TIMEOUT="+attemptTimeout.String(), "IDEMPROXY_RETRY_BUDGET="+attemptTimeout.String(),
		"IDEMPROXY_INFLIGHT_WAIT=1m", "IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())})

	first := make(chan reply, 1)
	go func() {
		r, _ := trySend("POST", "http://"+p.proxy+"/payments", paymentBody)
		first <- r
	}()
	<-held
	heldAt := time.Now()
	filler := filepath.Join(mnt, "filler")
	fill(t, filler)
	waitReadyz(t, p.admin, http.StatusServiceUnavailable)
	t.Logf("the disk was full and /readyz said 503 %v after the payment reached the provider (attempt timeout %v)",
		time.Since(heldAt), attemptTimeout)
	release()
	a := <-first
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "may have been executed") {
		t.Fatalf("answer on a full disk = %d %s, want 503 store_unavailable saying it may have run", a.status, a.body)
	}
	key := a.header.Get("Idempotency-Key")
	if r := send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+key, ""); r.status != http.StatusOK ||
		!strings.Contains(r.body, `"state":"in_flight"`) {
		t.Errorf("record on the full disk = %d %s, want it kept in flight", r.status, r.body)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, p.admin, http.StatusOK)
	retryExpired(t, p, gw, key)
}

// heldPayments is the payments sandbox, forgetting keys after retention,
// behind an httptest server: every payment waits at the provider until
// release, and held has a value once the first one is there.
func heldPayments(t *testing.T, retention time.Duration) (gw *gatewayProvider, up *httptest.Server, held <-chan struct{}, release func()) {
	t.Helper()
	at, wait := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	gw = newGatewayProvider(t, sandbox.Config{KeyRetention: retention, ExecuteHook: func(sandbox.Operation) {
		select {
		case at <- struct{}{}:
		default:
		}
		<-wait
	}})
	up = httptest.NewServer(gw)
	release = func() { once.Do(func() { close(wait) }) }
	t.Cleanup(func() { release(); up.Close() })
	return gw, up, at, release
}

// killedDuringPayment starts the binary with env, sends paymentBody and
// SIGKILLs the process while the provider (heldPayments') holds the payment,
// then lets the provider execute it, the answer going nowhere. It returns
// the payment's key and when the provider had executed it.
func killedDuringPayment(t *testing.T, env []string, gw *gatewayProvider, held <-chan struct{}, release func()) (key string, executed time.Time) {
	t.Helper()
	p := launch(t, launchSpec{env: env})
	go trySend("POST", "http://"+p.proxy+"/payments", paymentBody)
	<-held // the payment is at the provider
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	release() // the provider executes it, its answer goes nowhere
	for deadline := time.Now().Add(10 * time.Second); gw.sb.Ledger().Executions != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox executed %d payments, want 1", gw.sb.Ledger().Executions)
		}
	}
	executed = time.Now()
	key, _ = onlyKey(t, mustPosts(gw))
	return key, executed
}

// retryExpired sends the app's retry of paymentBody (key) to p once the
// store has room again and the provider has forgotten the key: it must get
// 409 idempotency_key_expired with nothing sent, leave the record unknown
// with its first send, and the provider must have seen one POST and
// executed one payment.
func retryExpired(t *testing.T, p *opsProc, gw *gatewayProvider, key string) {
	t.Helper()
	r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if r.status != http.StatusConflict || !strings.Contains(r.body, `"idempotency_key_expired"`) {
		t.Errorf("retry past the retention = %d %s, want 409 idempotency_key_expired with nothing sent", r.status, r.body)
	}
	if rec := send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+key, ""); !strings.Contains(rec.body, `"state":"unknown"`) ||
		strings.Contains(rec.body, `"first_sent_at":null`) {
		t.Errorf("record after the retry = %d %s, want it unknown with its first send", rec.status, rec.body)
	}
	if k, n := onlyKey(t, mustPosts(gw)); k != key || n != 1 || gw.sb.Ledger().Executions != 1 {
		t.Fatalf("provider saw %d POSTs under %s and executed %d payments, want 1 and 1", n, k, gw.sb.Ledger().Executions)
	}
}
