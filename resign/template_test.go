package resign_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/resign"
)

// fields is a set of values distinct enough to tell placeholders apart.
var fields = resign.Fields{
	Timestamp: "1700000000", Nonce: "n-1", Method: "POST", Path: "/v1/a%2Fb",
	Query: "x=1&y=2", IdempotencyKey: "key-1", Body: []byte(`{"a":1}`),
}

func TestTemplateAppend(t *testing.T) {
	// SHA-256 of `{"a":1}`, from `printf '{"a":1}' | sha256sum`.
	const bodySum = "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
	tests := []struct {
		name, tmpl, want string
	}{
		{"default", resign.DefaultCanonical, "1700000000\nPOST\n/v1/a%2Fb\n{\"a\":1}"},
		{"payments", `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`,
			"POST\n/v1/a%2Fb\n1700000000\nn-1\nkey-1\n" + bodySum},
		{"query", "{path}?{query}", "/v1/a%2Fb?x=1&y=2"},
		{"sum twice", "{body_sha256}.{body_sha256}", bodySum + "." + bodySum},
		{"literal only", "plain text", "plain text"},
		{"escaped backslash then n", `a\\n`, `a\n`},
		{"escaped braces", `\{timestamp\}`, "{timestamp}"},
		{"lone closing brace", "a}b", "a}b"},
		{"real newline kept", "{method}\n{path}", "POST\n/v1/a%2Fb"},
		{"adjacent placeholders", "{method}{method}", "POSTPOST"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := mustTemplate(t, tc.tmpl)
			if got := string(tmpl.Append(nil, fields)); got != tc.want {
				t.Errorf("Append = %q, want %q", got, tc.want)
			}
			if got := string(tmpl.Append([]byte("pre:"), fields)); got != "pre:"+tc.want {
				t.Errorf("Append with prefix = %q", got)
			}
		})
	}
}

func TestTemplateEmptyBodySum(t *testing.T) {
	// The well-known SHA-256 of the empty string.
	const want = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	if got := string(mustTemplate(t, "{body_sha256}").Append(nil, resign.Fields{})); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestParseTemplateErrors(t *testing.T) {
	tests := []struct {
		tmpl string
		want string // must appear in the error
	}{
		{"", "empty template"},
		{"{foo}", `unknown placeholder "{foo}" at offset 0`},
		{"{method}\\n{Timestamp}", `unknown placeholder "{Timestamp}" at offset 10`},
		{"{ timestamp }", `unknown placeholder "{ timestamp }"`},
		{"{}", `unknown placeholder "{}"`},
		{"a{{method}}", `unknown placeholder "{{method}"`},
		{"{timestamp}\\n{method", `unclosed brace at offset 13: "{method"`},
		{"abc{", `unclosed brace at offset 3`},
		{`a\tb`, `unknown escape "\\t" at offset 1`},
		{`abc\`, "trailing backslash at offset 3"},
	}
	for _, tc := range tests {
		t.Run(tc.tmpl, func(t *testing.T) {
			_, err := resign.ParseTemplate(tc.tmpl)
			if !errors.Is(err, resign.ErrTemplate) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want ErrTemplate containing %q", err, tc.want)
			}
		})
	}
}

func TestTemplateUses(t *testing.T) {
	tmpl := mustTemplate(t, `{method}\n{body_sha256}`)
	tests := []struct {
		name string
		want bool
	}{
		{"method", true}, {"{method}", true}, {"body_sha256", true},
		{"body", false}, {"nonce", false}, {"{timestamp}", false}, {"unknown", false}, {"", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tmpl.Uses(tc.name); got != tc.want {
				t.Errorf("Uses(%q) = %v, want %v", tc.name, got, tc.want)
			}
		})
	}
}

// A template of literal text only, escaped braces included, is constant:
// it would sign the same string for every request. Every placeholder of
// resign.Placeholders makes it vary.
func TestTemplateConstant(t *testing.T) {
	for _, tmpl := range []string{"plain text", `\{timestamp\}`, `a\nb`} {
		if !mustTemplate(t, tmpl).Constant() {
			t.Errorf("%q: Constant = false, want true", tmpl)
		}
	}
	for _, ph := range strings.Fields(resign.Placeholders) {
		if mustTemplate(t, "x "+ph).Constant() {
			t.Errorf("%q: Constant = true, want false", ph)
		}
	}
}

func TestTemplateString(t *testing.T) {
	tests := []struct{ in, want string }{
		{resign.DefaultCanonical, resign.DefaultCanonical},
		{"{method}\n{path}", `{method}\n{path}`},
		{`\{x\} a\\b }`, `\{x} a\\b }`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			if got := mustTemplate(t, tc.in).String(); got != tc.want {
				t.Errorf("String = %q, want %q", got, tc.want)
			}
		})
	}
}
