package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/internal/syncbuf"
	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// open opens a store on url with ttl, closed at the end of the test.
func open(t *testing.T, url string, ttl time.Duration) *Store {
	t.Helper()
	s, err := Open(context.Background(), Options{URL: url, TTL: ttl, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestConformance runs the contract's suite on a real PostgreSQL. The
// database's clock is the store's, so advance sleeps.
func TestConformance(t *testing.T) {
	url := pgtest.Database(t)
	storetest.Run(t, func(t *testing.T, ttl time.Duration) (store.Store, func(time.Duration)) {
		return open(t, url, ttl), time.Sleep
	})
}

// TestSchemaConcurrentStart opens three stores on a new database at once, as
// three replicas starting together do: the advisory lock makes them take
// turns, and all three work.
func TestSchemaConcurrentStart(t *testing.T) {
	url := pgtest.Database(t)
	errs := make(chan error, 3)
	stores := make(chan *Store, 3)
	for range 3 {
		go func() {
			s, err := Open(context.Background(), Options{URL: url, SweepInterval: -1})
			errs <- err
			stores <- s
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent Open: %v", err)
		}
		s := <-stores
		t.Cleanup(func() { s.Close() })
		if err := s.Ping(context.Background()); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	}
	s := open(t, url, 0)
	var version int
	if err := s.pool.QueryRow(context.Background(), `SELECT version FROM idemproxy_schema`).Scan(&version); err != nil || version != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d in one row", version, err, len(migrations))
	}
}

// TestSchemaUpgradeFromVersion2 opens a database left by a build with schema
// version 2 (no method, path, upstream key or last answer's body): the
// upgrade adds them, the old record reads with them empty, and new records
// keep them.
func TestSchemaUpgradeFromVersion2(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range append(migrations[:2:2],
		`CREATE TABLE idemproxy_schema (version integer NOT NULL); INSERT INTO idemproxy_schema VALUES (2)`,
		`INSERT INTO idemproxy_records (tenant, key, state, fingerprint, owner, fence, created_at, attempts, last_error)
			VALUES ('t', 'old', 3, '\x0a', 'o', 1, now(), 2, 'status 504 from upstream')`) {
		if _, err := pool.Exec(ctx, sql); err != nil {
			pool.Close()
			t.Fatalf("version 2 schema: %v", err)
		}
	}
	pool.Close()
	s := open(t, url, 0)
	old, err := s.Get(ctx, store.ID{Tenant: "t", Key: "old"})
	if err != nil || old.State != store.Unknown || old.Outcome.Attempts != 2 || old.Method != "" || old.UpstreamKey != "" || old.Outcome.LastBody != nil {
		t.Fatalf("record from version 2 = %+v, %v", old, err)
	}
	req := store.Request{Fingerprint: []byte{0x0a}, Method: "POST", Path: "/payments", UpstreamKey: "up-old"}
	rec, created, err := s.Begin(ctx, store.ID{Tenant: "t", Key: "old"}, req, "o2", time.Minute)
	if err != nil || !created || rec.Method != "POST" || rec.Path != "/payments" || rec.UpstreamKey != "up-old" || rec.Fence != 2 {
		t.Fatalf("resuming the version 2 record = %v, %+v, %v", created, rec, err)
	}
	var version int
	if err := s.pool.QueryRow(ctx, `SELECT version FROM idemproxy_schema`).Scan(&version); err != nil || version != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d", version, err, len(migrations))
	}
}

// TestSweepDeletesExpiredInBatches fills a table with expired and live
// records and checks that a sweep, in batches smaller than the backlog,
// deletes exactly the expired ones.
func TestSweepDeletesExpiredInBatches(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	s := open(t, url, 0)
	s.opt.SweepBatch = 7
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemproxy_records (tenant, key, state, fingerprint, owner, fence, created_at, expires_at)
		SELECT 't', int4send(i), 2, '', 'o', 1, now(), CASE WHEN i <= 50 THEN now() - interval '1 s' ELSE now() + interval '1 h' END
		FROM generate_series(1, 80) i`); err != nil {
		t.Fatal(err)
	}
	n, err := s.sweep(ctx)
	if err != nil || n != 50 {
		t.Fatalf("sweep = %d, %v; want 50 expired records deleted", n, err)
	}
	var left int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM idemproxy_records`).Scan(&left); err != nil || left != 30 {
		t.Fatalf("%d records left (%v), want the 30 live ones", left, err)
	}
}

// TestOpenRefusedFails: a database that answers but refuses (no such
// database) fails Open at once, naming the cause, and never shows the URL's
// password.
func TestOpenRefusedFails(t *testing.T) {
	c := pgtest.Shared(t)
	url := c.URL("no_such_db")
	url = "postgres://postgres:s3cret@" + url[len("postgres://postgres@"):]
	_, err := Open(context.Background(), Options{URL: url})
	if err == nil {
		t.Fatal("Open of a missing database succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, "no_such_db") || strings.Contains(msg, "s3cret") {
		t.Fatalf("Open error = %q, want the database named and no password", msg)
	}
}

// TestOpenRefusesMissingGrants: a user who can read idemproxy's tables but
// lacks a privilege the request path needs fails Open, naming the user, the
// tables and the privileges, instead of starting ready and failing every
// request. With the grants the README lists, it opens and works.
func TestOpenRefusesMissingGrants(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.Database(t)
	open(t, dbURL, 0) // the schema, created by its owner
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	role := "idemproxy_ro_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() {
		admin.Exec(context.Background(), `DROP OWNED BY `+role)
		admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	for _, sql := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT ON ALL TABLES IN SCHEMA public TO ` + role,
		`GRANT INSERT, UPDATE, DELETE ON idemproxy_throttle TO ` + role,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	s, err := Open(ctx, Options{URL: u.String(), SweepInterval: -1, AnalyzeInterval: -1})
	if err == nil {
		s.Close()
		t.Fatal("Open as a user with only SELECT on the records succeeded")
	}
	for _, want := range []string{role, "INSERT, UPDATE, DELETE on idemproxy_records", "INSERT, UPDATE, DELETE on idemproxy_replicas"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open error = %q, want it to name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "on idemproxy_throttle") || strings.Contains(err.Error(), "on idemproxy_schema") {
		t.Errorf("Open error = %q names a table whose grants are complete", err)
	}
	if _, err := admin.Exec(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE ON idemproxy_records, idemproxy_replicas TO `+role); err != nil {
		t.Fatal(err)
	}
	s = open(t, u.String(), time.Hour)
	id := store.ID{Key: "granted"}
	if _, created, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte{1}}, "o", time.Minute); err != nil || !created {
		t.Fatalf("Begin with the grants = %v, %v", created, err)
	}
	if err := s.Complete(ctx, id, "o", store.Response{Status: 201}, time.Now()); err != nil {
		t.Fatalf("Complete with the grants: %v", err)
	}
}

// TestDatabaseDownAndBack runs a store against a cluster of its own that is
// stopped and started again: while it is down every call fails with
// store.ErrUnavailable within the call timeout; once it is back the same
// store works again without being reopened, and the record written before
// is still there.
func TestDatabaseDownAndBack(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	ctx := context.Background()
	s, err := Open(ctx, Options{URL: url, CallTimeout: 2 * time.Second, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := store.ID{Tenant: "t", Key: "before"}
	if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id, "o", store.Response{Status: 201, Body: []byte("kept")}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Begin(ctx, store.ID{Tenant: "t", Key: "during"}, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Begin with the database down = %v, want ErrUnavailable", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping with the database down = %v, want ErrUnavailable", err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// The pool drops broken connections as they fail; a few calls may still
	// meet one, never more than the pool holds.
	for i := 0; ; i++ {
		err := s.Ping(ctx)
		if err == nil {
			break
		}
		if i > int(s.opt.MaxConns) {
			t.Fatalf("Ping after the database came back: %v", err)
		}
	}
	rec, err := s.Get(ctx, id)
	if err != nil || string(rec.Response.Body) != "kept" {
		t.Fatalf("record after the restart = %+v, %v; want the stored answer", rec, err)
	}
}

// TestOpenWhileDown: a replica started while the database is down starts,
// answers ErrUnavailable, and creates the schema once the database is up.
func TestOpenWhileDown(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	ctx := context.Background()
	if err := c.Stop(false); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, Options{URL: url, CallTimeout: time.Second, SweepInterval: -1})
	if err != nil {
		t.Fatalf("Open with the database down: %v (want a store that recovers)", err)
	}
	defer s.Close()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping before the schema = %v, want ErrUnavailable", err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for s.Ping(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("store did not recover within a minute: %v", s.Ping(ctx))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, created, err := s.Begin(ctx, store.ID{Key: "k"}, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil || !created {
		t.Fatalf("Begin after recovery = %v, %v", created, err)
	}
}

// TestOpenPreferWhileFull: under sslmode=prefer (the default), a server
// without TLS refuses it and the connection is tried again without; when
// that fails for a passing reason (here: every connection slot taken, as
// while the server starts up), Open waits for the database as for one it
// cannot reach, and the store works once a slot is free. It failed Open, as
// if TLS had been required, since the first try's refusal was counted.
func TestOpenPreferWhileFull(t *testing.T) {
	c, dbURL := pgtest.Own(t, pgtest.Options{Settings: []string{"max_connections = 5", "superuser_reserved_connections = 0"}})
	ctx := context.Background()
	release := takeEverySlot(t, c, dbURL, 50)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", "prefer")
	u.RawQuery = q.Encode()
	s, err := Open(ctx, Options{URL: u.String(), CallTimeout: time.Second, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatalf("Open with every slot taken: %v (want a store that waits for one)", err)
	}
	defer s.Close()
	release()
	deadline := time.Now().Add(time.Minute)
	for s.Ping(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("store not ready a minute after slots were freed: %v", s.Ping(ctx))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// session is a database session of the test's own on url (an operator's
// psql), closed when the test ends.
func session(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	return conn
}

// takeEverySlot opens connections to dbURL until the server refuses one for
// want of a slot (53300), failing the test past most; release (also run
// when the test ends) closes them.
func takeEverySlot(t *testing.T, c *pgtest.Cluster, dbURL string, most int) (release func()) {
	t.Helper()
	ctx := context.Background()
	var fillers []*pgx.Conn
	release = func() {
		for _, f := range fillers {
			f.Close(ctx)
		}
		fillers = nil
	}
	t.Cleanup(release)
	for {
		f, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "53300" {
				t.Fatalf("filling the connection slots: %v\n%s", err, c.Log())
			}
			return release
		}
		fillers = append(fillers, f)
		if len(fillers) > most {
			t.Fatalf("no connection refused after %d", most)
		}
	}
}

// TestOpenWhileDownThenRefused: a store opened while the database is down
// whose database, once up, refuses it (here: a schema newer than this
// build's; a wrong password or a missing grant alike) says so at ERROR
// with the cause, not that the database is still unreachable.
func TestOpenWhileDownThenRefused(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	ctx := context.Background()
	s := open(t, url, 0)
	if _, err := s.pool.Exec(ctx, `UPDATE idemproxy_schema SET version = version + 1`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := c.Stop(false); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	s, err := Open(ctx, Options{URL: url, CallTimeout: time.Second, SweepInterval: -1, AnalyzeInterval: -1,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatalf("Open with the database down: %v (want a store that retries)", err)
	}
	defer s.Close()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(logs.String(), "is newer than this build") {
		if time.Now().After(deadline) {
			t.Fatalf("no line about the newer schema within a minute:\n%s", logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "is newer than this build") &&
			(!strings.Contains(line, `"level":"ERROR"`) || !strings.Contains(line, "refuses") || strings.Contains(line, "unreachable")) {
			t.Errorf("the refusal is logged as: %s\nwant an ERROR saying the database refuses", line)
		}
	}
	if s.Migrated() {
		t.Fatal("the store took a schema newer than its own")
	}
}

// TestLostClaimIsUndone: a claim whose statement got no answer within the
// call timeout fails with ErrUnavailable, and the caller is told nothing was
// written: the proxy answers 503 "key left free". Yet the statement may
// commit after all: here its commit waits for a synchronous standby that
// does not answer, and the cancel pgx sends at the timeout ends that wait
// with the transaction committed locally (a server stopped and resumed, or
// a commit stuck in a slow WAL flush, does the same). The store undoes such
// a claim once the session that sent it is gone: a new claim is deleted, so
// the app's next try claims the key at once instead of waiting out a lease
// nobody holds, and a claim that resumed an unknown operation puts it back
// to unknown with its outcome.
func TestLostClaimIsUndone(t *testing.T) {
	_, url := pgtest.Own(t, pgtest.Options{})
	ctx := context.Background()
	s, err := Open(ctx, Options{URL: url, CallTimeout: time.Second, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fp := store.Request{Fingerprint: []byte("fp")}
	fresh, parked := store.ID{Key: "fresh"}, store.ID{Key: "parked"}
	if _, _, err := s.Begin(ctx, parked, fp, "o1", time.Minute); err != nil {
		t.Fatal(err)
	}
	sent := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	if err := s.Park(ctx, parked, "o1", store.Outcome{FirstSentAt: sent, Attempts: 2, LastError: "timeout after send"}); err != nil {
		t.Fatal(err)
	}

	admin := session(t, url)
	if _, err := admin.Exec(ctx, `CREATE TABLE sync_probe (at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	standby := func(names string) {
		t.Helper()
		if _, err := admin.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = '`+names+`'`); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
		// Whether a commit waits is decided by the checkpointer's reading
		// of the setting (shared by every session), not by the session's
		// own (what SHOW gives, which a new session has at once): wait
		// until a probe commit on a new session waits, or no longer does,
		// then replace the store's sessions.
		for deadline := time.Now().Add(30 * time.Second); ; {
			if commitWaits(t, admin, url) == (names != "") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("commits do not follow synchronous_standby_names = %q 30 s after the reload", names)
			}
			time.Sleep(50 * time.Millisecond)
		}
		s.pool.Reset()
	}
	standby("absent_standby") // every commit now waits for it
	for _, id := range []store.ID{fresh, parked} {
		if _, _, err := s.Begin(ctx, id, fp, "lost-"+id.Key, time.Hour); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Begin(%s) with commits waiting = %v, want ErrUnavailable", id.Key, err)
		}
	}
	standby("")
	// The checkpointer woke the commits that waited for the standby as it
	// read the cleared setting; end any session still there, as a server
	// restart would. Their claims are committed either way; what is tested
	// is that the store undoes them once the sessions are gone.
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`); err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(30 * time.Second)
	claimAnew(t, s, fresh, fp, deadline, "its claim failed")
	rec, err := s.Get(ctx, parked)
	for err == nil && rec.State == store.InFlight && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		rec, err = s.Get(ctx, parked)
	}
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.Unknown || rec.Outcome.Attempts != 2 || !rec.Outcome.FirstSentAt.Equal(sent) || rec.Outcome.LastError != "timeout after send" {
		t.Fatalf("unknown record after its lost resume = state %v owner %q outcome %+v, want unknown with 2 attempts first sent at %v",
			rec.State, rec.Owner, rec.Outcome, sent)
	}
}

// commitWaits says whether a commit on a new session of url waits for a
// synchronous standby: it inserts a row into sync_probe and watches that
// session from admin until the insert returns (no wait) or the session
// waits for the standby (wait_event SyncRep), which it then ends (the row
// is committed locally).
func commitWaits(t *testing.T, admin *pgx.Conn, url string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url) // one per probe: closed here, not at the test's end
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	pid := conn.PgConn().PID()
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, `INSERT INTO sync_probe VALUES (now())`)
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("probe commit: %v", err)
			}
			return false
		case <-time.After(20 * time.Millisecond):
		}
		var waiting bool
		if err := admin.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'`, pid).
			Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			<-done // the session ends: its commit gets no answer
			return true
		}
		if time.Now().After(deadline) {
			t.Fatal("probe commit neither returned nor waited for the standby in 30 s")
		}
	}
}

// TestPingReadOnlyPrimary: a primary that turned read-only (the server's
// default_transaction_read_only, as some managed databases set when their
// disk fills) refuses every write, so Ping (readiness) must fail as it does
// for a standby; once writes are allowed again it succeeds without a new
// store.
func TestPingReadOnlyPrimary(t *testing.T) {
	_, url := pgtest.Own(t, pgtest.Options{})
	ctx := context.Background()
	s := open(t, url, time.Hour)
	admin := session(t, url)
	// This session keeps writing whatever the server's default.
	if _, err := admin.Exec(ctx, `SET default_transaction_read_only = off`); err != nil {
		t.Fatal(err)
	}
	readOnly := func(on bool) {
		t.Helper()
		if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET default_transaction_read_only = %t`, on)); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
	}
	readOnly(true)
	defer readOnly(false)
	// Sessions take the reloaded setting at their next command.
	deadline := time.Now().Add(30 * time.Second)
	for s.Ping(ctx) == nil {
		if time.Now().After(deadline) {
			t.Fatal("Ping still succeeds 30 s after the database turned read-only")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping on a read-only primary = %v, want ErrUnavailable", err)
	}
	if _, _, err := s.Begin(ctx, store.ID{Key: "ro"}, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Begin on a read-only primary = %v, want ErrUnavailable", err)
	}
	readOnly(false)
	for s.Ping(ctx) != nil {
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatalf("Ping after writes were allowed again: %v", s.Ping(ctx))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPingFullDisk: a database whose disk is full answers reads, and its
// sessions are not read-only, yet it refuses every claim (53100). Ping, and
// so /readyz, must say so until there is space again; it said ready.
func TestPingFullDisk(t *testing.T) {
	dbURL, mnt := smallTablespace(t)
	ctx := context.Background()
	s := open(t, dbURL, time.Hour)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping with room: %v", err)
	}

	filler := fill(t, mnt)
	req := store.Request{Fingerprint: []byte("fp")}
	for i := 0; ; i++ {
		_, _, err := s.Begin(ctx, store.ID{Key: fmt.Sprintf("full-%d", i)}, req, "o", time.Minute)
		if errors.Is(err, store.ErrNoSpace) {
			break
		}
		if err != nil || i == 100_000 {
			t.Fatalf("claim %d on a full disk = %v, want ErrNoSpace in time", i, err)
		}
	}
	for range 2 {
		if err := s.Ping(ctx); !errors.Is(err, store.ErrNoSpace) {
			t.Fatalf("Ping while claims are refused for space = %v, want ErrNoSpace", err)
		}
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once there is space again: %v", err)
	}
	if _, created, err := s.Begin(ctx, store.ID{Key: "after"}, req, "o", time.Minute); err != nil || !created {
		t.Fatalf("claim once there is space again = %v, %v", created, err)
	}
}

// smallTablespace starts a cluster of the test's own whose database
// full_disk (returned as dbURL) keeps its files on a small tmpfs of their
// own (mnt, a tablespace on it), so that filling it (fill) fails the
// writes, not the WAL. It skips the test where no tmpfs can be mounted.
func smallTablespace(t *testing.T) (dbURL, mnt string) {
	t.Helper()
	c, _ := pgtest.Own(t, pgtest.Options{})
	ctx := context.Background()
	mnt = filepath.Join(c.SocketDir(), "small")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=32m"); err != nil {
		t.Skipf("cannot mount a tmpfs for the database (needs root or CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() {
		c.Stop(false)
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	if os.Geteuid() == 0 { // the server runs as postgres (pgtest)
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(mnt, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	admin := session(t, c.URL("postgres"))
	for _, q := range []string{`CREATE TABLESPACE small LOCATION '` + mnt + `'`, `CREATE DATABASE full_disk TABLESPACE small`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return c.URL("full_disk"), mnt
}

// fill writes a file in mnt until its file system is full, and returns
// the file's path: removing it gives the space back.
func fill(t *testing.T, mnt string) (filler string) {
	t.Helper()
	filler = filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 64<<10); ; {
		if _, err := f.Write(chunk); err != nil {
			break // the file system is full
		}
	}
	f.Close()
	return filler
}

// claimedThenStopped opens a store on a cluster of the test's own, claims
// key for owner "o" (created, an hour's lease) and stops the cluster.
func claimedThenStopped(t *testing.T, key string) (*pgtest.Cluster, *Store, store.ID, store.Request) {
	t.Helper()
	c, url := pgtest.Own(t, pgtest.Options{})
	ctx := context.Background()
	s, err := Open(ctx, Options{URL: url, CallTimeout: 2 * time.Second, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	id, req := store.ID{Key: key}, store.Request{Fingerprint: []byte("fp")}
	if _, created, err := s.Begin(ctx, id, req, "o", time.Hour); err != nil || !created {
		t.Fatalf("Begin = %v, %v", created, err)
	}
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	return c, s, id, req
}

// TestFailedAbandonDoneLater: an Abandon that fails while the database is
// down (the proxy releasing a key after the provider answered and the answer
// could not be stored) is done again once the database is back, so the app's
// retry claims the key then instead of waiting out a lease nobody runs.
func TestFailedAbandonDoneLater(t *testing.T) {
	ctx := context.Background()
	c, s, id, req := claimedThenStopped(t, "released")
	if err := s.Abandon(ctx, id, "o"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Abandon with the database down = %v, want ErrUnavailable", err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	claimAnew(t, s, id, req, time.Now().Add(30*time.Second), "the database came back")
}

// TestFailedParkDoneLater: a Park that fails while the database is down
// (the proxy keeping as unknown an operation the provider answered and whose
// answer could not be stored) is done again once the database is back: the
// record becomes unknown with the outcome Park was given, once, instead of
// staying in flight with that outcome lost (or, as when the proxy released
// such a key, being deleted). A deferred park of an owner that no longer
// holds the record leaves the record alone.
func TestFailedParkDoneLater(t *testing.T) {
	ctx := context.Background()
	c, s, id, req := claimedThenStopped(t, "answered")
	o := store.Outcome{FirstSentAt: time.Now().Add(-time.Minute).Truncate(time.Microsecond).UTC(), Attempts: 2,
		LastError: "status 201 from upstream, but the answer could not be stored", LastBody: []byte(`{"id":"pay_1"}`)}
	if err := s.Park(ctx, id, "o", o); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Park with the database down = %v, want ErrUnavailable", err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var rec store.Record
	var err error
	for {
		rec, err = s.Get(ctx, id)
		if err == nil && rec.State == store.Unknown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record 30 s after the database came back: %+v, %v; want it unknown", rec, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitNoneLost(t, s)
	rec, err = s.Get(ctx, id)
	if err != nil || rec.State != store.Unknown || !rec.Outcome.FirstSentAt.Equal(o.FirstSentAt) || rec.Outcome.Attempts != 2 ||
		rec.Outcome.LastError != o.LastError || string(rec.Outcome.LastBody) != string(o.LastBody) || !rec.LeaseUntil.IsZero() {
		t.Fatalf("record after the deferred park = %+v, %v; want unknown with outcome %+v, parked once", rec, err, o)
	}
	// The next claim resumes it at once, keeping what the park kept.
	got, created, err := s.Begin(ctx, id, req, "next", time.Minute)
	if err != nil || !created || got.Fence != 2 || !got.Outcome.FirstSentAt.Equal(o.FirstSentAt) {
		t.Fatalf("claim after the deferred park = %+v, %v, %v; want it resumed (fence 2) with its first send", got, created, err)
	}

	// A park remembered for an owner that lost the record changes nothing.
	taken := store.ID{Key: "taken"}
	if _, created, err := s.Begin(ctx, taken, req, "new", time.Hour); err != nil || !created {
		t.Fatalf("Begin = %v, %v", created, err)
	}
	s.parkLater(taken, "old", o)
	waitNoneLost(t, s)
	if rec, err := s.Get(ctx, taken); err != nil || rec.State != store.InFlight || rec.Owner != "new" || !rec.Outcome.IsZero() {
		t.Fatalf("record of another owner after a stale deferred park = %+v, %v; want it in flight, untouched", rec, err)
	}
}

// waitNoneLost waits until s has no lost claim or failed write left to
// redo, for up to 30 s.
func waitNoneLost(t *testing.T, s *Store) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.lostMu.Lock()
		n := len(s.lost)
		s.lostMu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lost claims or failed writes still pending after 30 s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// claimAnew claims id again until the claim creates a new record (fence 1),
// failing the test at deadline: the key is still held that long after what
// happened.
func claimAnew(t *testing.T, s *Store, id store.ID, req store.Request, deadline time.Time, after string) {
	t.Helper()
	for {
		rec, created, err := s.Begin(context.Background(), id, req, "next", time.Minute)
		if err == nil && created {
			if rec.Fence != 1 {
				t.Fatalf("claim after %s = fence %d, want 1 (a new record)", after, rec.Fence)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key still held 30 s after %s: record %+v created=%v err=%v", after, rec, created, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOpenRecordsOfThePreviousVersionNeverExpire: a version before in-flight
// and unknown records stopped expiring wrote them with an expires_at, and
// its replicas may share the database with this one during a rolling
// upgrade. Such a record past its expires_at is still there: Get and List
// find it, a sweep leaves it, and the same request takes it over keeping
// what the earlier sequences left (first send, attempts) instead of
// starting afresh as a new operation, which would skip the provider key
// retention guard and the status probe.
func TestOpenRecordsOfThePreviousVersionNeverExpire(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	s := open(t, url, time.Hour)
	fp := []byte("fingerprint")
	sent := time.Now().Add(-50 * time.Hour).Truncate(time.Microsecond)
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemproxy_records
		(tenant, key, state, fingerprint, owner, fence, lease_until, created_at, expires_at, first_sent_at, attempts, last_error)
		VALUES ('t', 'unknown', 3, $1, '', 2, NULL, $2, now() - interval '1 s', $2, 3, 'timeout'),
		       ('t', 'inflight', 1, $1, 'dead', 1, now() - interval '1 h', $2, now() - interval '1 s', NULL, 0, '')`,
		fp, sent); err != nil {
		t.Fatal(err)
	}
	if n, err := s.sweep(ctx); err != nil || n != 0 {
		t.Fatalf("sweep = %d, %v; want no unknown or in-flight record deleted", n, err)
	}
	for _, key := range []string{"unknown", "inflight"} {
		id := store.ID{Tenant: "t", Key: key}
		if _, err := s.Get(ctx, id); err != nil {
			t.Fatalf("Get %s: %v; want the record", key, err)
		}
	}
	recs, _, err := s.List(ctx, store.Filter{State: store.Unknown}, "", 10)
	if err != nil || len(recs) != 1 || recs[0].ID.Key != "unknown" {
		t.Fatalf("List unknown = %v, %v; want the unknown record", recs, err)
	}
	id := store.ID{Tenant: "t", Key: "unknown"}
	rec, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fp}, "o", time.Minute)
	if err != nil || !created {
		t.Fatalf("Begin = %v, %v; want a takeover", created, err)
	}
	if rec.Fence != 3 || rec.Outcome.Attempts != 3 || !rec.Outcome.FirstSentAt.Equal(sent) || !rec.CreatedAt.Equal(sent) || !rec.ExpiresAt.IsZero() {
		t.Fatalf("taken over: fence %d, attempts %d, first sent %v, created %v, expires %v; want fence 3, 3 attempts and %v kept, no expiry",
			rec.Fence, rec.Outcome.Attempts, rec.Outcome.FirstSentAt, rec.CreatedAt, rec.ExpiresAt, sent)
	}
	if err := s.Complete(ctx, id, "o", store.Response{Status: 201}, time.Time{}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	id = store.ID{Tenant: "t", Key: "inflight"}
	rec, created, err = s.Begin(ctx, id, store.Request{Fingerprint: fp}, "o2", time.Minute)
	if err != nil || !created || rec.Fence != 2 || !rec.CreatedAt.Equal(sent) {
		t.Fatalf("Begin in-flight = fence %d, created at %v, %v, %v; want a takeover at fence 2 keeping %v", rec.Fence, rec.CreatedAt, created, err, sent)
	}
}

// TestStoppedReplicasOperationsParkedAsUnknown: an in-flight record whose
// lease ended long ago belongs to a replica that stopped mid-operation. The
// sweep loop parks it as Unknown, as the embedded store does at start for
// its dead process, so that operators list it with the operations whose
// outcome is unknown; its first send becomes the claim time, its old owner
// can no longer complete it, and the same request takes it over with the
// next fence. A record whose lease ended within the grace, a live one, an
// unknown one and a final one are left as they are; an in-flight
// fingerprint-window anchor is deleted.
func TestStoppedReplicasOperationsParkedAsUnknown(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	var parked atomic.Int64
	s, err := Open(ctx, Options{URL: url, TTL: time.Hour, SweepInterval: 50 * time.Millisecond,
		OrphanAfter: 10 * time.Minute, AnalyzeInterval: -1, OnOrphansParked: func(n int) { parked.Add(int64(n)) }})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	fp := []byte("fingerprint")
	created := time.Now().Add(-2 * time.Hour).Truncate(time.Microsecond)
	anchor := store.WindowAnchorPrefix + "POST /cards/1/topup"
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemproxy_records
		(tenant, key, state, fingerprint, owner, fence, lease_until, created_at, expires_at, first_sent_at, attempts, last_error, status)
		VALUES ('t', 'dead',    1, $1, 'gone', 1, now() - interval '1 h',   $2, NULL, NULL, 0, '', 0),
		       ('t', 'grace',   1, $1, 'slow', 1, now() - interval '1 min', $2, NULL, NULL, 0, '', 0),
		       ('t', 'live',    1, $1, 'busy', 1, now() + interval '1 h',   $2, NULL, NULL, 0, '', 0),
		       ('t', 'unknown', 3, $1, 'was',  2, NULL,                     $2, NULL, $2,   2, 'timeout', 0),
		       ('t', 'final',   2, $1, 'done', 1, NULL,                     $2, now() + interval '1 h', $2, 0, '', 201),
		       ('t', $3,        1, $1, 'gone', 1, now() - interval '1 h',   $2, NULL, NULL, 0, '', 0)`,
		fp, created, []byte(anchor)); err != nil {
		t.Fatal(err)
	}
	get := func(key string) store.Record {
		t.Helper()
		rec, err := s.Get(ctx, store.ID{Tenant: "t", Key: key})
		if err != nil {
			t.Fatalf("Get %q: %v", key, err)
		}
		return rec
	}
	deadline := time.Now().Add(30 * time.Second)
	for get("dead").State != store.Unknown || parked.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s of sweeps the stopped replica's record is %s and %d were reported parked; want unknown and 1",
				get("dead").State, parked.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	rec := get("dead")
	if rec.Outcome.LastError != replicaStopped || !rec.Outcome.FirstSentAt.Equal(created) || !rec.LeaseUntil.IsZero() || !rec.ExpiresAt.IsZero() {
		t.Fatalf("parked: last error %q, first sent %v, lease %v, expires %v; want %q, %v, no lease, no expiry",
			rec.Outcome.LastError, rec.Outcome.FirstSentAt, rec.LeaseUntil, rec.ExpiresAt, replicaStopped, created)
	}
	for key, want := range map[string]store.State{"grace": store.InFlight, "live": store.InFlight, "unknown": store.Unknown, "final": store.Final} {
		if got := get(key).State; got != want {
			t.Errorf("%s record is %s after the sweeps; want %s", key, got, want)
		}
	}
	if rec := get("unknown"); rec.Outcome.LastError != "timeout" || rec.Outcome.Attempts != 2 {
		t.Errorf("unknown record changed: %+v", rec.Outcome)
	}
	if _, err := s.Get(ctx, store.ID{Tenant: "t", Key: anchor}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of the stopped replica's window anchor: %v; want it deleted (ErrNotFound)", err)
	}
	if n := parked.Load(); n != 1 {
		t.Errorf("OnOrphansParked told of %d records; want 1 (the anchor is deleted, not parked)", n)
	}
	recs, _, err := s.List(ctx, store.Filter{State: store.Unknown}, "", 10)
	if err != nil || len(recs) != 2 || recs[0].ID.Key != "dead" || recs[1].ID.Key != "unknown" {
		t.Fatalf("List unknown = %v, %v; want the parked record and the unknown one", recs, err)
	}
	id := store.ID{Tenant: "t", Key: "dead"}
	if err := s.Complete(ctx, id, "gone", store.Response{Status: 201}, time.Time{}); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete by the stopped replica's owner = %v; want ErrNotOwner", err)
	}
	rec, claimed, err := s.Begin(ctx, id, store.Request{Fingerprint: fp}, "next", time.Minute)
	if err != nil || !claimed || rec.Fence != 2 || !rec.CreatedAt.Equal(created) || !rec.Outcome.FirstSentAt.Equal(created) {
		t.Fatalf("Begin = fence %d, created %v, first sent %v, %v, %v; want a takeover at fence 2 keeping %v",
			rec.Fence, rec.CreatedAt, rec.Outcome.FirstSentAt, claimed, err, created)
	}
}

// schemaInUse gives a database at the schema version before the last
// migration (which alters idemproxy_records), a pool on it, and a
// transaction of that pool holding idemproxy_records in use, as a replica
// of the older build does.
func schemaInUse(t *testing.T) (string, *pgxpool.Pool, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.Database(t)
	open(t, url, 0).Close()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `ALTER TABLE idemproxy_records DROP COLUMN sent_body, DROP COLUMN sent_type, DROP COLUMN sent_encoding`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idemproxy_schema SET version = $1`, len(migrations)-1); err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Rollback(ctx) })
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM idemproxy_records`); err != nil {
		t.Fatal(err)
	}
	return url, pool, holder
}

// TestSchemaUpgradeWaitsForNoLock starts a replica of a newer build while a
// replica of the older one holds a transaction on a table the upgrade alters.
// The upgrade must not sit in the table's lock queue, where every other
// statement on the table would wait behind it: other statements run while
// it waits, and it completes once the table is free.
func TestSchemaUpgradeWaitsForNoLock(t *testing.T) {
	ctx := context.Background()
	url, pool, holder := schemaInUse(t)
	opened := make(chan error, 1)
	var s *Store
	go func() {
		var err error
		s, err = Open(ctx, Options{URL: url, SweepInterval: -1, AnalyzeInterval: -1})
		opened <- err
	}()
	// Wait until the upgrade asks for the table's lock.
	for deadline := time.Now().Add(20 * time.Second); ; {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT exists (SELECT FROM pg_locks
			WHERE relation = 'idemproxy_records'::regclass AND NOT granted)`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the upgrade never asked for idemproxy_records' lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Another replica's statement on the table still runs.
	probe, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := pool.Exec(probe, `SELECT count(*) FROM idemproxy_records`); err != nil {
		t.Fatalf("a statement on the table while the upgrade waits: %v", err)
	}
	select {
	case err := <-opened:
		t.Fatalf("Open returned %v while the table was in use", err)
	default:
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping after the upgrade: %v", err)
	}
	var version int
	if err := pool.QueryRow(ctx, `SELECT version FROM idemproxy_schema`).Scan(&version); err != nil || version != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d", version, err, len(migrations))
	}
}

// TestSchemaUpgradeBusyPastStart holds the table for longer than Open waits:
// Open returns a store that is not ready (store.ErrUnavailable), and the
// upgrade completes in the background once the table is free.
func TestSchemaUpgradeBusyPastStart(t *testing.T) {
	ctx := context.Background()
	url, pool, holder := schemaInUse(t)
	s, err := Open(ctx, Options{URL: url, CallTimeout: 300 * time.Millisecond, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatalf("Open while the table is in use: %v; want a store not yet ready", err)
	}
	defer s.Close()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping before the upgrade = %v; want store.ErrUnavailable", err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.Ping(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not ready 30 s after the table was freed: %v", s.Ping(ctx))
		}
		time.Sleep(50 * time.Millisecond)
	}
	var version int
	if err := pool.QueryRow(ctx, `SELECT version FROM idemproxy_schema`).Scan(&version); err != nil || version != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d", version, err, len(migrations))
	}
}

// TestNewerSchemaRefusalSaysWhatToDo: a replica of an older build started
// on a database a newer build has upgraded (an old pod restarted during a
// rolling update, or a rollback) stops; the reason must tell the operator
// that a rollback across the upgrade cannot run, to run the newer version,
// and not to lower the schema's version by hand: the newer build would run
// its upgrade again at its next start and stop on it ("column ... already
// exists"). It said only "run a newer idemproxy".
func TestNewerSchemaRefusalSaysWhatToDo(t *testing.T) {
	url := pgtest.Database(t)
	ctx := context.Background()
	s := open(t, url, 0)
	if _, err := s.pool.Exec(ctx, `UPDATE idemproxy_schema SET version = version + 1`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err := Open(ctx, Options{URL: url, SweepInterval: -1, AnalyzeInterval: -1})
	if err == nil {
		s.Close()
		t.Fatal("Open took a schema newer than its own")
	}
	for _, want := range []string{
		fmt.Sprintf("schema version %d is newer than this build's %d", len(migrations)+1, len(migrations)),
		"rollback", "by hand", "idemproxy_schema",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
}
