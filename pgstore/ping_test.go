package pgstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
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

// TestPingProbeNeedsNoFunctionAfter12: the README promises PostgreSQL 12
// or later, and gen_random_uuid() is in PostgreSQL's core only from 13 (on
// 12 it is pgcrypto's). The probe write that has to pass before Ping, and
// so /readyz, is ready again after a refusal called it: on 12 without
// pgcrypto it failed (42883) in every check, and a replica whose claims
// were refused once, for a full disk or a revoked grant, stayed not ready
// until restarted though the database took claims again. PostgreSQL 12 is
// not installed here: the function's absence is stood in for by revoking
// EXECUTE on it from PUBLIC in the test's own database (the store's role is
// no superuser), which fails the call as 12 does, if with another SQLSTATE.
func TestPingProbeNeedsNoFunctionAfter12(t *testing.T) {
	ctx := context.Background()
	s, admin, role := ownRoleStore(t, Options{CallTimeout: 3 * time.Second})
	if _, err := admin.Exec(ctx, `REVOKE EXECUTE ON FUNCTION pg_catalog.gen_random_uuid() FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}
	refuseClaim(t, s, admin, role)
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping while claims are refused = nil, want an error (not ready)")
	}
	if _, err := admin.Exec(ctx, `GRANT INSERT ON idemproxy_records TO `+role); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once INSERT is granted again, gen_random_uuid() unavailable: %v", err)
	}
	if _, created, err := s.Begin(ctx, store.ID{Key: "granted"}, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil || !created {
		t.Fatalf("claim once INSERT is granted again = %v, %v", created, err)
	}
}

// TestPingFullDiskRoomForARow: on a full disk, the sweep deleting a record
// now and then and (auto)vacuum giving its room back leave the table's
// pages room for a row or two but not for 8 claims at once, whose batched
// statement fails whole. Ping, and so /readyz, must fail in every check
// whose claims were refused, and pass once there is space again. Its probe
// was one row, which fitted: it passed in 16 of 16, 16 of 17 and 16 of 25
// such checks (of 40), and in 25 of 25 and 31 of 32 once a refusal was kept
// until a probe passed.
func TestPingFullDiskRoomForARow(t *testing.T) {
	dbURL, mnt := smallTablespace(t)
	ctx := context.Background()
	s := open(t, dbURL, time.Hour)
	admin := session(t, dbURL)
	// Autovacuum off: room comes back only where the test gives it (vacuum
	// below). A run whose claims fitted in 19 of 40 checks (all but one or
	// two are refused otherwise) had room given back while it ran, and its
	// Ping passed once between refused claims and that room.
	if _, err := admin.Exec(ctx, `ALTER TABLE idemproxy_records SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/v1/payments"}
	answer := store.Response{Status: 201, Body: []byte(strings.Repeat(`{"id":"pay_0123456789","status":"succeeded"}`, 5))}
	// Answered orders, as a replica has them, and the free space map
	// autovacuum keeps.
	var ids []store.ID
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 250 {
				id := store.ID{Key: randomKey()}
				if _, _, err := s.Begin(ctx, id, req, "o", time.Minute); err != nil {
					t.Error(err)
					return
				}
				if err := s.Complete(ctx, id, "o", answer, time.Now()); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if _, err := admin.Exec(ctx, `VACUUM idemproxy_records`); err != nil {
		t.Fatal(err)
	}
	// claims sends n claims at once, as concurrent orders do (one
	// statement, but for the first), and returns how many were refused
	// for space.
	claims := func(n int) (refused int) {
		t.Helper()
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range n {
			wg.Go(func() {
				_, _, err := s.Begin(ctx, store.ID{Key: randomKey()}, req, "o", time.Minute)
				if err != nil && !errors.Is(err, store.ErrNoSpace) {
					t.Errorf("claim on a full disk = %v, want ErrNoSpace or a claim", err)
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					refused++
				}
			})
		}
		wg.Wait()
		return refused
	}

	// vacuum gives the table's free space map the room its pages have
	// (not the indexes': their maps would need room).
	vacuum := func() {
		t.Helper()
		if _, err := admin.Exec(ctx, `VACUUM (INDEX_CLEANUP OFF) idemproxy_records`); err != nil {
			t.Fatal(err)
		}
	}

	filler := fill(t, mnt)
	// Claims one at a time fill the room the pages have, until one is
	// refused right after a vacuum.
	for i := 0; ; i++ {
		if i == 100_000 {
			t.Fatal("claims on a full disk never refused for space")
		}
		if claims(1) == 1 {
			vacuum()
			if claims(1) == 1 {
				break
			}
		}
	}
	const checks = 40
	passed, refusedChecks := 0, 0
	for i := range checks {
		if i%8 == 0 {
			// The sweep deletes an expired record; autovacuum gives its
			// room back: enough for a row or two.
			if _, err := admin.Exec(ctx, `DELETE FROM idemproxy_records WHERE tenant = $1 AND key = $2`,
				[]byte(ids[i].Tenant), []byte(ids[i].Key)); err != nil {
				t.Fatal(err)
			}
			vacuum()
		}
		refused := claims(8)
		err := s.Ping(ctx)
		if err != nil && !errors.Is(err, store.ErrNoSpace) {
			t.Fatalf("Ping %d on a full disk = %v, want ErrNoSpace", i, err)
		}
		if refused > 0 {
			refusedChecks++
			if err == nil {
				passed++
			}
		}
	}
	t.Logf("Ping passed in %d of the %d checks (of %d) whose claims were refused for space", passed, refusedChecks, checks)
	if refusedChecks < checks/4 {
		t.Fatalf("claims were refused in %d of %d checks only: the disk is not full", refusedChecks, checks)
	}
	if passed > 0 {
		t.Errorf("Ping passed in %d of the %d checks whose claims were refused for space, want none", passed, refusedChecks)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once there is space again: %v", err)
	}
	if refused := claims(8); refused > 0 {
		t.Fatalf("%d of 8 claims refused once there is space again", refused)
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
	db := pgtest.DatabaseName(dbURL)
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

// randomKey is a key shaped like a derived one (a UUID).
func randomKey() string {
	b := make([]byte, 16)
	rand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
