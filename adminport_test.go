package main

// End-to-end tests of the admin port's answers that no call of the admin API
// makes: a body over a call's limit, "OPTIONS *", a list cursor that is not
// whole, and the records of a client whose token was removed.

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// adminAnswer checks that r is a JSON error of the admin API's shape, with
// its header, status and code, and returns its message.
func adminAnswer(t *testing.T, what string, status int, header http.Header, body string, wantStatus int, wantCode string) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if status != wantStatus || header.Get("Idemproxy-Admin") != "v1" ||
		!strings.HasPrefix(header.Get("Content-Type"), "application/json") ||
		json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != wantCode {
		t.Fatalf("%s = %d %v %q, want %d %s in JSON with Idemproxy-Admin: v1", what, status, header, body, wantStatus, wantCode)
	}
	return e.Error.Message
}

// TestAdminOptionsStar: "OPTIONS *" on the admin port is answered as any
// path it does not serve, 404 not_found in JSON with its header; net/http
// answered it itself, 200 with neither.
func TestAdminOptionsStar(t *testing.T) {
	p := launch(t, launchSpec{env: unknownEnv(auditProvider(t), t.TempDir())})
	c, err := net.Dial("tcp", p.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	req := "OPTIONS * HTTP/1.1\r\nHost: admin\r\n\r\n"
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "OPTIONS"})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	adminAnswer(t, "OPTIONS *", resp.StatusCode, resp.Header, b.String(), http.StatusNotFound, "not_found")
}
