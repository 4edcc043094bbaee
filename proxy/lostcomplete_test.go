package proxy_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// writeSpy is a real store that notes the owners the proxy parks or
// abandons records for; the calls themselves go to the store.
type writeSpy struct {
	store.Store
	mu       sync.Mutex
	parks    []string
	abandons []string
}

func (s *writeSpy) Park(ctx context.Context, id store.ID, owner string, o store.Outcome) error {
	s.mu.Lock()
	s.parks = append(s.parks, owner)
	s.mu.Unlock()
	return s.Store.Park(ctx, id, owner, o)
}

func (s *writeSpy) Abandon(ctx context.Context, id store.ID, owner string) error {
	s.mu.Lock()
	s.abandons = append(s.abandons, owner)
	s.mu.Unlock()
	return s.Store.Abandon(ctx, id, owner)
}

// TestCompleteAfterLostLeaseWritesNothing: the provider answers a final 201
// after another owner has taken the key over (the store's clock stepped
// past the lease, so no renewal saw it lost). Complete fails with
// store.ErrNotOwner; the proxy must then write nothing for the key, neither
// Park nor Abandon (the record is the new owner's, who answers the app's
// retry), and the app gets 503 store_unavailable with the attempt made, as
// proxy's unstored documents. The new owner's record stays exactly as its
// claim left it.
func TestCompleteAfterLostLeaseWritesNothing(t *testing.T) {
	clock := &steppable{}
	st, err := cache.Open(cache.Options{Dir: t.TempDir(), SyncWrites: true, TTL: 24 * time.Hour, GCInterval: -1, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	spy := &writeSpy{Store: st}
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.Store, o.Lease = spy, time.Minute // no renewal within the test
	})
	e.prov.hold = make(chan struct{})
	e.prov.entered = make(chan string, 1)
	first := e.goSend("POST", "/v1/payments", order)
	id := store.ID{Tenant: proxy.DefaultTenant, Key: <-e.prov.entered}

	mine, err := st.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	clock.step(time.Hour) // the store sees the lease over
	req := store.Request{Fingerprint: mine.Fingerprint, Method: mine.Method, Path: mine.Path, UpstreamKey: mine.UpstreamKey}
	theirs, created, err := st.Begin(context.Background(), id, req, "other-owner", time.Hour)
	if err != nil || !created || theirs.Fence != mine.Fence+1 {
		t.Fatalf("takeover by another owner = %+v created %v, %v", theirs, created, err)
	}

	close(e.prov.hold) // the provider answers 201 to the owner that lost the key
	a := <-first
	if a.err != nil || a.status != http.StatusServiceUnavailable || errorCode(t, a.answer) != "store_unavailable" {
		t.Errorf("answer after Complete lost the lease = %d %s %v, want 503 store_unavailable", a.status, a.body, a.err)
	}
	e.h.Drain(context.Background()) // the operation has ended and written all it will
	spy.mu.Lock()
	parks, abandons := spy.parks, spy.abandons
	spy.mu.Unlock()
	if len(parks) != 0 || len(abandons) != 0 {
		t.Errorf("after losing the lease the proxy parked for %v and abandoned for %v; want no write", parks, abandons)
	}
	rec, err := st.Get(context.Background(), id)
	if err != nil || rec.State != store.InFlight || rec.Owner != "other-owner" || rec.Fence != theirs.Fence ||
		!rec.LeaseUntil.Equal(theirs.LeaseUntil) || !rec.Outcome.IsZero() {
		t.Errorf("record after = %+v, %v; want the other owner's claim untouched (%+v)", rec, err, theirs)
	}
	if total, _ := e.prov.counts(); total != 1 {
		t.Errorf("provider saw %d requests, want 1", total)
	}
}
