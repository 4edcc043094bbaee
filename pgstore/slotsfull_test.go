package pgstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestCallsWaitForPooledConnectionWhenServerFull: other clients take every
// connection slot the server has left while the store holds two
// connections. Calls that find both busy must wait for one, within the call
// timeout, as they do when the pool is at its own size: the pool's new
// connection is refused (53300 too many clients), and each such call failed
// at once with store.ErrUnavailable (503 store_unavailable) though a pooled
// connection was free a few milliseconds later.
func TestCallsWaitForPooledConnectionWhenServerFull(t *testing.T) {
	c, dbURL := pgtest.Own(t, pgtest.Options{Settings: []string{"max_connections = 10", "superuser_reserved_connections = 0"}})
	ctx := context.Background()
	s := open(t, dbURL, time.Hour)
	id, req := store.ID{Key: "k"}, store.Request{Fingerprint: []byte("fp")}
	if _, _, err := s.Begin(ctx, id, req, "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 2 { // two connections in the pool
		wg.Go(func() { s.pool.Exec(ctx, `SELECT pg_sleep(0.05)`) })
	}
	wg.Wait()
	takeEverySlot(t, c, dbURL, 20)
	var failed atomic.Int64
	var first atomic.Value
	for range 16 {
		wg.Go(func() {
			for range 5 {
				if _, err := s.Get(ctx, id); err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 80 reads failed while the server had no slot left for a third connection (first: %v); want them to wait for the pool's two", n, first.Load())
	}
}
