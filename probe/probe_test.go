package probe_test

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/probe"
	"github.com/idemproxy/idemproxy/routes"
)

func TestBuild(t *testing.T) {
	req := []byte(`{"order_id":"payout-1","amount":12.5,"meta":{"ref":"r/1"},"n":42}`)
	resp := []byte(`{"payment_id":"pay_7","error":{"code":"gateway_timeout"}}`)
	cases := []struct {
		tmpl, method, path, body string
	}{
		{`GET /payments/{resp.payment_id}`, "GET", "/payments/pay_7", ""},
		{`POST /v1/payout/info {"order_id":"{req.order_id}"}`, "POST", "/v1/payout/info", `{"order_id":"payout-1"}`},
		{`GET /operations?key={idempotency_key}`, "GET", "/operations?key=k+1%2F2", ""},
		{`GET /x/{req.meta.ref}`, "GET", "/x/r%2F1", ""},
		{`GET /x/{req.n}`, "GET", "/x/42", ""},
		{`POST /q {"a":{"b":"{req.meta.ref}"},"k":"{idempotency_key}"}`, "POST", "/q", `{"a":{"b":"r/1"},"k":"k 1/2"}`},
		{`  GET   /plain  `, "GET", "/plain", ""},
	}
	for _, c := range cases {
		t.Run(c.tmpl, func(t *testing.T) {
			tmpl, err := probe.Parse(c.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			p, err := tmpl.Build(probe.Values{Key: "k 1/2", Request: req, Response: resp})
			if err != nil {
				t.Fatal(err)
			}
			if p.Method != c.method || p.Path != c.path || string(p.Body) != c.body {
				t.Fatalf("got %s %s %q, want %s %s %q", p.Method, p.Path, p.Body, c.method, c.path, c.body)
			}
			if c.body == "" && p.Body != nil {
				t.Fatalf("body %q, want none", p.Body)
			}
		})
	}
}

func TestBuildEscapesBodyValues(t *testing.T) {
	tmpl, err := probe.Parse(`POST /info {"order_id":"{req.order_id}"}`)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tmpl.Build(probe.Values{Request: []byte(`{"order_id":"a\",\"x\":\"b\\\\"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"order_id":"a\",\"x\":\"b\\\\"}`; string(p.Body) != want {
		t.Fatalf("body %s, want %s", p.Body, want)
	}
}

// A value that would put a dot-segment into the probe's path, plain or
// behind a slash, a backslash, a path parameter, a query or fragment
// delimiter or a NUL (what the proxy refuses in an app's path, encoded or
// not), leaves the probe unfilled: the operation is re-sent with its key
// instead of a signed lookup reaching a path above the resource, at an
// upstream that decodes the path before it resolves. Values whose dots are
// not a segment, and any value in the query, fill the probe.
func TestBuildRefusesDotSegments(t *testing.T) {
	tmpl, _ := probe.Parse(`GET /payments/{resp.id}?order={req.order_id}`)
	resp := func(id string) []byte {
		b, _ := json.Marshal(map[string]string{"id": id})
		return b
	}
	for _, id := range []string{".", "..", "../admin", "a/../../admin", `..\admin`, "..;x", "..?x=1", "..#f", "..\x00", "x/./y"} {
		p, err := tmpl.Build(probe.Values{Response: resp(id), Request: []byte(`{"order_id":"o-1"}`)})
		if !errors.Is(err, probe.ErrUnfilled) {
			t.Errorf("value %q: path %q, err %v; want ErrUnfilled", id, p.Path, err)
		}
	}
	for _, id := range []string{"...", "..a", "a..b", ".hidden", "%2e%2e", "p_1"} {
		p, err := tmpl.Build(probe.Values{Response: resp(id), Request: []byte(`{"order_id":"../.."}`)})
		if err != nil {
			t.Errorf("value %q: %v", id, err)
			continue
		}
		u, err := url.Parse(p.Path)
		if err != nil || u.JoinPath().Path != u.Path || u.Query().Get("order") != "../.." || !strings.HasPrefix(p.Path, "/payments/") {
			t.Errorf("value %q gave %q", id, p.Path)
		}
	}
}

func TestBuildUnfilled(t *testing.T) {
	cases := []struct{ tmpl, req, resp, key string }{
		{`GET /payments/{resp.payment_id}`, `{}`, ``, "k"},                         // no answer body
		{`GET /payments/{resp.payment_id}`, `{}`, `<html>504</html>`, "k"},         // not JSON
		{`GET /payments/{resp.payment_id}`, `{}`, `{"payment_id":null}`, "k"},      // null
		{`GET /payments/{resp.payment_id}`, `{}`, `{"payment_id":""}`, "k"},        // empty
		{`GET /payments/{resp.payment_id}`, `{}`, `{"payment_id":{"a":1}}`, "k"},   // object
		{`POST /info {"order_id":"{req.order.id}"}`, `{"order":"x"}`, ``, "k"},     // path through a string
		{`POST /info {"order_id":"{req.order_id}"}`, `[1]`, ``, "k"},               // not an object
		{`GET /ops/{idempotency_key}`, `{}`, ``, ""},                               // no key
		{`POST /info {"order_id":"{req.order_id}"}`, `{"order_id":true}`, ``, "k"}, // bool
	}
	for _, c := range cases {
		tmpl, err := probe.Parse(c.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tmpl.Build(probe.Values{Key: c.key, Request: []byte(c.req), Response: []byte(c.resp)})
		if !errors.Is(err, probe.ErrUnfilled) {
			t.Errorf("%s with req %s resp %s: err %v, want ErrUnfilled", c.tmpl, c.req, c.resp, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, s := range []string{
		"", "GET", "get /x", "GET x", "GET", "G3T /x", "GET /x#frag", "GET /{req.}", "GET /{resp.a..b}",
		`POST /info {"a":"{req..a}"}`,
		// An unknown name would go to the provider as literal braces.
		"GET /{x}", "GET /payments/{payment_id}", "GET /payments/{key}", `POST /info {"order_id":"{order-id}"}`, "GET /p/{Req.a}",
		// Not a lookup: these once started, and were sent signed before
		// every re-send of an unknown operation, their 2xx answer stored
		// and replayed to the app (a TRACE echo holding the signature and
		// the static credentials).
		"DELETE /payments/{resp.payment_id}", "PUT /payments/{resp.payment_id}", "PATCH /p", "TRACE /payments", "TRACK /p", "CONNECT /p",
		// A dot-segment, which the proxy refuses in an app's path.
		"GET /payments/../admin/{resp.id}", "GET /./p", "GET /p/%2e%2e/admin", "GET /p/..?q={req.a}",
	} {
		_, err := probe.Parse(s)
		if !errors.Is(err, probe.ErrSyntax) {
			t.Errorf("Parse(%q) = %v, want ErrSyntax", s, err)
		}
	}
}

// A body value between quotes is escaped as the inside of a JSON string; one
// where the template puts a JSON value ({"order_id":{req.order_id}}) is put as
// the value it was, a number bare and a string quoted, so that no string can
// change the body's structure.
func TestBuildBodyValueOutsideQuotes(t *testing.T) {
	tmpl, err := probe.Parse(`POST /info {"order_id":{req.order_id},"ref":"{req.order_id}","n":[{req.n}]}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ req, want string }{
		{`{"order_id":123,"n":1.5e3}`, `{"order_id":123,"ref":"123","n":[1.5e3]}`},
		{`{"order_id":"A-1","n":"2"}`, `{"order_id":"A-1","ref":"A-1","n":["2"]}`},
		{`{"order_id":"[1]","n":"null"}`, `{"order_id":"[1]","ref":"[1]","n":["null"]}`},
		{`{"order_id":"1,\"x\":\"}","n":"]}"}`, `{"order_id":"1,\"x\":\"}","ref":"1,\"x\":\"}","n":["]}"]}`},
		{`{"order_id":"a\\\"","n":0}`, `{"order_id":"a\\\"","ref":"a\\\"","n":[0]}`},
	} {
		p, err := tmpl.Build(probe.Values{Request: []byte(c.req)})
		if err != nil || string(p.Body) != c.want || !json.Valid(p.Body) {
			t.Errorf("req %s: body %s, %v; want %s", c.req, p.Body, err, c.want)
		}
	}
}

// A body that is not JSON once its placeholders are filled (a brace or a
// quote missing, or text) stops the start: it is sent as application/json,
// and a provider refusing it before every re-send left every unknown
// operation re-sent, never reconciled, and past the key retention refused
// for good, with nothing said at start. Bodies that are JSON with their
// values, between quotes or as a value, are taken as before.
func TestParseBodyNotJSON(t *testing.T) {
	for _, s := range []string{
		`POST /info {"order_id":"{req.order_id}"`,
		`POST /info {"order_id":"{req.order_id}}`,
		`POST /info {"order_id":{req.order_id}`,
		`POST /info order_id={req.order_id}`,
		`POST /info {"order_id":"{req.order_id}",}`,
	} {
		if _, err := probe.Parse(s); !errors.Is(err, probe.ErrSyntax) || !strings.Contains(err.Error(), "JSON") {
			t.Errorf("Parse(%q) = %v, want ErrSyntax saying the body must be JSON", s, err)
		}
	}
	for _, s := range []string{
		`POST /info {"order_id":"{req.order_id}"}`,
		`POST /info {"order_id":{req.order_id},"n":[{req.n}],"k":"x-{idempotency_key}-{resp.id}"}`,
		`POST /info {"a":{"b":1}}`,
		`POST /info "{idempotency_key}"`,
		`POST /info {req.order_id}`,
	} {
		if _, err := probe.Parse(s); err != nil {
			t.Errorf("Parse(%q) = %v, want it taken", s, err)
		}
	}
}

// TestLookupCovers: with For, the lookup is for the operations it names,
// read below the upstream's base path; without, for every operation.
func TestLookupCovers(t *testing.T) {
	tmpl, err := probe.Parse("GET /payments/{resp.payment_id}")
	if err != nil {
		t.Fatal(err)
	}
	only, err := routes.Parse("POST /payments=unprotected")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		base, method, url string
		all, want         bool
	}{
		{"http://p.example", "POST", "http://p.example/payments", false, true},
		{"http://p.example", "POST", "http://p.example/payments/", false, true},
		{"http://p.example", "POST", "http://p.example/payments/pay-1/refunds", false, false},
		{"http://p.example", "PUT", "http://p.example/payments", false, false},
		{"http://p.example/api/", "POST", "http://p.example/api/payments", false, true},
		{"http://p.example/api", "POST", "http://p.example/api/payments/pay-1/refunds", false, false},
		{"http://p.example/api", "POST", "http://p.example/payments", false, false},
		{"http://p.example", "POST", "http://p.example/payments/pay-1/refunds", true, true},
	} {
		base, _ := url.Parse(c.base)
		l := &probe.Lookup{Template: tmpl, Base: base, For: only}
		if c.all {
			l.For = routes.Table{}
		}
		req := httptest.NewRequest(c.method, c.url, nil)
		if got := l.Covers(req); got != c.want {
			t.Errorf("base %s, all %v: Covers(%s %s) = %v, want %v", c.base, c.all, c.method, c.url, got, c.want)
		}
	}
}

// A GET or HEAD probe with a body stops the start: such a body has no
// defined meaning (RFC 9110, sections 9.3.1 and 9.3.2), and many providers
// and gateways drop it or refuse the request, so the lookup before every
// re-send found nothing or failed. It was taken, and sent. Without a body,
// or as POST, the same probe is taken.
func TestParseBodyOnlyWithPost(t *testing.T) {
	for _, s := range []string{
		`GET /payments/find {"order_id":"{req.order_id}"}`,
		`HEAD /payments/find {"order_id":"{req.order_id}"}`,
		`GET /payments/{resp.payment_id} {}`,
	} {
		if _, err := probe.Parse(s); !errors.Is(err, probe.ErrSyntax) || !strings.Contains(err.Error(), "no body") {
			t.Errorf("Parse(%q) = %v, want ErrSyntax saying the probe has no body", s, err)
		}
	}
	for _, s := range []string{
		`GET /payments/{resp.payment_id}`,
		`GET /payments/{resp.payment_id}   `,
		`POST /payments/find {"order_id":"{req.order_id}"}`,
	} {
		if _, err := probe.Parse(s); err != nil {
			t.Errorf("Parse(%q) = %v, want it taken", s, err)
		}
	}
}
