package main

// End-to-end tests of the admin port's answers that no call of the admin API
// makes: a body over a call's limit, "OPTIONS *", a list cursor that is not
// whole, and the records of a client whose token was removed.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
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

// TestAdminBodyOverLimit: a POST call's body over its limit is 413
// body_too_large naming the limit; it was 400 bad_request ("body must be
// JSON …: http: request body too large"), which says the body is wrong.
func TestAdminBodyOverLimit(t *testing.T) {
	p := launch(t, launchSpec{env: unknownEnv(auditProvider(t), t.TempDir(), "IDEMPROXY_ADMIN_TOKEN="+adminToken)})
	for _, c := range []struct {
		call  string
		limit int
	}{
		{"/admin/v1/records/resolve", 1 << 20},
		{"/admin/v1/orders/renew", 64 << 10},
	} {
		body := `{"key":"` + strings.Repeat("k", c.limit) + `"}`
		r := send(t, "POST", "http://"+p.admin+c.call, body, "Authorization", "Bearer "+adminToken)
		msg := adminAnswer(t, "POST "+c.call+" with a body over the limit", r.status, r.header, r.body, http.StatusRequestEntityTooLarge, "body_too_large")
		if !strings.Contains(msg, fmt.Sprint(c.limit)) {
			t.Fatalf("POST %s over the limit: message %q does not name the limit %d", c.call, msg, c.limit)
		}
		// Under the limit the body is read as before.
		r = send(t, "POST", "http://"+p.admin+c.call, `{"key":"k"`, "Authorization", "Bearer "+adminToken)
		adminAnswer(t, "POST "+c.call+" with a body cut short", r.status, r.header, r.body, http.StatusBadRequest, "bad_request")
	}
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

// TestAdminListCursorWhole: a listing's cursor cut short or with something
// after it is refused 400 bad_request naming cursor. Before, "unknown."
// (the cursor cut to its listing) and, on PostgreSQL, a cursor cut to its
// client's part started the listing again from the first page, and a script
// paging with it looped over the same records for ever.
func TestAdminListCursorWhole(t *testing.T) { onStores(t, testAdminListCursorWhole) }

func testAdminListCursorWhole(t *testing.T, shared bool) {
	c := startCards(t, shared)
	for _, order := range []string{"F-unknown-1", "F-unknown-2", "F-unknown-3"} {
		if r := c.post(t, order, "10"); r.status != http.StatusBadGateway {
			t.Fatalf("POST %s = %d %s, want 502", order, r.status, r.body)
		}
	}
	list := func(cursor string) reply {
		return c.admin(t, "GET", "/admin/v1/records?state=unknown&limit=1&cursor="+url.QueryEscape(cursor), "")
	}
	var first struct {
		NextCursor string `json:"next_cursor"`
	}
	if r := list(""); r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &first) != nil || first.NextCursor == "" {
		t.Fatalf("first page = %d %s, want a next cursor", r.status, r.body)
	}
	whole := first.NextCursor
	if r := list(whole); r.status != http.StatusOK {
		t.Fatalf("second page with the whole cursor = %d %s", r.status, r.body)
	}
	// The store's position is the second part of the cursor; the first
	// 16 hex digits of a PostgreSQL position are its client ("default").
	parts := strings.Split(whole, ".")
	if len(parts) < 2 || len(parts[1]) < 16 {
		t.Fatalf("cursor %q: want unknown.<position>…", whole)
	}
	for _, bad := range []string{
		whole + ".",
		whole + "x",
		whole[:len(whole)-1],
		"unknown.",
		"unknown." + parts[1][:16],
		"unknown." + parts[1][:16] + ".",
	} {
		r := list(bad)
		msg := adminAnswer(t, "listing with cursor "+bad, r.status, r.header, r.body, http.StatusBadRequest, "bad_request")
		if !strings.Contains(msg, "cursor") {
			t.Fatalf("listing with cursor %q: message %q does not name cursor", bad, msg)
		}
	}
}

// TestAdminRemovedClient: the records of a client whose token was removed
// from IDEMPROXY_CLIENT_TOKENS can still be read, listed and resolved, and
// its orders looked up and renewed, by naming it (client); before, every such
// call was 400 "no client has a client token", so its unknown operations could
// not be settled (and, until later, its failed orders not renewed). A name with no
// token and no records is still refused.
func TestAdminRemovedClient(t *testing.T) { onStores(t, testAdminRemovedClient) }

func testAdminRemovedClient(t *testing.T, shared bool) {
	up := auditProvider(t) // u-… orders: 504, their outcome unknown
	dir, db := t.TempDir(), ""
	if shared {
		db = pgtest.Database(t)
	}
	env := func(tokens string) []string {
		extra := append(fastRetry(), "IDEMPROXY_ADMIN_TOKEN="+adminToken, "IDEMPROXY_CLIENT_TOKENS="+tokens,
			"IDEMPROXY_KEY_SECRET="+keySecret)
		if shared {
			return sharedEnv(up, db, extra...)
		}
		return baseEnv(up, dir, extra...)
	}
	p := launch(t, launchSpec{env: env("app-a=" + tokenA + ",app-b=" + tokenB)})
	r := send(t, "POST", "http://"+p.proxy+"/payments", `{"order_id":"u-1","amount":"10.00"}`, "Idemproxy-Client-Token", tokenB)
	key := r.header.Get("Idempotency-Key")
	if r.status != http.StatusBadGateway || key == "" {
		t.Fatalf("app-b's POST = %d %v %s, want 502 with its key", r.status, r.header, r.body)
	}
	// And a failed one (400 "failed"), final: its order may be renewed.
	if r := send(t, "POST", "http://"+p.proxy+"/payments", `{"order_id":"f-1","amount":"10.00"}`, "Idemproxy-Client-Token", tokenB); r.status != http.StatusBadRequest {
		t.Fatalf("app-b's failed POST = %d %s, want 400", r.status, r.body)
	}
	if err := p.terminate(t); err != nil {
		t.Fatalf("first process: %v", err)
	}
	// app-b's token is removed; its unknown operation stays.
	p = launch(t, launchSpec{env: env("app-a=" + tokenA)})
	admin := func(method, path, body string) reply {
		t.Helper()
		return send(t, method, "http://"+p.admin+path, body, "Authorization", "Bearer "+adminToken)
	}
	r = admin("GET", "/admin/v1/records/"+key+"?client=app-b", "")
	if r.status != http.StatusOK || !strings.Contains(r.body, `"state":"unknown"`) || !strings.Contains(r.body, `"client":"app-b"`) {
		t.Fatalf("GET app-b's record after its token was removed = %d %s, want 200 unknown of client app-b", r.status, r.body)
	}
	r = admin("GET", "/admin/v1/records?state=unknown&client=app-b", "")
	if r.status != http.StatusOK || !strings.Contains(r.body, `"key":"`+key+`"`) {
		t.Fatalf("listing of app-b's unknown records = %d %s, want its record %s", r.status, r.body, key)
	}
	// Its orders too: looked up, and the failed one renewed to its next key.
	r = admin("GET", "/admin/v1/orders?method=POST&path=/payments&value=f-1&client=app-b", "")
	if r.status != http.StatusOK || !strings.Contains(r.body, `"generation":1`) || !strings.Contains(r.body, `"status":400`) {
		t.Fatalf("GET app-b's failed order after its token was removed = %d %s, want 200 generation 1 with its record", r.status, r.body)
	}
	r = admin("POST", "/admin/v1/orders/renew", `{"method":"POST","path":"/payments","value":"f-1","client":"app-b"}`)
	if r.status != http.StatusOK || !strings.Contains(r.body, `"generation":2`) {
		t.Fatalf("renew of app-b's failed order after its token was removed = %d %s, want 200 generation 2", r.status, r.body)
	}
	if line := p.waitLine(t, `order renewed`); !strings.Contains(line, `"client":"app-b"`) {
		t.Fatalf("the renew's log line %s does not name client app-b", line)
	}
	r = admin("POST", "/admin/v1/orders/renew", `{"method":"POST","path":"/payments","value":"u-1","client":"app-b"}`)
	adminAnswer(t, "renew of app-b's unknown order", r.status, r.header, r.body, http.StatusConflict, "renew_refused")
	r = admin("GET", "/admin/v1/orders?method=POST&path=/payments&value=f-1&client=app-c", "")
	adminAnswer(t, "GET an order of a client with no token and no records", r.status, r.header, r.body, http.StatusBadRequest, "bad_request")
	r = admin("POST", "/admin/v1/orders/renew", `{"method":"POST","path":"/payments","value":"f-1","client":"app-c"}`)
	adminAnswer(t, "renew for a client with no token and no records", r.status, r.header, r.body, http.StatusBadRequest, "bad_request")

	// A name that has neither a token nor records is refused as before.
	r = admin("GET", "/admin/v1/records/"+key+"?client=app-c", "")
	adminAnswer(t, "GET a record of a client with no token and no records", r.status, r.header, r.body, http.StatusBadRequest, "bad_request")
	r = admin("GET", "/admin/v1/records?state=unknown&client=app-c", "")
	adminAnswer(t, "listing of a client with no token and no records", r.status, r.header, r.body, http.StatusBadRequest, "bad_request")
	r = admin("POST", "/admin/v1/records/resolve", `{"key":"`+key+`","client":"app-c","outcome":"not_executed"}`)
	adminAnswer(t, "resolve for a client with no token and no records", r.status, r.header, r.body, http.StatusBadRequest, "bad_request")

	r = admin("POST", "/admin/v1/records/resolve", `{"key":"`+key+`","client":"app-b","outcome":"not_executed"}`)
	if r.status != http.StatusOK || !strings.Contains(r.body, `"client":"app-b"`) {
		t.Fatalf("resolve of app-b's record after its token was removed = %d %s, want 200", r.status, r.body)
	}
	if line := p.waitLine(t, `resolved by an operator`); !strings.Contains(line, `"client":"app-b"`) {
		t.Fatalf("the resolve's log line %s does not name client app-b", line)
	}
	// Resolved, nothing is left under app-b: the name is refused again.
	r = admin("GET", "/admin/v1/records/"+key+"?client=app-b", "")
	adminAnswer(t, "GET app-b's record after its resolve", r.status, r.header, r.body, http.StatusBadRequest, "bad_request")
}
