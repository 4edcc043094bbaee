package idemkey

import (
	"crypto/hmac"
	"crypto/sha256"

	"github.com/google/uuid"
)

// Bind returns the key sent upstream for key, the key client tenant's request
// uses (its own Idempotency-Key or a derived one), when several clients share
// idemproxy's provider credentials: a UUID (version 8) made from
// HMAC-SHA256(secret, tenant, key).
//
// Why: the provider deduplicates by key per API key, which every client
// shares. An unkeyed derivation, or a client's own key sent as it is, lets one
// client compute or claim another's upstream key and receive its operation.
// With a secret only idemproxy holds, no client can compute another's
// upstream key, and two clients' keys never meet upstream. The same secret
// gives the same keys on every replica and after every restart; a new secret
// gives new keys, so change it only while no operation is in flight.
func Bind(secret []byte, tenant, key string) string {
	mac := hmac.New(sha256.New, secret)
	b := appendField([]byte("idemproxy-upstream-key-v1"), tenant)
	b = appendField(b, key)
	mac.Write(b)
	var u uuid.UUID
	copy(u[:], mac.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8: custom (RFC 9562 §5.8)
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return u.String()
}
