package idemkey

import (
	"bytes"
	"compress/gzip"
	"testing"
)

// parseBodies are bodies whose canonical form or key source values could
// come out otherwise from one pass than from the two of Fingerprint and
// Derive: nesting, repeated members (same value, other value, other letter
// case, at every level), escapes in keys and values, lone surrogates,
// numbers, non-object documents, a byte order mark, invalid JSON, forms.
var parseBodies = []string{
	paymentBody,
	`{"order_id":"o-1","amount":1000}`,
	`{"order_id":1e3,"b":1.0}`, `{"order_id":-0.0e-0}`, `{"order_id":1000}`, `{"order_id":"1000"}`,
	`{"order_id":""}`, `{"order_id":null}`, `{"order_id":true}`, `{"order_id":[1]}`, `{"order_id":{}}`,
	`{"order_id":"caf\u00e9\ud83d\ude00"}`, `{"order_id":"\ud800"}`, `{"order_id":"\ud800\u0041"}`, `{"order_id":"a\"b\\c\/d"}`,
	`{"order\u005fid":"esc"}`, `{"ORDER_ID":"x"}`, `{"order_id":"a","ORDER_ID":"a"}`, `{"order_id":"a","ORDER_ID":"b"}`,
	`{"order_id":"a","order_id":"a"}`, `{"order_id":"a","order_id":"b"}`, `{"order_id":1,"order_id":"1"}`,
	`{"order_id":"a","order_id":""}`, `{"order_id":"","order_id":""}`, `{"order_id":"x","order_id":{}}`,
	`{"order_id":"\ufffd","order_id":"\ud800"}`,
	`{"a":{"b":"x"}}`, `{"a":{"b":"x"},"a":{"b":"x"}}`, `{"a":{"b":"x"},"a":{"b":"y"}}`, `{"a":{"b":"x"},"a":{}}`,
	`{"a":{"b":"x"},"A":{"b":"x"}}`, `{"A":{"b":"x"}}`, `{"a":{"B":"x"}}`, `{"a":"x","a":{"b":"x"}}`,
	`{"a":{"b":"x","b":null}}`, `{"a":[{"b":"x"}]}`, `{"a":{"b":{"c":"deep"}},"a":{"b":{"c":"deep"}}}`,
	`{"a":{"b":{"c":"deep"},"B":{"c":"deep"}}}`, `{"a":{"b":{"c":1}},"z":[{"a":{"b":2}}]}`,
	`{"z":1,"a":{"y":2,"b":"sorted","c":{"b":3}},"order_id":"late"}`,
	" \t\n{ \"order_id\" : \"ws\" , \"a\" : { \"b\" : 7 } }\r\n",
	"\xef\xbb\xbf{\"order_id\":\"bom\"}", "\xef\xbb\xbf [1]",
	`[{"order_id":"x"}]`, `"order_id"`, `12`, ``, `{`, `{"order_id":"x",}`, `{"order_id":"x"} x`,
	`{"order_id":"x","a":{"b":"y"}`, "{\"order_id\":\"\xff\"}", `{"order_id":"x","b":"\u12"}`,
	`order_id=f-1&a=1`, `a=1&order_id=f&order_id=f`,
}

var parseSourceLists = []string{
	"json:order_id",
	"json:a.b",
	"json:order_id,json:a.b",
	"json:a.b,json:order_id,json:a.b.c,json:a",
	"json:a.b.c,json:a.B.c",
	"header:X-Order-Id,json:order_id,form:order_id,query:order_id",
	"form:order_id,json:order_id",
	"json:x,json:y,json:z,json:w,json:order_id", // a fifth JSON source is looked up apart
}

// checkParse fails unless Parse gives r the fingerprint Fingerprint gives it
// and its Derive the key, source and presence Derive gives, also for the
// request on another path, tenant and generation (the key's other inputs).
func checkParse(t *testing.T, sources []Source, r Request) {
	t.Helper()
	p := Parse(sources, r)
	if want := Fingerprint(r); p.Fingerprint != want {
		t.Fatalf("%q (%s): Parse's fingerprint %x, Fingerprint's %x", r.Body, r.ContentType, p.Fingerprint, want)
	}
	for _, v := range []Request{r, {Method: "PUT", Path: "/q", RawQuery: r.RawQuery, ContentType: r.ContentType, Header: r.Header, Body: r.Body, Tenant: "t", Generation: 3}} {
		key, src, ok := p.Derive(v)
		wantKey, wantSrc, wantOK := Derive(sources, v)
		if key != wantKey || src != wantSrc || ok != wantOK {
			t.Fatalf("%q (%s) under %v: Parsed.Derive %q from %v (%v), Derive %q from %v (%v)",
				r.Body, r.ContentType, sources, key, src, ok, wantKey, wantSrc, wantOK)
		}
	}
}

// One pass over the body (Parse) gives the fingerprint and keys two passes
// (Fingerprint, Derive) give, for every body, content type and list of
// sources: records stored before are found and matched after.
func TestParseIsFingerprintAndDerive(t *testing.T) {
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write([]byte(`{"order_id":"gz"}`))
	w.Close()
	bodies := append(parseBodies, gz.String())
	for _, list := range parseSourceLists {
		sources := mustSources(t, list)
		for _, body := range bodies {
			for _, ct := range []string{"application/json", "", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b"} {
				checkParse(t, sources, Request{Method: "POST", Path: "/p", RawQuery: "order_id=q&b=2", ContentType: ct,
					Header: map[string][]string{"X-Order-Id": {"h"}}, Body: []byte(body)})
				checkParse(t, sources, Request{Method: "POST", Path: "/p", ContentType: ct, Body: []byte(body)})
			}
		}
	}
	fd := formData(t, "b", "order_id", "MP-1", "amount", "1.00")
	checkParse(t, mustSources(t, "json:order_id,form:order_id"), fd)
	checkParse(t, nil, fd)
}

// A value looked up in the pass is the body's own bytes (or a decoded
// copy): the pooled parser keeps none of it once Parse returns.
func TestParseValuesOutliveThePool(t *testing.T) {
	sources := mustSources(t, "json:order_id")
	r := Request{Method: "POST", Path: "/p", Body: []byte(`{"order_id":"keep-me"}`)}
	p := Parse(sources, r)
	for range 10 { // the pooled state is reused for other bodies
		Parse(sources, Request{Method: "POST", Path: "/p", Body: []byte(`{"order_id":"other-one","x":{"order_id":"y"}}`)})
	}
	if key, _, _ := p.Derive(r); key != wantKey("POST", "/p", sources[0], "keep-me") {
		t.Fatalf("key %s is not keep-me's", key)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range parseBodies {
		f.Add(s, uint8(0))
	}
	lists := make([][]Source, len(parseSourceLists))
	for i, l := range parseSourceLists {
		lists[i] = mustSources(f, l)
	}
	f.Fuzz(func(t *testing.T, body string, which uint8) {
		sources := lists[int(which)%len(lists)]
		for _, ct := range []string{"application/json", "", "application/x-www-form-urlencoded"} {
			checkParse(t, sources, Request{Method: "POST", Path: "/p", ContentType: ct, Body: []byte(body)})
		}
	})
}

// BenchmarkKeyAndFingerprint is what a protected request's key and
// fingerprint cost: two passes over the body (Fingerprint, then Derive) or
// one (Parse, then Parsed.Derive).
func BenchmarkKeyAndFingerprint(b *testing.B) {
	srcs := mustSources(b, "json:order_id")
	r := postJSON(paymentBody)
	b.Run("two-passes", func(b *testing.B) {
		b.SetBytes(int64(len(r.Body)))
		b.ReportAllocs()
		for b.Loop() {
			Fingerprint(r)
			if _, _, ok := Derive(srcs, r); !ok {
				b.Fatal("no key")
			}
		}
	})
	b.Run("one-pass", func(b *testing.B) {
		b.SetBytes(int64(len(r.Body)))
		b.ReportAllocs()
		for b.Loop() {
			p := Parse(srcs, r)
			if _, _, ok := p.Derive(r); !ok {
				b.Fatal("no key")
			}
		}
	})
}
