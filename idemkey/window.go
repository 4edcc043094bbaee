package idemkey

import (
	"encoding/binary"
	"time"
)

// WindowKey returns the key of a request protected by a fingerprint window
// (IDEMPROXY_ROUTES policy fingerprint:<window>): a UUIDv5 over the request's
// [Fingerprint] fp, the window, the start of the window period that anchors
// the operation (a whole number of windows since the Unix epoch) and the
// tenant. Identical requests anchored to the same period get the same key;
// the same request anchored to a later period is a new operation with a new
// key that no provider has seen, even one that keeps keys for ever. Which
// period anchors a request is the caller's decision (see proxy).
func WindowKey(fp [32]byte, window time.Duration, period int64, tenant string) string {
	b := make([]byte, 0, 96+len(tenant))
	b = append(b, namespace[:]...)
	b = append(b, "idemproxy-window-v1"...)
	b = appendField(b, fp[:])
	b = binary.AppendVarint(b, int64(window))
	b = binary.AppendVarint(b, period)
	b = appendField(b, tenant)
	return nameUUID(b)
}

// WindowPeriod is the window period t falls in: floor(t / window) counted
// from the Unix epoch. window must be positive.
func WindowPeriod(t time.Time, window time.Duration) int64 {
	n, w := t.UnixNano(), int64(window)
	p := n / w
	if n%w < 0 { // floor, not truncation, before 1970
		p--
	}
	return p
}
