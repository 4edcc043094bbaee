package proxy

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/routes"
	"github.com/idemproxy/idemproxy/store"
)

// keyPath is escaped, a request's escaped path, in the normal form of RFC
// 3986 §6.2.2.1 and §6.2.2.2: a percent-encoded unreserved character (ALPHA,
// DIGIT, "-", ".", "_", "~") decoded, every other escape in upper-case hex.
// Spellings with the same normal form are one resource to every server that
// decodes its paths (/v1/p%61yments is /v1/payments, /cards/a%2fb is
// /cards/a%2Fb), so a key derived from an order's source is derived over it:
// otherwise an app that spells the path one way and its retry another (a
// client library that encodes "~", a hand-built URL) would send one order
// under two keys, and the provider would execute it twice. An encoded
// reserved character stays encoded: /cards/a%2Fb and /cards/a/b are two
// resources.
//
// Repeated slashes are one and a trailing slash is dropped (/payments/,
// //payments and /v1//payout are /payments and /v1/payout): the routers of
// most providers' frameworks read them so (Rails and Spring merge repeated
// slashes; Rails, ASP.NET Core, Express and Spring before 6 ignore a
// trailing one; routes.Table.Match reads a rule's path the same way), and
// an app whose base URL gained or lost a slash between an order and its
// retry had the order executed once per spelling. A path without '%', a
// repeated slash or a trailing slash is its own normal form.
func keyPath(escaped string) string {
	if normalPath(escaped) {
		return escaped
	}
	var b strings.Builder
	b.Grow(len(escaped))
	for i := 0; i < len(escaped); i++ {
		c := escaped[i]
		switch {
		case c == '/' && i > 0 && escaped[i-1] == '/':
			continue // a repeated slash (a decoded escape is never one)
		case c != '%' || i+2 >= len(escaped) || !isHex(escaped[i+1]) || !isHex(escaped[i+2]):
			b.WriteByte(c)
			continue
		}
		if d := unhex(escaped[i+1])<<4 | unhex(escaped[i+2]); isUnreserved(d) {
			b.WriteByte(d)
		} else {
			b.WriteByte('%')
			b.WriteByte(upperHex(escaped[i+1]))
			b.WriteByte(upperHex(escaped[i+2]))
		}
		i += 2
	}
	p := b.String()
	if len(p) > 1 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	return p
}

// normalPath reports whether escaped is its own normal form (keyPath): no
// '%', no repeated slash and no trailing slash (but for "/"). Nearly every
// request's path is.
func normalPath(escaped string) bool {
	for i := 0; i < len(escaped); i++ {
		switch escaped[i] {
		case '%':
			return false
		case '/':
			if i > 0 && escaped[i-1] == '/' || i == len(escaped)-1 && i > 0 {
				return false
			}
		}
	}
	return true
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

func upperHex(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}

// isUnreserved reports an RFC 3986 §2.3 unreserved character.
func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// derivationPath is the path the key of r (a protected request whose path,
// r.Path, is not in its normal form) is derived over under rule: its normal
// form (keyPath), unless a record exists under the key derived over the path
// as it came, which is what versions before keyPath derived. Such a record
// (stored, in flight, or unknown since before an upgrade) stays the order's,
// so that its retry is replayed or resumed under its key instead of sent
// again under a new one. Only a key derived from a source can have one
// (parsed is r's body read for rule's sources: idemkey.Parse); a store that
// cannot be read is a storeError (503, nothing sent).
func (h *Handler) derivationPath(ctx context.Context, r idemkey.Request, parsed *idemkey.Parsed, rule routes.Rule, tenant string) (string, error) {
	normal := keyPath(r.Path)
	if _, present, _ := idemkey.FromHeader(r.Header); present || rule.Policy != routes.Key {
		return normal, nil
	}
	key, _, ok := parsed.Derive(r)
	if !ok {
		return normal, nil
	}
	_, err := h.opt.Store.Get(ctx, store.ID{Tenant: tenant, Key: key})
	switch {
	case err == nil:
		return r.Path, nil
	case errors.Is(err, store.ErrNotFound):
		return normal, nil
	}
	h.opt.Logger.Error("looking up the record of a path's earlier spelling failed; nothing sent, key left free", "path", r.Path, "err", err)
	return "", storeError{err}
}

// windowFingerprint is the fingerprint a fingerprint window rule keys the
// operation of r by (r.Path in its normal form, keyPath; fp is r's
// fingerprint over the path as it came): one whose path spellings are one
// resource is one operation, in one window under one key. The record keeps
// fp, so a second spelling is 409 idempotency_conflict, nothing sent. A
// window that versions before keyPath anchored under fp, in one of the
// periods windowKey reads, stays the operation's, so that a retry across an
// upgrade resumes or replays it instead of starting another.
func (h *Handler) windowFingerprint(ctx context.Context, r idemkey.Request, fp [32]byte, window time.Duration) ([32]byte, error) {
	r.Path = keyPath(r.Path)
	normal := idemkey.Fingerprint(r)
	if normal == fp {
		return fp, nil
	}
	period := idemkey.WindowPeriod(h.opt.Now(), window)
	for p := period; p >= period-2; p-- {
		_, found, err := h.lookup(ctx, anchorID(r.Tenant, fp, window, p))
		if err != nil {
			return fp, err
		}
		if found {
			return fp, nil
		}
	}
	return normal, nil
}

// clientKey is the key of a request whose app sent key in its Idempotency-Key
// header, for tenant ("" for DefaultTenant): key in its canonical spelling
// (idemkey.Canonical: a UUID in lower case without braces, the form of the
// keys idemproxy derives and generates), so that a key given back upper-cased
// by a uniqueidentifier column is the operation it names, not a second one
// at the provider. Versions before idemkey.Canonical kept a key as it came:
// when no record exists under the canonical spelling and one does under key
// as it came (stored, in flight or unknown since before an upgrade), key
// stays the operation's, so that its retry is replayed or resumed under it
// instead of sent again under another. A key already canonical, or not a
// UUID, costs no lookup. A store that cannot be read is a storeError (503,
// nothing sent).
func (h *Handler) clientKey(ctx context.Context, tenant, key string) (string, error) {
	canon := idemkey.Canonical(key)
	if canon == key {
		return key, nil
	}
	if tenant == "" {
		tenant = DefaultTenant
	}
	for _, k := range []string{canon, key} {
		_, found, err := h.lookup(ctx, store.ID{Tenant: tenant, Key: k})
		if err != nil {
			h.opt.Logger.Error("looking up the record of a key's other spelling failed; nothing sent, key left free", "key", key, "err", err)
			return "", err
		}
		if found {
			return k, nil
		}
	}
	return canon, nil
}
