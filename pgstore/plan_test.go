package pgstore

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestFinalAnswersFindRowsByPrimaryKey checks the plans PostgreSQL runs for
// final answers, logged by auto_explain, in the two states of the table
// where a final answer used to read far more than its own rows:
//
//   - the table grew from nearly empty since the statement was first run
//     on the connection (a plan cached then scans the whole table);
//   - the table was analyzed when few records were open, and the
//     open-records index still holds the entries of thousands of records
//     finished since (a plan through that index reads them all).
//
// In both, every final answer must find its rows through the primary key.
// The store measures its table for the planner as it grows (analyzeIfGrown);
// autovacuum, which would too, is off for the test's table.
func TestFinalAnswersFindRowsByPrimaryKey(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Shared(t)
	u, err := url.Parse(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	// The store's own sessions, and only they, log the plan of every
	// statement they run.
	q := u.Query()
	q.Set("session_preload_libraries", "auto_explain")
	q.Set("auto_explain.log_min_duration", "0")
	u.RawQuery = q.Encode()
	s, err := Open(ctx, Options{URL: u.String(), TTL: time.Hour, SweepInterval: -1, AnalyzeInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// Autovacuum off: the table is measured only by the store and the test.
	if _, err := admin.Exec(ctx, `ALTER TABLE idemproxy_records SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}

	req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/v1/charges", UpstreamKey: "up"}
	resp := store.Response{Status: 200, Body: []byte(`{"id":"ch"}`)}
	keys := 0
	newKeys := func(n int) {
		t.Helper()
		for range n {
			keys++
			id := store.ID{Tenant: "t", Key: "key-" + strconv.Itoa(keys)}
			if _, created, err := s.Begin(ctx, id, req, "o", time.Minute); err != nil || !created {
				t.Fatalf("Begin(%s) = created %v, %v", id.Key, created, err)
			}
			if err := s.Complete(ctx, id, "o", resp, time.Time{}); err != nil {
				t.Fatalf("Complete(%s): %v", id.Key, err)
			}
		}
	}
	// finished adds n records that were in flight and are final now, as
	// finished requests leave them (each leaves a dead entry in the
	// open-records index until a vacuum).
	finished := func(prefix string, n int) {
		t.Helper()
		if _, err := admin.Exec(ctx, `
INSERT INTO idemproxy_records (tenant, key, state, fingerprint, owner, fence, created_at, expires_at)
SELECT 't', convert_to($1 || i, 'UTF8'), 1, 'fp', 'o', 1, now(), now() + interval '1 hour'
FROM generate_series(1, $2) AS i`, prefix, n); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `UPDATE idemproxy_records SET state = 2 WHERE key >= convert_to($1, 'UTF8') AND key < convert_to($1 || '~', 'UTF8')`, prefix); err != nil {
			t.Fatal(err)
		}
	}
	// plans returns the plans of final answers logged since mark.
	plans := func(mark int) []string {
		t.Helper()
		var out []string
		for _, p := range strings.Split(c.Log()[mark:], "LOG:  duration:")[1:] {
			if strings.Contains(p, "SET state = 2") {
				out = append(out, p)
			}
		}
		return out
	}
	check := func(when string, mark int) {
		t.Helper()
		got := plans(mark)
		if len(got) == 0 {
			t.Fatalf("%s: no plan of a final answer was logged", when)
		}
		for _, p := range got {
			if !strings.Contains(p, "idemproxy_records_pkey") || strings.Contains(p, "Seq Scan on idemproxy_records") ||
				strings.Contains(p, "idemproxy_records_open") {
				t.Errorf("%s: a final answer ran this plan, not a lookup by primary key:\n%s", when, p)
			}
		}
	}

	// Run more than the five times after which PostgreSQL may keep a plan
	// for the statement, on a table of a few records, then grow it: the
	// store measures it again (ANALYZE) once it has doubled, which makes
	// PostgreSQL plan anew.
	newKeys(8)
	finished("grown-", 20000)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var pages int
		if err := admin.QueryRow(ctx, `SELECT relpages FROM pg_class WHERE relname = 'idemproxy_records'`).Scan(&pages); err != nil {
			t.Fatal(err)
		}
		if pages > 16 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store never measured the table it grew (relpages %d)", pages)
		}
	}
	mark := len(c.Log())
	newKeys(3)
	check("after the table grew from nearly empty", mark)

	finished("churn-", 20000)
	if _, err := admin.Exec(ctx, `ANALYZE idemproxy_records`); err != nil {
		t.Fatal(err)
	}
	mark = len(c.Log())
	newKeys(3)
	check("analyzed with few records open", mark)

	// Listing the records of one state is served by the open-records
	// index, plan made once or not: the state is in the statement.
	parked := store.ID{Tenant: "t", Key: "parked"}
	if _, created, err := s.Begin(ctx, parked, req, "o", time.Minute); err != nil || !created {
		t.Fatalf("Begin(parked) = created %v, %v", created, err)
	}
	if err := s.Park(ctx, parked, "o", store.Outcome{FirstSentAt: time.Now(), Attempts: 1, LastError: "timeout"}); err != nil {
		t.Fatal(err)
	}
	mark = len(c.Log())
	for range 7 { // past the five runs after which a plan may be kept
		recs, _, err := s.List(ctx, store.Filter{State: store.Unknown}, "", 10)
		if err != nil || len(recs) != 1 || recs[0].ID != parked {
			t.Fatalf("List(unknown) = %+v, %v; want the parked record", recs, err)
		}
	}
	lists := 0
	for _, p := range strings.Split(c.Log()[mark:], "LOG:  duration:")[1:] {
		if strings.Contains(p, "ORDER BY tenant, key") {
			lists++
			if !strings.Contains(p, "idemproxy_records_open") {
				t.Errorf("listing unknown records ran this plan, not the open-records index:\n%s", p)
			}
		}
	}
	if lists != 7 {
		t.Errorf("%d plans of the 7 lists were logged", lists)
	}
}

// TestAnalyzeIfGrown: the store measures its table when it reaches 16 pages
// and then each time it has doubled since it was last measured, and not
// between.
func TestAnalyzeIfGrown(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.Database(t)
	s := open(t, dbURL, time.Hour)
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	if _, err := admin.Exec(ctx, `ALTER TABLE idemproxy_records SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	rows := 0
	grow := func(n int) {
		t.Helper()
		if _, err := admin.Exec(ctx, `
INSERT INTO idemproxy_records (tenant, key, state, fingerprint, owner, fence, created_at)
SELECT 't', convert_to('k' || i, 'UTF8'), 2, 'fp', 'o', 1, now() FROM generate_series($1::int, $2::int) AS i`, rows+1, rows+n); err != nil {
			t.Fatal(err)
		}
		rows += n
	}
	pages := func() (size, measured int64) {
		t.Helper()
		if err := admin.QueryRow(ctx, `SELECT pg_relation_size(oid) / 8192, relpages FROM pg_class WHERE relname = 'idemproxy_records'`).Scan(&size, &measured); err != nil {
			t.Fatal(err)
		}
		return size, measured
	}
	want := func(when string, did bool) {
		t.Helper()
		size, measured := pages()
		got, err := s.analyzeIfGrown(ctx)
		if err != nil || got != did {
			t.Fatalf("%s (%d pages, %d measured): analyzeIfGrown = %v, %v; want %v", when, size, measured, got, err, did)
		}
		if _, after := pages(); did && after < size {
			t.Fatalf("%s: measured %d pages after ANALYZE, the table has %d", when, after, size)
		}
	}
	grow(10)
	want("a table of one page", false)
	for n := int64(0); n < 16; n, _ = pages() {
		grow(100)
	}
	want("16 pages, never measured", true)
	want("just measured", false)
	size, _ := pages()
	for now := size; now < 2*size; now, _ = pages() {
		if now > size {
			want("grown, not doubled", false)
		}
		grow(200)
	}
	want("doubled", true)

	// A user with only the grants the tables need may not ANALYZE: the
	// store leaves it to autovacuum instead of asking every time.
	role := "idemproxy_dml_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, sql := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ` + role,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		admin.Exec(context.Background(), `DROP OWNED BY `+role)
		admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	dml := open(t, u.String(), time.Hour)
	size, _ = pages()
	for now := size; now < 2*size; now, _ = pages() {
		grow(200)
	}
	if did, err := dml.analyzeIfGrown(ctx); err != nil || did {
		t.Fatalf("doubled, as a user who does not own the table: analyzeIfGrown = %v, %v; want false, nil", did, err)
	}
	want("doubled, as the owner", true)
}
