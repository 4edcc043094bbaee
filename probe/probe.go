// Package probe parses IDEMPROXY_STATUS_PROBE, the provider lookup idemproxy
// sends before re-sending an operation whose outcome is unknown, and fills it
// for one operation.
//
// The syntax is `METHOD PATH [BODY]`, e.g.
//
//	GET /payments/{resp.payment_id}
//	POST /v1/payout/info {"order_id":"{req.order_id}"}
//
// with the placeholders {idempotency_key} (the key sent upstream),
// {req.<dotted.path>} (a member of the original JSON request body) and
// {resp.<dotted.path>} (a member of the last ambiguous answer's JSON body).
// Any other brace is literal text, so a JSON body needs no escaping.
package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/routes"
)

// ErrSyntax is wrapped by every error Parse returns.
var ErrSyntax = errors.New("probe: invalid status probe")

// ErrUnfilled is wrapped by Build's error when a placeholder has no value:
// the body is not a JSON object, the member is missing, empty, or not a
// string or number. The caller then re-sends with the same key instead.
var ErrUnfilled = errors.New("probe: placeholder cannot be filled")

// source is where a placeholder's value comes from.
type source uint8

const (
	literal source = iota
	keySource
	reqSource
	respSource
)

// part is a literal text or a placeholder of a template.
type part struct {
	src  source
	text string // the literal, or the dotted path of req/resp
}

// Template is a parsed status probe. The zero Template is not valid; build
// one with Parse.
type Template struct {
	method string
	path   []part // path and optional query, starting with '/'
	body   []part // nil when the probe has no body
	raw    string
}

// Values are what a Template's placeholders read.
type Values struct {
	Key      string // {idempotency_key}
	Request  []byte // the original request body, for {req.…}
	Response []byte // the last ambiguous answer's body, for {resp.…}; nil if none
}

// Probe is a filled template, ready to send. Path may hold a query after '?'.
type Probe struct {
	Method string
	Path   string
	Body   []byte // nil when the template has no body
}

// Parse parses IDEMPROXY_STATUS_PROBE. Errors wrap ErrSyntax and say what is
// wrong; they quote no body text beyond the placeholder at fault.
func Parse(s string) (*Template, error) {
	s = strings.TrimSpace(s)
	method, rest, _ := strings.Cut(s, " ")
	if method == "" || strings.ContainsFunc(method, func(r rune) bool { return r < 'A' || r > 'Z' }) {
		return nil, fmt.Errorf("%w: want METHOD PATH [BODY] with an upper-case method, e.g. GET /payments/{resp.payment_id}", ErrSyntax)
	}
	if !lookupMethods[method] {
		return nil, fmt.Errorf("%w: method %s: a status probe is a lookup, GET, HEAD or POST", ErrSyntax, method)
	}
	rest = strings.TrimLeft(rest, " ")
	path, body, hasBody := strings.Cut(rest, " ")
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("%w: the path must start with /", ErrSyntax)
	}
	if strings.ContainsAny(path, "#\t\r\n") {
		return nil, fmt.Errorf("%w: the path must not hold a fragment or control characters", ErrSyntax)
	}
	if p, _, _ := strings.Cut(path, "?"); dotSegment(mustUnescape(p)) {
		return nil, fmt.Errorf("%w: the path must not hold a . or .. segment, which could lead above the provider's base path", ErrSyntax)
	}
	t := &Template{method: method, raw: s}
	var err error
	if t.path, err = parseParts(path); err != nil {
		return nil, err
	}
	if body = strings.TrimLeft(body, " "); hasBody && body != "" {
		if method != http.MethodPost {
			// A GET or HEAD body has no defined meaning (RFC 9110,
			// sections 9.3.1 and 9.3.2): many providers and their gateways
			// drop it or refuse the request, so the lookup would find
			// nothing, or fail, before every re-send.
			return nil, fmt.Errorf("%w: a %s probe has no body (many providers drop or refuse one): put the values in its path, "+
				"e.g. GET /payments/by-order/{req.order_id}, or use POST", ErrSyntax, method)
		}
		if t.body, err = parseParts(body); err != nil {
			return nil, err
		}
		// The body is sent as application/json: one that is not JSON
		// whatever its values (a brace or quote missing) would be refused
		// by the provider before every re-send, and no unknown operation
		// ever reconciled.
		filled, _ := fill(t.body, func(part) (value, error) { return value{text: "0", num: true}, nil }, jsonEscape)
		if !json.Valid([]byte(filled)) {
			return nil, fmt.Errorf("%w: the body must be JSON once its placeholders are filled (it is sent as application/json), e.g. {\"order_id\":\"{req.order_id}\"}", ErrSyntax)
		}
	}
	return t, nil
}

// lookupMethods are the methods a status probe may use. It is sent, signed,
// before every re-send of an operation whose outcome is unknown, and its 2xx
// answer is stored and replayed to the app: a DELETE (or PUT, PATCH) would
// act on the operation instead of looking it up, and TRACE, TRACK and CONNECT
// are what the proxy refuses from apps (a provider's gateway that echoes a
// TRACE would put the signature and the static credentials in the answer
// replayed to the app).
var lookupMethods = map[string]bool{http.MethodGet: true, http.MethodHead: true, http.MethodPost: true}

// parseParts splits s into literals and placeholders. A '{' that opens no
// name (JSON such as {"a":1}) is literal; one that opens an unknown name is
// an error (see placeholder).
func parseParts(s string) ([]part, error) {
	var parts []part
	lit := 0 // start of the pending literal
	for i := 0; i < len(s); i++ {
		if s[i] != '{' {
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			break
		}
		p, ok, err := placeholder(s[i+1 : i+end])
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if lit < i {
			parts = append(parts, part{text: s[lit:i]})
		}
		parts = append(parts, p)
		i += end
		lit = i + 1
	}
	if lit < len(s) {
		parts = append(parts, part{text: s[lit:]})
	}
	return parts, nil
}

// placeholder recognises the name between braces. ok is false for text that
// is not a placeholder (JSON such as {"a":1}); err is set for one that looks
// like a placeholder but is malformed ({req.} or {resp.a..b}) or unknown
// ({payment_id}, {key}): sent as literal text, it would ask the provider for
// a resource named by the braces themselves.
func placeholder(name string) (part, bool, error) {
	if name == "idempotency_key" {
		return part{src: keySource}, true, nil
	}
	var src source
	var path string
	switch {
	case strings.HasPrefix(name, "req."):
		src, path = reqSource, name[len("req."):]
	case strings.HasPrefix(name, "resp."):
		src, path = respSource, name[len("resp."):]
	case isName(name):
		return part{}, false, fmt.Errorf("%w: unknown placeholder {%s}: the placeholders are {idempotency_key}, {req.<dotted.path>} and {resp.<dotted.path>}", ErrSyntax, name)
	default:
		return part{}, false, nil
	}
	if strings.ContainsAny(name, " \"{\t\r\n") {
		return part{}, false, nil // not a name: literal text
	}
	for seg := range strings.SplitSeq(path, ".") {
		if seg == "" {
			return part{}, false, fmt.Errorf("%w: placeholder {%s} has an empty segment in its dotted path", ErrSyntax, name)
		}
	}
	return part{src: src, text: path}, true, nil
}

// isName says whether s reads as a placeholder's name: a letter or '_',
// then letters, digits, '_', '-' and '.'.
func isName(s string) bool {
	for i, c := range s {
		letter := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || !(c == '-' || c == '.' || '0' <= c && c <= '9')) {
			return false
		}
	}
	return s != ""
}

// String returns the template as it was configured.
func (t *Template) String() string { return t.raw }

// Method is the probe's HTTP method.
func (t *Template) Method() string { return t.method }

// Build fills t for one operation. Values in the path are path-escaped (in
// the query, query-escaped), so no value can change which resource is asked
// for. A value in the body is escaped as the inside of a JSON string where
// the body template puts it between quotes; elsewhere (`{"amount":{req.amount}}`)
// it is put as the one JSON value it was: a number as its text, a string
// quoted, so that no value ("[1,2]", "null", `1,"order_id":"x"`) can change
// the body's structure. A placeholder without a value gives an error
// wrapping ErrUnfilled, and so does a path value that holds a dot-segment
// (dotSegment): escaped, it would still lead above the resource at an
// upstream that decodes the path before it resolves it.
func (t *Template) Build(v Values) (Probe, error) {
	var req, resp map[string]any // decoded on first use
	lookup := func(p part) (value, error) {
		switch p.src {
		case keySource:
			if v.Key == "" {
				return value{}, fmt.Errorf("%w: {idempotency_key} is empty", ErrUnfilled)
			}
			return value{text: v.Key}, nil
		case reqSource:
			if req == nil {
				req = object(v.Request)
			}
			return member(req, "req", p.text)
		default:
			if resp == nil {
				resp = object(v.Response)
			}
			return member(resp, "resp", p.text)
		}
	}
	path, err := fill(t.path, lookup, pathEscape)
	if err != nil {
		return Probe{}, err
	}
	pr := Probe{Method: t.method, Path: path}
	if t.body != nil {
		body, err := fill(t.body, lookup, jsonEscape)
		if err != nil {
			return Probe{}, err
		}
		pr.Body = []byte(body)
	}
	return pr, nil
}

// value is a placeholder's value: its text, and whether it was a JSON
// number (else a string) where it was read.
type value struct {
	text string
	num  bool
}

// fill renders parts; escape gets the text before the value and the value,
// and may refuse the value (an error wrapping ErrUnfilled).
func fill(parts []part, lookup func(part) (value, error), escape func(before *strings.Builder, val value) (string, error)) (string, error) {
	var b strings.Builder
	for _, p := range parts {
		if p.src == literal {
			b.WriteString(p.text)
			continue
		}
		val, err := lookup(p)
		if err != nil {
			return "", err
		}
		esc, err := escape(&b, val)
		if err != nil {
			return "", err
		}
		b.WriteString(esc)
	}
	return b.String(), nil
}

// pathEscape escapes a value for where it lands: after a '?' it is a query
// value, before it a path segment. A value that holds a dot-segment
// (dotSegment) is refused in the path: escaped, it would still lead above
// the resource at an upstream that decodes the path before resolving it.
func pathEscape(before *strings.Builder, val value) (string, error) {
	if strings.Contains(before.String(), "?") {
		return url.QueryEscape(val.text), nil
	}
	if dotSegment(val.text) {
		return "", fmt.Errorf("%w: a value would be a dot-segment in the path", ErrUnfilled)
	}
	return url.PathEscape(val.text), nil
}

// dotSegment reports whether val, put in a path, holds a "." or ".."
// segment once an upstream decodes it: split at slashes and backslashes,
// each part cut at a path parameter, a query or fragment delimiter or a
// NUL. These are the paths the proxy refuses from an app (proxy's
// hasDotSegment).
func dotSegment(val string) bool {
	if !strings.Contains(val, ".") {
		return false
	}
	for part := range strings.FieldsFuncSeq(val, func(r rune) bool { return r == '/' || r == '\\' }) {
		if i := strings.IndexAny(part, ";?#\x00"); i >= 0 {
			part = part[:i]
		}
		if part == "." || part == ".." {
			return true
		}
	}
	return false
}

// jsonEscape escapes val for where it lands in a JSON body: inside a JSON
// string (the template put it between quotes), as the inside of a string;
// elsewhere, as the JSON value it was, a number as its text (valid JSON: it
// was decoded as one) and a string quoted.
func jsonEscape(before *strings.Builder, val value) (string, error) {
	quoted := inString(before.String())
	if !quoted && val.num {
		return val.text, nil
	}
	b, _ := json.Marshal(val.text) // a string always marshals
	if !quoted {
		return string(b), nil
	}
	return string(b[1 : len(b)-1]), nil
}

// inString reports whether the JSON text s ends inside a string: after an
// opening quote not yet closed. Values filled in before leave the count as
// it was (each is escaped inside a string, or a whole string or number).
func inString(s string) bool {
	in := false
	for i := 0; i < len(s); i++ {
		switch {
		case in && s[i] == '\\':
			i++
		case s[i] == '"':
			in = !in
		}
	}
	return in
}

// object decodes a JSON object, numbers kept as their text; anything else is
// an empty object.
func object(b []byte) map[string]any {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if d.Decode(&m) != nil || m == nil {
		return map[string]any{}
	}
	return m
}

// member returns the string or number at the dotted path of m.
func member(m map[string]any, side, path string) (value, error) {
	var cur any = m
	for seg := range strings.SplitSeq(path, ".") {
		obj, ok := cur.(map[string]any)
		if !ok {
			cur = nil
			break
		}
		cur = obj[seg]
	}
	switch v := cur.(type) {
	case string:
		if v != "" {
			return value{text: v}, nil
		}
	case json.Number:
		return value{text: v.String(), num: true}, nil
	}
	return value{}, fmt.Errorf("%w: {%s.%s} has no string or number value", ErrUnfilled, side, path)
}

// Lookup sends a Template to one provider: it implements retry.Prober.
type Lookup struct {
	Template *Template
	// Base is the provider's base URL; the probe's path is joined to its
	// path as the app's paths are.
	Base *url.URL
	// KeyHeader names the request header holding the key for
	// {idempotency_key}; empty means Idempotency-Key.
	KeyHeader string
	// For, when it has rules, names the operations the lookup is for
	// (IDEMPROXY_STATUS_PROBE_ROUTES, "POST /payments"): the payments
	// provider's GET /payments/{payment_id} says whether a payment exists,
	// and its 2xx must not become the result of a refund whose 504 named the
	// payment. The zero Table: every operation.
	For routes.Table
	// NotFoundCodes are the business codes by which the provider says, in a
	// 404, that it has no such operation (IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES,
	// payouts: payout.not_found), read at error.code or code of a JSON body.
	// With them, only such an answer means the operation did not happen.
	// None: any 404 does but a page (see NotFound).
	NotFoundCodes []string
}

// NotFound reports whether a probe's answer is the provider's "no such
// operation". With NotFoundCodes, only a 404 whose JSON body carries one of
// them at error.code (or code) is: a 404 for another reason (another code,
// none) or from a gateway in between says nothing of the operation, which
// may have run, and it stays unknown. Without them, a 404 is, as the
// contract says, but for a page (a body that begins with <: the HTML a
// gateway or load balancer answers for a route it does not know), which is
// not the provider's API speaking.
func (l *Lookup) NotFound(status int, body []byte) bool {
	if status != http.StatusNotFound {
		return false
	}
	if len(l.NotFoundCodes) == 0 {
		return !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n\ufeff"), []byte("<"))
	}
	var top, inner map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return false
	}
	var code string
	if json.Unmarshal(top["error"], &inner) != nil || json.Unmarshal(inner["code"], &code) != nil {
		if json.Unmarshal(top["code"], &code) != nil {
			return false
		}
	}
	return code != "" && slices.Contains(l.NotFoundCodes, code)
}

// Covers reports whether the lookup is for the operation req, whose URL is
// the upstream one: For has no rules, or one matches req's method and its
// path below Base's. An operation it does not cover is re-sent with the
// same key, as without a probe.
func (l *Lookup) Covers(req *http.Request) bool {
	if len(l.For.Rules()) == 0 {
		return true
	}
	p := req.URL.EscapedPath()
	if l.Base != nil {
		if base := strings.TrimSuffix(l.Base.EscapedPath(), "/"); base != "" {
			rest, ok := strings.CutPrefix(p, base)
			if !ok {
				return false
			}
			p = rest
		}
	}
	_, ok := l.For.Match(req.Method, p, true)
	return ok
}

// Lookup builds the probe request for the operation req (body is its body,
// last the body of its last ambiguous answer). The probe carries no
// Idempotency-Key: it is a lookup, not the operation.
func (l *Lookup) Lookup(ctx context.Context, req *http.Request, body, last []byte) (*http.Request, error) {
	kh := l.KeyHeader
	if kh == "" {
		kh = idemkey.HeaderName
	}
	p, err := l.Template.Build(Values{Key: req.Header.Get(kh), Request: body, Response: last})
	if err != nil {
		return nil, err
	}
	path, query, _ := strings.Cut(p.Path, "?")
	u := *l.Base
	u.RawPath = ""
	u.Path = strings.TrimSuffix(l.Base.Path, "/") + mustUnescape(path)
	u.RawPath = strings.TrimSuffix(l.Base.EscapedPath(), "/") + path
	u.RawQuery = query
	var rd io.Reader = http.NoBody
	if p.Body != nil {
		rd = bytes.NewReader(p.Body)
	}
	out, err := http.NewRequestWithContext(ctx, p.Method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnfilled, err)
	}
	if p.Body != nil {
		out.Header.Set("Content-Type", "application/json")
	}
	return out, nil
}

// mustUnescape decodes an escaped path Build produced (always valid).
func mustUnescape(p string) string {
	s, err := url.PathUnescape(p)
	if err != nil {
		return p
	}
	return s
}
