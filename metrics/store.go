package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
)

var (
	_ store.Store = (*InstrumentedStore)(nil)
	_ proxy.Store = (*InstrumentedStore)(nil)
)

// InstrumentedStore is a Store that times every operation, counts failures,
// and keeps idemproxy_operations_in_flight and idemproxy_records_stored_total.
// It relies on the proxy's contract with the store: a Begin that creates a
// record is followed by a Complete that stores the final answer, or by an
// Abandon that releases the key (also after a failed Complete).
type InstrumentedStore struct {
	next store.Store
	m    *Metrics
	// Now is the clock for the timings; nil means time.Now.
	Now func() time.Time
}

// Store wraps next so that its operations feed m.
func (m *Metrics) Store(next store.Store) *InstrumentedStore {
	return &InstrumentedStore{next: next, m: m}
}

// Begin implements proxy.Store.
func (s *InstrumentedStore) Begin(ctx context.Context, id store.ID, req store.Request, owner string, lease time.Duration) (store.Record, bool, error) {
	defer s.observe("begin", s.now())
	rec, created, err := s.next.Begin(ctx, id, req, owner, lease)
	s.fail("begin", err)
	if err == nil && created {
		s.m.operations.Inc()
		if !rec.Outcome.IsZero() { // an unknown operation resumed
			s.m.unknownStale.Store(true)
		}
	}
	return rec, created, err
}

// Complete implements proxy.Store.
func (s *InstrumentedStore) Complete(ctx context.Context, id store.ID, owner string, resp store.Response, sent time.Time) error {
	defer s.observe("complete", s.now())
	err := s.next.Complete(ctx, id, owner, resp, sent)
	s.fail("complete", err)
	if err == nil {
		s.m.operations.Dec()
		s.m.stored.Inc()
		if resp.NeedsReview() { // scanned once, with the store, when the caller asked WithReview
			s.m.needsReview.Inc()
		}
	}
	return err
}

// Abandon implements proxy.Store. The operation ends whether or not the
// release could be written: the record is no longer this process's.
func (s *InstrumentedStore) Abandon(ctx context.Context, id store.ID, owner string) error {
	defer s.observe("abandon", s.now())
	err := s.next.Abandon(ctx, id, owner)
	s.fail("abandon", err)
	s.m.operations.Dec()
	return err
}

// Get implements proxy.Store. A missing record is an answer, not a failure.
func (s *InstrumentedStore) Get(ctx context.Context, id store.ID) (store.Record, error) {
	defer s.observe("get", s.now())
	rec, err := s.next.Get(ctx, id)
	if !errors.Is(err, store.ErrNotFound) {
		s.fail("get", err)
	}
	return rec, err
}

// Renew implements store.Store.
func (s *InstrumentedStore) Renew(ctx context.Context, id store.ID, owner string, lease time.Duration) error {
	defer s.observe("renew", s.now())
	err := s.next.Renew(ctx, id, owner, lease)
	s.fail("renew", err)
	return err
}

// Park implements store.Store. Like Abandon, it ends the operation.
func (s *InstrumentedStore) Park(ctx context.Context, id store.ID, owner string, o store.Outcome) error {
	defer s.observe("park", s.now())
	err := s.next.Park(ctx, id, owner, o)
	s.fail("park", err)
	s.m.operations.Dec()
	s.m.unknownStale.Store(true)
	return err
}

// List implements store.Store; an operator's call, timed like the others.
func (s *InstrumentedStore) List(ctx context.Context, f store.Filter, cursor string, limit int) ([]store.Record, string, error) {
	defer s.observe("list", s.now())
	recs, next, err := s.next.List(ctx, f, cursor, limit)
	if !errors.Is(err, store.ErrBadCursor) {
		s.fail("list", err)
	}
	return recs, next, err
}

// Supersede implements store.Store.
func (s *InstrumentedStore) Supersede(ctx context.Context, id store.ID, owner string) (store.Record, error) {
	defer s.observe("supersede", s.now())
	rec, err := s.next.Supersede(ctx, id, owner)
	if !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrNotFinal) && !errors.Is(err, store.ErrNotOwner) &&
		!errors.Is(err, store.ErrSuperseded) {
		s.fail("supersede", err)
	}
	return rec, err
}

// Discard implements store.Store; an operator's call. The unknown records
// are counted again at the next scrape.
func (s *InstrumentedStore) Discard(ctx context.Context, id store.ID) (store.Record, error) {
	defer s.observe("discard", s.now())
	rec, err := s.next.Discard(ctx, id)
	if !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrReadable) {
		s.fail("discard", err)
	}
	s.m.unknownStale.Store(true)
	return rec, err
}

// Reviewed implements store.Store; an operator's call.
func (s *InstrumentedStore) Reviewed(ctx context.Context, id store.ID) (store.Record, bool, error) {
	defer s.observe("reviewed", s.now())
	rec, marked, err := s.next.Reviewed(ctx, id)
	if !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrNotFinal) && !errors.Is(err, store.ErrNoReview) {
		s.fail("reviewed", err)
	}
	return rec, marked, err
}

// MaxBodyBytes implements store.Store.
func (s *InstrumentedStore) MaxBodyBytes() int64 { return s.next.MaxBodyBytes() }

// Close implements store.Store.
func (s *InstrumentedStore) Close() error { return s.next.Close() }

// Ping checks that the store is writable (readiness).
func (s *InstrumentedStore) Ping(ctx context.Context) error {
	defer s.observe("ping", s.now())
	err := s.next.Ping(ctx)
	s.fail("ping", err)
	return err
}

// observe records op's duration since start; callers defer it with the
// start time taken at the defer.
func (s *InstrumentedStore) observe(op string, start time.Time) {
	s.m.storeSecondsBy.get(op, "").Observe(s.now().Sub(start).Seconds())
}

func (s *InstrumentedStore) fail(op string, err error) {
	if err != nil {
		s.m.storeErrors.WithLabelValues(op, errorKind(err)).Inc()
	}
}

func (s *InstrumentedStore) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// errorKind names the store's sentinel errors for the kind label. A
// deadline that ran out (the store's call timeout, a readiness probe's or a
// lease renewal's bound) is the store not answering in time: unavailable,
// like the failures a store wraps in store.ErrUnavailable, so that an alert
// on kind="unavailable" also fires for a hung database with no traffic but
// the readiness probes. Only a cancelled context, a caller that went away
// (a client that left), is canceled.
func errorKind(err error) string {
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	return "other"
}

// errorKinds are errorKind's kinds by error, in the order it tries them.
var errorKinds = []struct {
	err  error
	kind string
}{
	{store.ErrNotOwner, "not_owner"},
	{store.ErrNoSpace, "no_space"},
	{store.ErrTooLarge, "too_large"},
	{store.ErrClosed, "closed"},
	{store.ErrUnavailable, "unavailable"},
	{context.Canceled, "canceled"},
	{context.DeadlineExceeded, "unavailable"},
}

// storeErrorKinds are every value errorKind returns.
var storeErrorKinds = []string{"not_owner", "no_space", "too_large", "closed", "unavailable", "canceled", "other"}

// Resolve implements store.Store; an operator's call. The unknown records
// are counted again at the next scrape.
func (s *InstrumentedStore) Resolve(ctx context.Context, id store.ID, resp *store.Response) (store.Record, error) {
	defer s.observe("resolve", s.now())
	rec, err := s.next.Resolve(ctx, id, resp)
	if !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrNotUnknown) {
		s.fail("resolve", err)
	}
	s.m.unknownStale.Store(true)
	if err == nil && resp != nil {
		s.m.stored.Inc()
		if resp.NeedsReview() {
			s.m.needsReview.Inc()
		}
	}
	return rec, err
}
