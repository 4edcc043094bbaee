package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// keyRequest is one protected request of the tables below: its query, body
// (with its Content-Type) and extra header lines (name, value, ...).
type keyRequest struct {
	name, query, contentType, body string
	hdr                            []string
}

// post sends kr through e's proxy.
func (e *env) post(t *testing.T, kr keyRequest) answer {
	t.Helper()
	target := e.srv.URL + "/v1/payments"
	if kr.query != "" {
		target += "?" + kr.query
	}
	req, err := http.NewRequest("POST", target, strings.NewReader(kr.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", kr.contentType)
	for i := 0; i+1 < len(kr.hdr); i += 2 {
		req.Header.Add(kr.hdr[i], kr.hdr[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: b}
	return a
}

// keySourcesEnv is newEnv with every kind of key source, under policy.
func keySourcesEnv(t *testing.T, policy proxy.MissingKey) *env {
	return newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.MissingKey = policy
		o.KeySources, _ = idemkey.ParseSources("json:order_id,form:order_id,header:X-Order-Id,query:order_id")
	})
}

// wantRefused checks that a is 422 idempotency_key_missing, with a message
// holding cause, and that nothing reached e's provider.
func wantRefused(t *testing.T, e *env, kr keyRequest, a answer, cause string) {
	t.Helper()
	if a.status != http.StatusUnprocessableEntity || errorCode(t, a) != proxy.CodeKeyMissing {
		t.Errorf("%s: %d %s, want 422 %s", kr.name, a.status, a.body, proxy.CodeKeyMissing)
	} else if !strings.Contains(string(a.body), cause) {
		t.Errorf("%s: message %s does not say %q", kr.name, a.body, cause)
	}
	if got := e.prov.takeTargets(); len(got) > 0 {
		t.Errorf("%s: the provider got %v, want nothing", kr.name, got)
	}
}

// A 422 for a key source the proxy cannot read one order id from names the
// cause when the generic message does not cover it: an escaped lone
// surrogate in a JSON string, and a ';' joining the field to another in a
// form body or in the query. Before, each got the generic message, which
// says nothing of either (and the query's was not refused at all).
func TestKeyMissingNamesTheCause(t *testing.T) {
	const (
		surrogate = "escaped lone surrogate"
		formSemi  = "its form body has a field with a ';'"
		querySemi = "its query has a parameter with a ';'"
	)
	cases := []struct {
		kr    keyRequest
		cause string
	}{
		{keyRequest{name: "lone surrogate", contentType: "application/json", body: `{"order_id":"s\ud800","amount":"1"}`}, surrogate},
		{keyRequest{name: "lone surrogate in a repeated member", contentType: "application/json", body: `{"order_id":"a","order_id":"s\udbff"}`}, surrogate},
		{keyRequest{name: "form field then ';'", contentType: "application/x-www-form-urlencoded", body: "order_id=A;amount=5"}, formSemi},
		{keyRequest{name: "form field after ';'", contentType: "application/x-www-form-urlencoded", body: "amount=5;order_id=A"}, formSemi},
		{keyRequest{name: "query parameter then ';'", query: "order_id=1;x=2", contentType: "application/json", body: `{"amount":"1"}`}, querySemi},
		{keyRequest{name: "query parameter after ';'", query: "x=2;order_id=1", contentType: "application/json", body: `{"amount":"1"}`}, querySemi},
		{keyRequest{name: "repeated form field", contentType: "application/x-www-form-urlencoded", body: "order_id=A&order_id=B"}, "given twice with different values"},
	}
	for _, policy := range []proxy.MissingKey{proxy.Reject, proxy.Generate, proxy.Passthrough} {
		e := keySourcesEnv(t, policy)
		for _, c := range cases {
			wantRefused(t, e, c.kr, e.post(t, c.kr), c.cause)
		}
	}
}

// A query parameter that a ';' joins to another, or that follows one, has no
// one reading: Go's url.ParseQuery (and so the query idemproxy forwards,
// as httputil.ReverseProxy's) drops the pair, Perl's CGI.pm, Python before
// 3.9.2 and Go before 1.17 split it at ';' (order 1), PHP, Java and Rack
// read order "1;x=2". Measured before the fix, through the proxy to this
// provider: ?order_id=1;x=2 and ?order_id=1;x=3 were 201 under two keys
// (those of "1;x=2" and "1;x=3"), each forwarded as POST /v1/payments with
// the query dropped, so order 1 at a ';'-splitting server would have been
// executed twice; ?order_id=1&x=2;order_id=3 was 201 under order 1's key
// though such a server reads order_id twice; ?x=2;order_id=1 was sent with
// a random key under generate and with none under passthrough. Now each is
// 422 under every policy, nothing sent; an escaped ';' is one value to
// every server and still gives its key.
func TestQuerySemicolonOrderIsRefused(t *testing.T) {
	for _, policy := range []proxy.MissingKey{proxy.Reject, proxy.Generate, proxy.Passthrough} {
		e := keySourcesEnv(t, policy)
		for _, q := range []string{"order_id=1;x=2", "order_id=1;x=3", "order_id=1;order_id=2", "x=2;order_id=1",
			"order_id=1&x=2;order_id=3", "order_id;x=1", "ORDER_ID=1;x=2", "order.id=1;x=2"} {
			kr := keyRequest{name: q, query: q, contentType: "application/json", body: `{"amount":"1"}`}
			wantRefused(t, e, kr, e.post(t, kr), "its query has a parameter with a ';'")
		}
		for _, q := range []string{"order_id=1%3Bx%3D2", "order_id=1&x=2;y=3"} {
			a := e.post(t, keyRequest{query: q, contentType: "application/json", body: `{"amount":"1"}`})
			if a.status != http.StatusCreated || a.header.Get("Idempotency-Key") == "" {
				t.Errorf("%s: %d %s, want 201 with a key", q, a.status, a.body)
			}
			e.prov.takeTargets()
		}
	}
}

// A repeated order id is refused the same way from every source and under
// every policy, also when a later source has one value: that source does
// not stand in for the repeated one, which the provider may read. Before,
// {"order_id":"a","order_id":"b"} sent with ?order_id=c and with
// ?order_id=d was 201 twice under two keys (those of c and d), both sent
// upstream: a provider reading the body's order executed it twice. The same
// held for a repeated form field or multipart part with the query, and for
// a repeated JSON member with the header.
func TestRepeatedOrderIDRefusedEverywhere(t *testing.T) {
	const multipart = "--XX\r\nContent-Disposition: form-data; name=\"order_id\"\r\n\r\na\r\n" +
		"--XX\r\nContent-Disposition: form-data; name=\"order_id\"\r\n\r\nb\r\n--XX--\r\n"
	cases := []keyRequest{
		{name: "JSON", contentType: "application/json", body: `{"order_id":"a","order_id":"b"}`},
		{name: "form", contentType: "application/x-www-form-urlencoded", body: "order_id=a&order_id=b"},
		{name: "multipart", contentType: "multipart/form-data; boundary=XX", body: multipart},
		{name: "header", contentType: "application/json", body: `{"amount":"1"}`, hdr: []string{"X-Order-Id", "a", "X-Order-Id", "b"}},
		{name: "query", query: "order_id=a&order_id=b", contentType: "application/json", body: `{"amount":"1"}`},
		{name: "JSON, query c", query: "order_id=c", contentType: "application/json", body: `{"order_id":"a","order_id":"b"}`},
		{name: "JSON, query d", query: "order_id=d", contentType: "application/json", body: `{"order_id":"a","order_id":"b"}`},
		{name: "JSON, header c", contentType: "application/json", body: `{"order_id":"a","order_id":"b"}`, hdr: []string{"X-Order-Id", "c"}},
		{name: "form, query c", query: "order_id=c", contentType: "application/x-www-form-urlencoded", body: "order_id=a&order_id=b"},
		{name: "multipart, query c", query: "order_id=c", contentType: "multipart/form-data; boundary=XX", body: multipart},
		{name: "header, query c", query: "order_id=c", contentType: "application/json", body: `{"amount":"1"}`, hdr: []string{"X-Order-Id", "a", "X-Order-Id", "b"}},
	}
	for _, policy := range []proxy.MissingKey{proxy.Reject, proxy.Generate, proxy.Passthrough} {
		e := keySourcesEnv(t, policy)
		for _, kr := range cases {
			wantRefused(t, e, kr, e.post(t, kr), proxy.CodeKeyMissing)
		}
	}
}
