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
//
// The rule that matters most (never a new key for an operation whose outcome
// is unknown) outranks the window: when a request comes after the window and
// the fingerprint's last operation is still in flight or its outcome is
// unknown, the request resumes that operation with its key instead of
// starting a new one. Each anchor therefore names the operation its period
// belongs to (in its record's UpstreamKey, set when the anchor is made, so
// that it is readable from the first instant): its own period's key, or the
// key of the earlier operation it carried on. The last operation is found
// through the anchors of the two periods before the request's; a retry that
// comes later than that after the fingerprint's last request starts a new
// operation.

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
	prev, err := h.readAnchor(ctx, tenant, fp, window, period-1)
	if err != nil {
		return "", err
	}
	if prev.found && now.Sub(prev.at) < window {
		return prev.key, nil
	}
	own, err := h.readAnchor(ctx, tenant, fp, window, period)
	if err != nil || own.found {
		return own.key, err
	}
	last := prev
	if !last.found {
		if last, err = h.readAnchor(ctx, tenant, fp, window, period-2); err != nil {
			return "", err
		}
	}
	key := own.key
	if last.found {
		open, err := h.unsettled(ctx, tenant, last.key)
		if err != nil {
			return "", err
		}
		if open {
			key = last.key
		}
	}
	named, err := h.anchor(ctx, anchorID(tenant, fp, window, period), fp, key)
	if named == "" { // anchored first by an earlier version, naming no operation
		named = own.key
	}
	return named, err
}

// anchorRef is what a period's anchor says: when the period's first request
// came, and the key of the operation the period belongs to.
type anchorRef struct {
	found bool
	at    time.Time
	key   string
}

// readAnchor reads the anchor of period. Its key is the period's own window
// key when the anchor names none (an anchor made before anchors named their
// operation) or when there is no anchor.
func (h *Handler) readAnchor(ctx context.Context, tenant string, fp [32]byte, window time.Duration, period int64) (anchorRef, error) {
	ref := anchorRef{key: idemkey.WindowKey(fp, window, period, tenant)}
	rec, found, err := h.lookup(ctx, anchorID(tenant, fp, window, period))
	if !found {
		return ref, err
	}
	ref.found, ref.at = true, rec.CreatedAt
	if rec.UpstreamKey != "" {
		ref.key = rec.UpstreamKey
	}
	return ref, nil
}

// unsettled says whether the operation key of tenant is in flight or its
// outcome unknown: one that a request must resume rather than replace.
func (h *Handler) unsettled(ctx context.Context, tenant, key string) (bool, error) {
	if tenant == "" {
		tenant = DefaultTenant
	}
	rec, found, err := h.lookup(ctx, store.ID{Tenant: tenant, Key: key})
	return found && (rec.State == store.InFlight || rec.State == store.Unknown), err
}

// lookup reads id's record; found is false when there is none or the store
// failed (err, a storeError).
func (h *Handler) lookup(ctx context.Context, id store.ID) (rec store.Record, found bool, err error) {
	rec, err = h.opt.Store.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return rec, false, nil
	case err != nil:
		return rec, false, storeError{err}
	}
	return rec, true, nil
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

// anchor makes the anchor id, naming the operation key, unless another
// request made it first, and returns the key the anchor names ("" for an
// anchor that names none).
func (h *Handler) anchor(ctx context.Context, id store.ID, fp [32]byte, key string) (string, error) {
	owner := newOwner()
	rec, created, err := h.opt.Store.Begin(ctx, id, store.Request{Fingerprint: fp[:], UpstreamKey: key}, owner, anchorLease)
	if err != nil {
		return "", storeError{err}
	}
	if !created { // another request anchored this period first
		return rec.UpstreamKey, nil
	}
	if err := h.opt.Store.Complete(ctx, id, owner, store.Response{Status: http.StatusNoContent}, time.Time{}); err != nil {
		return "", storeError{err}
	}
	return key, nil
}
