package main

// End-to-end tests of the operator's view: the admin API's token and the
// records subcommand against a running binary.

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
)

const adminToken = "operator-token-0123456789"

// startOperatorSetup runs the binary with an admin token in front of a
// gateway that loses every POST's answer, and leaves one payment unknown.
func startOperatorSetup(t *testing.T) (*opsProc, string) {
	t.Helper()
	gw := newGatewayProvider(t, sandbox.Config{})
	up := httptest.NewServer(gw)
	t.Cleanup(up.Close)
	gw.set(1<<30, true, "")
	p := launch(t, launchSpec{env: unknownEnv(up.URL, t.TempDir(), "IDEMPROXY_ADMIN_TOKEN="+adminToken)})
	r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if r.status != http.StatusBadGateway {
		t.Fatalf("POST = %d %s, want 502", r.status, r.body)
	}
	return p, r.header.Get("Idempotency-Key")
}

func TestAdminAPIToken(t *testing.T) {
	p, key := startOperatorSetup(t)
	url := "http://" + p.admin + "/admin/v1/records/" + key
	if r := send(t, "GET", url, ""); r.status != http.StatusUnauthorized || !strings.Contains(r.body, `"unauthorized"`) {
		t.Fatalf("without token = %d %s, want 401 unauthorized", r.status, r.body)
	}
	if r := send(t, "GET", url, "", "Authorization", "Bearer wrong"); r.status != http.StatusUnauthorized {
		t.Fatalf("wrong token = %d, want 401", r.status)
	}
	for _, open := range []string{"/healthz", "/readyz", "/metrics"} {
		if got := getStatus(t, "http://"+p.admin+open); got != http.StatusOK {
			t.Fatalf("GET %s without token = %d, want 200", open, got)
		}
	}
	r := send(t, "GET", url, "", "Authorization", "Bearer "+adminToken)
	var rec struct {
		LastError   string  `json:"last_error"`
		Attempts    int     `json:"attempts"`
		FirstSentAt *string `json:"first_sent_at"`
	}
	if err := json.Unmarshal([]byte(r.body), &rec); r.status != http.StatusOK || err != nil {
		t.Fatalf("with token = %d %s", r.status, r.body)
	}
	if !strings.Contains(r.body, `"state":"unknown"`) || !strings.Contains(r.body, `"key":"`+key+`"`) ||
		rec.Attempts != 1 || rec.FirstSentAt == nil || !strings.Contains(rec.LastError, "504") {
		t.Fatalf("record = %s, want key %s unknown after 1 attempt with first_sent_at and a 504 last_error", r.body, key)
	}
	if strings.Contains(p.text(), adminToken) {
		t.Fatal("the admin token reached the log")
	}
}

func TestCLIRecordsGet(t *testing.T) {
	p, key := startOperatorSetup(t)
	run := func(env []string, args ...string) (string, string, int) {
		cmd := exec.Command(binPath, args...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "IDEMPROXY_ADMIN_ADDR=" + p.admin}, env...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errOut.String(), code
	}
	tok := []string{"IDEMPROXY_ADMIN_TOKEN=" + adminToken}

	out, errOut, code := run(tok, "records", "get", key)
	if code != 0 || !strings.Contains(out, "state") || !strings.Contains(out, "unknown") ||
		!strings.Contains(out, "first sent at") || !strings.Contains(out, key) ||
		!strings.Contains(out, "POST /payments") || !strings.Contains(out, "expires at") || !strings.Contains(out, "upstream key") {
		t.Fatalf("records get = %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = run(tok, "records", "get", "--json", key)
	var rec map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &rec) != nil || rec["state"] != "unknown" || rec["key"] != key {
		t.Fatalf("records get --json = %d %s%s", code, out, errOut)
	}
	tokenFile := t.TempDir() + "/token"
	os.WriteFile(tokenFile, []byte(adminToken+"\n"), 0o600)
	if _, errOut, code := run([]string{"IDEMPROXY_ADMIN_TOKEN_FILE=" + tokenFile}, "records", "get", key); code != 0 {
		t.Fatalf("with the token from a file = %d %s", code, errOut)
	}
	// Both set: refused as the server refuses it, not one silently taken.
	if _, errOut, code := run([]string{"IDEMPROXY_ADMIN_TOKEN=wrong-token", "IDEMPROXY_ADMIN_TOKEN_FILE=" + tokenFile}, "records", "get", key); code != 2 ||
		!strings.Contains(errOut, "IDEMPROXY_ADMIN_TOKEN and IDEMPROXY_ADMIN_TOKEN_FILE are both set") {
		t.Fatalf("with both the token and its file = %d %s, want exit 2 saying both are set", code, errOut)
	}
	emptyFile := t.TempDir() + "/empty"
	os.WriteFile(emptyFile, []byte("\n"), 0o600)
	if _, errOut, code := run([]string{"IDEMPROXY_ADMIN_TOKEN_FILE=" + emptyFile}, "records", "get", key); code != 2 ||
		!strings.Contains(errOut, "holds no token") {
		t.Fatalf("with an empty token file = %d %s, want exit 2 saying it holds no token", code, errOut)
	}
	if _, errOut, code := run(nil, "records", "get", key); code != 1 || !strings.Contains(errOut, "401") ||
		!strings.Contains(errOut, "set IDEMPROXY_ADMIN_TOKEN") {
		t.Fatalf("without the token = %d %s, want exit 1 naming 401 and the variable to set", code, errOut)
	}
	if _, errOut, code := run([]string{"IDEMPROXY_ADMIN_TOKEN=wrong-token"}, "records", "get", key); code != 1 ||
		!strings.Contains(errOut, "401") || !strings.Contains(errOut, "was refused") {
		t.Fatalf("with a wrong token = %d %s, want exit 1 saying the token was refused", code, errOut)
	}
	// The proxy's address given for the admin one: the provider's answer
	// is not taken for the API's.
	if _, errOut, code := run(tok, "records", "get", key, "--admin", p.proxy); code != 1 ||
		!strings.Contains(errOut, "not the admin API's") {
		t.Fatalf("against the proxy port = %d %s, want exit 1 saying it is not the admin API", code, errOut)
	}
	if _, errOut, code := run(tok, "records", "get", "no-such-key"); code != 1 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("unknown key = %d %s, want exit 1 not_found", code, errOut)
	}
	if _, _, code := run(tok, "records", "get"); code != 2 {
		t.Fatalf("no key = exit %d, want 2", code)
	}
}

// TestCLIWithTokenLogsNoRefusal: an operator command run with the right
// token leaves no "call refused" line in the instance's log. Its check
// that the address is the admin API (asked without the token, so that the
// token never goes to the proxy port) was GET /admin/v1/, which the API
// refused 401 and logged at WARN as a call refused for its token, with a
// count: every records and orders command of an incident read in the log as
// someone trying the admin API without the token, an alert on those lines
// fired for the on-call's own commands, and a real guesser's refusals were
// lost among them.
func TestCLIWithTokenLogsNoRefusal(t *testing.T) {
	p, key := startOperatorSetup(t)
	for _, args := range [][]string{
		{"records", "get", key},
		{"records", "list", "--state", "unknown"},
		{"orders", "get", "--path", "/payments", "--value", "no-such-order"},
	} {
		cmd := exec.Command(binPath, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "IDEMPROXY_ADMIN_ADDR=" + p.admin, "IDEMPROXY_ADMIN_TOKEN=" + adminToken}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v = %v\n%s", args, err, out)
		}
	}
	// Without the token a refusal is still logged: the line is what the
	// commands above must not cause.
	if r := send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+key, ""); r.status != http.StatusUnauthorized {
		t.Fatalf("GET without token = %d, want 401", r.status)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.text(), "call refused") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	var refused []string
	for _, l := range strings.Split(p.text(), "\n") {
		if strings.Contains(l, "call refused") {
			refused = append(refused, l)
		}
	}
	if len(refused) != 1 || !strings.Contains(refused[0], `"what":"GET /admin/v1/records/`+key+`"`) || !strings.Contains(refused[0], `"refused":1`) {
		t.Fatalf("refusal lines = %q, want one, for the GET without token only", refused)
	}
}

// TestCLIRecordsGetAnyKey: records get finds the record of every key an app
// may send, those that are a dot-segment of a URL path included. "." and
// ".." went into the call's path as they are, so the admin listener took
// them for /admin/v1/records and /admin/v1: records get . answered 400
// "state must be in_flight, unknown or needs_review" and records get ..
// 404 "no such admin call", exit 1, for records that exist.
func TestCLIRecordsGetAnyKey(t *testing.T) {
	up := httptest.NewServer(newDedupProvider())
	t.Cleanup(up.Close)
	p := launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir(), "IDEMPROXY_ADMIN_TOKEN="+adminToken)})
	for i, key := range []string{".", "..", "a/b", "../a", "x%y", "%2F", "a?b#c", "a+b"} {
		order := `{"order_id":"any-key-` + strconv.Itoa(i) + `"}`
		if r := send(t, "POST", "http://"+p.proxy+"/payments", order, "Idempotency-Key", key); r.status != http.StatusCreated {
			t.Fatalf("POST with key %q = %d %s", key, r.status, r.body)
		}
		cmd := exec.Command(binPath, "records", "get", "--json", "--", key)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "IDEMPROXY_ADMIN_ADDR=" + p.admin, "IDEMPROXY_ADMIN_TOKEN=" + adminToken}
		out, err := cmd.CombinedOutput()
		var rec map[string]any
		if err != nil || json.Unmarshal(out, &rec) != nil || rec["key"] != key || rec["state"] != "final" {
			t.Errorf("records get %q = %v\n%s; want its final record", key, err, out)
		}
	}
}

// A final record says when its operation was first sent, as an unknown one
// does: first_sent_at is set, at or after the claim (created_at).
func TestFinalRecordFirstSentAt(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"pay_1","status":"succeeded"}`))
	}))
	defer up.Close()
	p := launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir())})
	r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if r.status != http.StatusCreated {
		t.Fatalf("POST = %d %s, want 201", r.status, r.body)
	}
	a := send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+r.header.Get("Idempotency-Key"), "")
	var rec struct {
		State       string     `json:"state"`
		Attempts    int        `json:"attempts"`
		CreatedAt   time.Time  `json:"created_at"`
		FirstSentAt *time.Time `json:"first_sent_at"`
	}
	if err := json.Unmarshal([]byte(a.body), &rec); a.status != http.StatusOK || err != nil {
		t.Fatalf("record = %d %s (%v)", a.status, a.body, err)
	}
	if rec.State != "final" || rec.Attempts != 1 || rec.FirstSentAt == nil || rec.FirstSentAt.Before(rec.CreatedAt) {
		t.Fatalf("record = %s, want final after 1 attempt, first_sent_at set and not before created_at", a.body)
	}
}

// TestCLIProxyAddressGivenForAdmin: the proxy's address given for the admin
// one, in front of a provider that answers any GET with 200 JSON. The
// commands exit 1 saying it is not the admin API (they printed the
// provider's answer as a record, or as the API's JSON with --json), and the
// admin token never reaches the provider (it was sent with every call).
func TestCLIProxyAddressGivenForAdmin(t *testing.T) {
	var mu sync.Mutex
	var auths []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"key":"k-1","state":"final","status":200,"records":[],"next_cursor":"","generation":1}`)
	}))
	defer up.Close()
	p := launch(t, launchSpec{env: unknownEnv(up.URL, t.TempDir(), "IDEMPROXY_ADMIN_TOKEN="+adminToken)})
	for _, args := range [][]string{
		{"records", "get", "k-1"},
		{"records", "get", "--json", "k-1"},
		{"records", "list", "--state", "unknown"},
		{"orders", "get", "--path", "/pay", "--value", "F-1"},
	} {
		cmd := exec.Command(binPath, append(args, "--admin", p.proxy)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "IDEMPROXY_ADMIN_TOKEN=" + adminToken}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(errOut.String(), "not the admin API's") {
			t.Errorf("%v against the proxy port = %v\nstdout: %s\nstderr: %s\nwant exit 1 saying it is not the admin API", args, err, out.String(), errOut.String())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auths) == 0 {
		t.Fatal("no call reached the provider: the test does not show what it should")
	}
	for _, a := range auths {
		if strings.Contains(a, adminToken) {
			t.Fatalf("the provider got the admin token (Authorization %q)", a)
		}
	}
}

// TestUnknownRecordBody: ?body=1 on an operation whose outcome is unknown
// shows the provider's last ambiguous answer the record keeps (here the
// gateway's 504 naming the payment), which is what an operator asks the
// provider about before running records resolve; without ?body=1, no body.
func TestUnknownRecordBody(t *testing.T) {
	p, key := startOperatorSetup(t)
	url := "http://" + p.admin + "/admin/v1/records/" + key
	auth := []string{"Authorization", "Bearer " + adminToken}
	var rec struct {
		State string          `json:"state"`
		Body  json.RawMessage `json:"body"`
	}
	r := send(t, "GET", url+"?body=1", "", auth...)
	if err := json.Unmarshal([]byte(r.body), &rec); r.status != http.StatusOK || err != nil {
		t.Fatalf("GET ?body=1 = %d %s", r.status, r.body)
	}
	var body struct {
		PaymentID string `json:"payment_id"`
	}
	if err := json.Unmarshal(rec.Body, &body); rec.State != "unknown" || err != nil || body.PaymentID == "" {
		t.Fatalf("unknown record with ?body=1 = %s, want the 504's body with its payment_id", r.body)
	}
	if r := send(t, "GET", url, "", auth...); strings.Contains(r.body, `"body"`) {
		t.Fatalf("record without ?body=1 = %s, want no body", r.body)
	}
	r = send(t, "GET", "http://"+p.admin+"/admin/v1/records?state=unknown&body=1", "", auth...)
	if r.status != http.StatusOK || !strings.Contains(r.body, `"payment_id":"`+body.PaymentID+`"`) {
		t.Fatalf("listing with body=1 = %d %s, want the 504's body", r.status, r.body)
	}
}
