package proxy

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/store"
)

// Fingerprint windows (route policy fingerprint:<window>, for legacy bodies
// that carry no identifier). Identical requests within the window of the first
// one are one operation; the same request after it is a new operation with a
// new key.
//
// A key is idemkey.WindowKey(fingerprint, window, period): time is cut into
// periods of one window, and an operation is anchored to the period its first
// request arrived in. A bare period would split two requests a second apart
// around a period boundary into two operations, so each period's first
// request leaves an anchor record (a final record under a key no client can
// send) holding its arrival time. A request first looks at the previous
// period's anchor: if it is younger than the window, the request belongs to
// that operation; otherwise it belongs to (and anchors, if first) its own
// period. Anchors are final records, so a crash, a restart or an abandoned
// attempt never loses one, and they live for IDEMPROXY_RECORD_TTL, which must
// be at least the window. In one process the look-up and the anchoring are
// serialised per fingerprint; across replicas on a shared store two identical
// requests arriving within milliseconds of each other exactly at a period
// boundary could still anchor two periods.

// anchorLease bounds the in-flight anchor record, which lives only between
// its Begin and Complete.
const anchorLease = 30 * time.Second

// windowLocks serialise anchoring per fingerprint within the process.
type windowLocks struct {
	stripes [64]sync.Mutex
}

func (l *windowLocks) lock(fp [32]byte) func() {
	m := &l.stripes[fp[0]%uint8(len(l.stripes))]
	m.Lock()
	return m.Unlock
}

// windowKey returns the key of a request with fingerprint fp under a
// fingerprint window rule, anchoring its operation if it is the first.
func (h *Handler) windowKey(ctx context.Context, tenant string, fp [32]byte, window time.Duration) (string, error) {
	defer h.windows.lock(fp)()
	now := h.opt.Now()
	period := idemkey.WindowPeriod(now, window)
	prev, err := h.anchorTime(ctx, anchorID(tenant, fp, window, period-1))
	if err != nil {
		return "", err
	}
	if !prev.IsZero() && now.Sub(prev) < window {
		return idemkey.WindowKey(fp, window, period-1, tenant), nil
	}
	if err := h.anchor(ctx, anchorID(tenant, fp, window, period), fp); err != nil {
		return "", err
	}
	return idemkey.WindowKey(fp, window, period, tenant), nil
}

// anchorID names the anchor of one period. The key starts with
// store.WindowAnchorPrefix, whose newline no Idempotency-Key a client sends
// can hold, so no client can reach it, and by which a store knows an anchor
// caught in flight by a crash for one (no operation to keep unknown).
func anchorID(tenant string, fp [32]byte, window time.Duration, period int64) store.ID {
	if tenant == "" {
		tenant = DefaultTenant
	}
	return store.ID{Tenant: tenant, Key: fmt.Sprintf("%s%s/%d/%d", store.WindowAnchorPrefix, hex.EncodeToString(fp[:]), int64(window), period)}
}

// anchorTime returns when the anchor id was made; the zero time if there is none.
func (h *Handler) anchorTime(ctx context.Context, id store.ID) (time.Time, error) {
	rec, err := h.opt.Store.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return time.Time{}, nil
	case err != nil:
		return time.Time{}, storeError{err}
	}
	return rec.CreatedAt, nil
}

// anchor makes sure the anchor id exists, final, and made now if it did not
// exist before.
func (h *Handler) anchor(ctx context.Context, id store.ID, fp [32]byte) error {
	owner := newOwner()
	_, created, err := h.opt.Store.Begin(ctx, id, store.Request{Fingerprint: fp[:]}, owner, anchorLease)
	if err != nil {
		return storeError{err}
	}
	if !created { // another request anchored this period first
		return nil
	}
	if err := h.opt.Store.Complete(ctx, id, owner, store.Response{Status: http.StatusNoContent}, time.Time{}); err != nil {
		return storeError{err}
	}
	return nil
}
