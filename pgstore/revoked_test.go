package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestPingWhileWritesDenied: a DBA revokes a privilege every claim needs
// (INSERT, or UPDATE, which INSERT ... ON CONFLICT DO UPDATE needs) from
// idemproxy's user while it runs. Every claim is refused (42501), so Ping,
// and so /readyz, must fail as for a read-only database, and pass again
// once the grant is back, without a new store. It passed: the replica said
// ready while it answered every new order 503 store_unavailable.
func TestPingWhileWritesDenied(t *testing.T) {
	dbURL := pgtest.Database(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	db := pgtest.DatabaseName(dbURL)
	role := db + "_role"
	for _, q := range []string{`CREATE ROLE ` + role + ` LOGIN`, `GRANT CREATE ON SCHEMA public TO ` + role} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s := open(t, strings.Replace(dbURL, "postgres@", role+"@", 1), time.Hour)
	req := store.Request{Fingerprint: []byte("fp")}
	for i, priv := range []string{"INSERT", "UPDATE"} {
		if _, err := admin.Exec(ctx, `REVOKE `+priv+` ON idemproxy_records FROM `+role); err != nil {
			t.Fatal(err)
		}
		id := store.ID{Key: fmt.Sprintf("denied-%d", i)}
		if _, _, err := s.Begin(ctx, id, req, "o", time.Minute); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("claim without %s = %v, want ErrUnavailable", priv, err)
		}
		for range 2 {
			if err := s.Ping(ctx); err == nil {
				t.Fatalf("Ping while claims are refused for want of %s = nil, want an error (not ready)", priv)
			}
		}
		if _, err := admin.Exec(ctx, `GRANT `+priv+` ON idemproxy_records TO `+role); err != nil {
			t.Fatal(err)
		}
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("Ping once %s is granted again: %v", priv, err)
		}
		if _, created, err := s.Begin(ctx, id, req, "o", time.Minute); err != nil || !created {
			t.Fatalf("claim once %s is granted again = %v, %v", priv, created, err)
		}
	}
}
