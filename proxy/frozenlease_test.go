package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// TestAnswerKeptWhenLeaseRunsOutOnFrozenDatabase: the database stops
// (SIGSTOP, as a network partition looks) while the provider holds an
// operation, for longer than the lease. The lease renewals wait on the
// store; the provider answers while the last one still waits, before the
// lease's end; that renewal then finds the lease run out. The answer is
// the provider's, received within the lease, and nobody took the key over:
// once the database is back (within the store's call timeout), it is stored
// and the app gets it, and a repeat replays it without reaching the
// provider. The answer was dropped: the app got 409
// idempotency_in_progress, the record stayed in flight, and the app's retry
// sent the operation to the provider again.
func TestAnswerKeptWhenLeaseRunsOutOnFrozenDatabase(t *testing.T) {
	c := ownCluster(t)
	st, _ := sharedPG(t, c)       // the store's call timeout: 5 s
	const lease = 6 * time.Second // renewals at 2 s and 4 s, each waiting up to 2 s
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.Store, o.Lease = st, lease })
	e.prov.hold, e.prov.entered = make(chan struct{}), make(chan string, 1)
	first := e.goSend("POST", "/v1/payments", order)
	key := <-e.prov.entered
	claimed := time.Now() // just after the claim
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := c.Thaw(); err != nil {
				t.Error(err)
			}
		}
	}
	defer thaw()
	// The provider answers at 5 s, while the renewal sent at 4 s waits; it
	// gives up at 6 s, the lease's end, and the database is back at 7.5 s.
	time.Sleep(time.Until(claimed.Add(5 * time.Second)))
	close(e.prov.hold)
	time.Sleep(time.Until(claimed.Add(7500 * time.Millisecond)))
	thaw()
	a := <-first
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.status != http.StatusCreated {
		t.Fatalf("answer received within the lease, database back within the call timeout: %d %s, want the provider's 201", a.status, a.body)
	}
	rec, err := st.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: key})
	if err != nil || rec.State != store.Final || string(rec.Response.Body) != string(a.body) {
		t.Fatalf("record = %+v, %v; want final with the answer the app got", rec, err)
	}
	again := e.do(t, "POST", "/v1/payments", order)
	if again.status != http.StatusCreated || string(again.body) != string(a.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat = %d %s replayed=%q, want the stored answer replayed", again.status, again.body, again.header.Get("Idempotent-Replayed"))
	}
	if total, execs := e.prov.counts(); total != 1 || execs[key] != 1 {
		t.Fatalf("provider saw %d requests (%v), want 1", total, execs)
	}
}
