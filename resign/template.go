package resign

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// DefaultCanonical is the canonical-string template used when Config.Template
// is nil, written as it appears in IDEMPROXY_SIGN_CANONICAL (the two characters
// `\n` stand for a newline). It is the payouts provider's scheme
// "ts\nMETHOD\npath\nbody", and the documented default (docs/signing.md).
const DefaultCanonical = `{timestamp}\n{method}\n{path}\n{body}`

// Placeholders are the placeholders a template may hold, as written in it.
const Placeholders = "{timestamp} {nonce} {method} {path} {query} {body} {body_sha256} {idempotency_key}"

// ErrTemplate is wrapped by every error ParseTemplate returns.
var ErrTemplate = errors.New("resign: invalid signing template")

// placeholder identifies one kind of template segment; phLiteral is plain text.
type placeholder uint8

const (
	phLiteral placeholder = iota
	phTimestamp
	phNonce
	phMethod
	phPath
	phQuery
	phBody
	phBodySHA256
	phIdempotencyKey
)

// lookupPlaceholder maps a placeholder name (without braces) to its kind.
// A switch rather than a package map keeps the package free of mutable globals.
func lookupPlaceholder(name string) (placeholder, bool) {
	switch name {
	case "timestamp":
		return phTimestamp, true
	case "nonce":
		return phNonce, true
	case "method":
		return phMethod, true
	case "path":
		return phPath, true
	case "query":
		return phQuery, true
	case "body":
		return phBody, true
	case "body_sha256":
		return phBodySHA256, true
	case "idempotency_key":
		return phIdempotencyKey, true
	}
	return phLiteral, false
}

// placeholderName is the inverse of lookupPlaceholder, used by String.
func placeholderName(p placeholder) string {
	switch p {
	case phTimestamp:
		return "timestamp"
	case phNonce:
		return "nonce"
	case phMethod:
		return "method"
	case phPath:
		return "path"
	case phQuery:
		return "query"
	case phBody:
		return "body"
	case phBodySHA256:
		return "body_sha256"
	case phIdempotencyKey:
		return "idempotency_key"
	}
	return ""
}

// segment is one piece of a parsed template: literal text, or a placeholder.
type segment struct {
	ph  placeholder
	lit string // only for phLiteral
}

// Template is a parsed IDEMPROXY_SIGN_CANONICAL: literal text with the
// placeholders {timestamp} {nonce} {method} {path} {query} {body}
// {body_sha256} {idempotency_key}. A Template is immutable and safe for
// concurrent use. Create it with ParseTemplate; the zero Template renders to
// the empty string.
type Template struct {
	segs []segment
	uses uint16 // bit (1 << placeholder) set for each placeholder present
}

// Fields are the per-attempt values substituted into a Template.
type Fields struct {
	Timestamp      string // {timestamp}: unix seconds, as sent in the timestamp header
	Nonce          string // {nonce}: as sent in the nonce header
	Method         string // {method}: upper-case
	Path           string // {path}: the escaped path as sent on the wire
	Query          string // {query}: the raw query, without "?"
	IdempotencyKey string // {idempotency_key}: the Idempotency-Key header
	Body           []byte // {body} verbatim; {body_sha256} = lowercase hex SHA-256 of it
}

// ParseTemplate parses a canonical-string template.
//
// Placeholders are written {name}. Escapes, because an environment variable
// cannot comfortably hold a newline and because a literal brace would
// otherwise open a placeholder:
//
//	\n  newline
//	\\  one backslash
//	\{  a literal "{"
//	\}  a literal "}" (a lone "}" outside a placeholder is literal too)
//
// Any other backslash sequence, a trailing backslash, an unknown placeholder,
// an unclosed brace or an empty template is an error wrapping ErrTemplate
// that names the offending text and its byte offset: a typo in the template
// would otherwise produce signatures the provider silently rejects.
// Real newlines in s (e.g. from a _FILE secret) are kept as literal text.
func ParseTemplate(s string) (*Template, error) {
	if s == "" {
		return nil, fmt.Errorf("%w: empty template", ErrTemplate)
	}
	t := &Template{}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.segs = append(t.segs, segment{ph: phLiteral, lit: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			r, err := unescape(s, i)
			if err != nil {
				return nil, err
			}
			lit.WriteByte(r)
			i++
		case '{':
			ph, end, err := parsePlaceholder(s, i)
			if err != nil {
				return nil, err
			}
			flush()
			t.segs = append(t.segs, segment{ph: ph})
			t.uses |= 1 << ph
			i = end
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return t, nil
}

// unescape decodes the escape sequence whose backslash is at s[i].
func unescape(s string, i int) (byte, error) {
	if i+1 >= len(s) {
		return 0, fmt.Errorf("%w: trailing backslash at offset %d (write \\\\ for a literal backslash)", ErrTemplate, i)
	}
	switch s[i+1] {
	case 'n':
		return '\n', nil
	case '\\', '{', '}':
		return s[i+1], nil
	}
	return 0, fmt.Errorf("%w: unknown escape %q at offset %d (known: \\n \\\\ \\{ \\})", ErrTemplate, s[i:i+2], i)
}

// parsePlaceholder parses the placeholder whose "{" is at s[i] and returns
// its kind and the offset of its closing "}".
func parsePlaceholder(s string, i int) (placeholder, int, error) {
	n := strings.IndexByte(s[i+1:], '}')
	if n < 0 {
		return 0, 0, fmt.Errorf("%w: unclosed brace at offset %d: %q", ErrTemplate, i, truncate(s[i:], 24))
	}
	end := i + 1 + n
	ph, ok := lookupPlaceholder(s[i+1 : end])
	if !ok {
		return 0, 0, fmt.Errorf("%w: unknown placeholder %q at offset %d (known: %s)",
			ErrTemplate, s[i:end+1], i, Placeholders)
	}
	return ph, end, nil
}

// truncate shortens s to at most n bytes, marking the cut, for error messages.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Append renders the template with f and appends the result to dst.
// {body_sha256} is the lowercase hex SHA-256 of f.Body, computed at most once.
func (t *Template) Append(dst []byte, f Fields) []byte {
	var sum [sha256.Size]byte
	summed := false
	for _, sg := range t.segs {
		switch sg.ph {
		case phLiteral:
			dst = append(dst, sg.lit...)
		case phTimestamp:
			dst = append(dst, f.Timestamp...)
		case phNonce:
			dst = append(dst, f.Nonce...)
		case phMethod:
			dst = append(dst, f.Method...)
		case phPath:
			dst = append(dst, f.Path...)
		case phQuery:
			dst = append(dst, f.Query...)
		case phBody:
			dst = append(dst, f.Body...)
		case phBodySHA256:
			if !summed {
				sum, summed = sha256.Sum256(f.Body), true
			}
			dst = hex.AppendEncode(dst, sum[:])
		case phIdempotencyKey:
			dst = append(dst, f.IdempotencyKey...)
		}
	}
	return dst
}

// Uses reports whether the template contains the placeholder, given by name
// with or without braces ("body" or "{body}"). Unknown names report false.
func (t *Template) Uses(name string) bool {
	ph, ok := lookupPlaceholder(strings.TrimSuffix(strings.TrimPrefix(name, "{"), "}"))
	return ok && t.uses&(1<<ph) != 0
}

// Constant reports whether the template holds no placeholder: it renders
// to the same string for every request, so a signature of it would be the
// same for every request too.
func (t *Template) Constant() bool {
	return t.uses == 0
}

// needsBody reports whether rendering needs the request body.
func (t *Template) needsBody() bool {
	return t.uses&(1<<phBody|1<<phBodySHA256) != 0
}

// String returns the template in the escaped form ParseTemplate accepts;
// parsing it again yields a template that renders identically.
func (t *Template) String() string {
	var b strings.Builder
	for _, sg := range t.segs {
		if sg.ph != phLiteral {
			b.WriteString("{" + placeholderName(sg.ph) + "}")
			continue
		}
		for i := 0; i < len(sg.lit); i++ {
			switch c := sg.lit[i]; c {
			case '\n':
				b.WriteString(`\n`)
			case '\\', '{':
				b.WriteByte('\\')
				b.WriteByte(c)
			default:
				b.WriteByte(c)
			}
		}
	}
	return b.String()
}
