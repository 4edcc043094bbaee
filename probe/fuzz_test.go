package probe_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/probe"
)

// FuzzProbe checks Parse and Build on arbitrary templates and bodies: no
// panic; errors wrap ErrSyntax or ErrUnfilled; the method is kept; the path
// starts with '/' and gains no '#', newline, or '/' from a value beyond what
// the template itself has; a body template that is a JSON object with string
// placeholders stays valid JSON whatever the values hold.
func FuzzProbe(f *testing.F) {
	f.Add(`GET /payments/{resp.payment_id}`, "k", []byte(`{"order_id":"o-1"}`), []byte(`{"payment_id":"p/../1"}`))
	f.Add(`POST /v1/payout/info {"order_id":"{req.order_id}"}`, "k", []byte(`{"order_id":"a\"b"}`), []byte(nil))
	f.Add(`GET /ops?key={idempotency_key}&o={req.a.b}`, "k&x=1", []byte(`{"a":{"b":7}}`), []byte(`{}`))
	f.Add(`GET /{req.a}{resp.b}`, "", []byte(`{"a":"\n"}`), []byte(`{"b":"#"}`))
	f.Fuzz(func(t *testing.T, s, key string, req, resp []byte) {
		tmpl, err := probe.Parse(s)
		if err != nil {
			if !errors.Is(err, probe.ErrSyntax) {
				t.Fatalf("Parse error does not wrap ErrSyntax: %v", err)
			}
			return
		}
		p, err := tmpl.Build(probe.Values{Key: key, Request: req, Response: resp})
		if err != nil {
			if !errors.Is(err, probe.ErrUnfilled) {
				t.Fatalf("Build error does not wrap ErrUnfilled: %v", err)
			}
			return
		}
		if p.Method != tmpl.Method() || !strings.HasPrefix(p.Path, "/") {
			t.Fatalf("built %s %q from %q", p.Method, p.Path, s)
		}
		pathTmpl, _, _ := strings.Cut(strings.TrimLeft(strings.TrimSpace(s)[len(p.Method):], " "), " ")
		for _, c := range []string{"#", "\n", "\r", " "} {
			if strings.Contains(p.Path, c) && !strings.Contains(pathTmpl, c) {
				t.Fatalf("a value put %q into the path %q (template %q)", c, p.Path, s)
			}
		}
		if strings.Count(p.Path, "/") != strings.Count(pathTmpl, "/")-countPlaceholderSlashes(pathTmpl) {
			t.Fatalf("a value added a path separator: %q from %q", p.Path, s)
		}
		if p.Body != nil && json.Valid([]byte(bodyTmpl(s))) && !json.Valid(p.Body) {
			t.Fatalf("values broke a JSON body: %q from %q", p.Body, s)
		}
	})
}

// countPlaceholderSlashes counts the '/' inside placeholders of a path
// template (none: dotted paths have no '/', but literal braces may).
func countPlaceholderSlashes(path string) int {
	n := 0
	for {
		i := strings.IndexByte(path, '{')
		if i < 0 {
			return n
		}
		j := strings.IndexByte(path[i:], '}')
		if j < 0 {
			return n
		}
		inner := path[i+1 : i+j]
		if inner == "idempotency_key" || strings.HasPrefix(inner, "req.") || strings.HasPrefix(inner, "resp.") {
			if !strings.ContainsAny(inner, " \"{\t\r\n") {
				n += strings.Count(inner, "/")
			}
		}
		path = path[i+j+1:]
	}
}

// bodyTmpl is the body part of a template.
func bodyTmpl(s string) string {
	s = strings.TrimSpace(s)
	_, rest, _ := strings.Cut(s, " ")
	_, body, _ := strings.Cut(strings.TrimLeft(rest, " "), " ")
	return strings.TrimLeft(body, " ")
}
