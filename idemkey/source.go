package idemkey

import (
	"errors"
	"fmt"
	"net/textproto"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultSources is the default of IDEMPROXY_KEY_SOURCES (docs/keys.md).
const DefaultSources = "json:order_id"

// ErrInvalidSource is wrapped by every error [ParseSources] returns.
var ErrInvalidSource = errors.New("invalid key source")

// Kind is where a [Source] reads its value from. The zero Kind is invalid.
type Kind uint8

// The kinds of IDEMPROXY_KEY_SOURCES entries (docs/keys.md).
const (
	JSON   Kind = iota + 1 // a field of a JSON object body, by dotted path
	Form                   // a field of an application/x-www-form-urlencoded body
	Header                 // a request header
	Query                  // a query parameter
)

var kindNames = [...]string{JSON: "json", Form: "form", Header: "header", Query: "query"}

// String returns the kind as written in IDEMPROXY_KEY_SOURCES ("json", "form",
// "header", "query"), or "Kind(n)" for an invalid kind.
func (k Kind) String() string {
	if k >= JSON && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Source is one place a key may be derived from. For JSON, Name is a dotted
// path through nested objects ("payment.order_id"); for Header it is the
// canonical header name; for Form and Query it is the field name. The zero
// Source is invalid; build Sources with [ParseSources].
type Source struct {
	Kind Kind
	Name string
}

// String returns the source in IDEMPROXY_KEY_SOURCES syntax ("json:order_id");
// [ParseSources] of it gives the Source back.
func (s Source) String() string {
	return s.Kind.String() + ":" + s.Name
}

// ParseSources parses IDEMPROXY_KEY_SOURCES: a comma list of json:<dotted.path>,
// form:<field>, header:<Name> and query:<name>, tried in that order by [Derive].
// Spaces around entries and around the name are ignored and kinds are
// case-insensitive. An empty string, an empty entry, an unknown kind, an empty
// name, a name with whitespace or control characters, a dotted path with an
// empty segment ("a..b", ".a", "a."), a header name that is not an RFC 9110
// token and a name holding another source after ; or | ("json:a;header:B",
// a list written with another separator) are errors that name the bad entry
// and wrap [ErrInvalidSource].
func ParseSources(s string) ([]Source, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%w: no sources", ErrInvalidSource)
	}
	entries := strings.Split(s, ",")
	out := make([]Source, 0, len(entries))
	for i, e := range entries {
		src, err := parseSource(strings.TrimSpace(e))
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d %q: %s", ErrInvalidSource, i+1, e, err.Error())
		}
		out = append(out, src)
	}
	return out, nil
}

// parseSource parses one trimmed entry. Its errors are bare reasons;
// ParseSources adds the entry.
func parseSource(e string) (Source, error) {
	if e == "" {
		return Source{}, errors.New("empty entry")
	}
	kindText, name, found := strings.Cut(e, ":")
	if !found {
		return Source{}, errors.New(`want <kind>:<name>, e.g. "json:order_id"`)
	}
	kind, err := parseKind(strings.TrimSpace(kindText))
	if err != nil {
		return Source{}, err
	}
	name = strings.TrimSpace(name)
	if err := checkSeparators(name); err != nil {
		return Source{}, err
	}
	if err := checkName(kind, name); err != nil {
		return Source{}, err
	}
	if kind == Header {
		// Header.Get canonicalises anyway; storing the canonical form makes
		// String() show what is matched.
		name = textproto.CanonicalMIMEHeaderKey(name)
	}
	return Source{Kind: kind, Name: name}, nil
}

// checkSeparators refuses a name that holds another source after a
// separator other than the comma ("json:order_id;header:X-Order-Id",
// "json:order_id|query:id"): it would be one source, a field of that whole
// name that no request has, so that no request gets a key from either, and
// with MISSING_KEY=generate every retry of an order would get a new key.
func checkSeparators(name string) error {
	for _, sep := range []string{";", "|"} {
		parts := strings.Split(name, sep)
		for _, p := range parts[1:] {
			kindText, rest, ok := strings.Cut(strings.TrimSpace(p), ":")
			if _, err := parseKind(strings.TrimSpace(kindText)); ok && err == nil && strings.TrimSpace(rest) != "" {
				return fmt.Errorf("name holds %q and then another source (%s): separate sources with commas", sep, strings.TrimSpace(p))
			}
		}
	}
	return nil
}

func parseKind(s string) (Kind, error) {
	for k := JSON; int(k) < len(kindNames); k++ {
		if strings.EqualFold(s, kindNames[k]) {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown kind %q (want json, form, header or query)", s)
}

// checkName validates a source name for its kind.
func checkName(kind Kind, name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	if !utf8.ValidString(name) {
		return errors.New("name is not valid UTF-8")
	}
	for _, r := range name {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return errors.New("whitespace or control character in name")
		}
	}
	switch kind {
	case JSON:
		for seg := range strings.SplitSeq(name, ".") {
			if seg == "" {
				return errors.New("empty segment in dotted path")
			}
		}
	case Header:
		// RFC 9110 §5.1: field-name = token.
		for i := 0; i < len(name); i++ {
			if !isTchar(name[i]) {
				return fmt.Errorf("header name has %q, not a token character", name[i])
			}
		}
	}
	return nil
}

// isTchar reports whether c is an RFC 9110 §5.6.2 tchar.
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
