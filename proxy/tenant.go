package proxy

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
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
// namespace holds the records stored while authentication was off.
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
		sum := sha256.Sum256([]byte(token))
		if _, dup := c.byToken[sum]; dup {
			return nil, fmt.Errorf("entry %d (%s): token used by another client", i+1, name)
		}
		c.byToken[sum] = name
	}
	return c, nil
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
	name, ok := c.byToken[sha256.Sum256([]byte(vals[0]))]
	if !ok {
		return "", ErrUnauthorized
	}
	return name, nil
}
