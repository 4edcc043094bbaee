package idemkey

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCanonicalJSON(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n\t\"b\" : [ 1 , 2 ] ,\r\n \"a\" : { \"y\" : null , \"x\" : true } } ", `{"a":{"x":true,"y":null},"b":[1,2]}`},
		{`[3,1,2]`, `[3,1,2]`},
		{`{}`, `{}`},
		{`[]`, `[]`},
		{`{ }`, `{}`},
		{`[ ]`, `[]`},
		{`"s"`, `"s"`},
		{`-0`, `-0`},
		{`1.0`, `1.0`},
		{`1E+05`, `1E+05`},
		{`false`, `false`},
		{`{"a":2,"b":0,"a":1}`, `{"a":2,"a":1,"b":0}`}, // duplicates keep their order, so the last still wins
		{`{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`},
		{`{"é":1,"z":2}`, `{"z":2,"é":1}`},
		{`"\u0041\/\"\\"`, `"A/\"\\"`},
		{`"\u00e9\u00E9é"`, `"ééé"`},
		{`"\b\f\n\r\t\u0008\u000C\u000a\u000D\u0009"`, `"\b\f\n\r\t\b\f\n\r\t"`},
		{`"\u0000\u001F\u007f"`, "\"\\u0000\\u001f\x7f\""},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\uD83D\uDE00"`, `"😀"`},
		{`"\ud800"`, `"\ud800"`},
		{`"\uDC00x"`, `"\udc00x"`},
		{`"\ud800\u0041"`, `"\ud800A"`},
		{`"\ud800\ud800\udc00"`, `"\ud800𐀀"`},
		{"\"\u2028<>&\"", "\"\u2028<>&\""},
		{`{"b":{"d":1,"c":2},"a":[{"f":1,"e":2}]}`, `{"a":[{"e":2,"f":1}],"b":{"c":2,"d":1}}`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := CanonicalJSON([]byte("prefix:"), []byte(tt.in))
			if err != nil {
				t.Fatalf("CanonicalJSON(%s): %v", tt.in, err)
			}
			if string(got) != "prefix:"+tt.want {
				t.Fatalf("CanonicalJSON(%s) = %s, want %s", tt.in, got, tt.want)
			}
			checkJSONEqual(t, []byte(tt.in), got[len("prefix:"):])
		})
	}
}

func TestCanonicalJSONInvalid(t *testing.T) {
	tests := []string{
		"", " ", "{", "}", `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`, `{a:1}`, `{"a" 1}`, `{"a":1 "b":2}`,
		`[1,]`, `[,1]`, `[1 2]`, `01`, `-01`, `1.`, `.5`, `+1`, `-`, `1e`, `1e+`, `0x1`, `NaN`, `Infinity`,
		"\"a\x01\"", "\"\xff\"", "\"\xed\xa0\x80\"", `"\x"`, `"\u12"`, `"\u12G4"`, `"abc`, `"abc\`,
		`tru`, `nul`, `falsey`, `{} {}`, `1 2`, "\ufeff{}", "'a'",
		strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1),
	}
	for _, in := range tests {
		t.Run(in, func(t *testing.T) {
			dst := []byte("keep")
			got, err := CanonicalJSON(dst, []byte(in))
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("CanonicalJSON(%q) = %q, %v; want ErrInvalidJSON", in, got, err)
			}
			if string(got) != "keep" {
				t.Fatalf("dst changed to %q on error", got)
			}
		})
	}
}

func TestCanonicalJSONMaxDepth(t *testing.T) {
	// encoding/json accepts exactly maxDepth levels; so does CanonicalJSON.
	doc := strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth)
	if !json.Valid([]byte(doc)) {
		t.Fatal("encoding/json rejects maxDepth levels; maxDepth is out of date")
	}
	got, err := CanonicalJSON(nil, []byte(doc))
	if err != nil || string(got) != doc {
		t.Fatalf("CanonicalJSON at maxDepth: %v", err)
	}
}

// checkJSONEqual fails unless a and b decode (numbers as their text) to the same value.
func checkJSONEqual(t *testing.T, a, b []byte) {
	t.Helper()
	va, errA := decodeJSON(a)
	vb, errB := decodeJSON(b)
	if errA != nil || errB != nil {
		t.Fatalf("decode: %v, %v", errA, errB)
	}
	if !reflect.DeepEqual(va, vb) {
		t.Fatalf("%s and %s decode differently: %#v vs %#v", a, b, va, vb)
	}
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		paymentBody, `{"b":1,"a":2}`, `[1,"x",null,true,false,{"":[]}]`, `"\ud800\udc00\ud800"`,
		`{"a":2,"b":0,"a":1}`, `-1.5e-7`, `{"\u0000":1,"\\":2,"\"":3}`, `"\u00e9é"`, `{`, "\"\xff\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := CanonicalJSON(nil, in)
		if err != nil {
			if json.Valid(in) && utf8.Valid(in) {
				t.Fatalf("CanonicalJSON rejects valid JSON %q: %v", in, err)
			}
			if got != nil {
				t.Fatalf("CanonicalJSON(nil, %q) returned %q with an error", in, got)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("CanonicalJSON accepts %q, which encoding/json rejects", in)
		}
		if !json.Valid(got) || !utf8.Valid(got) {
			t.Fatalf("canonical form %q of %q is not valid JSON", got, in)
		}
		again, err := CanonicalJSON(nil, got)
		if err != nil || !bytes.Equal(again, got) {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", in, got, again, err)
		}
		checkJSONEqual(t, in, got)
		if fp := Fingerprint(Request{ContentType: "application/json", Body: in}); fp != Fingerprint(Request{ContentType: "application/json", Body: got}) {
			t.Fatalf("fingerprints of %q and its canonical form differ", in)
		}
	})
}

func TestFingerprintSame(t *testing.T) {
	req := func(ct, query, body string) Request {
		return Request{Method: "POST", Path: "/v1/payments", RawQuery: query, ContentType: ct, Body: []byte(body)}
	}
	const js, form = "application/json", "application/x-www-form-urlencoded"
	tests := []struct {
		name string
		a, b Request
	}{
		{"json key order and whitespace", req(js, "", `{"a":1,"b":{"c":[1,2],"d":"x"}}`), req(js, "", " {\n \"b\": {\"d\": \"x\", \"c\": [1, 2]},\n \"a\": 1\n}\n")},
		{"json string escapes", req(js, "", `{"s":"é/A"}`), req(js, "", `{"s":"\u00e9\/\u0041"}`)},
		{"json without content type", req(js, "", `{"a":1}`), req("", "", `{"a":1}`)},
		{"json with charset", req(js, "", `[1]`), req("application/json; charset=utf-8", "", `[1]`)},
		{"json with +json type", req(js, "", `"x"`), req("application/vnd.api+json", "", ` "x" `)},
		{"form field order", req(form, "", "a=1&b=2&c=3"), req(form+"; charset=utf-8", "", "c=3&a=1&b=2")},
		{"form encoding", req(form, "", "a=x+y&b=%41"), req(form, "", "b=A&a=x%20y")},
		{"form empty segments", req(form, "", "a=1&&b=2&"), req(form, "", "b=2&a=1")},
		{"query order", req("", "a=1&b=2", ""), req("", "b=2&a=1", "")},
		{"query encoding", req("", "a=%41&b=x+y", ""), req("", "b=x%20y&a=A", "")},
		{"empty query", req("", "", ""), req("", "&", "")},
		{"nil and empty body", Request{Method: "POST", Path: "/p"}, Request{Method: "POST", Path: "/p", Body: []byte{}}},
		{"identical invalid json", req(js, "", `{"a":1,}`), req(js, "", `{"a":1,}`)},
		{"identical raw body", req("text/plain", "", "hello"), req("text/plain", "", "hello")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if Fingerprint(tt.a) != Fingerprint(tt.b) {
				t.Fatalf("fingerprints differ:\n%+v\n%+v", tt.a, tt.b)
			}
		})
	}
}

func TestFingerprintDifferent(t *testing.T) {
	req := func(method, path, query, ct, body string) Request {
		return Request{Method: method, Path: path, RawQuery: query, ContentType: ct, Body: []byte(body)}
	}
	const js, form = "application/json", "application/x-www-form-urlencoded"
	base := req("POST", "/v1/payments", "", js, `{"order_id":"1","amount":100}`)
	tests := []struct {
		name string
		a, b Request
	}{
		{"amount", base, req("POST", "/v1/payments", "", js, `{"order_id":"1","amount":101}`)},
		{"number vs string", base, req("POST", "/v1/payments", "", js, `{"order_id":1,"amount":100}`)},
		{"number text", base, req("POST", "/v1/payments", "", js, `{"order_id":"1","amount":100.0}`)},
		{"extra member", base, req("POST", "/v1/payments", "", js, `{"order_id":"1","amount":100,"x":null}`)},
		{"array order", req("POST", "/p", "", js, `[1,2]`), req("POST", "/p", "", js, `[2,1]`)},
		{"duplicate order", req("POST", "/p", "", js, `{"a":1,"a":2}`), req("POST", "/p", "", js, `{"a":2,"a":1}`)},
		{"lone surrogate vs U+FFFD", req("POST", "/p", "", js, `"\ud800"`), req("POST", "/p", "", js, `"\ufffd"`)},
		{"method", base, req("PUT", "/v1/payments", "", js, `{"order_id":"1","amount":100}`)},
		{"path", base, req("POST", "/v1/refunds", "", js, `{"order_id":"1","amount":100}`)},
		{"query", base, req("POST", "/v1/payments", "x=1", js, `{"order_id":"1","amount":100}`)},
		{"method/path boundary", req("POST", "/p", "", "", ""), req("POS", "T/p", "", "", "")},
		{"query value", req("POST", "/p", "a=1", "", ""), req("POST", "/p", "a=2", "", "")},
		{"query repeated order", req("POST", "/p", "a=1&a=2", "", ""), req("POST", "/p", "a=2&a=1", "", "")},
		{"query key/value boundary", req("POST", "/p", "ab=c", "", ""), req("POST", "/p", "a=bc", "", "")},
		{"invalid query", req("POST", "/p", "a=%zz", "", ""), req("POST", "/p", "a=%ZZ", "", "")},
		{"form value", req("POST", "/p", "", form, "a=1&b=2"), req("POST", "/p", "", form, "a=1&b=3")},
		{"form repeated order", req("POST", "/p", "", form, "a=1&a=2"), req("POST", "/p", "", form, "a=2&a=1")},
		{"form fields in query", req("POST", "/p", "a=1", form, ""), req("POST", "/p", "", form, "a=1")},
		{"invalid json raw bytes", req("POST", "/p", "", js, `{"a":1,}`), req("POST", "/p", "", js, `{ "a":1,}`)},
		{"invalid json vs its fix", req("POST", "/p", "", js, `{"a":1,}`), req("POST", "/p", "", js, `{"a":1}`)},
		{"raw body", req("POST", "/p", "", "text/plain", "a b"), req("POST", "/p", "", "text/plain", "a  b")},
		{"form without content type is raw", req("POST", "/p", "", "", "a=1&b=2"), req("POST", "/p", "", "", "b=2&a=1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if Fingerprint(tt.a) == Fingerprint(tt.b) {
				t.Fatalf("same fingerprint for\n%+v\n%+v", tt.a, tt.b)
			}
		})
	}
}

func TestFingerprintPinned(t *testing.T) {
	// Stored records compare fingerprints across restarts and upgrades; a changed
	// encoding would turn every legitimate retry in flight into a 409 conflict.
	r := Request{Method: "POST", Path: "/v1/payments", RawQuery: "b=2&a=1", ContentType: "application/json", Body: []byte(paymentBody)}
	const pinned = "a759149b15478697f60c6b0ca4bd801e86f1e7ee4ee0da75cdf462b659d20bff"
	if got := Fingerprint(r); hex.EncodeToString(got[:]) != pinned {
		t.Fatalf("Fingerprint = %x; pinned %s", got, pinned)
	}
}

func TestFingerprintConcurrent(t *testing.T) {
	// The pooled scratch space must not leak between goroutines (run with -race).
	bodies := []string{`{"a":1}`, `{"b":[1,2,3]}`, paymentBody, `{"c":"x"}`}
	want := make([][32]byte, len(bodies))
	for i, b := range bodies {
		want[i] = Fingerprint(postJSON(b))
	}
	done := make(chan error)
	for g := range 4 {
		go func() {
			var err error
			for i := range 200 {
				j := (g + i) % len(bodies)
				if Fingerprint(postJSON(bodies[j])) != want[j] {
					err = errors.New("fingerprint changed under concurrency")
				}
			}
			done <- err
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func BenchmarkFingerprint(b *testing.B) {
	r := postJSON(paymentBody)
	b.SetBytes(int64(len(r.Body)))
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint(r)
	}
}

func BenchmarkCanonicalJSON(b *testing.B) {
	body := []byte(paymentBody)
	var dst []byte
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = CanonicalJSON(dst[:0], body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFingerprintStdlib is the obvious alternative, for comparison:
// decode into map[string]any, re-encode (encoding/json sorts map keys), hash.
func BenchmarkFingerprintStdlib(b *testing.B) {
	body := []byte(paymentBody)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			b.Fatal(err)
		}
		out, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		_ = sha256.Sum256(out)
	}
}

// nestedBody is a JSON body of n objects nested in one another, each with
// its keys out of order, padded to about size bytes: the shape that made
// canonicalisation quadratic (every level copied its whole subtree).
func nestedBody(n, size int) []byte {
	pad := strings.Repeat("p", max(size/n-40, 1))
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"z":"%s","a":%d,"m":`, pad, i)
	}
	b.WriteString("null")
	b.WriteString(strings.Repeat("}", n))
	return []byte(b.String())
}

// flatBody is a JSON object of the same size as nestedBody(n, size), with
// its n members out of order but no nesting.
func flatBody(n, size int) []byte {
	pad := strings.Repeat("p", max(size/n-20, 1))
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%07d":"%s"`, n-i, pad)
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// Nested and flat bodies of equal size canonicalise to what encoding/json's
// sorted re-encoding gives, deep nesting included.
func TestCanonicalJSONNestedMatchesStdlib(t *testing.T) {
	for _, body := range [][]byte{nestedBody(300, 30_000), flatBody(300, 30_000),
		[]byte(`{"b":{"d":[{"y":1,"x":2},{"b":{"z":0,"a":1}}],"c":3},"a":[{"k":{"j":1,"i":2}}]}`)} {
		got, err := CanonicalJSON(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(v) // sorts map keys; no escapes differ in these bodies
		if !bytes.Equal(got, want) {
			t.Errorf("canonical form of %.60s...:\n got %.200s\nwant %.200s", body, got, want)
		}
	}
}

// BenchmarkFingerprintShape compares a 0.9 MB body of 9,000 nested objects
// with out-of-order keys against a flat body of the same size: linear
// canonicalisation keeps them within a small factor (BENCHMARKS.md).
func BenchmarkFingerprintShape(b *testing.B) {
	const n, size = 9000, 900_000
	for _, c := range []struct {
		name string
		body []byte
	}{{"flat", flatBody(n, size)}, {"nested", nestedBody(n, size)}} {
		b.Run(c.name, func(b *testing.B) {
			r := Request{Method: "POST", Path: "/v1/payments", ContentType: "application/json", Body: c.body}
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				Fingerprint(r)
			}
		})
	}
}
