package idemkey

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
)

var uuidShape = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// wantUnreadable checks that r gives no key, through Derive and through
// Parse, and is Unreadable (422 under every IDEMPROXY_MISSING_KEY rather
// than a random key or none).
func wantUnreadable(t *testing.T, name string, srcs []Source, r Request) {
	t.Helper()
	if key, src, ok := Derive(srcs, r); ok {
		t.Errorf("%s: Derive gave key %s from %v, want none", name, key, src)
	}
	p := Parse(srcs, r)
	if key, src, ok := p.Derive(r); ok {
		t.Errorf("%s: Parsed.Derive gave key %s from %v, want none", name, key, src)
	}
	if !Unreadable(srcs, r) {
		t.Errorf("%s: not Unreadable: its order id would get a random key or none", name)
	}
}

func mustSources(t testing.TB, s string) []Source {
	t.Helper()
	srcs, err := ParseSources(s)
	if err != nil {
		t.Fatal(err)
	}
	return srcs
}

func form(body string) Request {
	return Request{Method: "POST", Path: "/payouts", ContentType: "application/x-www-form-urlencoded; charset=utf-8", Body: []byte(body)}
}

func postJSON(body string) Request {
	return Request{Method: "POST", Path: "/v1/payments", ContentType: "application/json", Body: []byte(body)}
}

// wantKey is the key Derive must produce, computed here from the documented
// encoding rather than through Derive's own code.
func wantKey(method, path string, src Source, value string) string {
	var b []byte
	b = append(b, "idemproxy-key-v1"...)
	for _, f := range []string{method, path, src.Kind.String(), src.Name, value} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return uuid.NewSHA1(namespace, b).String()
}

func TestNamespaceProvenance(t *testing.T) {
	got := uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/idemproxy/idemproxy#idempotency-key"))
	if got != namespace {
		t.Fatalf("namespace = %s, but its documented derivation gives %s", namespace, got)
	}
}

func TestDerive(t *testing.T) {
	tests := []struct {
		name      string
		sources   string
		req       Request
		wantSrc   Source
		wantValue string
	}{
		{"json top level", "json:order_id", postJSON(`{"amount":100,"order_id":"A-1"}`), Source{JSON, "order_id"}, "A-1"},
		{"json nested", "json:payment.order.id", postJSON(`{"payment":{"order":{"id":"N-7"},"id":"x"}}`), Source{JSON, "payment.order.id"}, "N-7"},
		{"json number", "json:order_id", postJSON(`{"order_id":12345}`), Source{JSON, "order_id"}, "12345"},
		{"json number literal text", "json:order_id", postJSON(`{"order_id":-1.50e+3}`), Source{JSON, "order_id"}, "-1.50e+3"},
		{"json escaped string", "json:order_id", postJSON(`{"order_id":"A\u002d1"}`), Source{JSON, "order_id"}, "A-1"},
		{"json escaped key", "json:order_id", postJSON(`{"order\u005fid":"A-1"}`), Source{JSON, "order_id"}, "A-1"},
		{"json duplicate, same value", "json:order_id", postJSON(`{"order_id":"A","x":1,"order_id":"A"}`), Source{JSON, "order_id"}, "A"},
		{"json duplicate, same value quoted and not", "json:order_id", postJSON(`{"order_id":"7","order_id":7}`), Source{JSON, "order_id"}, "7"},
		{"json duplicate parent, same value", "json:a.b", postJSON(`{"a":{"b":"x","c":1},"a":{"b":"x"}}`), Source{JSON, "a.b"}, "x"},
		{"json duplicate in another case, same value", "json:order_id", postJSON(`{"order_id":"A","ORDER_ID":"A"}`), Source{JSON, "order_id"}, "A"},
		{"json other keys in another case", "json:a.b", postJSON(`{"B":"y","a":{"b":"x","B":"x"},"c":{"B":1}}`), Source{JSON, "a.b"}, "x"},
		{"form field repeated in another case, same value", "form:order_id", form("order_id=F-1&Order_Id=F-1"), Source{Form, "order_id"}, "F-1"},
		{"form field repeated as PHP spells it, same value", "form:order_id", form("order.id=F-1&order_id=F-1"), Source{Form, "order_id"}, "F-1"},
		{"form fields PHP spells otherwise", "form:order_id", form("order.x=1&order_idx=2&order_id=F-1&order_id.x[]=3&Order.Id=4"), Source{Form, "order_id"}, "F-1"},
		{"json duplicate elsewhere", "json:a.b", postJSON(`{"b":"y","a":{"b":"x"},"b":"z","c":{"b":1},"c":{}}`), Source{JSON, "a.b"}, "x"},
		{"json without content type", "json:order_id", Request{Method: "POST", Path: "/p", Body: []byte(" \n{\"order_id\":\"A\"}")}, Source{JSON, "order_id"}, "A"},
		{"json with wrong content type", "json:order_id", Request{Method: "POST", Path: "/p", ContentType: "text/plain", Body: []byte(`{"order_id":"A"}`)}, Source{JSON, "order_id"}, "A"},
		{"form", "form:order_id", form("amount=1&order_id=F%2D1+x"), Source{Form, "order_id"}, "F-1 x"},
		{"form field repeated with one value", "form:order_id", form("order_id=F-1&amount=1&order_id=F%2D1"), Source{Form, "order_id"}, "F-1"},
		{"form with a ';' in other fields", "form:order_id", form("note=a;b&order_id=ok&x;y=1"), Source{Form, "order_id"}, "ok"},
		{"form field with an escaped ';'", "form:order_id", form("order_id=A%3Bx=1"), Source{Form, "order_id"}, "A;x=1"},
		{"form skips malformed pairs of other fields", "form:order_id", form("note=100%&order_id=ok&x%zz=1"), Source{Form, "order_id"}, "ok"},
		// A query's malformed pairs are dropped before it is forwarded.
		{"query skips malformed pairs", "query:order_id", Request{Method: "POST", Path: "/p", RawQuery: "order_id=%zz&order_id=ok"}, Source{Query, "order_id"}, "ok"},
		{"form without content type", "form:order_id", Request{Method: "POST", Path: "/p", Body: []byte("order_id=7")}, Source{Form, "order_id"}, "7"},
		{"header", "header:x-order-id", Request{Method: "POST", Path: "/p", Header: http.Header{"X-Order-Id": {"H-1"}}}, Source{Header, "X-Order-Id"}, "H-1"},
		{"header repeated with one value", "header:x-order-id", Request{Method: "POST", Path: "/p", Header: http.Header{"X-Order-Id": {"H-1", "H-1"}}}, Source{Header, "X-Order-Id"}, "H-1"},
		{"header repeated with underscores, same value", "header:x-order-id", Request{Method: "POST", Path: "/p", Header: http.Header{"X-Order-Id": {"H-1"}, "X_order_id": {"H-1"}, "X_order": {"H-2"}}}, Source{Header, "X-Order-Id"}, "H-1"},
		{"query", "query:order", Request{Method: "POST", Path: "/p", RawQuery: "a=1&order=Q%201"}, Source{Query, "order"}, "Q 1"},
		{"query repeated with one value", "query:order", Request{Method: "POST", Path: "/p", RawQuery: "order=Q+1&a=1&order=Q%201"}, Source{Query, "order"}, "Q 1"},
		{"first present wins", "json:order_id,form:order_id,header:X-Id,query:id",
			Request{Method: "POST", Path: "/p", RawQuery: "id=q", Header: http.Header{"X-Id": {"h"}}, Body: []byte(`{"other":1}`)},
			Source{Header, "X-Id"}, "h"},
		{"order of sources decides", "query:id,header:X-Id",
			Request{Method: "POST", Path: "/p", RawQuery: "id=q", Header: http.Header{"X-Id": {"h"}}},
			Source{Query, "id"}, "q"},
		{"empty json value falls through", "json:order_id,query:id", Request{Method: "POST", Path: "/p", RawQuery: "id=q", Body: []byte(`{"order_id":""}`)}, Source{Query, "id"}, "q"},
		{"null falls through", "json:order_id,query:id", Request{Method: "POST", Path: "/p", RawQuery: "id=q", Body: []byte(`{"order_id":null}`)}, Source{Query, "id"}, "q"},
		// Invalid JSON that names the member ends the search instead
		// (TestUnreadableSourceEndsTheSearch).
		{"invalid json falls through", "json:order_id,query:id", Request{Method: "POST", Path: "/p", RawQuery: "id=q", Body: []byte(`{"id":"A",}`)}, Source{Query, "id"}, "q"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, src, ok := Derive(mustSources(t, tt.sources), tt.req)
			if !ok || src != tt.wantSrc {
				t.Fatalf("Derive = %q, %v, %v; want source %v", key, src, ok, tt.wantSrc)
			}
			if want := wantKey(tt.req.Method, tt.req.Path, tt.wantSrc, tt.wantValue); key != want {
				t.Fatalf("Derive key = %s, want %s (value %q)", key, want, tt.wantValue)
			}
			if !uuidShape.MatchString(key) || len(key) > MaxLen {
				t.Fatalf("key %q is not a UUIDv5", key)
			}
		})
	}
}

func TestDeriveNotPresent(t *testing.T) {
	tests := []struct {
		name, sources string
		req           Request
	}{
		{"no body", "json:order_id", Request{Method: "POST", Path: "/p"}},
		{"missing field", "json:order_id", postJSON(`{"id":"x"}`)},
		{"nested field missing", "json:a.b", postJSON(`{"a":{"c":"x"},"b":"y"}`)},
		{"path through a non-object", "json:a.b", postJSON(`{"a":"x"}`)},
		{"path through an array", "json:a.b", postJSON(`{"a":[{"b":"x"}]}`)},
		{"empty string", "json:order_id", postJSON(`{"order_id":""}`)},
		{"null", "json:order_id", postJSON(`{"order_id":null}`)},
		{"bool", "json:order_id", postJSON(`{"order_id":true}`)},
		{"object", "json:order_id", postJSON(`{"order_id":{"id":"x"}}`)},
		{"array", "json:order_id", postJSON(`{"order_id":["x"]}`)},
		{"last duplicate is empty", "json:order_id", postJSON(`{"order_id":"A","order_id":""}`)},
		{"last duplicate of parent lacks it", "json:a.b", postJSON(`{"a":{"b":"x"},"a":{}}`)},
		// Which duplicate a provider reads depends on its parser: no key.
		{"duplicates differ", "json:order_id", postJSON(`{"order_id":"A","order_id":"B"}`)},
		{"duplicates differ, other order", "json:order_id", postJSON(`{"order_id":"B","order_id":"A"}`)},
		{"third duplicate differs", "json:order_id", postJSON(`{"order_id":"A","order_id":"A","order_id":"B"}`)},
		{"first duplicate is null", "json:order_id", postJSON(`{"order_id":null,"order_id":"A"}`)},
		{"first duplicate of parent lacks it", "json:a.b", postJSON(`{"a":{},"a":{"b":"x"}}`)},
		{"duplicate parents differ", "json:a.b", postJSON(`{"a":{"b":"x"},"a":{"b":"y"}}`)},
		{"duplicates differ inside the parent", "json:a.b", postJSON(`{"a":{"b":"x","b":"y"}}`)},
		// encoding/json, ASP.NET and Json.NET match keys in any letter case
		// (the last one winning), other parsers only as written: no key.
		{"duplicate in another case differs", "json:order_id", postJSON(`{"order_id":"A","ORDER_ID":"B"}`)},
		{"duplicate in another case differs, first", "json:order_id", postJSON(`{"Order_Id":"B","order_id":"A"}`)},
		{"duplicate in another case is null", "json:order_id", postJSON(`{"order_id":"A","oRDER_ID":null}`)},
		{"duplicate parent in another case differs", "json:payment.id", postJSON(`{"payment":{"id":"x"},"Payment":{"id":"y"}}`)},
		{"duplicate in another case inside the parent", "json:payment.id", postJSON(`{"payment":{"id":"x","ID":"y"}}`)},
		{"duplicate with the Kelvin sign", "json:key", postJSON(`{"key":"A","Key":"B"}`)},
		{"only in another case", "json:order_id", postJSON(`{"ORDER_ID":"A"}`)},
		{"parent only in another case", "json:payment.id", postJSON(`{"Payment":{"id":"x"}}`)},
		{"form field repeated in another case", "form:order_id", form("order_id=F-1&ORDER_ID=F-2")},
		{"form field only in another case", "form:order_id", form("Order_Id=F-1")},
		// PHP registers these as order_id ($_POST, $_GET), the last winning.
		{"form field only as PHP spells it", "form:order_id", form("order.id=F-1")},
		{"form field repeated as PHP spells it", "form:order_id", form("order_id=F-1&order+id=F-2")},
		{"form field repeated as a PHP array", "form:order_id", form("order_id=F-1&order_id%5B%5D=F-2")},
		{"form field repeated with a NUL", "form:order_id", form("order_id=F-1&+order_id%00x=F-2")},
		{"query parameter only as PHP spells it", "query:order_id", Request{Method: "POST", Path: "/p", RawQuery: "order%5Bid=Q-1"}},
		// PHP behind a server passing underscored names reads both as
		// HTTP_X_ORDER_ID: which one wins is the server's.
		{"header repeated with underscores, another value", "header:X-Order-Id", Request{Method: "POST", Path: "/p", Header: http.Header{"X-Order-Id": {"H-1"}, "X_order_id": {"H-2"}}}},
		{"header repeated with underscores, another value among", "header:X-Order-Id", Request{Method: "POST", Path: "/p", Header: http.Header{"X-Order-Id": {"H-1"}, "X_Order-Id": {"H-1", "H-2"}}}},
		{"header only with underscores", "header:X-Order-Id", Request{Method: "POST", Path: "/p", Header: http.Header{"X_order_id": {"H-1"}}}},
		{"query repeated in another case", "query:order", Request{Method: "POST", Path: "/p", RawQuery: "order=1&Order=2"}},
		{"top-level array", "json:order_id", postJSON(`[{"order_id":"A"}]`)},
		// .NET's StringContent with Encoding.Unicode: read by ASP.NET, not here.
		{"UTF-16LE with a byte order mark", "json:order_id", postJSON(wide(`{"order_id":"A"}`, binary.LittleEndian, true))},
		{"UTF-16BE without one", "json:order_id", postJSON(wide(` {"order_id":"A"}`, binary.BigEndian, false))},
		{"UTF-16LE without one", "json:order_id", postJSON(wide(`{"order_id":"A"}`, binary.LittleEndian, false))},
		{"UTF-16LE array", "json:order_id", postJSON(wide(`[{"order_id":"A"}]`, binary.LittleEndian, true))},
		// ASP.NET Core reads a form in the charset its Content-Type names.
		{"form in UTF-16LE with a byte order mark", "form:order_id", form(wide("order_id=F-1", binary.LittleEndian, true))},
		{"form in UTF-16BE without one", "form:order_id", form(wide("order_id=F-1", binary.BigEndian, false))},
		{"trailing garbage", "json:order_id", postJSON(`{"order_id":"A"} x`)},
		{"truncated", "json:order_id", postJSON(`{"order_id":"A"`)},
		{"invalid JSON not naming it", "json:order_id", postJSON(`{'id': 'A', 'amount': 5}`)},
		// encoding/json reads it as "A\uFFFD": unreadable, as are bodies
		// only lenient parsers read (Json.NET, Gson).
		{"invalid UTF-8", "json:order_id", postJSON("{\"order_id\":\"A\xff\"}")},
		{"single quotes", "json:order_id", postJSON(`{'order_id': 'A', 'amount': 5}`)},
		{"name without quotes", "json:order_id", postJSON(`{order_id: "A"}`)},
		{"comment before it", "json:order_id", postJSON(`{"amount": 5, /* x */ "order_id": "A"}`)},
		{"leading zero before it", "json:order_id", postJSON(`{"amount": 05, "Order_Id": "A"}`)},
		{"nested, single quotes", "json:payment.order_id", postJSON(`{'payment': {'order_id': 'A'}}`)},
		// Json.NET and Gson (lenient) also skip what comes before the
		// object: comments, white space JSON does not allow (Json.NET reads
		// any char.IsWhiteSpace) and Gson's non-execute prefix.
		{"comment before the object", "json:order_id", postJSON(`/* v2 */ {"order_id": "A", "amount": 5}`)},
		{"line comment before the object", "json:order_id", postJSON("// v2\n{\"order_id\": \"A\"}")},
		{"hash comment before the object", "json:order_id", postJSON("# v2\r\n{\"order_id\": \"A\"}")},
		{"form feed before the object", "json:order_id", postJSON("\f{\"order_id\": \"A\"}")},
		{"no-break space before the object", "json:order_id", postJSON("\u00a0\n{\"order_id\": \"A\"}")},
		{"non-execute prefix before the object", "json:order_id", postJSON(")]}'\n{\"order_id\": \"A\"}")},
		{"comment before the object not naming it", "json:order_id", postJSON(`/* v2 */ {"id": "A"}`)},
		{"comment before an array", "json:order_id", postJSON(`/* v2 */ [{"order_id": "A"}]`)},
		{"form field repeated with another value", "form:order_id", form("order_id=F-1&order_id=second")},
		// A body is forwarded as it came: PHP and Node.js read a value
		// that does not decode with its '%' kept, Go and Java not at all.
		{"form field with a malformed escape", "form:order_id", form("order_id=50%off")},
		{"form field repeated with a malformed escape", "form:order_id", form("order_id=%zz&order_id=ok")},
		{"form field repeated, the second with a malformed escape", "form:order_id", form("order_id=ok&order_id=ok%")},
		// Perl's CGI.pm, Go before 1.17, Python before 3.9.2 and Django
		// before 3.2 split a form at ';' too; PHP, Java and Rack do not.
		{"form field after a ';'", "form:order_id", form("amount=5;order_id=F-1")},
		{"form field with a ';' in its value", "form:order_id", form("order_id=F-1;amount=5")},
		{"form field after a ';', escaped name", "form:order_id", form("x;order%5Fid=F-1&amount=5")},
		{"form field beside one after a ';'", "form:order_id", form("order_id=F-1&x=1;order_id=F-2")},
		{"form field beside one after a ';', same value", "form:order_id", form("order_id=F-1&x=1;order_id=F-1")},
		{"form field repeated, the second empty", "form:order_id", form("order_id=F-1&order_id=")},
		{"form field repeated, the first empty", "form:order_id", form("order_id&order_id=F-1")},
		{"header repeated with another value", "header:X-Order-Id", Request{Method: "POST", Path: "/p", Header: http.Header{"X-Order-Id": {"H-1", "H-2"}}}},
		{"query repeated with another value", "query:order", Request{Method: "POST", Path: "/p", RawQuery: "order=1&order=2"}},
		{"form field empty", "form:order_id", Request{ContentType: "application/x-www-form-urlencoded", Body: []byte("order_id=&x=1")}},
		{"form field without value", "form:order_id", Request{ContentType: "application/x-www-form-urlencoded", Body: []byte("order_id")}},
		{"form body with JSON content type", "form:order_id", Request{ContentType: "application/json", Body: []byte("order_id=1")}},
		{"form source on a JSON body", "form:order_id", Request{Body: []byte(`{"order_id":"1"}`)}},
		{"form source on a JSON body with a byte order mark", "form:order_id", Request{Body: []byte("\xef\xbb\xbf{\"x\":\"a&order_id=1\"}")}},
		{"header absent", "header:X-Id", Request{Header: http.Header{"X-Other": {"1"}}}},
		{"header empty", "header:X-Id", Request{Header: http.Header{"X-Id": {""}}}},
		{"nil header", "header:X-Id", Request{}},
		{"query absent", "query:id", Request{RawQuery: "idx=1"}},
		{"query empty", "query:id", Request{RawQuery: "id="}},
		{"no sources", "", Request{RawQuery: "id=1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var srcs []Source
			if tt.sources != "" {
				srcs = mustSources(t, tt.sources)
			}
			if key, src, ok := Derive(srcs, tt.req); ok || key != "" || src != (Source{}) {
				t.Fatalf("Derive = %q, %v, %v; want nothing", key, src, ok)
			}
			// A source that is there with a value, in some spelling, is
			// unreadable; one that is not there, or has no value, is absent.
			if got, want := Unreadable(srcs, tt.req), !absent[tt.name]; got != want {
				t.Errorf("Unreadable = %v, want %v", got, want)
			}
		})
	}
}

// wide is s in UTF-16 of byte order o, after a byte order mark if bom.
func wide(s string, o binary.AppendByteOrder, bom bool) string {
	var b []byte
	if bom {
		b = o.AppendUint16(b, 0xfeff)
	}
	for _, r := range s {
		b = o.AppendUint16(b, uint16(r))
	}
	return string(b)
}

// absent names the cases of TestDeriveNotPresent whose source is not in the
// request with a value, in any spelling: every other case has one, which
// Derive cannot take as the order's (Unreadable).
var absent = map[string]bool{
	"no body": true, "missing field": true, "nested field missing": true, "path through a non-object": true,
	"path through an array": true, "empty string": true, "null": true, "bool": true, "object": true, "array": true,
	"top-level array": true, "UTF-16LE array": true, "invalid JSON not naming it": true,
	"comment before the object not naming it": true, "comment before an array": true, "form field empty": true, "form field without value": true,
	"form body with JSON content type": true, "form source on a JSON body": true,
	"form source on a JSON body with a byte order mark": true, "header absent": true, "header empty": true,
	"nil header": true, "query absent": true, "query empty": true, "no sources": true,
}

func TestDeriveSameOperation(t *testing.T) {
	srcs := mustSources(t, "json:order_id")
	base := postJSON(`{"order_id":"12345","amount":100}`)
	baseKey, _, _ := Derive(srcs, base)
	same := []Request{
		base,
		postJSON(`{"order_id":12345,"amount":100}`),             // legacy apps quote ids inconsistently
		postJSON(` { "amount" : 999 , "order_id" : "12345" } `), // another body is still the same operation
		{Method: "POST", Path: "/v1/payments", Body: []byte(`{"order_id":"\u0031\u0032345"}`)},
		// A byte order mark, as .NET's UTF-8 writers add: it once hid the
		// id, and every such request was refused 422.
		postJSON("\xef\xbb\xbf{\"order_id\":\"12345\",\"amount\":100}"),
	}
	for i, r := range same {
		if key, _, _ := Derive(srcs, r); key != baseKey {
			t.Errorf("request %d: key %s, want %s", i, key, baseKey)
		}
	}
}

func TestDeriveDifferentOperations(t *testing.T) {
	srcs := mustSources(t, "json:order_id")
	base := postJSON(`{"order_id":"12345"}`)
	baseKey, _, _ := Derive(srcs, base)
	other := map[string]Request{
		"refund of the same order": {Method: "POST", Path: "/v1/refunds", Body: base.Body},
		"other method":             {Method: "PUT", Path: base.Path, Body: base.Body},
		"other order":              postJSON(`{"order_id":"12346"}`),
		"number text differs":      postJSON(`{"order_id":12345.0}`),
		// With plain concatenation, method+path "POST"+"/v1/payments" would equal "POS"+"T/v1/payments".
		"shifted field boundary": {Method: "POS", Path: "T/v1/payments", Body: base.Body},
	}
	for name, r := range other {
		if key, _, _ := Derive(srcs, r); key == baseKey {
			t.Errorf("%s: same key %s as the payment", name, key)
		}
	}
	// The same value in another source is another key.
	q := Request{Method: "POST", Path: "/v1/payments", RawQuery: "order_id=12345"}
	if key, _, _ := Derive(mustSources(t, "query:order_id"), q); key == baseKey {
		t.Errorf("query source gave the JSON source's key")
	}
}

func TestDeriveDeterministic(t *testing.T) {
	srcs := mustSources(t, "json:order_id")
	r := postJSON(paymentBody)
	first, _, ok := Derive(srcs, r)
	if !ok {
		t.Fatal("no key for the payment body")
	}
	for range 100 {
		if key, _, _ := Derive(srcs, r); key != first {
			t.Fatalf("key changed: %s then %s", first, key)
		}
	}
	// Pinned, so that a change of encoding (which would give every operation in
	// flight a new key, i.e. a second charge) cannot go unnoticed.
	const pinned = "c3d6bc0f-c5e2-52ae-9a10-dc04e86e9b67"
	if first != pinned || first != wantKey("POST", "/v1/payments", Source{JSON, "order_id"}, "ORD-2024-000123456") {
		t.Fatalf("key for the payment body = %s; pinned %s", first, pinned)
	}
}

func TestDeriveLongValue(t *testing.T) {
	// A long value still gives a UUID; length prefixes of more than one byte work.
	long := strings.Repeat("x", 100000)
	key, _, ok := Derive(mustSources(t, "header:X-Id"), Request{Header: http.Header{"X-Id": {long}}})
	if !ok || !uuidShape.MatchString(key) {
		t.Fatalf("Derive = %q, %v", key, ok)
	}
	key2, _, _ := Derive(mustSources(t, "header:X-Id"), Request{Header: http.Header{"X-Id": {long + "y"}}})
	if key == key2 {
		t.Fatal("values differing at the end gave one key")
	}
}

func TestDeriveDeepNesting(t *testing.T) {
	deep := func(n int) []byte {
		return []byte(`{"a":` + strings.Repeat(`{"a":`, n-1) + `"x"` + strings.Repeat("}", n))
	}
	path := strings.TrimSuffix(strings.Repeat("a.", 100), ".")
	if _, _, ok := Derive(mustSources(t, "json:"+path), Request{Body: deep(100)}); !ok {
		t.Fatal("no key at depth 100")
	}
	// Deeper than encoding/json accepts: not a value, and no stack exhaustion.
	if _, _, ok := Derive(mustSources(t, "json:a"), Request{Body: deep(maxDepth + 1)}); ok {
		t.Fatal("key from a document nested deeper than maxDepth")
	}
}

func FuzzDeriveJSON(f *testing.F) {
	for _, s := range []string{
		paymentBody, `{"order_id":1}`, `{"order_id":""}`, `{"a":{"b":"c"}}`, `{"order_id":"\ud800"}`,
		`{"order_id":"A","order_id":{}}`, `{`, `{"a":[1,{"order_id":2}]}`, " {\"order_id\" : -0.0e-0 }",
	} {
		f.Add(s)
	}
	srcs := mustSources(f, "json:order_id,json:a.b")
	f.Fuzz(func(t *testing.T, body string) {
		r := Request{Method: "POST", Path: "/p", Body: []byte(body)}
		key, src, ok := Derive(srcs, r)
		if !ok {
			if key != "" {
				t.Fatalf("key %q with ok=false", key)
			}
			return
		}
		if len(key) > MaxLen || !uuidShape.MatchString(key) {
			t.Fatalf("key %q is not a UUIDv5", key)
		}
		if src.Kind != JSON {
			t.Fatalf("source %v", src)
		}
		if again, _, _ := Derive(srcs, r); again != key {
			t.Fatalf("not deterministic: %s then %s", key, again)
		}
		if _, err := CanonicalJSON(nil, r.Body); err != nil {
			t.Fatalf("key derived from a body CanonicalJSON rejects: %v", err)
		}
	})
}

// FuzzDeriveJSONStdlib checks the hand-written lookup against encoding/json:
// a key is derived exactly when encoding/json finds a non-empty string or a
// number at the path, and it is the key of that value.
func FuzzDeriveJSONStdlib(f *testing.F) {
	for _, s := range []string{
		paymentBody, `{"a":{"b":"x"},"a":{}}`, `{"a":{"b":1e5}}`, `{"a":{"b":"\ud800"}}`, `{"a":{"b":""}}`,
		`{"a":{"b":"x","b":null}}`, `{"a\u002e":{"b":"x"}}`, `{"a":[{"b":"x"}]}`,
		`{"a":{"b":"x"},"a":{"b":"y"}}`, `{"a":{"b":"x"},"a":{"b":"x"}}`, `{"a":{"b":1,"b":"1"}}`, `{"a":{"b":"x","b":"y"}}`,
	} {
		f.Add(s)
	}
	src := Source{JSON, "a.b"}
	f.Fuzz(func(t *testing.T, body string) {
		if !utf8.ValidString(body) {
			return // encoding/json accepts invalid UTF-8; Derive, like RFC 8259, does not
		}
		want, wantOK := stdlibLookup(body)
		key, _, ok := Derive([]Source{src}, Request{Method: "POST", Path: "/p", Body: []byte(body)})
		if ok != wantOK {
			t.Fatalf("Derive found=%v, encoding/json found=%v (%q)", ok, wantOK, want)
		}
		if ok && key != wantKey("POST", "/p", src, want) {
			t.Fatalf("key is not the key of %q", want)
		}
	})
}

// stdlibLookup returns a.b of body as encoding/json's decoder reads it, with
// the rules Derive adds: a key of the path that repeats in its object gives
// no value unless every member gives the same one, and a string with a lone
// surrogate escape gives none (encoding/json reads U+FFFD in its place).
func stdlibLookup(body string) (string, bool) {
	if !json.Valid([]byte(body)) {
		return "", false
	}
	d := json.NewDecoder(strings.NewReader(markLoneSurrogates(body)))
	d.UseNumber()
	v, err := decodeMembers(d)
	if err != nil {
		return "", false
	}
	return lookupMembers(v, []string{"a", "b"})
}

// jsonMember is one object member; decodeMembers keeps every member of an
// object, repeated keys included, in order.
type jsonMember struct {
	key string
	val any
}

// loneMark is what markLoneSurrogates puts in place of a lone surrogate
// escape, so that the value encoding/json decodes shows where one was.
const loneMark = "\x00lone\x00"

// markLoneSurrogates replaces each \u escape of a lone surrogate in body, a
// valid JSON document (so every backslash starts an escape), with an escape
// of loneMark; a surrogate pair is left as it is.
func markLoneSurrogates(body string) string {
	surrogate := func(s string, lo, hi rune) bool {
		if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
			return false
		}
		r, err := strconv.ParseUint(s[2:6], 16, 16)
		return err == nil && lo <= rune(r) && rune(r) <= hi
	}
	var b strings.Builder
	for i := 0; i < len(body); i++ {
		switch {
		case body[i] != '\\':
			b.WriteByte(body[i])
		case surrogate(body[i:], 0xd800, 0xdbff) && i+6 <= len(body) && surrogate(body[i+6:], 0xdc00, 0xdfff):
			b.WriteString(body[i : i+12])
			i += 11
		case surrogate(body[i:], 0xd800, 0xdfff):
			b.WriteString(`\u0000lone\u0000`)
			i += 5
		default: // another escape: its two characters as they are
			b.WriteString(body[i : i+2])
			i++
		}
	}
	return b.String()
}

func decodeMembers(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		var obj []jsonMember
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeMembers(d)
			if err != nil {
				return nil, err
			}
			obj = append(obj, jsonMember{k.(string), v})
		}
		_, err := d.Token()
		return obj, err
	case json.Delim('['):
		for d.More() {
			if _, err := decodeMembers(d); err != nil {
				return nil, err
			}
		}
		_, err := d.Token()
		return []any(nil), err
	}
	return tok, nil
}

func lookupMembers(v any, path []string) (string, bool) {
	obj, isObj := v.([]jsonMember)
	if len(path) == 0 {
		switch x := v.(type) {
		case string:
			return x, x != "" && !strings.Contains(x, loneMark)
		case json.Number:
			return string(x), true
		}
		return "", false
	}
	if !isObj {
		return "", false
	}
	var val string
	var found, seen bool
	for _, m := range obj {
		if m.key != path[0] {
			continue
		}
		mv, mf := lookupMembers(m.val, path[1:])
		if seen && (mf != found || mv != val) {
			return "", false
		}
		val, found, seen = mv, mf, true
	}
	return val, found
}

// paymentBody is a realistic ~500-byte payment request.
const paymentBody = `{
  "order_id": "ORD-2024-000123456",
  "amount": {"value": 150000, "currency": "RUB"},
  "description": "Оплата заказа №123456",
  "payment_method": {"type": "bank_card", "card": {"token": "tok_1NxJ2eHk9vQ8aB3cD4eF5gH6", "expiry": "12/27"}},
  "customer": {"id": "cus_884213", "email": "ivan.petrov@example.com", "phone": "+79161234567"},
  "capture": true,
  "metadata": {"cart_id": 998877, "source": "legacy-shop", "campaign": null},
  "return_url": "https://shop.example.com/orders/123456/complete"
}`

func BenchmarkDerive(b *testing.B) {
	srcs := mustSources(b, "json:order_id")
	r := postJSON(paymentBody)
	b.SetBytes(int64(len(r.Body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := Derive(srcs, r); !ok {
			b.Fatal("no key")
		}
	}
}

func ExampleDerive() {
	srcs, err := ParseSources("json:order_id,header:X-Order-Id")
	if err != nil {
		panic(err)
	}
	pay := Request{Method: "POST", Path: "/v1/payments", Body: []byte(`{"order_id": 42, "amount": 100}`)}
	retry := Request{Method: "POST", Path: "/v1/payments", Body: []byte(`{"amount":100,"order_id":"42"}`)}
	refund := Request{Method: "POST", Path: "/v1/refunds", Body: []byte(`{"order_id": 42}`)}
	k1, src, _ := Derive(srcs, pay)
	k2, _, _ := Derive(srcs, retry)
	k3, _, _ := Derive(srcs, refund)
	fmt.Println(src, k1 == k2, k1 == k3)
	// Output: json:order_id true false
}

func TestDeriveTenantSeparatesKeys(t *testing.T) {
	srcs, _ := ParseSources("json:order_id")
	r := Request{Method: "POST", Path: "/payments", Body: []byte(`{"order_id":"1"}`)}
	none, _, _ := Derive(srcs, r)
	r.Tenant = "app-a"
	a, _, _ := Derive(srcs, r)
	r.Tenant = "app-b"
	b, _, ok := Derive(srcs, r)
	if !ok || a == b || a == none || b == none {
		t.Fatalf("keys none=%s a=%s b=%s: want three different keys", none, a, b)
	}
	if again, _, _ := Derive(srcs, r); again != b {
		t.Fatalf("tenant key not deterministic: %s vs %s", again, b)
	}
}

// TestNameUUIDIsNewSHA1: the stack-hashed UUIDv5 is uuid.NewSHA1's, for names
// of every length around the hash's block size.
func TestNameUUIDIsNewSHA1(t *testing.T) {
	for n := range 200 {
		name := []byte(strings.Repeat("k", n))
		want := uuid.NewSHA1(namespace, name).String()
		if got := nameUUID(append(namespace[:], name...)); got != want {
			t.Fatalf("name of %d bytes: %s, want %s", n, got, want)
		}
	}
	r := postJSON(`{"order_id":"A-1"}`)
	src := mustSources(t, "json:order_id")
	Derive(src, r) // the state pool warmed
	if n := testing.AllocsPerRun(100, func() { Derive(src, r) }); n > 1 && !raceEnabled {
		t.Errorf("Derive: %v allocations, want 1 (the key)", n)
	}
}

// A string with a \u escape of a lone surrogate has no one value: Go's
// encoding/json reads U+FFFD in its place, so "s\ud800", "s\udbff" and
// "s\ufffd" are one order to a Go provider and three to one in JavaScript,
// Python or Java. Before, Derive read each as "s\ufffd": three orders of
// such a provider shared one key, and all but the first were refused 409
// idempotency_conflict. Now none gives a key, and each is Unreadable (422
// under every IDEMPROXY_MISSING_KEY); a surrogate pair and U+FFFD itself
// still give theirs.
func TestLoneSurrogateGivesNoKey(t *testing.T) {
	srcs := mustSources(t, "json:order_id,json:p.order_id")
	for _, body := range []string{
		`{"order_id":"s\ud800"}`, `{"order_id":"s\udbff"}`, `{"order_id":"s\uDFFF"}`, `{"order_id":"s\ud83dx"}`,
		`{"order_id":"\ud83d"}`, `{"order_id":"\ud83d\u0041"}`, `{"order_id":"\ude00\ud83d"}`,
		`{"order_id":"\ufffd","order_id":"\ud800"}`, `{"order_id":"\ud800","order_id":"\ud800"}`,
		`{"p":{"order_id":"s\ud800"}}`, `{"p":{"order_id":"s\ud800"},"p":{"order_id":"s\ud800"}}`,
		"\xef\xbb\xbf{\"order_id\":\"s\\ud800\"}",
	} {
		wantUnreadable(t, body, srcs, postJSON(body))
	}
	for body, same := range map[string]string{
		`{"order_id":"s\ud83d\ude00"}`: `{"order_id":"s😀"}`,
		`{"order_id":"s\ufffd"}`:       `{"order_id":"s` + "\ufffd" + `"}`,
		`{"order_id":"s\u0041"}`:       `{"order_id":"sA"}`,
	} {
		k1, _, ok1 := Derive(srcs, postJSON(body))
		k2, _, ok2 := Derive(srcs, postJSON(same))
		if !ok1 || !ok2 || k1 != k2 {
			t.Errorf("%s: key %q (%v), %s: %q (%v): want one key", body, k1, ok1, same, k2, ok2)
		}
	}
}
