package idemkey

import "testing"

// A legacy PHP app sends JSON in windows-1251 and says so in its
// Content-Type; the customer's name is Cyrillic, the order id ASCII. The
// order id reads the same to every parser, so it gives the key the same
// body in UTF-8 gives, and the fingerprint is the one of the bytes as they
// came (a retry of the same bytes is replayed).
func TestSingleByteCharsetBodyGivesTheKey(t *testing.T) {
	srcs := mustSources(t, "json:order_id,json:p.order_id")
	cp1251 := func(body string) Request {
		r := postJSON(body)
		r.ContentType = "application/json; charset=windows-1251"
		return r
	}
	for _, tc := range []struct{ body, same string }{
		{"{\"name\":\"\xc8\xe2\xe0\xed\",\"order_id\":\"A-1\"}", `{"order_id":"A-1"}`},
		{"{\"order_id\":\"A-1\",\"name\":\"\xc8\xe2\xe0\xed\"}", `{"order_id":"A-1"}`},
		{"{\"p\":{\"name\":\"\xc8\",\"order_id\":\"A-\\u0032\"},\"n\":[\"\xff\"]}", `{"p":{"order_id":"A-2"}}`},
		{"{\"order_id\":\"A-3\",\"order_id\":\"A-3\",\"name\":\"\xc8\"}", `{"order_id":"A-3"}`},
	} {
		r := cp1251(tc.body)
		want, _, ok := Derive(srcs, postJSON(tc.same))
		if !ok {
			t.Fatalf("%q: no key", tc.same)
		}
		if key, _, ok := Derive(srcs, r); !ok || key != want {
			t.Errorf("%q: Derive gave %q (%v), want %q", tc.body, key, ok, want)
		}
		p := Parse(srcs, r)
		if key, _, ok := p.Derive(r); !ok || key != want {
			t.Errorf("%q: Parsed.Derive gave %q (%v), want %q", tc.body, key, ok, want)
		}
		if p.Fingerprint != Fingerprint(r) {
			t.Errorf("%q: Parse and Fingerprint differ", tc.body)
		}
		raw := r
		raw.ContentType = "application/json"
		if Fingerprint(r) != Fingerprint(raw) {
			t.Errorf("%q: fingerprint changed by the charset: want the bytes as they came", tc.body)
		}
	}
}

// What stays refused: an order id with a byte that is not UTF-8 (a Go
// provider ignoring the charset reads U+FFFD for it, so "И-1" and "Ж-1"
// would be one order), a member repeated with such a value, and a
// non-UTF-8 body that declares no single-byte charset (Shift_JIS's second
// bytes may be a backslash to a parser reading bytes).
func TestSingleByteCharsetStillRefused(t *testing.T) {
	srcs := mustSources(t, "json:order_id")
	for _, tc := range []struct{ contentType, body string }{
		{"application/json; charset=windows-1251", "{\"order_id\":\"\xc8-1\"}"},
		{"application/json; charset=windows-1251", "{\"order_id\":\"\\u0041\xc8\"}"},
		{"application/json; charset=koi8-r", "{\"order_id\":\"A-1\",\"order_id\":\"A-1\xc8\"}"},
		{"application/json; charset=windows-1251", "{\"order_id\":\"A-1\",\"ORDER_ID\":\"A-2\",\"n\":\"\xc8\"}"},
		{"application/json", "{\"order_id\":\"A-1\",\"name\":\"\xc8\"}"},
		{"application/json; charset=shift_jis", "{\"order_id\":\"A-1\",\"name\":\"\x81\x5c\"}"},
	} {
		r := postJSON(tc.body)
		r.ContentType = tc.contentType
		wantUnreadable(t, tc.contentType+" "+tc.body, srcs, r)
	}
}

func TestSingleByteCharset(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json; charset=windows-1251":              true,
		"application/json;charset=\"CP1251\"":                 true,
		"application/json; q=1; Charset=KOI8-R":               true,
		"application/json; charset=iso-8859-5":                true,
		"application/json; charset=utf-8":                     false,
		"application/json; charset=shift_jis":                 false,
		"application/json":                                    false,
		"application/json; charset=windows-1251-ish":          false,
		"application/json; charset=iso-8859-12":               false,
		"application/json; charset=iso-8859-16":               true,
		"application/json; charset=cp1251; charset=shift_jis": false,
		"application/json; charset=cp1251; charset=koi8-r":    true,
	} {
		if got := singleByteCharset(ct); got != want {
			t.Errorf("singleByteCharset(%q) = %v, want %v", ct, got, want)
		}
	}
}
