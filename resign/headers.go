package resign

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ErrStaticHeaders is wrapped by every error ParseStaticHeaders returns.
var ErrStaticHeaders = errors.New("resign: invalid static headers")

// ParseStaticHeaders parses IDEMPROXY_STATIC_HEADERS: a comma-separated list
// of Name=value entries, e.g. "X-Public-Id=abc,X-Api-Version=2". Space around
// entries, names and values is trimmed; a value runs to the next comma, so it
// cannot contain one, but may contain "=". Names are canonicalized
// (x-public-id becomes X-Public-Id). The empty string (or only spaces) yields
// an empty, non-nil header.
//
// Errors wrap ErrStaticHeaders and name the bad entry by its 1-based position
// and, when it has one, its header name — never its value, because static
// headers are where credentials such as X-Public-Id or an API key live.
// Empty entries, a missing "=", an invalid name, an empty value or a value
// with control characters, and a name given twice are errors.
func ParseStaticHeaders(s string) (http.Header, error) {
	h := http.Header{}
	if strings.TrimSpace(s) == "" {
		return h, nil
	}
	for i, entry := range strings.Split(s, ",") {
		name, value, err := parseStaticEntry(entry)
		if err != nil && name != "" {
			return nil, fmt.Errorf("%w: entry %d (%s): %w", ErrStaticHeaders, i+1, name, err)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d: %w", ErrStaticHeaders, i+1, err)
		}
		if _, dup := h[name]; dup {
			return nil, fmt.Errorf("%w: entry %d (%s): header given twice", ErrStaticHeaders, i+1, name)
		}
		h[name] = []string{value}
	}
	return h, nil
}

// parseStaticEntry splits and checks one Name=value entry. On error it
// returns the canonical name when the name itself was valid, so the caller
// can say which header is wrong; the error text never contains the value.
func parseStaticEntry(entry string) (name, value string, err error) {
	entry = strings.TrimSpace(entry)
	if entry == "" {
		return "", "", errors.New("empty entry (stray comma?)")
	}
	name, value, ok := strings.Cut(entry, "=")
	if !ok {
		return "", "", errors.New(`missing "=" (want Name=value)`)
	}
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if err := CheckHeaderName(name); err != nil {
		return "", "", err
	}
	name = http.CanonicalHeaderKey(name)
	if value == "" {
		return name, "", errors.New("empty value")
	}
	if !validHeaderValue(value) {
		return name, "", errors.New("value contains control characters")
	}
	return name, value, nil
}

// CheckHeaderName explains why name is not a header field name (an RFC 9110
// token), or returns nil. It quotes only the offending character: a mistyped
// entry such as "Authorization: Bearer x=" has a credential in what parses as
// its name.
func CheckHeaderName(name string) error {
	if name == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return fmt.Errorf("invalid header name: character %q at offset %d not allowed", name[i], i)
		}
	}
	return nil
}

// isTokenChar reports whether c is an RFC 9110 §5.6.2 tchar.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// validHeaderValue reports whether s is a safe field value: no CR, LF, NUL or
// other control characters except horizontal tab (RFC 9110 §5.5), so a
// configured value can never split a header.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
