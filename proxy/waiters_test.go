package proxy_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// getWatch is the record store with its reads of one key watched: it
// reports each request (its context) that reads the key, once.
type getWatch struct {
	proxy.Store
	key    string
	mu     sync.Mutex
	seen   map[context.Context]bool
	reader chan struct{}
}

func (g *getWatch) Get(ctx context.Context, id store.ID) (store.Record, error) {
	if id.Key == g.key {
		g.mu.Lock()
		first := !g.seen[ctx]
		g.seen[ctx] = true
		g.mu.Unlock()
		if first {
			g.reader <- struct{}{}
		}
	}
	return g.Store.Get(ctx, id)
}

// TestWaitersHoldNoSlot: an app repeating one slow order (two repeats
// waiting for it in flight) does not use up IDEMPROXY_MAX_INFLIGHT: a
// request waiting for its key sends nothing, so it holds no request slot
// while it waits, and another order is still served. The repeats get the
// stored answer once the order ends, and the provider executes it once.
// Before, each repeat held a slot for up to INFLIGHT_WAIT, and with a
// bound of 3 the other order was refused 503 overloaded.
func TestWaitersHoldNoSlot(t *testing.T) {
	var watch *getWatch
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.MaxInflight, o.InflightWait = 3, time.Minute
		watch = &getWatch{Store: o.Store, seen: map[context.Context]bool{}, reader: make(chan struct{}, 8)}
		o.Store = watch
	})
	watch.key = orderKey(t, e, "slow")
	release := park(t, e, orderOf("slow", 0))
	repeats := make(chan answer, 2)
	for range 2 {
		go func() { a, _ := e.send(http.MethodPost, "/v1/payments", orderOf("slow", 0)); repeats <- a }()
	}
	<-watch.reader // each repeat has found the order in flight (awaitOwn reads its record)
	<-watch.reader

	e.prov.set(func(p *provider) { p.entered = make(chan string, 2) })
	other := make(chan answer, 1)
	go func() { a, _ := e.send(http.MethodPost, "/v1/payments", orderOf("other", 0)); other <- a }()
	select {
	case k := <-e.prov.entered:
		if k != orderKey(t, e, "other") {
			t.Errorf("the provider saw %q, want the other order's key", k)
		}
	case a := <-other:
		t.Errorf("another order while two repeats wait for one in flight: %d %s, want it sent", a.status, a.body)
		other <- answer{status: http.StatusCreated}
	}
	release()
	if a := <-other; a.status != http.StatusCreated {
		t.Errorf("the other order: %d %s, want 201", a.status, a.body)
	}
	for range 2 {
		if a := <-repeats; a.status != http.StatusCreated || a.header.Get(proxy.ReplayedHeader) != "true" {
			t.Errorf("repeat of the slow order: %d %s, want its answer replayed", a.status, a.body)
		}
	}
	e.prov.mu.Lock()
	defer e.prov.mu.Unlock()
	if n := e.prov.execs[orderKey(t, e, "slow")]; n != 1 {
		t.Errorf("the slow order was executed %d times, want once", n)
	}
}
