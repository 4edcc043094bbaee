package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// startupSettings are the settings idemproxy sent in the startup packet
// before: what an operator had to list in PgBouncer's
// ignore_startup_parameters for idemproxy to connect at all.
var startupSettings = []string{"synchronous_commit", "plan_cache_mode", "lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"}

// TestPgBouncerSessionSettings: behind PgBouncer in session mode, every
// session of the store runs with synchronous_commit on, plan_cache_mode
// force_generic_plan, no lock or statement timeout and the call timeout as
// idle_in_transaction_session_timeout, whatever the database's defaults.
// They were startup parameters: PgBouncer refused every connection
// (unsupported startup parameter), and Open answered as if the database
// were unreachable, retrying for ever; with them in
// ignore_startup_parameters, PgBouncer dropped them unseen and records were
// written with the database's synchronous_commit = off.
func TestPgBouncerSessionSettings(t *testing.T) {
	c := pgtest.Shared(t)
	for name, ignore := range map[string][]string{"plain": nil, "ignoring": startupSettings} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dbURL := pgtest.Database(t)
			weaken(t, dbURL)
			b := pgtest.StartPgBouncer(t, c, pgtest.PgBouncerOptions{PoolMode: "session", IgnoreStartupParameters: ignore})
			s := open(t, b.Via(dbURL), time.Hour)
			if !s.Migrated() {
				t.Fatalf("through PgBouncer (session mode, ignore_startup_parameters=%v): schema not in place after Open; pgbouncer log:\n%s",
					ignore, b.Log())
			}
			// Every connection of the pool, each its own PgBouncer client.
			var held []*pgxpool.Conn
			defer func() {
				for _, h := range held {
					h.Release()
				}
			}()
			for range 4 {
				conn, err := s.pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, conn)
				got := map[string]string{}
				for _, name := range startupSettings {
					var v string
					if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
						t.Fatal(err)
					}
					got[name] = v
				}
				want := map[string]string{"synchronous_commit": "on", "plan_cache_mode": "force_generic_plan",
					"lock_timeout": "0", "statement_timeout": "0", "idle_in_transaction_session_timeout": "5s"}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("a session through PgBouncer (ignore_startup_parameters=%v) runs with %v, want %v", ignore, got, want)
				}
			}
		})
	}
}

// weaken sets the database's defaults to what idemproxy must not run with.
func weaken(t *testing.T, dbURL string) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	db := pgtest.DatabaseName(dbURL)
	for _, set := range []string{"synchronous_commit = off", "lock_timeout = '20ms'", "statement_timeout = '100ms'",
		"idle_in_transaction_session_timeout = 0", "plan_cache_mode = auto"} {
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" SET "+set); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPgBouncerTransactionModeRefused: behind a pooler that does not keep
// sessions (PgBouncer in transaction or statement mode), Open fails naming
// the cause: the session settings (synchronous_commit on, the timeouts),
// pgx's prepared statements, the schema's advisory lock and the throttle's
// LISTEN would each run on whichever server connection is free. It left no
// schema lock held behind it: a store opened directly starts at once.
// Before, with the settings in ignore_startup_parameters, Open took it.
func TestPgBouncerTransactionModeRefused(t *testing.T) {
	c := pgtest.Shared(t)
	for _, mode := range []string{"transaction", "statement"} {
		t.Run(mode, func(t *testing.T) {
			dbURL := pgtest.Database(t)
			b := pgtest.StartPgBouncer(t, c, pgtest.PgBouncerOptions{PoolMode: mode, IgnoreStartupParameters: startupSettings})
			s, err := Open(context.Background(), Options{URL: b.Via(dbURL), SweepInterval: -1, AnalyzeInterval: -1})
			if err == nil {
				s.Close()
				t.Fatalf("Open through PgBouncer in %s mode succeeded; want it refused, naming pool_mode", mode)
			}
			if !errors.Is(err, errSessionNotKept) || !strings.Contains(err.Error(), "pool_mode = session") {
				t.Fatalf("Open through PgBouncer in %s mode: %v; want the refusal naming pool_mode = session", mode, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			direct, err := Open(ctx, Options{URL: dbURL, SweepInterval: -1, AnalyzeInterval: -1})
			if err != nil {
				t.Fatalf("Open directly after the refusal: %v", err)
			}
			defer direct.Close()
			if !direct.Migrated() {
				t.Fatal("Open directly after the refusal: schema not in place (its lock still held?)")
			}
		})
	}
}

// TestPgBouncerTwoReplicas: two stores (two replicas) through one PgBouncer
// in session mode: a new key is claimed once, seen in flight by the other
// replica until its answer is stored, then replayed by both; keys claimed
// from both at once are each claimed by exactly one.
func TestPgBouncerTwoReplicas(t *testing.T) {
	dbURL := pgtest.Database(t)
	b := pgtest.StartPgBouncer(t, pgtest.Shared(t), pgtest.PgBouncerOptions{PoolMode: "session"})
	// PgBouncer logs in one server connection at a time (about 100 ms each
	// on a loaded host): two pools of the default 32 opened during the race
	// below made its last claims wait past the call timeout (README, Behind
	// PgBouncer). 8 each keeps the race and its one claim per key.
	via := b.Via(dbURL)
	if strings.Contains(via, "?") {
		via += "&pool_max_conns=8"
	} else {
		via += "?pool_max_conns=8"
	}
	a, other := open(t, via, time.Hour), open(t, via, time.Hour)
	ctx := context.Background()
	req := store.Request{Fingerprint: []byte("fp-1")}
	resp := store.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}

	id := store.ID{Key: "order-1"}
	if _, created, err := a.Begin(ctx, id, req, "a", time.Minute); err != nil || !created {
		t.Fatalf("new key on a: created=%v err=%v", created, err)
	}
	rec, created, err := other.Begin(ctx, id, req, "b", time.Minute)
	if err != nil || created || rec.State != store.InFlight || rec.Owner != "a" {
		t.Fatalf("the key on b while a holds it: created=%v state=%v owner=%q err=%v; want a's in-flight record", created, rec.State, rec.Owner, err)
	}
	// b waits for a's answer, as a replica's in-flight wait does.
	done := make(chan store.Record, 1)
	go func() {
		for {
			rec, err := other.Get(ctx, id)
			if err == nil && rec.State == store.Final {
				done <- rec
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	if err := a.Complete(ctx, id, "a", resp, time.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case rec := <-done:
		if string(rec.Response.Body) != string(resp.Body) {
			t.Fatalf("b's wait ended with %q, want a's answer", rec.Response.Body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b still sees the key in flight 10 s after a stored its answer")
	}
	for name, s := range map[string]*Store{"a": a, "b": other} {
		rec, created, err := s.Begin(ctx, id, req, name+"-again", time.Minute)
		if err != nil || created || rec.State != store.Final || string(rec.Response.Body) != string(resp.Body) {
			t.Fatalf("replay on %s: created=%v state=%v body=%q err=%v; want the stored answer", name, created, rec.State, rec.Response.Body, err)
		}
	}

	const keys, each = 40, 4
	var mu sync.Mutex
	claims := map[string]int{}
	var wg sync.WaitGroup
	for k := range keys {
		for i := range each {
			s := []*Store{a, other}[i%2]
			wg.Go(func() {
				id := store.ID{Key: fmt.Sprintf("race-%d", k)}
				_, created, err := s.Begin(ctx, id, req, fmt.Sprintf("o%d", i), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if created {
					mu.Lock()
					claims[id.Key]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	for k := range keys {
		if n := claims[fmt.Sprintf("race-%d", k)]; n != 1 {
			t.Errorf("race-%d claimed %d times by %d Begins from two replicas, want once", k, n, each)
		}
	}
}

// TestPgBouncerServerConnectionReused: PgBouncer in session mode with
// server_reset_query empty hands a server connection to its next client as
// the last one left it, its prepared statements included: a replica
// started after another stopped found pgx's statement names taken.
func TestPgBouncerServerConnectionReused(t *testing.T) {
	dbURL := pgtest.Database(t)
	b := pgtest.StartPgBouncer(t, pgtest.Shared(t), pgtest.PgBouncerOptions{PoolMode: "session",
		Settings: []string{"server_reset_query =", "default_pool_size = 4"}})
	ctx := context.Background()
	req := store.Request{Fingerprint: []byte("fp")}
	for round := range 3 {
		s, err := Open(ctx, Options{URL: b.Via(dbURL) + "&pool_max_conns=4", SweepInterval: -1, AnalyzeInterval: -1})
		if err != nil {
			t.Fatalf("round %d: Open: %v", round, err)
		}
		id := store.ID{Key: fmt.Sprintf("k-%d", round)}
		_, created, err := s.Begin(ctx, id, req, "o", time.Minute)
		if err == nil {
			err = s.Complete(ctx, id, "o", store.Response{Status: 201}, time.Now())
		}
		if err == nil {
			_, err = s.Get(ctx, id)
		}
		s.Close()
		if err != nil || !created {
			t.Fatalf("round %d through reused server connections: created=%v err=%v", round, created, err)
		}
	}
}

// TestPgBouncerUnsupportedParameterRefused: a URL parameter PgBouncer does
// not pass on fails Open with PgBouncer's words naming it. Before, Open
// took it as a database not reachable yet, and the replica stayed not
// ready, retrying for ever.
func TestPgBouncerUnsupportedParameterRefused(t *testing.T) {
	dbURL := pgtest.Database(t)
	b := pgtest.StartPgBouncer(t, pgtest.Shared(t), pgtest.PgBouncerOptions{PoolMode: "session"})
	s, err := Open(context.Background(), Options{URL: b.Via(dbURL) + "&search_path=public", SweepInterval: -1, AnalyzeInterval: -1})
	if err == nil {
		s.Close()
		t.Fatal("Open with search_path in the URL through PgBouncer succeeded; want PgBouncer's refusal")
	}
	if !strings.Contains(err.Error(), "unsupported startup parameter: search_path") {
		t.Fatalf("Open with search_path in the URL through PgBouncer: %v; want PgBouncer's refusal naming it", err)
	}
}
