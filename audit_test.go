package main

// The admin API's audit trail and the admin listener's own answers, with the
// real binary: every change made through the API is logged at WARN whatever
// IDEMPROXY_LOG_LEVEL, a change whose commit answer was lost is logged as one
// that may have been made, and every answer of the admin listener carries
// Idemproxy-Admin: v1 in the API's JSON error shape, with no redirect.

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// auditProvider answers 504 (outcome unknown) to an order whose id starts
// with "u-", and 400 {"status":"failed"} to any other: a failed order an
// operator may renew.
func auditProvider(t *testing.T) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"u-`)) {
			w.WriteHeader(http.StatusGatewayTimeout)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"status":"failed"}`)
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// noRedirects is a client that shows a redirect instead of following it.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func adminCall(t *testing.T, method, u, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// getReady is the status of GET /readyz at the admin address addr, 0 when
// nothing answers.
func getReady(addr string) int {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// logLine returns p's log line holding every one of substrs, waiting up to
// five seconds for it; "" if none came.
func logLine(p *opsProc, substrs ...string) string {
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
	lines:
		for _, line := range strings.Split(p.text(), "\n") {
			for _, s := range substrs {
				if !strings.Contains(line, s) {
					continue lines
				}
			}
			return line
		}
		if time.Now().After(end) {
			return ""
		}
	}
}

// TestAdminAuditAtAnyLogLevel: at IDEMPROXY_LOG_LEVEL=error (an operator
// turning the log down), a renew and a resolve made through the admin API
// are each logged, at WARN, naming who, the order or key and the change,
// and never the admin token (given in a file, IDEMPROXY_ADMIN_TOKEN_FILE).
// Before, the process's level dropped the WARN lines: no audit trail at all.
func TestAdminAuditAtAnyLogLevel(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(tokenFile, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// At error, the process does not log where it listens: fixed ports.
	env := unknownEnv(auditProvider(t), t.TempDir(), "IDEMPROXY_LOG_LEVEL=error", "IDEMPROXY_ADMIN_TOKEN_FILE="+tokenFile)
	proxyAddr, adminAddr := "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t)
	for i, kv := range env {
		switch {
		case strings.HasPrefix(kv, "IDEMPROXY_LISTEN_ADDR="):
			env[i] = "IDEMPROXY_LISTEN_ADDR=" + proxyAddr
		case strings.HasPrefix(kv, "IDEMPROXY_ADMIN_ADDR="):
			env[i] = "IDEMPROXY_ADMIN_ADDR=" + adminAddr
		}
	}
	p := startProc(t, launchSpec{env: env})
	p.proxy, p.admin = proxyAddr, adminAddr
	for deadline := time.Now().Add(time.Minute); getReady(p.admin) != http.StatusOK; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not ready within a minute:\n%s", p.text())
		}
	}
	auth := []string{"Authorization", "Bearer " + adminToken, "X-Forwarded-For", "10.9.8.7"}

	failed := send(t, "POST", "http://"+p.proxy+"/cards", `{"order_id":"f-1"}`)
	unknown := send(t, "POST", "http://"+p.proxy+"/cards", `{"order_id":"u-1"}`)
	if failed.status != http.StatusBadRequest || unknown.status != http.StatusBadGateway {
		t.Fatalf("orders = %d %s and %d %s, want 400 failed and 502", failed.status, failed.body, unknown.status, unknown.body)
	}
	if r := adminCall(t, "POST", "http://"+p.admin+"/admin/v1/orders/renew", `{"method":"POST","path":"/cards","value":"f-1"}`, auth...); r.status != http.StatusOK {
		t.Fatalf("renew = %d %s, want 200", r.status, r.body)
	}
	key := unknown.header.Get("Idempotency-Key")
	if r := adminCall(t, "POST", "http://"+p.admin+"/admin/v1/records/resolve", `{"key":"`+key+`","outcome":"not_executed"}`, auth...); r.status != http.StatusOK {
		t.Fatalf("resolve = %d %s, want 200", r.status, r.body)
	}

	renewed := logLine(p, `"msg":"admin: order renewed to its next key generation"`)
	if renewed == "" || !strings.Contains(renewed, `"level":"WARN"`) || !strings.Contains(renewed, "10.9.8.7") ||
		jsonField(renewed, "from_key") != failed.header.Get("Idempotency-Key") || !strings.Contains(renewed, `"generation":2`) {
		t.Errorf("renew's audit line at LOG_LEVEL=error = %q, want a WARN line with who, the order's keys and generations\nlog:\n%s", renewed, p.text())
	}
	resolved := logLine(p, `"msg":"admin: operation whose outcome was unknown resolved by an operator"`)
	if resolved == "" || jsonField(resolved, "key") != key || !strings.Contains(resolved, `"outcome":"not_executed"`) ||
		!strings.Contains(resolved, "10.9.8.7") {
		t.Errorf("resolve's audit line at LOG_LEVEL=error = %q, want who, the key and the outcome\nlog:\n%s", resolved, p.text())
	}
	if strings.Contains(p.text(), adminToken) {
		t.Error("the admin token reached the log")
	}
	// The level still holds for everything else: no request line at error.
	if line := logLine(p, `"msg":"request"`); line != "" {
		t.Errorf("a request line at LOG_LEVEL=error: %s", line)
	}
}

// TestAdminListenerAnswers: every answer of the admin listener carries
// Idemproxy-Admin: v1, in the API's JSON error shape for a path or method it
// does not serve, and none is a redirect (ServeMux answered 307 to /admin/
// and to a cleaned path before the token was checked, and text 404 and 405
// for a path outside the API, none with the header).
func TestAdminListenerAnswers(t *testing.T) {
	p := launch(t, launchSpec{env: unknownEnv(auditProvider(t), t.TempDir(), "IDEMPROXY_ADMIN_TOKEN="+adminToken)})
	auth := []string{"Authorization", "Bearer " + adminToken}
	cases := []struct {
		method, path string
		header       []string
		status       int
		code         string
	}{
		{"GET", "/admin", auth, http.StatusNotFound, "not_found"},
		{"GET", "/admin", nil, http.StatusUnauthorized, "unauthorized"},
		{"GET", "/admin/v1//records?state=unknown", auth, http.StatusNotFound, "not_found"},
		{"GET", "/admin/v1//records?state=unknown", nil, http.StatusUnauthorized, "unauthorized"},
		{"POST", "/admin/v1/./records/resolve", auth, http.StatusNotFound, "not_found"},
		{"POST", "/admin/v1/orders/../orders/renew", auth, http.StatusNotFound, "not_found"},
		{"GET", "/admin/v1/records/", auth, http.StatusNotFound, "not_found"},
		{"GET", "/nope", nil, http.StatusNotFound, "not_found"},
		{"GET", "/healthz/", nil, http.StatusNotFound, "not_found"},
		{"GET", "//healthz", nil, http.StatusNotFound, "not_found"},
		{"POST", "/healthz", nil, http.StatusMethodNotAllowed, "method_not_allowed"},
		{"DELETE", "/metrics", nil, http.StatusMethodNotAllowed, "method_not_allowed"},
		{"PUT", "/readyz", nil, http.StatusMethodNotAllowed, "method_not_allowed"},
		{"DELETE", "/admin/v1/records", auth, http.StatusMethodNotAllowed, "method_not_allowed"},
		{"GET", "/healthz", nil, http.StatusOK, ""},
		{"GET", "/readyz", nil, http.StatusOK, ""},
		{"GET", "/metrics", nil, http.StatusOK, ""},
		{"HEAD", "/healthz", nil, http.StatusOK, ""},
		{"GET", "/admin/v1/records?state=unknown", auth, http.StatusOK, ""},
	}
	for _, c := range cases {
		r := adminCall(t, c.method, "http://"+p.admin+c.path, "", c.header...)
		if r.status != c.status || r.header.Get("Idemproxy-Admin") != "v1" {
			t.Errorf("%s %s (token %v) = %d Idemproxy-Admin %q Location %q %s, want %d with Idemproxy-Admin: v1",
				c.method, c.path, c.header != nil, r.status, r.header.Get("Idemproxy-Admin"), r.header.Get("Location"), strings.TrimSpace(r.body[:min(len(r.body), 120)]), c.status)
			continue
		}
		if c.status == http.StatusMethodNotAllowed && r.header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", c.method, c.path)
		}
		if c.code == "" {
			continue
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error.Code != c.code || e.Error.Message == "" ||
			r.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s = %s (Content-Type %q), want the JSON error %s", c.method, c.path, r.body, r.header.Get("Content-Type"), c.code)
		}
	}
}

// TestNetFaultAdminChangeAnswerLost: replica a's connection to the database
// is cut after the COMMIT of an operator's change was sent, before its
// answer: the change is made (replica b shows it), a answers 503
// store_unavailable saying it may have been made, and a logs it at WARN with
// who, what, before and after. Before, a answered 503 with no audit line
// for a change that was made: the audit trail missed it. Both the resolve
// and the renew.
func TestNetFaultAdminChangeAnswerLost(t *testing.T) {
	up := auditProvider(t)
	db := pgtest.Database(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	relay := newFaultRelay(t, u.Host)
	u.Host = relay.addr()
	env := append(fastRetry(), "IDEMPROXY_ADMIN_TOKEN="+adminToken)
	a := launch(t, launchSpec{env: sharedEnv(up, u.String(), env...)})
	b := launch(t, launchSpec{env: sharedEnv(up, db, env...)})
	auth := []string{"Authorization", "Bearer " + adminToken}

	unknown := send(t, "POST", "http://"+b.proxy+"/payments", `{"order_id":"u-lost"}`)
	failed := send(t, "POST", "http://"+b.proxy+"/cards", `{"order_id":"f-lost"}`)
	if unknown.status != http.StatusBadGateway || failed.status != http.StatusBadRequest {
		t.Fatalf("orders = %d %s and %d %s, want 502 and 400 failed", unknown.status, unknown.body, failed.status, failed.body)
	}
	key := unknown.header.Get("Idempotency-Key")

	// The resolve: its statement names state = 3 (unknown).
	cut := relay.dropCommitAfter([]byte("state = 3 RETURNING"))
	r := adminCall(t, "POST", "http://"+a.admin+"/admin/v1/records/resolve",
		`{"key":"`+key+`","outcome":"executed","status":201,"body":{"id":"pay_9","status":"succeeded"}}`, auth...)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, `"store_unavailable"`) {
		t.Fatalf("resolve through a, its commit's answer lost = %d %s, want 503 store_unavailable", r.status, r.body)
	}
	if !strings.Contains(r.body, "may have been made") {
		t.Errorf("resolve through a, its commit's answer lost = %s, want a message saying it may have been made", r.body)
	}
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay never cut the resolve's COMMIT")
	}
	if got := send(t, "GET", "http://"+b.admin+"/admin/v1/records/"+key, "", auth...); got.status != http.StatusOK ||
		!strings.Contains(got.body, `"state":"final"`) || !strings.Contains(got.body, `"status":201`) {
		t.Fatalf("the record on b = %d %s, want the resolve made: final 201", got.status, got.body)
	}
	line := logLine(a, `"key":"`+key+`"`, `"level":"WARN"`, `"msg":"admin: `)
	if line == "" || !strings.Contains(line, `"outcome":"executed"`) || !strings.Contains(line, `"status":201`) ||
		jsonField(line, "who") == "" || !strings.Contains(line, `"result":"unknown"`) {
		t.Errorf("a's audit line of the resolve whose answer was lost = %q, want WARN with who, key, outcome, status and result unknown\nlog:\n%s", line, a.text())
	}

	// The renew: its statement sets superseded.
	cut = relay.dropCommitAfter([]byte("SET superseded = true"))
	r = adminCall(t, "POST", "http://"+a.admin+"/admin/v1/orders/renew", `{"method":"POST","path":"/cards","value":"f-lost"}`, auth...)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("renew through a, its commit's answer lost = %d %s, want 503", r.status, r.body)
	}
	if !strings.Contains(r.body, "may have been made") {
		t.Errorf("renew through a, its commit's answer lost = %s, want a message saying it may have been made", r.body)
	}
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay never cut the renew's COMMIT")
	}
	if got := send(t, "GET", "http://"+b.admin+"/admin/v1/orders?method=POST&path=/cards&value=f-lost", "", auth...); got.status != http.StatusOK ||
		!strings.Contains(got.body, `"generation":2`) {
		t.Fatalf("the order on b = %d %s, want the renew made: generation 2", got.status, got.body)
	}
	line = logLine(a, `"from_key":"`+failed.header.Get("Idempotency-Key")+`"`, `"level":"WARN"`)
	if line == "" || !strings.Contains(line, `"generation":2`) || jsonField(line, "who") == "" || !strings.Contains(line, `"result":"unknown"`) {
		t.Errorf("a's audit line of the renew whose answer was lost = %q, want WARN with who, both keys, the generation and result unknown\nlog:\n%s", line, a.text())
	}
	if strings.Contains(a.text(), adminToken) {
		t.Error("the admin token reached the log")
	}
	// a serves the operator once its connection is back.
	if got := send(t, "GET", "http://"+a.admin+"/admin/v1/records/"+key, "", auth...); got.status != http.StatusOK {
		t.Errorf("a's next admin call = %d %s, want 200", got.status, got.body)
	}
}
