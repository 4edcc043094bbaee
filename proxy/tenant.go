package proxy

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// ClientTokens authenticates legacy apps by a token header of idemproxy's own and
// names the tenant their records live under, so that one app can never receive
// an answer stored for another, even for the same order_id (docs/contract.md, Tenancy).
type ClientTokens struct {
	header  string
	byToken map[[32]byte]string // sha256(token) → client name
}

// DefaultClientHeader carries a client's token when IDEMPROXY_CLIENT_HEADER is unset.
const DefaultClientHeader = "Idemproxy-Client-Token"

// ParseClientTokens parses IDEMPROXY_CLIENT_TOKENS, a comma list of
// client=token; white space around a name or a token is not part of it. An
// empty list means authentication is off (nil, nil). Errors name the entry by
// position, never the token. A client may not be named DefaultTenant: that
// namespace holds the records stored while authentication was off. A name
// must print, and no two names may look alike (lookAlike): a client's name
// is its tenant, so one spelt two ways would be two clients.
func ParseClientTokens(header, list string) (*ClientTokens, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	if header == "" {
		header = DefaultClientHeader
	}
	c := &ClientTokens{header: textproto.CanonicalMIMEHeaderKey(header), byToken: map[[32]byte]string{}}
	for i, entry := range strings.Split(list, ",") {
		name, token, ok := strings.Cut(strings.TrimSpace(entry), "=")
		// White space around the token, as around the name ("a = token"),
		// is not part of it: HTTP drops it from every header value (RFC 9110
		// §5.5), so a token kept with it would match no request.
		name, token = strings.TrimSpace(name), strings.TrimSpace(token)
		switch {
		case !ok || name == "" || token == "":
			return nil, fmt.Errorf("entry %d: want client=token", i+1)
		case name == DefaultTenant:
			// Its records would be the ones stored without tokens, every
			// app's: that client would be replayed their answers, and its
			// orders would collide with their keys.
			return nil, fmt.Errorf("entry %d: the client name %q is reserved for the records stored without client tokens; give that client another name", i+1, name)
		case len(token) < 16:
			return nil, fmt.Errorf("entry %d (%s): token shorter than 16 characters", i+1, name)
		case strings.ContainsFunc(token, func(r rune) bool { return (r < ' ' && r != '\t') || r == 0x7f }):
			return nil, fmt.Errorf("entry %d (%s): token holds a control character, which no header carries", i+1, name)
		}
		if r, bad := unprintable(name); bad {
			return nil, fmt.Errorf("entry %d: the client name %q holds %U, a character that does not print: "+
				"the name would look like another one (a byte order mark at the start of a file does this); write it without", i+1, name, r)
		}
		for _, other := range c.byToken {
			if other != name && lookAlike(other, name) {
				// A token rotation written "app-a=old,App-A=new", or an
				// "app-a" retyped in another Unicode form, would move the
				// app to a new client: its stored answers and operations
				// in flight or unknown left behind, its orders sent
				// again under new keys, executed twice.
				return nil, fmt.Errorf("entry %d: the client name %q differs from %q only in letter case, white space or Unicode form: "+
					"they would be two clients, each with its own records and keys; name one client alike for each of its tokens, "+
					"and two clients so that they do not look alike", i+1, name, other)
			}
		}
		sum := sha256.Sum256([]byte(token))
		if _, dup := c.byToken[sum]; dup {
			return nil, fmt.Errorf("entry %d (%s): token used by another client", i+1, name)
		}
		c.byToken[sum] = name
	}
	return c, nil
}

// unprintable returns the first rune of name that does not print (a
// control, format or invisible character, or white space other than a
// space), if any.
func unprintable(name string) (rune, bool) {
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return r, true
		}
	}
	return 0, false
}

// lookAlike says whether two client names read as one: equal once in Unicode
// compatibility form (NFKC), with runs of white space as one space, and
// letter case folded.
func lookAlike(a, b string) bool {
	fold := func(s string) string { return strings.Join(strings.Fields(norm.NFKC.String(s)), " ") }
	return strings.EqualFold(fold(a), fold(b))
}

// ErrUnauthorized is the contract's 401: client authentication is on and failed.
var ErrUnauthorized = &Error{http.StatusUnauthorized, CodeUnauthorized, "missing or unknown client token"}

// Names are the clients' names, sorted, each once (a client may have more
// than one token, while it rotates them); nil for nil c (authentication off).
func (c *ClientTokens) Names() []string {
	if c == nil {
		return nil
	}
	var names []string
	for _, name := range c.byToken {
		names = append(names, name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Header is the request header that carries the token; idemproxy removes it
// before anything goes upstream.
func (c *ClientTokens) Header() string { return c.header }

// Tenant returns the client named by r's token. Tokens are compared by their
// SHA-256, so the lookup time says nothing about how much of a token matched.
func (c *ClientTokens) Tenant(r *http.Request) (string, error) {
	vals := r.Header.Values(c.header)
	if len(vals) != 1 {
		return "", ErrUnauthorized
	}
	name, ok := c.Holder(vals[0])
	if !ok {
		return "", ErrUnauthorized
	}
	return name, nil
}

// Holder returns the client whose token is token, if any (false for nil c).
func (c *ClientTokens) Holder(token string) (name string, ok bool) {
	if c == nil {
		return "", false
	}
	name, ok = c.byToken[sha256.Sum256([]byte(token))]
	return name, ok
}
