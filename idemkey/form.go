package idemkey

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
)

// text is what form and query scanning accept: a request body or a raw query.
type text interface{ ~string | ~[]byte }

// formValue returns the decoded value of the field called name in the
// application/x-www-form-urlencoded text s, appended to buf[:0]. Like
// url.ParseQuery, it skips pairs that do not decode, and a field without '='
// has an empty value; an empty value counts as absent, and so does the field.
// With asSent (a body, which reaches the provider as it came), a field whose
// value does not decode ("order_id=50%off") gives no value instead of being
// skipped: PHP and Node.js read it with its '%' kept, Go and Java not at all,
// so idemproxy cannot know which order the provider reads. A query is not
// asSent: such a parameter is dropped from it before it is forwarded.
// A field given more than once counts as absent unless every value is the
// same: applications differ on which one they read (Go's and Java's the
// first, PHP's the last), so a key derived from one would be another order's
// for a provider that reads the other. A field whose name differs only in
// letter case is the same field to ASP.NET, and one PHP registers under the
// name (formNameIs) the same to PHP, so either is such a repeat too; a field
// present only in another spelling counts as absent. A field with a ';'
// that names the field in one of its ';'-separated parts (semicolonNames)
// gives no value either: a body goes as it came, and a query's such
// parameter, which the forwarded query drops (url.ParseQuery), is still
// read at ';' by servers that split there.
func formValue[T text](buf []byte, s T, name string, asSent bool) ([]byte, bool) {
	n := -1 // the length of the first value, kept at buf[:n]; -1 before one
	exact := false
	for len(s) > 0 {
		var pair T
		pair, s = cutByte(s, '&')
		if semicolonNames(buf[:max(n, 0)], pair, name) {
			return buf[:0], false
		}
		k, v := cutByte(pair, '=')
		base := max(n, 0)
		key, ok := unescapeForm(buf[:base], k)
		if !ok || !formNameIs(key[base:], name) {
			continue
		}
		isName := string(key[base:]) == name
		val, ok := unescapeForm(key[:base], v)
		if !ok {
			if asSent {
				return val[:0], false
			}
			continue
		}
		exact = exact || isName
		if n < 0 {
			buf, n = val, len(val)
			continue
		}
		if string(val[n:]) != string(val[:n]) {
			return val[:0], false
		}
		buf = val
	}
	if n < 0 || !exact {
		return buf[:0], false
	}
	return buf[:n], n > 0
}

// formMentions reports whether the form text s has a field called name, in
// any spelling (formNameIs), whose value is not empty (Unreadable), or,
// with asSent (see formValue), whose value does not decode, or one named in
// a field with a ';' (semicolonNames); buf is scratch.
func formMentions[T text](buf []byte, s T, name string, asSent bool) bool {
	for len(s) > 0 {
		var pair T
		pair, s = cutByte(s, '&')
		if semicolonNames(buf[:0], pair, name) {
			return true
		}
		k, v := cutByte(pair, '=')
		key, ok := unescapeForm(buf[:0], k)
		if !ok || !formNameIs(key, name) {
			continue
		}
		if val, ok := unescapeForm(key[:0], v); ok && len(val) > 0 || !ok && asSent {
			return true
		}
	}
	return false
}

// formSemicolon reports whether a field of the form text s has a ';' and
// names the field name in one of its ';'-separated parts (semicolonNames);
// buf is scratch.
func formSemicolon[T text](buf []byte, s T, name string) bool {
	for len(s) > 0 {
		var pair T
		pair, s = cutByte(s, '&')
		if semicolonNames(buf, pair, name) {
			return true
		}
	}
	return false
}

// semicolonNames reports whether pair, one '&'-separated field of a form
// body or a query, has a ';' and names the field name (formNameIs) in one
// of its ';'-separated parts: "order_id=A;x=1", "x=1;order_id=A",
// "x;order_id=A". Parsers read such a field three ways: PHP, Java's servlets, Rack and Node.js split a form at '&' only
// ("order_id=A;x=1" is order "A;x=1"; "x=1;order_id=A" names no order);
// Perl's CGI.pm, Go before 1.17, Python's parse_qs before 3.9.2 and Django
// before 3.2 split at ';' too (order "A"); Go since 1.17 drops the field.
// So idemproxy cannot know which order, if any, the provider reads. buf is
// scratch, appended to.
func semicolonNames[T text](buf []byte, pair T, name string) bool {
	semicolon := false
	for i := 0; i < len(pair) && !semicolon; i++ {
		semicolon = pair[i] == ';'
	}
	for semicolon && len(pair) > 0 {
		var part T
		part, pair = cutByte(pair, ';')
		k, _ := cutByte(part, '=')
		if key, ok := unescapeForm(buf, k); ok && formNameIs(key[len(buf):], name) {
			return true
		}
	}
	return false
}

// formNameIs reports whether key, a decoded form field or query parameter
// name, is a spelling of the field name to some application that reads it:
// name in any letter case (ASP.NET), or the name PHP registers for it
// ($_POST, $_GET, $_REQUEST; php_register_variable_ex): leading spaces
// dropped, the name cut at a NUL, ' ', '.' and a '[' without a ']' after it
// turned into '_', and "name[...]", an array, named name. So "order.id",
// "order id", " order_id", "order[id" and "order_id[]" are all order_id to
// a PHP provider, the last one winning.
func formNameIs(key []byte, name string) bool {
	if bytes.EqualFold(key, []byte(name)) {
		return true
	}
	for len(key) > 0 && key[0] == ' ' {
		key = key[1:]
	}
	if i := bytes.IndexByte(key, 0); i >= 0 {
		key = key[:i]
	}
	if i := bytes.IndexByte(key, '['); i >= 0 && bytes.IndexByte(key[i:], ']') > 0 {
		key = key[:i]
	}
	if len(key) != len(name) {
		return false
	}
	for i, c := range key {
		if c == ' ' || c == '.' || c == '[' {
			c = '_'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

// pair is one decoded form field: key and value as ranges of a buffer.
type pair struct{ kStart, kEnd, vStart, vEnd int }

// formPairs decodes every field of s into buf, appending their ranges to
// pairs (empty segments, as in "a=1&&b=2", are skipped, as url.ParseQuery
// does), and sorts them by key, keeping the order of repeated keys, which
// is significant to the applications that read them. ok is false when a
// field does not decode.
func formPairs[T text](buf []byte, pairs []pair, s T) ([]byte, []pair, bool) {
	for len(s) > 0 {
		var seg T
		seg, s = cutByte(s, '&')
		if len(seg) == 0 {
			continue
		}
		k, v := cutByte(seg, '=')
		var p pair
		var ok bool
		p.kStart = len(buf)
		if buf, ok = unescapeForm(buf, k); !ok {
			return buf, pairs, false
		}
		p.kEnd, p.vStart = len(buf), len(buf)
		if buf, ok = unescapeForm(buf, v); !ok {
			return buf, pairs, false
		}
		p.vEnd = len(buf)
		pairs = append(pairs, p)
	}
	slices.SortStableFunc(pairs, func(a, b pair) int {
		return strings.Compare(string(buf[a.kStart:a.kEnd]), string(buf[b.kStart:b.kEnd]))
	})
	return buf, pairs, true
}

// cutByte splits s around the first c (the whole of s when there is none).
func cutByte[T text](s T, c byte) (before, after T) {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return s[:i], s[i+1:]
		}
	}
	return s, s[len(s):]
}

// unescapeForm appends s decoded as by url.QueryUnescape ('+' is a space,
// %XX a byte); ok is false for a malformed percent escape.
func unescapeForm[T text](dst []byte, s T) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '+':
			dst = append(dst, ' ')
		case '%':
			if i+2 >= len(s) {
				return dst, false
			}
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if !ok1 || !ok2 {
				return dst, false
			}
			dst = append(dst, hi<<4|lo)
			i += 2
		default:
			dst = append(dst, c)
		}
	}
	return dst, true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// mediaType returns the media type of a Content-Type value, without parameters.
func mediaType(contentType string) string {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.TrimSpace(mt)
}

// singleByteCharset reports whether contentType declares a charset of one
// byte per character whose first 128 are ASCII, as legacy PHP apps send
// JSON ("application/json; charset=windows-1251"): in such a body a byte
// from 0x80 up is never a quote or a backslash, so its structure reads the
// same in that charset, in UTF-8 with each stray byte as U+FFFD, and as
// bytes. Multi-byte charsets such as Shift_JIS are not: a second byte of
// 0x5C is a backslash to a parser that reads bytes.
func singleByteCharset(contentType string) bool {
	_, params, ok := strings.Cut(contentType, ";")
	if !ok {
		return false
	}
	// Every charset parameter must be one: a parser that takes the last of
	// "charset=windows-1251; charset=shift_jis" reads another structure.
	named := false
	for param := range strings.SplitSeq(params, ";") {
		name, val, _ := strings.Cut(param, "=")
		if !strings.EqualFold(strings.TrimSpace(name), "charset") {
			continue
		}
		if !isSingleByte(strings.ToLower(strings.Trim(strings.TrimSpace(val), `"`))) {
			return false
		}
		named = true
	}
	return named
}

// isSingleByte reports whether the lower-case charset name cs is one of
// singleByteCharset's.
func isSingleByte(cs string) bool {
	for _, prefix := range []string{"windows-125", "cp125"} {
		if n, ok := strings.CutPrefix(cs, prefix); ok {
			return len(n) == 1 && '0' <= n[0] && n[0] <= '8'
		}
	}
	if n, ok := strings.CutPrefix(cs, "iso-8859-"); ok {
		i, err := strconv.Atoi(n)
		return err == nil && 1 <= i && i <= 16 && i != 12 && n[0] != '0'
	}
	switch cs {
	case "koi8-r", "koi8-u", "latin1", "cp866", "ibm866":
		return true
	}
	return false
}

// isFormType reports whether contentType is application/x-www-form-urlencoded.
func isFormType(contentType string) bool {
	return strings.EqualFold(mediaType(contentType), "application/x-www-form-urlencoded")
}

// isJSONType reports whether contentType is application/json or any
// */json or */*+json type (RFC 6839 §3.1).
func isJSONType(contentType string) bool {
	_, sub, ok := strings.Cut(mediaType(contentType), "/")
	if !ok {
		return false
	}
	return strings.EqualFold(sub, "json") ||
		(len(sub) > 5 && strings.EqualFold(sub[len(sub)-5:], "+json"))
}

// firstNonSpace returns the first byte of b that is not JSON whitespace, or 0.
func firstNonSpace(b []byte) byte {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
		default:
			return c
		}
	}
	return 0
}
