package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream"
)

// replicaAt is a replica on the shared database dbURL whose clock is skew
// off the real time, and so off the database's, which runs on this host:
// its proxy and its attempt layer read that clock, as every part of a
// process on a host whose clock is off does (the system clock cannot be
// stepped here). Its provider's key retention is retention.
func replicaAt(t *testing.T, dbURL string, skew, retention time.Duration) (*env, *pgstore.Store) {
	t.Helper()
	clock := func() time.Time { return time.Now().Add(skew) }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := pgstore.Open(ctx, pgstore.Options{URL: dbURL, TTL: time.Hour, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := newEnvUpstream(t, func(c *upstream.Config) { c.KeyRetention = retention }, func(o *proxy.Options, _ *retry.Policy) {
		o.Store, o.Now = st, clock
	})
	// Set before any request reaches the handler.
	e.tr.Now = clock
	return e, st
}

// The provider's key retention is counted by the database's clock, the
// only clock the replicas share: the first send a replica records is the
// database's now() in its claim plus how long after the claim it was by the
// replica's own clock, and a replica resuming the operation counts its age
// from the database's now() in its own claim. Before, a replica wrote its own clock's time and the
// resuming one compared it with its own clock: a sender whose clock was
// ahead, or a resumer whose clock was behind, re-sent an operation whose
// outcome was unknown past the provider's retention, by up to the skew (an
// hour here): the provider, having forgotten the key, executed it again (a
// second charge). A resumer whose clock was ahead refused one still within
// the retention (409 idempotency_key_expired, nothing sent, for a person to
// resolve).
func TestKeyRetentionCountedByDatabaseClock(t *testing.T) {
	c := ownCluster(t)
	const skew = time.Hour

	// unknownOn sends the order through replica a, whose provider answers
	// 504 (the operation's outcome unknown: kept for the next request), and
	// returns its key.
	unknownOn := func(t *testing.T, a *env) string {
		t.Helper()
		a.prov.status = http.StatusGatewayTimeout
		r := a.do(t, "POST", "/v1/payments", order)
		key := r.header.Get("Idempotency-Key")
		if r.status < 500 || key == "" {
			t.Fatalf("first send = %d %s, want a 5xx with the key", r.status, r.body)
		}
		if total, _ := a.prov.counts(); total != 1 {
			t.Fatalf("a's provider saw %d requests, want 1", total)
		}
		return key
	}
	// firstSentSkew is how far the record's first send is from its claim's
	// created_at, both as the database stored them.
	firstSentSkew := func(t *testing.T, dbURL, key string) time.Duration {
		t.Helper()
		conn, err := pgx.Connect(context.Background(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		var sent, created time.Time
		if err := conn.QueryRow(context.Background(), `SELECT first_sent_at, created_at FROM idemproxy_records WHERE key = $1`,
			[]byte(key)).Scan(&sent, &created); err != nil {
			t.Fatal(err)
		}
		return sent.Sub(created)
	}
	// refused checks that b refused to re-send past the retention: 409
	// idempotency_key_expired, nothing sent, the record kept unknown.
	refused := func(t *testing.T, b *env, bst store.Store, key string) {
		t.Helper()
		r := b.do(t, "POST", "/v1/payments", order)
		if r.status != http.StatusConflict || errorCode(t, r) != "idempotency_key_expired" {
			t.Errorf("resume past the key retention = %d %s, want 409 idempotency_key_expired", r.status, r.body)
		}
		if total, execs := b.prov.counts(); total != 0 {
			t.Errorf("b's provider saw %d requests (%v), want none: the provider has forgotten the key and executes it again", total, execs)
		}
		rec, err := bst.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: key})
		if err != nil || rec.State != store.Unknown {
			t.Errorf("record after = %+v, %v; want unknown", rec, err)
		}
	}

	// A sender whose clock is ahead wrote its first send an hour late; a
	// replica with a right clock, past the retention, re-sent.
	t.Run("sender ahead", func(t *testing.T) {
		dbURL, err := c.NewDatabase(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		const retention = 2 * time.Second
		a, _ := replicaAt(t, dbURL, skew, retention)
		key := unknownOn(t, a)
		if d := firstSentSkew(t, dbURL, key); d < 0 || d > time.Second {
			t.Errorf("first_sent_at is %v after the claim's created_at, want within a second after it (by the database's clock)", d)
		}
		time.Sleep(retention + 500*time.Millisecond)
		b, bst := replicaAt(t, dbURL, 0, retention)
		refused(t, b, bst, key)
	})

	// A resumer whose clock is behind counted the age from its own clock:
	// past the retention, it re-sent.
	t.Run("resumer behind", func(t *testing.T) {
		dbURL, err := c.NewDatabase(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		const retention = 2 * time.Second
		a, _ := replicaAt(t, dbURL, 0, retention)
		key := unknownOn(t, a)
		time.Sleep(retention + 500*time.Millisecond)
		b, bst := replicaAt(t, dbURL, -skew, retention)
		refused(t, b, bst, key)
	})

	// A resumer whose clock is ahead refused an operation still within the
	// retention; it re-sends it, once, with the same key.
	t.Run("resumer ahead within retention", func(t *testing.T) {
		dbURL, err := c.NewDatabase(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		const retention = 10 * time.Minute
		a, _ := replicaAt(t, dbURL, 0, retention)
		key := unknownOn(t, a)
		b, bst := replicaAt(t, dbURL, skew, retention)
		r := b.do(t, "POST", "/v1/payments", order)
		if r.status != http.StatusCreated || r.header.Get("Idempotency-Key") != key {
			t.Fatalf("resume within the key retention = %d %s, want 201 under key %s", r.status, r.body, key)
		}
		if total, execs := b.prov.counts(); total != 1 || execs[key] != 1 {
			t.Errorf("b's provider saw %d requests (%v), want 1 with key %s", total, execs, key)
		}
		rec, err := bst.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: key})
		if err != nil || rec.State != store.Final {
			t.Errorf("record after = %+v, %v; want final", rec, err)
		}
	})
}
