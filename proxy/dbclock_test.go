package proxy_test

import (
	"context"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore"
	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// counted is a real store whose claims and reads are counted.
type counted struct {
	store.Store
	begins, gets atomic.Int64
}

func (c *counted) Begin(ctx context.Context, id store.ID, req store.Request, owner string, lease time.Duration) (store.Record, bool, error) {
	c.begins.Add(1)
	return c.Store.Begin(ctx, id, req, owner, lease)
}

func (c *counted) Get(ctx context.Context, id store.ID) (store.Record, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, id)
}

// ownCluster starts a PostgreSQL cluster of the test's own (one it may
// freeze), removed when the test ends; without PostgreSQL the test is
// skipped, or failed when pgtest.RequireEnv is 1.
func ownCluster(t *testing.T) *pgtest.Cluster {
	t.Helper()
	c, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		if os.Getenv(pgtest.RequireEnv) == "1" {
			t.Fatalf("PostgreSQL is required (%s=1) but unavailable: %v; %s", pgtest.RequireEnv, err, pgtest.Install)
		}
		t.Skipf("PostgreSQL unavailable (%v): %s to run this test", err, pgtest.Install)
	}
	t.Cleanup(c.Remove)
	return c
}

// sharedPG is a PostgreSQL store on a new database of c, and that database's URL.
func sharedPG(t *testing.T, c *pgtest.Cluster) (*pgstore.Store, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, err := c.NewDatabase(ctx)
	if err != nil {
		t.Fatalf("new database: %v\n%s", err, c.Log())
	}
	st, err := pgstore.Open(ctx, pgstore.Options{URL: url, TTL: time.Hour, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, url
}

// inFlightOnOtherReplica starts order on replica a of the shared store st,
// whose provider holds it (a replica stalled or dead mid-operation, under a
// lease of an hour), and returns its key. The hold is released at the end
// of the test.
func inFlightOnOtherReplica(t *testing.T, st store.Store) string {
	t.Helper()
	a := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.Store, o.Lease = st, time.Hour })
	a.prov.hold, a.prov.entered = make(chan struct{}), make(chan string, 1)
	done := a.goSend("POST", "/v1/payments", order)
	key := <-a.prov.entered
	t.Cleanup(func() { close(a.prov.hold); <-done })
	return key
}

// The database's clock is the only lease authority: a replica waiting for a
// key in flight on another replica judges that replica's lease by the
// database's clock, whatever its own says. Replica b's clock is set apart
// from the database's by more than a lease (through Options.Now, since the
// system clock cannot be stepped here).
func TestAwaitOtherJudgesLeaseByDatabaseClock(t *testing.T) {
	c := ownCluster(t)

	// Behind the database's clock, the dead replica's lease, over by the
	// database's clock while b waits, looked live until b's wait bound: the
	// repeat got 409 idempotency_in_progress and the key was not resumed.
	t.Run("behind", func(t *testing.T) {
		st, url := sharedPG(t, c)
		key := inFlightOnOtherReplica(t, st)
		cs := &counted{Store: st}
		b := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
			o.Store, o.Lease, o.InflightWait = cs, time.Hour, 5*time.Second
			o.Now = func() time.Time { return time.Now().Add(-2 * time.Hour) }
		})
		repeat := b.goSend("POST", "/v1/payments", order)
		for cs.gets.Load() == 0 { // b polls the record: it saw the lease live
			time.Sleep(10 * time.Millisecond)
		}
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		// The other replica's lease runs out, by the database's clock.
		tag, err := conn.Exec(context.Background(),
			`UPDATE idemproxy_records SET lease_until = now() - interval '1 second' WHERE key = $1 AND state = 1`, []byte(key))
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("ending the lease: %v, %d rows", err, tag.RowsAffected())
		}
		a := <-repeat
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.status != http.StatusCreated {
			t.Fatalf("repeat on a replica whose clock is behind the database's, after the other's lease ran out = %d %s, want 201 (the key resumed)", a.status, a.body)
		}
		if total, execs := b.prov.counts(); total != 1 || execs[key] != 1 {
			t.Errorf("b's provider saw %d requests (%v), want 1 with key %s", total, execs, key)
		}
		rec, err := st.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: key})
		if err != nil || rec.State != store.Final || rec.Fence != 2 {
			t.Errorf("record after = %+v, %v; want final, taken over once (fence 2)", rec, err)
		}
	})

	// Ahead of it, a live lease looked over at every poll: b claimed (a
	// write) every 100 ms instead of reading.
	t.Run("ahead", func(t *testing.T) {
		st, _ := sharedPG(t, c)
		inFlightOnOtherReplica(t, st)
		cs := &counted{Store: st}
		b := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
			o.Store, o.Lease, o.InflightWait = cs, time.Hour, time.Second
			o.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
		})
		a := b.do(t, "POST", "/v1/payments", order)
		if a.status != http.StatusConflict || errorCode(t, a) != "idempotency_in_progress" {
			t.Fatalf("repeat while the other replica's lease is live = %d %s, want 409 idempotency_in_progress", a.status, a.body)
		}
		if n, gets := cs.begins.Load(), cs.gets.Load(); n != 1 || gets == 0 {
			t.Errorf("b claimed the key %d times and read it %d times while waiting, want 1 claim, then reads only", n, gets)
		}
		if total, _ := b.prov.counts(); total != 0 {
			t.Errorf("b's provider saw %d requests, want none", total)
		}
	})
}
