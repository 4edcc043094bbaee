package pgstore

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestOpenWithoutCreateNamesTheGrant: the first start on an empty database
// as a user without CREATE on its schema, and an upgrade as a user who does
// not own the tables, fail Open naming the user, the schema, the database
// and the statement to run. Before, the operator got only PostgreSQL's
// "permission denied for schema public" or "must be owner of table".
// Granting what the first message says lets Open succeed.
func TestOpenWithoutCreateNamesTheGrant(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.Database(t)
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	role := "idemproxy_nocreate_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() {
		admin.Exec(context.Background(), `DROP OWNED BY `+role)
		admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	for _, sql := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`REVOKE CREATE ON SCHEMA public FROM PUBLIC`, // PostgreSQL 14 and older grant it
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
	opts := Options{URL: u.String(), SweepInterval: -1, AnalyzeInterval: -1}
	db := pgtest.DatabaseName(dbURL)

	s, err := Open(ctx, opts)
	if err == nil {
		s.Close()
		t.Fatal("Open on an empty database as a user without CREATE succeeded")
	}
	grant := `GRANT CREATE ON SCHEMA "public" TO "` + role + `"`
	for _, want := range []string{`"` + role + `"`, `schema "public"`, `database "` + db + `"`, grant, "permission denied"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open error = %q, want it to name %q", err, want)
		}
	}
	if _, err := admin.Exec(ctx, grant); err != nil {
		t.Fatal(err)
	}
	open(t, u.String(), time.Hour).Close()

	// The tables are the role's now; an upgrade by another user, who has
	// every grant on them but does not own them, is refused likewise.
	other := role + "_b"
	t.Cleanup(func() {
		admin.Exec(context.Background(), `DROP OWNED BY `+other)
		admin.Exec(context.Background(), `DROP ROLE `+other)
	})
	rs, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close(ctx)
	for _, sql := range []string{
		`CREATE ROLE ` + other + ` LOGIN`,
		`GRANT CREATE ON SCHEMA public TO ` + other,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	for _, sql := range []string{
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idemproxy_records, idemproxy_throttle, idemproxy_replicas, idemproxy_schema TO ` + other,
		// back to version 5, as a database an older build made
		`ALTER TABLE idemproxy_replicas DROP COLUMN provider, DROP COLUMN keying`,
		`UPDATE idemproxy_schema SET version = 5`,
	} {
		if _, err := rs.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	u.User = url.User(other)
	opts.URL = u.String()
	s, err = Open(ctx, opts)
	if err == nil {
		s.Close()
		t.Fatal("an upgrade as a user who does not own the tables succeeded")
	}
	for _, want := range []string{`"` + other + `"`, fmt.Sprintf("from schema version 5 to %d", len(migrations)), "owner of the idemproxy_ tables", "must be owner"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open error = %q, want it to name %q", err, want)
		}
	}
}
