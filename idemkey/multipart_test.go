package idemkey

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/textproto"
	"testing"
)

// formData is a POST /payouts whose multipart/form-data body has the fields
// of kv (name, value, name, value…) under boundary; a name starting with
// '@' is a file part of that name.
func formData(t *testing.T, boundary string, kv ...string) Request {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	if err := w.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		var err error
		if name, ok := cutAt(kv[i]); ok {
			var fw io.Writer
			if fw, err = w.CreateFormFile(name, "id.txt"); err == nil {
				_, err = fw.Write([]byte(kv[i+1]))
			}
		} else {
			err = w.WriteField(kv[i], kv[i+1])
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	return Request{Method: "POST", Path: "/payouts", ContentType: w.FormDataContentType(), Body: b.Bytes()}
}

func cutAt(s string) (string, bool) {
	if len(s) > 0 && s[0] == '@' {
		return s[1:], true
	}
	return "", false
}

// A multipart/form-data order (curl -F, PHP's curl with an array of fields)
// has the form source's key, the same as the order sent urlencoded, and one
// fingerprint whatever boundary the client drew. Before, its order_id could
// not be read (422, or a random key under IDEMPROXY_MISSING_KEY=generate),
// and since curl draws a new boundary for every request, a retry with the
// app's own key was 409 idempotency_conflict instead of its answer.
func TestFormDataOrder(t *testing.T) {
	srcs := mustSources(t, "json:order_id,form:order_id")
	formSrc := Source{Form, "order_id"}
	a := formData(t, "------------------------a1b2c3", "order_id", "MP-1", "amount", "1.00")
	b := formData(t, "------------------------d4e5f6", "order_id", "MP-1", "amount", "1.00")
	want := wantKey("POST", "/payouts", formSrc, "MP-1")
	for _, r := range []Request{a, b, form("order_id=MP-1&amount=1.00")} {
		if key, src, ok := Derive(srcs, r); !ok || src != formSrc || key != want {
			t.Errorf("%s %q: key %q from %v (%v), want %q from the form source", r.ContentType, r.Body, key, src, ok, want)
		}
	}
	if Fingerprint(a) != Fingerprint(b) {
		t.Error("one form under two boundaries: two fingerprints")
	}
	for name, other := range map[string]Request{
		"another amount":   formData(t, "x", "order_id", "MP-1", "amount", "2.00"),
		"fields reordered": formData(t, "x", "amount", "1.00", "order_id", "MP-1"),
		"a field more":     formData(t, "x", "order_id", "MP-1", "amount", "1.00", "note", ""),
		"a file":           formData(t, "x", "order_id", "MP-1", "@amount", "1.00"),
		"urlencoded":       form("order_id=MP-1&amount=1.00"),
	} {
		if Fingerprint(other) == Fingerprint(a) {
			t.Errorf("%s: the same fingerprint as the order", name)
		}
	}
	// No value, as for an urlencoded form: repeated with another value (in
	// any letter case), only in another case, only as a file, empty, with
	// a transfer encoding, or a body that does not parse.
	qp := formData(t, "qp", "order_id", "MP=2D1")
	qp.Body = bytes.Replace(qp.Body, []byte("name=\"order_id\"\r\n"), []byte("name=\"order_id\"\r\nContent-Transfer-Encoding: quoted-printable\r\n"), 1)
	cut := formData(t, "cut", "order_id", "MP-1")
	cut.Body = cut.Body[:len(cut.Body)-8]
	for name, r := range map[string]Request{
		"repeated":           formData(t, "x", "order_id", "MP-1", "order_id", "MP-2"),
		"repeated, ORDER_ID": formData(t, "x", "order_id", "MP-1", "ORDER_ID", "MP-2"),
		"only ORDER_ID":      formData(t, "x", "ORDER_ID", "MP-1"),
		"repeated, order.id": formData(t, "x", "order_id", "MP-1", "order.id", "MP-2"), // PHP's order_id
		"only order id":      formData(t, "x", "order id", "MP-1"),
		"a file":             formData(t, "x", "@order_id", "MP-1"),
		"empty":              formData(t, "x", "order_id", ""),
		"quoted-printable":   qp,
		"no closing line":    cut,
	} {
		if key, _, ok := Derive(srcs, r); ok {
			t.Errorf("%s: key %q, want none", name, key)
		}
	}
	if key, _, ok := Derive(srcs, formData(t, "x", "order_id", "MP-1", "order_id", "MP-1")); !ok || key != want {
		t.Errorf("repeated identically: key %q (%v), want %q", key, ok, want)
	}
	// A part's header fields are compared as a set, not as written.
	h1 := textproto.MIMEHeader{"Content-Disposition": {`form-data; name="order_id"`}, "Content-Type": {"text/plain"}}
	var p1, p2 bytes.Buffer
	for _, c := range []struct {
		buf   *bytes.Buffer
		order []string
	}{{&p1, []string{"Content-Disposition", "Content-Type"}}, {&p2, []string{"Content-Type", "Content-Disposition"}}} {
		c.buf.WriteString("--x\r\n")
		for _, k := range c.order {
			c.buf.WriteString(k + ": " + h1.Get(k) + "\r\n")
		}
		c.buf.WriteString("\r\nMP-1\r\n--x--\r\n")
	}
	r1 := Request{Method: "POST", Path: "/payouts", ContentType: "multipart/form-data; boundary=x", Body: p1.Bytes()}
	r2 := r1
	r2.Body = p2.Bytes()
	if Fingerprint(r1) != Fingerprint(r2) {
		t.Error("a part's header fields in another order: two fingerprints")
	}
}

// rawFormData is a POST /payouts whose multipart/form-data body has one part
// per pair of parts: its Content-Disposition as written, and its bytes.
func rawFormData(parts ...string) Request {
	var b bytes.Buffer
	for i := 0; i+1 < len(parts); i += 2 {
		b.WriteString("--x\r\nContent-Disposition: " + parts[i] + "\r\n\r\n" + parts[i+1] + "\r\n")
	}
	b.WriteString("--x--\r\n")
	return Request{Method: "POST", Path: "/payouts", ContentType: "multipart/form-data; boundary=x", Body: b.Bytes()}
}

// PHP reads a part's Content-Disposition its own way (rfc1867.c): a value
// in single quotes, any disposition type or none, a parameter without '=',
// a name given twice (the last one wins), and no filename* (a part with only
// filename* is a field to PHP, a file to Go's mime package). Such a part,
// which PHP's $_POST['order_id'] reads, has the field for a PHP provider;
// idemproxy, reading it with Go's mime.ParseMediaType, did not: a part with
// only such a name had no key and was not unreadable (a random key for each
// blind retry under IDEMPROXY_MISSING_KEY=generate, executed each time by a
// PHP provider), and one beside a part Go reads gave the key of that part's
// value, though PHP reads the last one (order MP-2 sent with MP-1 and then
// with MP-3: two keys, executed twice). Now such a part is a spelling of the
// field, as order.id is: alone it is unreadable, beside another value the
// field has none, and the same value keeps the key.
func TestFormDataAsPHPReadsIt(t *testing.T) {
	srcs := mustSources(t, "form:order_id")
	want := wantKey("POST", "/payouts", Source{Form, "order_id"}, "MP-1")
	good := `form-data; name="order_id"`
	for _, cd := range []string{
		`form-data; name='order_id'`,
		`inline; name="order_id"`,
		`name="order_id"`,
		`form-data; name="order_id"; v2`,
		`form-data; name="x"; name="order_id"`,
		`form-data; name="order_id"; filename*=UTF-8''id.txt`,
	} {
		for name, r := range map[string]Request{
			"alone":                rawFormData(cd, "MP-2"),
			"after another value":  rawFormData(good, "MP-1", cd, "MP-2"),
			"before another value": rawFormData(cd, "MP-2", good, "MP-1"),
		} {
			if key, _, ok := Derive(srcs, r); ok {
				t.Errorf("%s, %s: key %q, want none", cd, name, key)
			}
			if !Unreadable(srcs, r) {
				t.Errorf("%s, %s: not unreadable", cd, name)
			}
		}
		if key, _, ok := Derive(srcs, rawFormData(good, "MP-1", cd, "MP-1")); !ok || key != want {
			t.Errorf("%s with the same value: key %q (%v), want %q", cd, key, ok, want)
		}
	}
	// Parts that are no order_id to PHP either leave the key alone.
	for _, cd := range []string{
		`form-data; name='x'`,
		`form-data; name="order_id"; filename="id.txt"`,
		`form-data; name="order_id"; name="x"`,
		`form-data; filename='id.txt'; name='order_id'`,
	} {
		if key, _, ok := Derive(srcs, rawFormData(good, "MP-1", cd, "MP-2")); !ok || key != want {
			t.Errorf("%s beside the order: key %q (%v), want %q", cd, key, ok, want)
		}
	}
}

// PHP finds a multipart body's boundary its own way (rfc1867.c): after the
// first "boundary" in the Content-Type, up to ';' or ',' (or the closing
// quote), whatever else the value holds; and it registers the fields it
// read before a body's end that lacks the closing line. Go's mime package
// refuses a Content-Type with a parameter it cannot parse, and
// mime/multipart a body cut short. Such a form, whose order_id PHP's
// $_POST reads, had no key and was not unreadable (a random key for each
// blind retry under IDEMPROXY_MISSING_KEY=generate, executed each time by a
// PHP provider); one whose Content-Type gives PHP another boundary than Go
// ("xboundary=y; boundary=x") had the key of the order Go reads, though
// PHP reads another. Now each is unreadable.
func TestFormDataBoundaryAsPHPReadsIt(t *testing.T) {
	srcs := mustSources(t, "form:order_id")
	part := func(boundary, value string) string {
		return "--" + boundary + "\r\nContent-Disposition: form-data; name=\"order_id\"\r\n\r\n" + value + "\r\n"
	}
	whole := part("x", "MP-1") + "--x--\r\n"
	for name, r := range map[string]Request{
		"a parameter Go cannot parse": {Method: "POST", Path: "/payouts", ContentType: "multipart/form-data; boundary=x; v2", Body: []byte(whole)},
		"a comma before the boundary": {Method: "POST", Path: "/payouts", ContentType: "multipart/form-data, boundary=x", Body: []byte(whole)},
		"no closing line":             {Method: "POST", Path: "/payouts", ContentType: "multipart/form-data; boundary=x", Body: []byte(part("x", "MP-1"))},
		"another boundary to PHP": {Method: "POST", Path: "/payouts", ContentType: "multipart/form-data; xboundary=y; boundary=x",
			Body: []byte(part("y", "MP-2") + "--y--\r\n" + whole)},
	} {
		if key, _, ok := Derive(srcs, r); ok {
			t.Errorf("%s: key %q, want none", name, key)
		}
		if !Unreadable(srcs, r) {
			t.Errorf("%s: not unreadable", name)
		}
	}
	// The boundary as PHP and Go both read it, also quoted, keeps the key.
	want := wantKey("POST", "/payouts", Source{Form, "order_id"}, "MP-1")
	for _, ct := range []string{"multipart/form-data; boundary=x", `multipart/form-data; boundary="x"`, "multipart/form-data; boundary=x; charset=utf-8"} {
		r := Request{Method: "POST", Path: "/payouts", ContentType: ct, Body: []byte(whole)}
		if key, _, ok := Derive(srcs, r); !ok || key != want {
			t.Errorf("%s: key %q (%v), want %q", ct, key, ok, want)
		}
	}
}
