package pgstore

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestSessionSettingsUnderRoleStatementTimeout: a DBA set a short
// statement_timeout on idemproxy's role (ALTER ROLE ... SET
// statement_timeout = '1ms'). The settings every new connection makes
// (sessionSettings, statement_timeout = 0 among them) were one query
// string that ran under the role's timeout until its own SET was reached:
// when it fired first, the connection failed ("session settings: canceling
// statement", SQLSTATE 57014) and so did the call that opened it, a claim
// (503 store_unavailable) or, after the provider had acted, the final
// answer's write. Measured with three replicas whose sessions the server
// ended when idle (idle_session_timeout): 34 requests answered 503 in 20 s
// of load on a healthy database. Every new connection must come up, with
// statement_timeout 0.
func TestSessionSettingsUnderRoleStatementTimeout(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.Database(t)
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	role := "idemproxy_stmt_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() { admin.Exec(context.Background(), `DROP ROLE `+role) })
	for _, sql := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`ALTER ROLE ` + role + ` SET statement_timeout = '1ms'`,
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
	cfg, _, err := poolConfig(withDefaults(Options{URL: u.String()}))
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 25
	var failed, canceled atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				c, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
				if err != nil {
					t.Error(err)
					return
				}
				err = cfg.AfterConnect(ctx, c)
				if err == nil {
					var v string
					if err = c.QueryRow(ctx, `SHOW statement_timeout`).Scan(&v); err == nil && v != "0" {
						err = errors.New("statement_timeout " + v + ", want 0")
					}
				}
				if err != nil {
					failed.Add(1)
					if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "57014" {
						canceled.Add(1)
					}
					once.Do(func() { first = err })
				}
				c.Close(ctx)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d new connections failed (%d cancelled, SQLSTATE 57014) under the role's statement_timeout of 1ms; first: %v",
			n, workers*each, canceled.Load(), first)
	}
}
