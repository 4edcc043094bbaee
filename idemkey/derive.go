package idemkey

import (
	"bytes"
	"crypto/sha1"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Request is what derivation and fingerprinting read from an HTTP request.
// Path is the request path as it will be forwarded and RawQuery the query
// without '?'; Body is the whole body, already read (nil means empty).
// A nil Header has no fields.
type Request struct {
	Method, Path, RawQuery, ContentType string
	Header                              http.Header
	Body                                []byte
	// Tenant, when not empty, is part of a derived key: two apps behind one
	// idemproxy share its provider credentials, so the same order_id from
	// each must reach the provider as two keys. Empty keeps the v1 keys.
	Tenant string
	// Generation is the order's key generation: 0 or 1 for its first key,
	// which stays what it always was; an operator moves a failed order to
	// the next generation to try it again under a new key.
	Generation int
}

// namespace is the UUIDv5 namespace of derived keys:
// uuid.NewSHA1(uuid.NameSpaceURL, "https://github.com/idemproxy/idemproxy#idempotency-key").
// Changing it changes every derived key, which would send a second charge for
// any operation in flight across the change.
var namespace = uuid.MustParse("37a209bb-1b51-5f69-bf68-a0460f24db7b")

// Derive returns the key derived from the first of sources present in r, and
// that source; ok is false, and key empty, when none is present.
//
// The key is a UUIDv5 (uuid.NewSHA1 over a fixed idemproxy namespace) of an
// unambiguous, length-prefixed encoding of r's method and path, the source
// and its value. It is deterministic, so a legacy app's blind retry gets the
// same key, and it differs per method and path, because a payment and a
// refund of one order are two operations (docs/keys.md).
// It also differs per source, so changing IDEMPROXY_KEY_SOURCES changes the
// keys of operations in flight; change it only when none are.
//
// Values, empty ones counting as absent:
//   - JSON: the member at the dotted path of a body that is a JSON object,
//     tried whenever the body starts with '{' (legacy apps send JSON with a
//     missing or wrong Content-Type). A string gives its decoded value, a
//     number its literal text; null, bools, objects and arrays are absent.
//     The number 12345 and the string "12345" give the same key, because
//     legacy apps are inconsistent about quoting order ids and a retry that
//     quotes differently must not become a second charge. A key of the
//     path repeated with different values ({"order_id":"a","order_id":"b"},
//     also in another letter case) has no value: parsers differ on which
//     member wins. Invalid JSON has
//     no values (it is still forwarded; the provider decides).
//   - Form: the value of the field in an application/x-www-form-urlencoded
//     body, or in a body without Content-Type that does not start with '{',
//     or in a multipart/form-data body (a part without a filename, its
//     bytes as they came).
//   - Header: r.Header.Get(Name); the same name spelt with underscores for
//     dashes (X_Order_Id) with another value is a repeat.
//   - Query: the value of the query parameter.
//     A form field, query parameter or header given twice with different
//     values has no value, as a repeated JSON member.
//
// A source that is in r without one value (Unreadable) ends the search at
// the next source of another kind: a query parameter or header does not
// stand in for a repeated JSON member or form field (nor the other way
// round), since the provider may read the order from the earlier one, and
// each later value would make that order another key. A later source of
// the same kind (json:order_id, then json:payment.order_id) still does, as
// it did in earlier versions, whose keys stay what they were.
func Derive(sources []Source, r Request) (key string, src Source, ok bool) {
	st := getState()
	defer putState(st)
	var unread Kind // the kind of the first source in r without one value
	for i, s := range sources {
		if unread != 0 && s.Kind != unread {
			break
		}
		if val, ok := st.value(s, r); ok {
			return st.key(r, s, val), s, true
		}
		if unread == 0 && i < len(sources)-1 && st.mentions(s, r) != ReasonNone {
			unread = s.Kind // see Derive: no source of another kind stands in
		}
	}
	return "", Source{}, false
}

// Unreadable reports, for a request Derive found no source in, whether one
// of sources is in r all the same, without one value Derive can take from it: a JSON member at the path, a form field, a
// query parameter or a header (with underscores for dashes too) that has a
// value that is not empty but is given twice with different values, or is
// spelt in another letter case only, or a JSON member in a body that does
// not parse whole as one object (data after it, a syntax error after the
// member), or a body that starts as a JSON object, is not valid JSON and
// names the member's key anywhere (lenient parsers such as Json.NET's and
// Gson's read single quotes, names without quotes, comments); or a JSON
// object or a form in UTF-16 or UTF-32, which is not read at all
// (wideObject, wideText). Derive counts such a source as absent; the provider may well
// read an order id from it (encoding/json matches member names without
// regard to case, a streaming decoder stops after the first object), so
// a random key or none for the request would have each of the app's blind
// retries executed again. [UnreadableReason] says why.
func Unreadable(sources []Source, r Request) bool {
	return UnreadableReason(sources, r) != ReasonNone
}

// Reason is why a key source that is in a request gives no one value
// ([UnreadableReason]), for the refusal to name it.
type Reason uint8

// The reasons [UnreadableReason] gives.
const (
	// ReasonNone: no source is in the request without a value.
	ReasonNone Reason = iota
	// ReasonOther: any cause below does not apply (a value given twice,
	// another letter case, JSON that does not parse whole, UTF-16...).
	ReasonOther
	// ReasonLoneSurrogate: the JSON member is a string with a \u escape of
	// a lone surrogate ("s\ud800"), read as U+FFFD by Go and as the
	// surrogate by JavaScript, Python and Java.
	ReasonLoneSurrogate
	// ReasonFormSemicolon: a field of the form body has a ';' and names the
	// field in one of its ';'-separated parts ("order_id=A;amount=5").
	ReasonFormSemicolon
	// ReasonQuerySemicolon: the same in the query ("?order_id=A;x=1").
	ReasonQuerySemicolon
)

// UnreadableReason is [Unreadable] saying why: ReasonNone when no source is
// in r without a value, else the reason of the first such source.
func UnreadableReason(sources []Source, r Request) Reason {
	st := getState()
	defer putState(st)
	for _, s := range sources {
		if why := st.mentions(s, r); why != ReasonNone {
			return why
		}
	}
	return ReasonNone
}

// mentions reports whether source s has, in some spelling, a value that is
// not empty in r (see Unreadable), and why it gives none (ReasonNone when
// it is not there).
func (st *state) mentions(s Source, r Request) Reason {
	switch s.Kind {
	case JSON:
		body := bytes.TrimPrefix(r.Body, utf8BOM)
		if wideObject(body) {
			return ReasonOther // not read at all (see wideObject)
		}
		if firstNonSpace(body) != '{' {
			// Json.NET and Gson (lenient) skip comments, white space
			// JSON does not allow and Gson's ")]}'" prefix before the
			// object, and find the order id in it (lenientObject).
			return reasonIf(lenientObject(body) && containsFold(body, lastSegment(s.Name)), ReasonOther)
		}
		st.json.singleByte = singleByteCharset(r.ContentType)
		st.json.lookup(body, s.Name)
		if st.json.loneSeen {
			return ReasonLoneSurrogate
		}
		if st.json.seen {
			return ReasonOther
		}
		// A body that is not valid JSON before the member (single
		// quotes, a name without quotes, a comment, a leading zero) is
		// still read by lenient parsers (Json.NET, Gson), whose provider
		// finds the order id in it: one that names the member's key
		// anywhere mentions it.
		st.json.reset(body, false)
		return reasonIf(st.json.document() != nil && containsFold(body, lastSegment(s.Name)), ReasonOther)
	case Form:
		// PHP may find a boundary where Go finds none or another, and
		// reads a body cut short (phpBoundary, formParts).
		boundary, ok := formDataBoundary(r.ContentType)
		if pb, pok := phpBoundary(r.ContentType); ok || pok {
			return reasonIf(ok && formDataMentions(r.Body, boundary, s.Name) ||
				pok && pb != boundary && formDataMentions(r.Body, pb, s.Name), ReasonOther)
		}
		if !isFormType(r.ContentType) && (r.ContentType != "" || firstNonSpace(bytes.TrimPrefix(r.Body, utf8BOM)) == '{') {
			return ReasonNone
		}
		if wideText(r.Body) {
			return ReasonOther // not read at all, as a JSON object in UTF-16 (wideObject)
		}
		if formSemicolon(st.val[:0], r.Body, s.Name) {
			return ReasonFormSemicolon
		}
		return reasonIf(formMentions(st.val[:0], r.Body, s.Name, true), ReasonOther)
	case Header:
		for k, vs := range r.Header {
			if sameCGIName(k, s.Name) && slices.ContainsFunc(vs, func(v string) bool { return v != "" }) {
				return ReasonOther
			}
		}
	case Query:
		if formSemicolon(st.val[:0], r.RawQuery, s.Name) {
			return ReasonQuerySemicolon
		}
		return reasonIf(formMentions(st.val[:0], r.RawQuery, s.Name, false), ReasonOther)
	}
	return ReasonNone
}

// lenientObject reports whether body, which does not start with '{' after
// JSON white space, is a JSON object to a lenient parser all the same: its
// first character after what Json.NET or Gson (lenient, as Gson.fromJson
// reads) skip before a document is '{'. They skip comments ("/* */" and
// "//" both, "#" Gson), white space JSON does not allow (Json.NET's is
// char.IsWhiteSpace: a form feed, a no-break space) and Gson's non-execute
// prefix ")]}'" followed by a newline. A legacy app that writes a comment
// or a stray form feed before its JSON has its order read by such a
// provider, and a random key for it (MISSING_KEY=generate) would have each
// of its blind retries executed again.
func lenientObject(body []byte) bool {
	for b := body; len(b) > 0; {
		switch {
		case bytes.HasPrefix(b, []byte("/*")):
			end := bytes.Index(b[2:], []byte("*/"))
			if end < 0 {
				return false
			}
			b = b[2+end+2:]
		case bytes.HasPrefix(b, []byte("//")) || b[0] == '#':
			end := bytes.IndexAny(b, "\r\n")
			if end < 0 {
				return false
			}
			b = b[end:]
		case bytes.HasPrefix(b, []byte(")]}'\n")):
			b = b[5:]
		default:
			r, n := utf8.DecodeRune(b)
			if !unicode.IsSpace(r) {
				return b[0] == '{'
			}
			b = b[n:]
		}
	}
	return false
}

// reasonIf is why when mentioned, else ReasonNone.
func reasonIf(mentioned bool, why Reason) Reason {
	if mentioned {
		return why
	}
	return ReasonNone
}

// lastSegment is the last key of a dotted path.
func lastSegment(path string) string {
	return path[strings.LastIndexByte(path, '.')+1:]
}

// containsFold reports whether b contains s in any ASCII letter case.
func containsFold(b []byte, s string) bool {
	for i := 0; i+len(s) <= len(b); i++ {
		if bytes.EqualFold(b[i:i+len(s)], []byte(s)) {
			return true
		}
	}
	return false
}

// wideObject reports whether body is a JSON object in UTF-16 or UTF-32:
// after a byte order mark (FE FF or FF FE), or with a NUL among its first
// two bytes (RFC 4627 §3), its first character that is not white space is
// '{'. .NET's StringContent with Encoding.Unicode sends such a body, as
// "application/json; charset=utf-16", and ASP.NET reads it; idemproxy, whose
// sources read UTF-8 (RFC 8259 §8.1), finds nothing in it.
func wideObject(body []byte) bool {
	b, marked := body, false
	for _, bom := range [][]byte{{0xfe, 0xff}, {0xff, 0xfe}} {
		if bytes.HasPrefix(b, bom) {
			b, marked = b[2:], true
		}
	}
	if len(b) < 2 || !marked && b[0] != 0 && b[1] != 0 {
		return false
	}
	for _, c := range b[:min(len(b), 64)] {
		switch c {
		case 0, ' ', '\t', '\n', '\r':
		case '{':
			return true
		default:
			return false
		}
	}
	return false
}

// wideText reports whether body is text in UTF-16 or UTF-32: it starts with
// a byte order mark (FE FF or FF FE), or has a NUL among its first two
// bytes. A form sent so ("application/x-www-form-urlencoded;
// charset=utf-16", as .NET's StringContent with Encoding.Unicode sends it)
// is read in that charset by ASP.NET Core's form reader; idemproxy's form
// source reads it as bytes and finds nothing.
func wideText(body []byte) bool {
	return len(body) >= 2 && (body[0] == 0xfe && body[1] == 0xff || body[0] == 0xff && body[1] == 0xfe || body[0] == 0 || body[1] == 0)
}

// KeyFor returns the key Derive gives a request of r.Method, r.Path, r.Tenant
// and r.Generation whose source src has the value val (for an operator who
// knows an order's id but not its request).
func KeyFor(src Source, val string, r Request) string {
	st := getState()
	defer putState(st)
	return st.key(r, src, []byte(val))
}

// utf8BOM is the UTF-8 encoding of U+FEFF, the byte order mark.
var utf8BOM = []byte("\xef\xbb\xbf")

// value returns the value of source s in r.
func (st *state) value(s Source, r Request) ([]byte, bool) {
	switch s.Kind {
	case JSON:
		// A UTF-8 byte order mark before the document, which legacy
		// runtimes write (RFC 8259 §8.1 lets a parser ignore it), does not
		// hide the id. The fingerprint still takes such a body as it came.
		body := bytes.TrimPrefix(r.Body, utf8BOM)
		if firstNonSpace(body) != '{' {
			return nil, false
		}
		st.json.singleByte = singleByteCharset(r.ContentType)
		return st.json.lookup(body, s.Name)
	case Form:
		if boundary, ok := formDataBoundary(r.ContentType); ok {
			if pb, pok := phpBoundary(r.ContentType); pok && pb != boundary && formDataMentions(r.Body, pb, s.Name) {
				return nil, false // PHP reads its parts under another boundary
			}
			var found bool
			st.val, found = formDataValue(st.val, r.Body, boundary, s.Name)
			return st.val, found
		}
		// A body without Content-Type is a form unless it is a JSON
		// object, byte order mark or not.
		if !isFormType(r.ContentType) && (r.ContentType != "" || firstNonSpace(bytes.TrimPrefix(r.Body, utf8BOM)) == '{') {
			return nil, false
		}
		var ok bool
		st.val, ok = formValue(st.val, r.Body, s.Name, true)
		return st.val, ok
	case Header:
		vs := r.Header.Values(s.Name)
		if len(vs) == 0 || slices.ContainsFunc(vs[1:], func(v string) bool { return v != vs[0] }) ||
			underscoredDiffers(r.Header, s.Name, vs[0]) {
			return nil, false // absent, or repeated with other values (see Form)
		}
		st.val = append(st.val[:0], vs[0]...)
		return st.val, len(st.val) > 0
	case Query:
		var ok bool
		st.val, ok = formValue(st.val, r.RawQuery, s.Name, false)
		return st.val, ok
	}
	return nil, false
}

// key computes the derived key for value val of source s.
func (st *state) key(r Request, s Source, val []byte) string {
	b := append(st.buf[:0], namespace[:]...) // the hash input is namespace || name
	if r.Generation > 1 {
		// A prefix generation 1 cannot have ("-g" where its method's length
		// byte follows "v1"), so no generation can collide with another.
		b = append(b, "idemproxy-key-g"...)
		b = appendField(b, strconv.Itoa(r.Generation))
	} else {
		b = append(b, "idemproxy-key-v1"...)
	}
	b = appendField(b, r.Method)
	b = appendField(b, r.Path)
	b = appendField(b, s.Kind.String())
	b = appendField(b, s.Name)
	b = appendField(b, val)
	if r.Tenant != "" {
		b = appendField(b, r.Tenant)
	}
	st.buf = b
	return nameUUID(b)
}

// nameUUID is uuid.NewSHA1(namespace, name).String() for b = namespace ||
// name, with the hash on the stack: one allocation (the string) where
// uuid.NewSHA1 makes four.
func nameUUID(b []byte) string {
	sum := sha1.Sum(b)
	var u uuid.UUID
	copy(u[:], sum[:])
	u[6] = u[6]&0x0f | 0x50 // version 5
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return u.String()
}

// underscoredDiffers says whether h has name spelt with underscores for
// dashes (X_Order_Id for X-Order-Id) with a value other than val. Servers
// that turn header names into CGI-style variables (HTTP_X_ORDER_ID: PHP and
// CGI behind a server that passes such names on) read both spellings as one
// header, so such a pair is a repeat with another value, whichever one the
// provider reads.
func underscoredDiffers(h http.Header, name, val string) bool {
	for k, vs := range h {
		if strings.IndexByte(k, '_') < 0 || !sameCGIName(k, name) {
			continue
		}
		if slices.ContainsFunc(vs, func(v string) bool { return v != val }) {
			return true
		}
	}
	return false
}

// sameCGIName says whether header names a and b are one CGI variable: equal
// but for letter case and '_' for '-'.
func sameCGIName(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == '_' {
			x = '-'
		}
		if y == '_' {
			y = '-'
		}
		if x != y && lower(x) != lower(y) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
