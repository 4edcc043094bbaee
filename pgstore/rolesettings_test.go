package pgstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestRoleTimeoutsDoNotFailWrites: a DBA's lock_timeout or statement_timeout
// on idemproxy's role (ALTER ROLE ... SET), shorter than a row lock is held
// by another session, made the final answer's UPDATE fail (55P03 or 57014):
// the operation had run at the provider, and the app got 503 instead of its
// answer (7 of 200 orders through two replicas with lock_timeout 1ms). Every
// store call is bounded by the call timeout, so a write waits for the lock
// within it whatever the role says; a timeout the URL gives is kept.
func TestRoleTimeoutsDoNotFailWrites(t *testing.T) {
	ctx := context.Background()
	for i, setting := range []string{`lock_timeout = '20ms'`, `statement_timeout = '100ms'`} {
		t.Run(strings.Fields(setting)[0], func(t *testing.T) {
			dbURL := pgtest.Database(t)
			admin, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(ctx)
			db := pgtest.DatabaseName(dbURL)
			role := db + "_role" // roles are the cluster's: one per database
			for _, q := range []string{`CREATE ROLE ` + role + ` LOGIN`, `ALTER DATABASE ` + db + ` OWNER TO ` + role,
				`ALTER ROLE ` + role + ` SET ` + setting} {
				if _, err := admin.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			s := open(t, strings.Replace(dbURL, "postgres@", role+"@", 1), time.Hour)
			id, req := store.ID{Key: "locked-" + string(rune('a'+i))}, store.Request{Fingerprint: []byte("fp")}
			if _, created, err := s.Begin(ctx, id, req, "o", time.Minute); err != nil || !created {
				t.Fatalf("Begin = %v, %v", created, err)
			}
			// Another session (a DBA's, an operator's UPDATE) holds the row
			// for 400 ms.
			tx, err := admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SELECT 1 FROM idemproxy_records WHERE key = $1 FOR UPDATE`, []byte(id.Key)); err != nil {
				t.Fatal(err)
			}
			released := make(chan error, 1)
			go func() {
				time.Sleep(400 * time.Millisecond)
				released <- tx.Rollback(ctx)
			}()
			err = s.Complete(ctx, id, "o", store.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, time.Now())
			if rerr := <-released; rerr != nil {
				t.Fatal(rerr)
			}
			if err != nil {
				t.Fatalf("Complete while another session held the row 400 ms, role with %s: %v; want it stored once the lock is free", setting, err)
			}
			rec, err := s.Get(ctx, id)
			if err != nil || rec.State != store.Final || string(rec.Response.Body) != `{"id":"pay_1"}` {
				t.Fatalf("record after Complete: %+v, %v", rec, err)
			}
		})
	}
}

// TestURLTimeoutsKept: a lock_timeout or statement_timeout the URL gives is
// the session's as given; without one, idemproxy sets 0 (the call timeout bounds
// every statement).
func TestURLTimeoutsKept(t *testing.T) {
	base := "postgres://u@127.0.0.1:5432/db"
	for query, want := range map[string][2]string{
		"":                 {"0", "0"},
		"?lock_timeout=2s": {"2s", "0"},
		"?statement_timeout=3000&lock_timeout=1s": {"1s", "3000"},
	} {
		_, rp, err := poolConfig(withDefaults(Options{URL: base + query}))
		if err != nil {
			t.Fatal(err)
		}
		if rp["lock_timeout"] != want[0] || rp["statement_timeout"] != want[1] {
			t.Errorf("URL %q: lock_timeout %q statement_timeout %q, want %q %q", query, rp["lock_timeout"], rp["statement_timeout"], want[0], want[1])
		}
	}
}
