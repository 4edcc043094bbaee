package pgstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// Callers that leave while their read runs (a client hanging up while its
// request waits for a key in flight and polls the record, or an admin
// listing cut short) do not cost the database new sessions: the statement
// runs on with the store's own timeout and its connection goes back to the
// pool, while the caller is answered at once. Before, pgx cancelled the
// statement with the caller's context and dropped its connection, and the
// pool opened a new one: 200 waiters leaving reads held up behind a lock
// (for 50 ms each, over a second) made 160 new sessions on a pool of 8.
// Each read is still bounded by the call timeout.
func TestCallersLeavingReadsKeepConnections(t *testing.T) {
	url := pgtest.Database(t)
	ctx := context.Background()
	const poolSize = 8
	s, err := Open(ctx, Options{URL: url, MaxConns: poolSize, CallTimeout: 3 * time.Second, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := store.ID{Key: "k"}
	req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/v1/payments"}
	if _, created, err := s.Begin(ctx, id, req, "o", time.Hour); err != nil || !created {
		t.Fatalf("Begin = %v, %v", created, err)
	}
	if _, err := s.Get(ctx, id); err != nil {
		t.Fatal(err)
	}
	admin := session(t, url)

	before := s.pool.Stat().NewConnsCount()
	unlock := lockRecords(t, admin)
	const waiters = 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	var errs []error
	for i := range waiters {
		time.Sleep(5 * time.Millisecond)
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			var err error
			if i%10 == 9 {
				_, _, err = s.List(cctx, store.Filter{State: store.InFlight}, "", 10)
			} else {
				_, err = s.Get(cctx, id)
			}
			late := time.Since(mustDeadline(cctx))
			mu.Lock()
			defer mu.Unlock()
			slowest = max(slowest, late)
			if !errors.Is(err, context.DeadlineExceeded) {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	unlock()
	waitIdle(t, s, 5*time.Second)
	if _, err := s.Get(ctx, id); err != nil {
		t.Fatalf("Get after the waiters left: %v", err)
	}
	if n := s.pool.Stat().NewConnsCount() - before; n > poolSize {
		t.Errorf("%d waiters leaving reads held up behind a lock opened %d new connections, want at most the pool's %d", waiters, n, poolSize)
	}
	if len(errs) > 0 {
		t.Errorf("%d callers got another error than their context's deadline, first: %v", len(errs), errs[0])
	}
	if slowest > 500*time.Millisecond {
		t.Errorf("a caller that left was answered %v after its context ended, want at once", slowest)
	}

	// A read whose caller left still ends at the call timeout, and a
	// caller that stays is answered then.
	unlock = lockRecords(t, admin)
	defer unlock()
	left, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Get(left, id); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get of a caller that left = %v, want its deadline", err)
	}
	start := time.Now()
	if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrUnavailable) || time.Since(start) > 4*time.Second {
		t.Fatalf("Get behind a lock = %v after %v, want unavailable at the 3 s call timeout", err, time.Since(start))
	}
	waitIdle(t, s, 2*time.Second)
}

func mustDeadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}
