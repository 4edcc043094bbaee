package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// heldBegin is a real store whose nth Begin (counted from 1) waits until
// release is closed, having said so on entered: a replica caught between
// two steps of anchoring a fingerprint window's operation.
type heldBegin struct {
	store.Store
	nth              int32
	begins           atomic.Int32
	entered, release chan struct{}
}

func holdBegin(st store.Store, nth int32) *heldBegin {
	return &heldBegin{Store: st, nth: nth, entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *heldBegin) Begin(ctx context.Context, id store.ID, req store.Request, owner string, lease time.Duration) (store.Record, bool, error) {
	if h.begins.Add(1) == h.nth {
		close(h.entered)
		<-h.release
	}
	return h.Store.Begin(ctx, id, req, owner, lease)
}

// A fingerprint window's identical requests are one operation also when
// they reach two replicas of one PostgreSQL store whose clocks put them in
// two periods: a replica's clock apart from the other's, or two requests
// racing on each side of a period boundary. Before, each replica anchored
// the period its own clock gave, and the top-up was executed twice.
func TestFingerprintWindowAcrossReplicas(t *testing.T) {
	c := ownCluster(t)
	const (
		rule  = "POST /cards/*/topup=fingerprint:1m"
		topup = `{"amount":"50"}`
	)
	replica := func(t *testing.T, st store.Store, now func() time.Time) *env {
		return newRouteEnv(t, rule, nil, t.TempDir(), func(o *proxy.Options, _ *retry.Policy) {
			o.Store, o.Now = st, now
		})
	}
	// oneOperation checks that answers first and then are one operation,
	// executed once by the replicas' providers together.
	oneOperation := func(t *testing.T, first, then answer, replicas ...*env) {
		t.Helper()
		key := first.header.Get("Idempotency-Key")
		if first.status != http.StatusCreated || key == "" {
			t.Fatalf("first top-up = %d key %q %s, want 201 with a key", first.status, key, first.body)
		}
		if k := then.header.Get("Idempotency-Key"); k != key || then.status != http.StatusCreated || then.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the same top-up on the other replica = %d key %q replayed=%q, want 201 replayed under %q",
				then.status, k, then.header.Get("Idempotent-Replayed"), key)
		}
		total := 0
		for _, r := range replicas {
			n, _ := r.prov.counts()
			total += n
		}
		if total != 1 {
			t.Errorf("the provider executed the top-up %d times, want once", total)
		}
	}

	t.Run("clocks an hour apart", func(t *testing.T) {
		st, _ := sharedPG(t, c)
		a := replica(t, st, time.Now)
		b := replica(t, st, func() time.Time { return time.Now().Add(time.Hour) })
		first := a.do(t, "POST", "/cards/c1/topup", topup)
		then := b.do(t, "POST", "/cards/c1/topup", topup)
		oneOperation(t, first, then, a, b)
	})

	t.Run("racing at a period boundary", func(t *testing.T) {
		st, _ := sharedPG(t, c)
		boundary := periodStart(time.Minute)
		held := holdBegin(st, 1)
		a := replica(t, held, func() time.Time { return boundary.Add(-time.Millisecond) })
		b := replica(t, st, func() time.Time { return boundary.Add(time.Millisecond) })
		ra := a.goSend("POST", "/cards/c1/topup", topup)
		<-held.entered // a found no anchor and is about to write
		first := b.do(t, "POST", "/cards/c1/topup", topup)
		close(held.release)
		then := <-ra
		if then.err != nil {
			t.Fatal(then.err)
		}
		oneOperation(t, first, then.answer, a, b)
	})

	// A replica that stopped while deciding (here: held between taking
	// the fingerprint's lock and anchoring) holds the others' decisions
	// for the lock's lease: a request meanwhile waits, and past its wait
	// bound is 409 with nothing sent; once the lease is over, by the
	// database's clock, the next request anchors and runs the operation,
	// and the stopped replica, resuming, joins it.
	t.Run("a replica stopped holding the lock", func(t *testing.T) {
		st, url := sharedPG(t, c)
		held := holdBegin(st, 2)
		a := replica(t, held, time.Now)
		b := newRouteEnv(t, rule, nil, t.TempDir(), func(o *proxy.Options, _ *retry.Policy) {
			o.Store, o.InflightWait = st, 500*time.Millisecond
		})
		ra := a.goSend("POST", "/cards/c1/topup", topup)
		<-held.entered
		if r := b.do(t, "POST", "/cards/c1/topup", topup); r.status != http.StatusConflict || errorCode(t, r) != "idempotency_in_progress" {
			t.Fatalf("while another replica holds the lock = %d %s, want 409 idempotency_in_progress", r.status, r.body)
		}
		if n, _ := b.prov.counts(); n != 0 {
			t.Fatalf("sent %d requests while another replica decided, want none", n)
		}
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		tag, err := conn.Exec(context.Background(),
			`UPDATE idemproxy_records SET lease_until = now() - interval '1 second' WHERE state = 1 AND key LIKE '%/lock'::bytea`)
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("ending the lock's lease: %v, %d rows", err, tag.RowsAffected())
		}
		first := b.do(t, "POST", "/cards/c1/topup", topup)
		close(held.release)
		then := <-ra
		if then.err != nil {
			t.Fatal(then.err)
		}
		oneOperation(t, first, then.answer, a, b)
	})
}
