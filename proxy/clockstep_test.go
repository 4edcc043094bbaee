package proxy_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// steppable is a wall clock a test can step forward, as a VM resume or an NTP
// step does.
type steppable struct {
	mu   sync.Mutex
	skew time.Duration
}

func (c *steppable) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.skew)
}

func (c *steppable) step(d time.Duration) {
	c.mu.Lock()
	c.skew += d
	c.mu.Unlock()
}

// A clock stepped forward past the lease while an operation runs must not let
// a repeat take the key over and execute the order a second time: the process
// is still running it.
func TestClockStepDoesNotTakeOverOwnOperation(t *testing.T) {
	clock := &steppable{}
	st, err := cache.Open(cache.Options{Dir: t.TempDir(), SyncWrites: true, TTL: 24 * time.Hour, GCInterval: -1, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.Store, o.Lease, o.InflightWait = st, time.Minute, 100*time.Millisecond
	})
	e.prov.hold = make(chan struct{})
	e.prov.entered = make(chan string, 1)
	first := make(chan answer, 1)
	go func() {
		a, _ := e.send("POST", "/v1/payments", order)
		first <- a
	}()
	<-e.prov.entered
	clock.step(time.Hour) // the lease has "expired" by the wall clock

	repeat := make(chan answer, 1)
	go func() {
		a, _ := e.send("POST", "/v1/payments", order)
		repeat <- a
	}()
	var a answer
	select {
	case a = <-repeat:
	case key := <-e.prov.entered:
		close(e.prov.hold)
		t.Fatalf("the repeat took the key over and executed %s a second time", key)
	}
	if a.status != http.StatusConflict || errorCode(t, a) != "idempotency_in_progress" {
		t.Fatalf("repeat after the clock step = %d %s, want 409 idempotency_in_progress", a.status, a.body)
	}
	close(e.prov.hold)
	if f := <-first; f.status != http.StatusCreated {
		t.Fatalf("first request = %d %s, want 201", f.status, f.body)
	}
	r := e.do(t, "POST", "/v1/payments", order)
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("repeat after the first finished = %d replayed=%q, want the stored 201", r.status, r.header.Get("Idempotent-Replayed"))
	}
	if total, execs := e.prov.counts(); total != 1 {
		t.Errorf("provider saw %d requests (%v), want 1: the order ran twice", total, execs)
	}
}
