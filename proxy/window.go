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
	"github.com/idemproxy/idemproxy/ratelimit"
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
// be at least the window. A request that would anchor decides again under
// the fingerprint's lock (a mutex in the process, a lock record in the
// store across replicas) by the store's clock, so that replicas never anchor
// two periods for one operation (see windowKey).
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
//
// Most requests join an operation anchored already: reads only, by this
// process's clock. A request that would anchor one decides again under the
// fingerprint's lock record (lockWindow), by the store's clock read as the
// lock is taken: replicas whose clocks differ, or two requests on each side
// of a period boundary on two replicas, would otherwise anchor two periods,
// and the provider would execute the operation twice.
func (h *Handler) windowKey(ctx context.Context, tenant string, fp [32]byte, window time.Duration) (string, error) {
	defer h.windows.lock(fp)()
	if _, key, joined, err := h.joinWindow(ctx, tenant, fp, window, h.opt.Now()); err != nil || joined {
		return key, err
	}
	now, held, unlock, err := h.lockWindow(ctx, tenant, fp, window)
	if err != nil {
		return "", err
	}
	defer unlock()
	last, key, joined, err := h.joinWindow(ctx, tenant, fp, window, now)
	if err != nil || joined {
		return key, err
	}
	period := idemkey.WindowPeriod(now, window)
	if !last.found {
		if last, err = h.readAnchor(ctx, tenant, fp, window, period-2); err != nil {
			return "", err
		}
	}
	key = idemkey.WindowKey(fp, window, period, tenant)
	if last.found {
		open, err := h.unsettled(ctx, tenant, last.key)
		if err != nil {
			return "", err
		}
		if open {
			key = last.key
		}
	}
	// The lock is not renewed: past the end of its lease another replica
	// may hold it and have anchored the next period for this operation
	// under another key. Deciding on, this request would anchor its own
	// period too and send the operation a second time under its own key.
	// So the anchor is made only while the lock is surely this request's:
	// past its end nothing is anchored and nothing sent, and an anchor
	// whose claim reaches the store only after it is undone by the store
	// (its caller gone, see pgstore's orphaned claims).
	if !time.Now().Before(held) {
		return "", storeError{fmt.Errorf("%w: the fingerprint window's lock outlived its lease of %v while deciding (the store's answers too slow); nothing anchored", store.ErrUnavailable, windowLockLease)}
	}
	actx, cancel := context.WithDeadline(ctx, held)
	defer cancel()
	named, err := h.anchor(actx, anchorID(tenant, fp, window, period), fp, key)
	if named == "" { // anchored first by an earlier version, naming no operation
		named = idemkey.WindowKey(fp, window, period, tenant)
	}
	return named, err
}

// joinWindow returns the key of the operation a request at now belongs to,
// if one is anchored (joined): the previous period's, if its first request
// came less than a window ago, else its own period's. An anchor read with
// the store's clock (Record.ReadAt) is judged by it rather than by now. prev
// is what the previous period's anchor says.
func (h *Handler) joinWindow(ctx context.Context, tenant string, fp [32]byte, window time.Duration, now time.Time) (prev anchorRef, key string, joined bool, err error) {
	period := idemkey.WindowPeriod(now, window)
	for _, p := range [...]int64{period - 1, period} {
		ref, err := h.readAnchor(ctx, tenant, fp, window, p)
		if err != nil {
			return prev, "", false, err
		}
		if p < period {
			prev = ref
		}
		at := now
		if !ref.readAt.IsZero() {
			at = ref.readAt
		}
		if ref.found && at.Sub(ref.at) < window {
			return prev, ref.key, true, nil
		}
	}
	return prev, "", false, nil
}

// windowLockLease bounds how long a replica that stopped while deciding a
// fingerprint's anchor holds the others' decisions for it.
const windowLockLease = 10 * time.Second

// lockWindow takes the lock record of fingerprint fp's window, which
// serialises anchoring across replicas sharing the store as h.windows does
// within the process, and returns the store's time at the claim (this
// process's for a store that gives none), the end of the lock's lease as
// this process knows it (a lease after the claim was sent, by the monotonic
// clock: before the store's own end of it) and the function that releases it.
// While another replica holds it, it waits, reading, as for a key in flight,
// up to InflightWait: then 409, nothing sent.
func (h *Handler) lockWindow(ctx context.Context, tenant string, fp [32]byte, window time.Duration) (time.Time, time.Time, func(), error) {
	id := anchorID(tenant, fp, window, 0)
	id.Key += "/lock"
	owner := newOwner()
	deadline := h.opt.Now().Add(h.opt.InflightWait)
	for {
		claimed := time.Now()
		rec, created, err := h.opt.Store.Begin(ctx, id, store.Request{Fingerprint: fp[:]}, owner, windowLockLease)
		if err != nil {
			return time.Time{}, time.Time{}, nil, storeError{err}
		}
		if created {
			now := rec.ReadAt
			if now.IsZero() {
				now = h.opt.Now()
			}
			return now, claimed.Add(windowLockLease), func() {
				// Also when the client has gone: left held, the lock would
				// hold the fingerprint's next request for a lease.
				h.opt.Store.Abandon(context.WithoutCancel(ctx), id, owner)
			}, nil
		}
		// Held for a few statements: read it again every few milliseconds
		// until it is released, or its lease ran out by the store's clock
		// (a replica that stopped holding it).
		for rec.LeaseLive(h.opt.Now()) {
			if !h.opt.Now().Before(deadline) {
				return time.Time{}, time.Time{}, nil, h.inProgress
			}
			if err := ratelimit.SleepContext(ctx, windowLockPoll); err != nil {
				return time.Time{}, time.Time{}, nil, err
			}
			if rec, err = h.opt.Store.Get(ctx, id); errors.Is(err, store.ErrNotFound) {
				break
			} else if err != nil {
				return time.Time{}, time.Time{}, nil, storeError{err}
			}
		}
	}
}

// windowLockPoll is how often a request waiting for a fingerprint's lock
// reads it.
const windowLockPoll = 5 * time.Millisecond

// anchorRef is what a period's anchor says: when the period's first request
// came, and the key of the operation the period belongs to.
type anchorRef struct {
	found  bool
	at     time.Time
	key    string
	readAt time.Time // the store's clock at the read (Record.ReadAt), if it gives one
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
	ref.found, ref.at, ref.readAt = true, rec.CreatedAt, rec.ReadAt
	if rec.UpstreamKey != "" {
		ref.key = rec.UpstreamKey
	}
	return ref, nil
}

// unsettled says whether the operation key of tenant is in flight, its
// outcome unknown, or its answer awaits a person's review (needs_review, not
// yet marked reviewed: it may have been carried out, and is never to be
// repeated): one that a request must resume or replay rather than replace.
func (h *Handler) unsettled(ctx context.Context, tenant, key string) (bool, error) {
	if tenant == "" {
		tenant = DefaultTenant
	}
	rec, found, err := h.lookup(ctx, store.ID{Tenant: tenant, Key: key})
	return found && (rec.State == store.InFlight || rec.State == store.Unknown || rec.AwaitsReview()), err
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
