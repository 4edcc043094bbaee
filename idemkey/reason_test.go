package idemkey

import (
	"net/http"
	"testing"
)

// A source that is in the request without one value ends the search: a
// later source of another kind does not give the key. Before, {"order_id":"a","order_id":"b"}
// with ?order_id=c and with ?order_id=d got the keys of c and d, and a
// provider reading the body's order (b to Go, a to others) executed it once
// for each; the same held for a repeated form field or header, a lone
// surrogate and JSON that does not parse whole.
func TestUnreadableSourceEndsTheSearch(t *testing.T) {
	srcs := mustSources(t, "json:order_id,form:order_id,header:X-Order-Id,query:order_id")
	q := func(r Request) Request { r.Method, r.Path, r.RawQuery = "POST", "/p", "order_id=c"; return r }
	for name, r := range map[string]Request{
		"JSON member repeated":        q(postJSON(`{"order_id":"a","order_id":"b"}`)),
		"JSON member in another case": q(postJSON(`{"order_id":"a","ORDER_ID":"b"}`)),
		"JSON lone surrogate":         q(postJSON(`{"order_id":"s\ud800"}`)),
		"JSON trailing comma":         q(postJSON(`{"order_id":"A",}`)),
		"form field repeated":         q(form("order_id=a&order_id=b")),
		"form field with a ';'":       q(form("order_id=a;amount=5")),
		"multipart field repeated":    q(formData(t, "XX", "order_id", "a", "order_id", "b")),
		"header repeated":             q(Request{Header: http.Header{"X-Order-Id": {"a", "b"}}}),
	} {
		wantUnreadable(t, name, srcs, r)
	}
	// A later JSON source still gives the key after an unreadable JSON one,
	// as in earlier versions, whose keys are kept (the proxy's
	// TestKeysAndFingerprintsPinned).
	js := mustSources(t, "json:order_id,json:payment.order_id,query:order_id")
	r := q(postJSON(`{"order_id":"a","order_id":"b","payment":{"order_id":"p"}}`))
	if _, src, ok := Derive(js, r); !ok || src != (Source{JSON, "payment.order_id"}) {
		t.Errorf("later JSON source: Derive source %v (%v), want json:payment.order_id", src, ok)
	}
	p := Parse(js, r)
	if _, src, ok := p.Derive(r); !ok || src != (Source{JSON, "payment.order_id"}) {
		t.Errorf("later JSON source: Parsed.Derive source %v (%v), want json:payment.order_id", src, ok)
	}
	// An absent or empty earlier source still lets a later one give the key.
	for name, r := range map[string]Request{
		"JSON without the member": q(postJSON(`{"amount":5}`)),
		"JSON member empty":       q(postJSON(`{"order_id":""}`)),
		"form without the field":  q(form("amount=5")),
		"header empty":            q(Request{Header: http.Header{"X-Order-Id": {""}}}),
	} {
		if _, src, ok := Derive(srcs, r); !ok || src != (Source{Query, "order_id"}) {
			t.Errorf("%s: Derive source %v (%v), want query:order_id", name, src, ok)
		}
		p := Parse(srcs, r)
		if _, src, ok := p.Derive(r); !ok || src != (Source{Query, "order_id"}) {
			t.Errorf("%s: Parsed.Derive source %v (%v), want query:order_id", name, src, ok)
		}
	}
}

// UnreadableReason names the cause a refusal can explain: a lone surrogate
// in a JSON string, a ';' in a form body's field or a query parameter that
// names the source; ReasonOther for the rest, ReasonNone when the source
// is absent (it is asked of requests Derive found no key in).
func TestUnreadableReason(t *testing.T) {
	withQuery := func(q string) Request { return Request{Method: "POST", Path: "/p", RawQuery: q} }
	tests := []struct {
		name, sources string
		req           Request
		want          Reason
	}{
		{"lone surrogate", "json:order_id", postJSON(`{"order_id":"s\ud800"}`), ReasonLoneSurrogate},
		{"lone low surrogate, nested", "json:p.order_id", postJSON(`{"p":{"order_id":"s\udc00"}}`), ReasonLoneSurrogate},
		{"lone surrogate repeated", "json:order_id", postJSON(`{"order_id":"a","order_id":"s\ud800"}`), ReasonLoneSurrogate},
		{"surrogate pair", "json:order_id", postJSON(`{"order_id":"s\ud83d\ude00","order_id":"b"}`), ReasonOther},
		{"form field then ';'", "form:order_id", form("order_id=A;amount=5"), ReasonFormSemicolon},
		{"form field after ';'", "form:order_id", form("amount=5;order_id=A"), ReasonFormSemicolon},
		{"form field repeated", "form:order_id", form("order_id=A&order_id=B"), ReasonOther},
		{"form ';' not naming it", "form:order_id", form("amount=5;x=1"), ReasonNone},
		{"query parameter then ';'", "query:order_id", withQuery("order_id=1;x=2"), ReasonQuerySemicolon},
		{"query parameter twice in one", "query:order_id", withQuery("order_id=1;order_id=2"), ReasonQuerySemicolon},
		{"query parameter after ';'", "query:order_id", withQuery("x=2;order_id=1"), ReasonQuerySemicolon},
		{"query parameter beside one after ';'", "query:order_id", withQuery("order_id=1&x=2;order_id=1"), ReasonQuerySemicolon},
		{"query parameter repeated", "query:order_id", withQuery("order_id=1&order_id=2"), ReasonOther},
		{"query ';' escaped", "query:order_id", withQuery("x=1%3Border_id%3D2"), ReasonNone},
		{"header repeated", "header:X-Order-Id", Request{Header: http.Header{"X-Order-Id": {"a", "b"}}}, ReasonOther},
		{"absent", "json:order_id,query:order_id", postJSON(`{"amount":5}`), ReasonNone},
		{"first unreadable source", "query:order_id,json:order_id",
			Request{Method: "POST", Path: "/p", RawQuery: "order_id=1;x=2", Body: []byte(`{"order_id":"s\ud800"}`)}, ReasonQuerySemicolon},
	}
	for _, tt := range tests {
		srcs := mustSources(t, tt.sources)
		if got := UnreadableReason(srcs, tt.req); got != tt.want {
			t.Errorf("%s: UnreadableReason = %d, want %d", tt.name, got, tt.want)
		}
		if got := Unreadable(srcs, tt.req); got != (tt.want != ReasonNone) {
			t.Errorf("%s: Unreadable = %v", tt.name, got)
		}
	}
}

// A query parameter with a ';' that names the source gives no key: the
// forwarded query drops it (url.ParseQuery), and servers that split at ';'
// read another order from it. Before, "order_id=1;x=2" gave the key of
// "1;x=2", "order_id=1;x=3" another, for one order 1 at such a server.
func TestQuerySemicolonGivesNoKey(t *testing.T) {
	srcs := mustSources(t, "query:order_id")
	for _, q := range []string{"order_id=1;x=2", "order_id=1;order_id=2", "x=2;order_id=1", "order_id=1&x=2;order_id=3", "order_id;x=1"} {
		r := Request{Method: "POST", Path: "/p", RawQuery: q}
		if key, _, ok := Derive(srcs, r); ok {
			t.Errorf("%s: key %s, want none", q, key)
		}
		if !Unreadable(srcs, r) {
			t.Errorf("%s: not Unreadable", q)
		}
	}
	// An escaped ';' is one value to everyone.
	if _, _, ok := Derive(srcs, Request{Method: "POST", Path: "/p", RawQuery: "order_id=1%3Bx&y=1;z=2"}); !ok {
		t.Errorf("escaped ';': no key")
	}
}
