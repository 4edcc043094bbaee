package idemkey

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// MaxLen is the longest idempotency key accepted or produced: providers cap
// keys at 255 characters (the payouts provider's limit).
const MaxLen = 255

// HeaderName is the request and response header that carries the key
// (docs/keys.md).
const HeaderName = "Idempotency-Key"

// ErrInvalidKey is wrapped by every error [FromHeader] returns; the wrapping
// text gives the reason but never the key itself.
var ErrInvalidKey = errors.New("invalid idempotency key")

// FromHeader returns the client's Idempotency-Key: a bare token (what legacy
// clients send, typically a UUID) or an RFC 8941 sf-string ("\"abc\"", with \"
// and \\ escapes), which is what the IETF httpapi Idempotency-Key draft
// specifies. present is false, and err nil, when the header is absent.
//
// When the header is present, err wraps [ErrInvalidKey] if the key is empty,
// longer than [MaxLen], contains a control, non-ASCII or (unquoted) whitespace
// character, begins or ends with a space (quoted: no header can carry it), is a malformed sf-string (bad escape, missing closing quote,
// anything after it, including sf parameters), or if several header lines or
// comma-separated members carry keys that differ. Identical repeats are
// accepted: an intermediary may have duplicated or folded the header (RFC 9110
// §5.3). A consequence is that an unquoted key cannot contain a comma.
func FromHeader(h http.Header) (key string, present bool, err error) {
	lines := h.Values(HeaderName)
	if len(lines) == 0 {
		return "", false, nil
	}
	seen := false
	for _, line := range lines {
		for rest, more := line, true; more; {
			var member string
			member, rest, more = cutMember(rest)
			k, err := parseKey(strings.Trim(member, " \t"))
			if err != nil {
				return "", true, err
			}
			if seen && k != key {
				return "", true, invalidKey("multiple values that differ")
			}
			key, seen = k, true
		}
	}
	return key, true, nil
}

// HeaderValue is key written as an Idempotency-Key field value that
// [FromHeader] reads back as key: key itself when it reads back bare, else
// key as an RFC 8941 sf-string. Only a key the app sent quoted, with a
// space, a '"' or a ',' in it (`"pay 7, retry"`), is answered quoted: bare,
// the value the app keeps from the answer and sends back (docs/keys.md) was
// two members, or whitespace in an unquoted key, and refused 400.
func HeaderValue(key string) string {
	for i := 0; i < len(key); i++ {
		switch key[i] {
		case ' ', '"', ',':
			return `"` + sfEscaper.Replace(key) + `"`
		}
	}
	return key
}

var sfEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`)

func invalidKey(reason string) error {
	return fmt.Errorf("%w: %s", ErrInvalidKey, reason)
}

// cutMember splits s at its first comma outside an sf-string.
func cutMember(s string) (member, rest string, found bool) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++ // skip the escaped byte; parseKey validates it
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// parseKey parses one trimmed member: an sf-string or a bare token.
func parseKey(s string) (string, error) {
	var (
		key string
		err error
	)
	if strings.HasPrefix(s, `"`) {
		key, err = parseSFString(s)
	} else {
		key, err = parseBare(s)
	}
	switch {
	case err != nil:
		return "", err
	case key == "":
		return "", invalidKey("empty")
	case len(key) > MaxLen:
		return "", invalidKey(fmt.Sprintf("longer than %d characters", MaxLen))
	case key[0] == ' ' || key[len(key)-1] == ' ':
		// Only an sf-string can get here. An HTTP field value has no
		// leading or trailing white space (RFC 9110 §5.5): written as the
		// header sent upstream and answered, such a key loses it, so the
		// provider and the app would know it as another key's spelling
		// (" k " and "k" two records here, one key upstream).
		return "", invalidKey("space at the start or end of a quoted key")
	}
	return key, nil
}

func parseBare(s string) (string, error) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ' ' || c == '\t':
			return "", invalidKey("whitespace in an unquoted key")
		case c == '"':
			return "", invalidKey("quote inside an unquoted key")
		default:
			if err := checkPrintable(c); err != nil {
				return "", err
			}
		}
	}
	return s, nil
}

// parseSFString decodes an RFC 8941 §3.3.3 sf-string that must make up all of s.
func parseSFString(s string) (string, error) {
	escaped := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			// RFC 8941 §4.2.5: only \" and \\ are escapes; anything else fails parsing.
			if i+1 >= len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return "", invalidKey("malformed sf-string: bad escape")
			}
			i++
			escaped = true
		case '"':
			if i != len(s)-1 {
				return "", invalidKey("malformed sf-string: characters after the closing quote")
			}
			if !escaped {
				return s[1:i], nil
			}
			return unescapeSF(s[1:i]), nil
		default:
			if err := checkPrintable(c); err != nil {
				return "", err
			}
		}
	}
	return "", invalidKey("malformed sf-string: no closing quote")
}

// unescapeSF removes the backslashes of an already validated sf-string body.
func unescapeSF(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// checkPrintable accepts printable ASCII (%x20-7E); RFC 8941 sf-strings allow
// nothing else, and a key outside it would not survive every provider and log.
func checkPrintable(c byte) error {
	switch {
	case c >= 0x80:
		return invalidKey("non-ASCII character")
	case c < 0x20 || c == 0x7f:
		return invalidKey("control character")
	}
	return nil
}
