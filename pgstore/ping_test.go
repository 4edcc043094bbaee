package pgstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestPingCallersLeavingKeepConnections: readiness probes whose deadline
// ends while Ping's statement waits for a database that does not answer
// (here stopped, SIGSTOP, for 2 s) do not cost the database sessions: the
// statement runs on within the call timeout and its connection goes back to
// the pool, while each caller is answered at its deadline. Before, pgx
// cancelled the statement with the caller's context and dropped its
// connection: 20 probes timing out one after the other ended the 4 sessions
// of the pool, and the pool opened 4 new ones.
func TestPingCallersLeavingKeepConnections(t *testing.T) {
	c, dbURL := pgtest.Own(t, pgtest.Options{})
	ctx := context.Background()
	const poolSize = 4
	s, err := Open(ctx, Options{URL: dbURL, MaxConns: poolSize, CallTimeout: 3 * time.Second, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The pool holds its full size of sessions, idle.
	var held []*pgxpool.Conn
	for range poolSize {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, conn)
	}
	for _, conn := range held {
		conn.Release()
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	admin := session(t, dbURL)
	sessions := func() map[int32]bool {
		t.Helper()
		rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'idemproxy'`)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		set := map[int32]bool{}
		for _, p := range pids {
			set[p] = true
		}
		return set
	}
	before, opened := sessions(), s.pool.Stat().NewConnsCount()
	if len(before) != poolSize {
		t.Fatalf("the store has %d sessions before the probes, want %d", len(before), poolSize)
	}

	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	const probes = 20
	for i := range probes {
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := s.Ping(pctx)
		late := time.Since(mustDeadline(pctx))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			c.Thaw()
			t.Fatalf("probe %d on a stopped database = %v, want its deadline", i, err)
		}
		if late > 500*time.Millisecond {
			c.Thaw()
			t.Fatalf("probe %d was answered %v after its deadline, want at once", i, late)
		}
	}
	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, s, 5*time.Second)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once the database answers again: %v", err)
	}
	opened = s.pool.Stat().NewConnsCount() - opened
	after := sessions()
	ended := 0
	for p := range before {
		if !after[p] {
			ended++
		}
	}
	t.Logf("%d probes timed out: %d of the store's %d sessions ended, %d new connections", probes, ended, len(before), opened)
	if ended > 0 || opened > 0 {
		t.Errorf("%d probes timing out ended %d of the store's %d sessions and opened %d new connections, want none",
			probes, ended, len(before), opened)
	}
}

// TestPingFailsAfterItsCallerLeft: a Ping whose caller leaves while its
// probe write runs (a readiness probe's deadline) does not clear what the
// refused claims said: the next Ping probes again, and fails while claims
// are refused. Before, Ping cleared the refusal before its probe and only
// the probe's failure set it again: the caller that left lost it, and every
// later Ping passed without a probe (/readyz 200 while every claim was
// refused).
func TestPingFailsAfterItsCallerLeft(t *testing.T) {
	ctx := context.Background()
	s, admin, role := ownRoleStore(t, Options{CallTimeout: 3 * time.Second})
	refuseClaim(t, s, admin, role)
	unlock := lockRecords(t, admin)
	left, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := s.Ping(left); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ping whose caller left = %v, want its deadline", err)
	}
	unlock()
	for i := range 2 {
		if err := s.Ping(ctx); err == nil {
			t.Fatalf("Ping %d after a caller left while claims are refused = nil, want an error (not ready)", i)
		}
	}
	if _, err := admin.Exec(ctx, `GRANT INSERT ON idemproxy_records TO `+role); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once INSERT is granted again: %v", err)
	}
	if _, created, err := s.Begin(ctx, store.ID{Key: "granted"}, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil || !created {
		t.Fatalf("claim once INSERT is granted again = %v, %v", created, err)
	}
}

// ownRoleStore opens a store (with opt, but for its URL) on a new
// database, as a role of its own that an admin session (returned) may
// revoke privileges from.
func ownRoleStore(t *testing.T, opt Options) (*Store, *pgx.Conn, string) {
	t.Helper()
	dbURL := pgtest.Database(t)
	ctx := context.Background()
	admin := session(t, dbURL)
	db := dbURL[strings.LastIndex(dbURL, "/")+1 : strings.Index(dbURL, "?")]
	role := db + "_role"
	for _, q := range []string{`CREATE ROLE ` + role + ` LOGIN`, `GRANT CREATE ON SCHEMA public TO ` + role} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	opt.URL = strings.Replace(dbURL, "postgres@", role+"@", 1)
	opt.SweepInterval, opt.AnalyzeInterval = -1, -1
	s, err := Open(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, admin, role
}

// refuseClaim revokes INSERT on the records from role and has a claim
// refused for it (42501).
func refuseClaim(t *testing.T, s *Store, admin *pgx.Conn, role string) {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.Exec(ctx, `REVOKE INSERT ON idemproxy_records FROM `+role); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Begin(ctx, store.ID{Key: "denied"}, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim without INSERT = %v, want ErrUnavailable", err)
	}
}

// lockRecords holds every statement on the records table until the
// returned function ends the admin's transaction.
func lockRecords(t *testing.T, admin *pgx.Conn) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE idemproxy_records IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitIdle waits until none of the store's connections is acquired.
func waitIdle(t *testing.T, s *Store, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for s.pool.Stat().AcquiredConns() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still acquired %v later", s.pool.Stat().AcquiredConns(), within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
