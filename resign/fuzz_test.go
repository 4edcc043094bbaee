package resign_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/resign"
)

// Reference escape handling for the fuzz target, written with
// strings.Replacer rather than the parser's loop.
var (
	refUnescape    = strings.NewReplacer(`\\`, `\`, `\n`, "\n", `\{`, "{", `\}`, "}")
	refValidEscape = strings.NewReplacer(`\\`, "", `\n`, "", `\{`, "", `\}`, "")
)

// FuzzTemplate checks ParseTemplate and Append on arbitrary input: no
// panic; errors wrap ErrTemplate; rendering is deterministic and appends to
// dst; a template without "{" renders to itself after escape processing and
// ignores the fields; String parses back to a template that renders the same.
func FuzzTemplate(f *testing.F) {
	seeds := []string{
		resign.DefaultCanonical,
		`{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`,
		`{timestamp}:{nonce}:{method}:{path}?{query}:{body_sha256}`,
		`plain`, `a\\n`, `\{x\}`, `}{`, `{`, `\`, `\q`, "{body}\n{body}", "",
	}
	for _, s := range seeds {
		f.Add(s, "1700000000", "POST", "/v1/x", []byte(`{"a":1}`))
	}
	f.Fuzz(func(t *testing.T, s, ts, method, path string, body []byte) {
		tmpl, err := resign.ParseTemplate(s)
		noBrace := !strings.Contains(s, "{")
		wantOK := s != "" && !strings.Contains(refValidEscape.Replace(s), `\`)
		if err != nil {
			if !errors.Is(err, resign.ErrTemplate) {
				t.Fatalf("error does not wrap ErrTemplate: %v", err)
			}
			if noBrace && wantOK {
				t.Fatalf("ParseTemplate(%q) rejected a valid literal template: %v", s, err)
			}
			return
		}
		if noBrace && !wantOK {
			t.Fatalf("ParseTemplate(%q) accepted an invalid escape", s)
		}
		fl := resign.Fields{Timestamp: ts, Nonce: ts + "n", Method: method, Path: path, Query: path + "q", IdempotencyKey: method + "k", Body: body}
		out := tmpl.Append(nil, fl)
		if again := tmpl.Append([]byte("prefix"), fl); !bytes.Equal(again, append([]byte("prefix"), out...)) {
			t.Fatalf("rendering not deterministic: %q vs %q", out, again)
		}
		if noBrace {
			if want := refUnescape.Replace(s); string(out) != want {
				t.Fatalf("literal template %q rendered %q, want %q", s, out, want)
			}
			if zero := tmpl.Append(nil, resign.Fields{}); !bytes.Equal(zero, out) {
				t.Fatalf("literal template depends on fields: %q vs %q", zero, out)
			}
		}
		back, err := resign.ParseTemplate(tmpl.String())
		if err != nil {
			t.Fatalf("String() %q does not parse: %v", tmpl.String(), err)
		}
		if got := back.Append(nil, fl); !bytes.Equal(got, out) {
			t.Fatalf("String() round trip renders %q, want %q", got, out)
		}
	})
}
