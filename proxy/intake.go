package proxy

import (
	"context"
	"net/http"
	"net/url"
	"strings"
)

// methodOverrideHeaders name another method than the request line's. Some
// frameworks honour them, so a GET carrying one could execute a POST at the
// provider without a key; idemproxy refuses them instead of guessing which
// method the provider will act on.
var methodOverrideHeaders = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// checkShape refuses what idemproxy will not forward, before anything is read
// or sent (README, Security):
//   - a forward-proxy request (absolute URI) or a protocol upgrade;
//   - CONNECT, TRACE and TRACK: a tunnel, or an echo of the signed request
//     (signature and static credentials) back to the app;
//   - a method not in upper case: methods are case-sensitive (RFC 9110 §9.1),
//     but some servers act on "post" as on POST, and idemproxy would sign it
//     as POST while protecting only POST;
//   - a method override header (methodOverrideHeaders);
//   - declared trailers: they arrive after the body, could carry a key or a
//     signature past every check, and are never forwarded;
//   - a fragment in the request target ("/v1/payments#x"), which an HTTP
//     request never carries (RFC 9112 §3.2): net/http keeps it in the path,
//     and it would be forwarded, signed, as "/v1/payments%23x", a path the
//     app never named, whose answer (a 404) would be stored as final;
//   - a path with a dot-segment, plain or percent-encoded, that could take
//     the request outside the upstream base path once joined to it;
//   - a request whose length is ambiguous (MarkAmbiguousFraming);
//   - Content-Type on two lines with different values: idemproxy reads the
//     body by the first, a provider may by the last (or both joined), and
//     a form, a multipart boundary or a charset then names another order.
func checkShape(r *http.Request) error {
	switch {
	case r.Context().Value(ambiguousFramingKey{}) != nil:
		return ErrFraming
	case r.Method == http.MethodConnect || r.Method == http.MethodTrace || r.Method == "TRACK":
		return ErrMethod
	case r.URL.IsAbs() || !strings.HasPrefix(r.RequestURI, "/"):
		return ErrBadRequest
	case strings.IndexByte(r.RequestURI, '#') >= 0:
		return ErrFragment
	case r.Method != strings.ToUpper(r.Method):
		return ErrMethodCase
	case r.Header.Get("Upgrade") != "":
		return ErrUpgrade
	case hasAny(r.Header, methodOverrideHeaders):
		return ErrMethodOverride
	case len(r.Header.Values("Trailer")) > 0 || len(r.Trailer) > 0:
		return ErrTrailers
	case hasDotSegment(r.URL.EscapedPath()):
		return ErrDotSegment
	case repeatsOtherwise(r.Header.Values("Content-Type")):
		return ErrContentTypeTwice
	}
	return nil
}

// ignoreH2CUpgrade returns r without an offer to upgrade to HTTP/2 over
// cleartext (Upgrade: h2c, HTTP2-Settings, and their Connection tokens),
// which Java's java.net.http.HttpClient sends by default on an http:// URL
// (curl --http2 too). The offer is optional: a server that does not take it
// answers over HTTP/1.1 (RFC 9110 §7.8), as net/http does; refused, every
// request of such an app failed with 400 upgrade_not_supported. It must not
// reach the provider either, which could switch the connection to a
// protocol idemproxy does not read. Any other upgrade (a websocket, h2c
// offered with another protocol) is left for checkShape to refuse. r itself
// is not modified; it is returned when it offers no h2c upgrade.
func ignoreH2CUpgrade(r *http.Request) *http.Request {
	ups := r.Header.Values("Upgrade")
	if len(ups) == 0 {
		return r
	}
	for _, v := range ups {
		for tok := range strings.SplitSeq(v, ",") {
			if !strings.EqualFold(strings.TrimSpace(tok), "h2c") {
				return r
			}
		}
	}
	out := r.WithContext(r.Context())
	out.Header = r.Header.Clone()
	out.Header.Del("Upgrade")
	out.Header.Del("Http2-Settings")
	var conn []string
	for _, v := range out.Header.Values("Connection") {
		for tok := range strings.SplitSeq(v, ",") {
			if t := strings.TrimSpace(tok); t != "" && !strings.EqualFold(t, "Upgrade") && !strings.EqualFold(t, "HTTP2-Settings") {
				conn = append(conn, t)
			}
		}
	}
	out.Header.Del("Connection")
	if len(conn) > 0 {
		out.Header.Set("Connection", strings.Join(conn, ", "))
	}
	return out
}

// keepEscapes returns r with a URL whose escaped path is the app's, the
// bytes a path may not hold as they are escaped. When the request line's
// path holds one (raw UTF-8, "|", "{", '"'), url.URL.EscapedPath drops
// the path as sent and escapes the decoded path anew, so the app's escapes
// were lost: "/cards/a|b%2Fc/topup" went upstream, keyed and signed, as
// "/cards/a%7Cb/c/topup", another resource than the app named (README,
// Paths: the path signed is the path sent). Escapes are written in upper
// case, as Go writes them; the app's stay as they came. r itself is not
// modified (a handler may not), and is returned when nothing changes.
func keepEscapes(r *http.Request) *http.Request {
	raw := r.URL.RawPath
	if raw == "" || r.URL.EscapedPath() == raw {
		return r
	}
	u := *r.URL
	u.RawPath = escapeInvalid(raw)
	if u.EscapedPath() != u.RawPath { // not a spelling of Path: leave it to Go
		return r
	}
	out := r.WithContext(r.Context())
	out.URL = &u
	return out
}

// escapeInvalid escapes the bytes of a path that RFC 3986 §3.3 does not
// allow as they are, keeping every %XX escape as it is.
func escapeInvalid(p string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]), pathChar(c):
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String()
}

// pathChar reports a byte a path holds as it is: an unreserved character,
// a sub-delimiter, ":", "@" or "/" (RFC 3986 §3.3).
func pathChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@/", c) >= 0
}

type ambiguousFramingKey struct{}

// MarkAmbiguousFraming returns r marked as a request whose length is
// ambiguous: it came with Transfer-Encoding and Content-Length, with
// Transfer-Encoding on HTTP/1.0, or with Content-Length twice. net/http's
// server reads such a request one way (chunked, or the one length) and hides
// the rest from handlers; a front proxy that read it the other way has sent
// the next request's bytes as its body, or this request's body as a next
// request (request smuggling, RFC 9112 §6.1, §11.2). The handler refuses it
// with 400 bad_request and closes the connection. Only the server, which
// sees the request's bytes, can tell; see answerRefusalsInJSON in package
// main.
func MarkAmbiguousFraming(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), ambiguousFramingKey{}, true))
}

// repeatsOtherwise reports whether vals holds two values that differ.
func repeatsOtherwise(vals []string) bool {
	for _, v := range vals[min(1, len(vals)):] {
		if v != vals[0] {
			return true
		}
	}
	return false
}

func hasAny(h http.Header, names []string) bool {
	for _, n := range names {
		if len(h.Values(n)) > 0 {
			return true
		}
	}
	return false
}

// hasDotSegment reports a "." or ".." path segment (RFC 3986 §3.3), also when
// its dots are percent-encoded (%2e), when a decoded segment hides one behind
// an encoded slash or backslash ("..%2f", "..%5c"), when a path parameter
// follows it ("..;x"), or when an encoded query or fragment delimiter or a
// NUL does ("..%3f", "..%23", "..%00"): an upstream or a gateway that
// decodes the path and parses it again, drops path parameters, or stops at
// a NUL before it resolves would move up from the base path.
func hasDotSegment(escaped string) bool {
	for rest := escaped; rest != ""; {
		var seg string
		seg, rest, _ = strings.Cut(rest, "/")
		if !strings.ContainsAny(seg, ".%") { // the common case: no allocation
			continue
		}
		dec, err := url.PathUnescape(seg)
		if err != nil {
			return true // not a valid escape: no one can say where it leads
		}
		for part := range strings.FieldsFuncSeq(dec, isSlash) {
			// A path parameter does not hide one: servlet containers
			// (Tomcat, Jetty) drop ";..." before they resolve, so
			// "..;/admin" and "..;jsessionid=1" move up too. Nor does
			// a decoded "?" or "#", which a parser that sees the
			// decoded path takes for the query or fragment, nor a NUL.
			if i := strings.IndexAny(part, ";?#\x00"); i >= 0 {
				part = part[:i]
			}
			if part == "." || part == ".." {
				return true
			}
		}
	}
	return false
}

func isSlash(r rune) bool { return r == '/' || r == '\\' }
