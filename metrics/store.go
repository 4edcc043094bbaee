package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/proxy"
)

// Store is what InstrumentedStore wraps: the proxy's record store and the
// readiness probe. *cache.Store implements it.
type Store interface {
	proxy.Store
	Ping(ctx context.Context) error
}

var (
	_ Store = (*cache.Store)(nil)
	_ Store = (*InstrumentedStore)(nil)
)

// InstrumentedStore is a Store that times every operation, counts failures,
// and keeps idemproxy_operations_in_flight and idemproxy_records_stored_total.
// It relies on the proxy's contract with the store: a Begin that creates a
// record is followed by a Complete that stores the final answer, or by an
// Abandon that releases the key (also after a failed Complete).
type InstrumentedStore struct {
	next Store
	m    *Metrics
	// Now is the clock for the timings; nil means time.Now.
	Now func() time.Time
}

// Store wraps next so that its operations feed m.
func (m *Metrics) Store(next Store) *InstrumentedStore {
	return &InstrumentedStore{next: next, m: m}
}

// Begin implements proxy.Store.
func (s *InstrumentedStore) Begin(ctx context.Context, id cache.ID, fp []byte, owner string, lease time.Duration) (cache.Record, bool, error) {
	defer s.observe("begin", s.now())
	rec, created, err := s.next.Begin(ctx, id, fp, owner, lease)
	s.fail("begin", err)
	if err == nil && created {
		s.m.operations.Inc()
	}
	return rec, created, err
}

// Complete implements proxy.Store.
func (s *InstrumentedStore) Complete(ctx context.Context, id cache.ID, owner string, resp cache.Response) error {
	defer s.observe("complete", s.now())
	err := s.next.Complete(ctx, id, owner, resp)
	s.fail("complete", err)
	if err == nil {
		s.m.operations.Dec()
		s.m.stored.Inc()
	}
	return err
}

// Abandon implements proxy.Store. The operation ends whether or not the
// release could be written: the record is no longer this process's.
func (s *InstrumentedStore) Abandon(ctx context.Context, id cache.ID, owner string) error {
	defer s.observe("abandon", s.now())
	err := s.next.Abandon(ctx, id, owner)
	s.fail("abandon", err)
	s.m.operations.Dec()
	return err
}

// Get implements proxy.Store. A missing record is an answer, not a failure.
func (s *InstrumentedStore) Get(ctx context.Context, id cache.ID) (cache.Record, error) {
	defer s.observe("get", s.now())
	rec, err := s.next.Get(ctx, id)
	if !errors.Is(err, cache.ErrNotFound) {
		s.fail("get", err)
	}
	return rec, err
}

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
	s.m.storeSeconds.WithLabelValues(op).Observe(s.now().Sub(start).Seconds())
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

// errorKind names the store's sentinel errors for the kind label.
func errorKind(err error) string {
	kinds := []struct {
		err  error
		kind string
	}{
		{cache.ErrNotOwner, "not_owner"},
		{cache.ErrNoSpace, "no_space"},
		{cache.ErrTooLarge, "too_large"},
		{cache.ErrClosed, "closed"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "canceled"},
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	return "other"
}
