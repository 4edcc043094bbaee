package pgstore

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// schemaLock is the advisory lock key held while the schema is created or
// upgraded, so that replicas starting at once take turns.
const schemaLock = 0x1de3_9a0c_5c4e_0001

// migrations[i] upgrades the schema from version i to i+1. Append only: a
// released migration never changes.
var migrations = []string{
	`CREATE TABLE idemproxy_records (
		tenant        bytea       NOT NULL,
		key           bytea       NOT NULL,
		state         smallint    NOT NULL,
		fingerprint   bytea       NOT NULL,
		owner         text        NOT NULL,
		fence         bigint      NOT NULL,
		lease_until   timestamptz,
		created_at    timestamptz NOT NULL,
		expires_at    timestamptz,
		status        integer     NOT NULL DEFAULT 0,
		header        bytea,
		body          bytea,
		first_sent_at timestamptz,
		attempts      integer     NOT NULL DEFAULT 0,
		last_error    text        NOT NULL DEFAULT '',
		PRIMARY KEY (tenant, key)
	);
	CREATE INDEX idemproxy_records_expires ON idemproxy_records (expires_at) WHERE expires_at IS NOT NULL;
	CREATE INDEX idemproxy_records_open ON idemproxy_records (state) WHERE state <> 2;
	-- Provider-wide state shared by replicas (pauses and the rate limit). It
	-- may be lost in a database crash: that only ends a pause early.
	CREATE UNLOGGED TABLE idemproxy_throttle (
		name         text PRIMARY KEY,
		paused_until timestamptz NOT NULL DEFAULT '-infinity',
		tat          timestamptz NOT NULL DEFAULT '-infinity'
	);`,
	// 2: a final record an operator moved to its order's next key generation
	// is kept (without expiry) and marked.
	`ALTER TABLE idemproxy_records ADD COLUMN superseded boolean NOT NULL DEFAULT false;`,
	// 3: a heartbeat row per running replica, so that each knows how many
	// share the provider's rate (see Throttle). Lost in a database crash
	// and written again within seconds.
	`CREATE UNLOGGED TABLE idemproxy_replicas (
		replica text        PRIMARY KEY,
		seen_at timestamptz NOT NULL
	);`,
	// 4: what the request was and the key sent upstream, for operators, and
	// the last ambiguous answer's body, for the status probe. Rows written
	// before have them empty.
	`ALTER TABLE idemproxy_records
		ADD COLUMN method       text NOT NULL DEFAULT '',
		ADD COLUMN path         text NOT NULL DEFAULT '',
		ADD COLUMN upstream_key text NOT NULL DEFAULT '',
		ADD COLUMN last_body    bytea;`,
	// 5: a final record whose answer needs review is kept without expiry
	// until an operator marks it reviewed (store.Store.Reviewed).
	`ALTER TABLE idemproxy_records ADD COLUMN reviewed boolean NOT NULL DEFAULT false;`,
	// 6: each replica's provider and a digest of its key settings, so
	// that replicas of one provider whose settings would give one order
	// two keys are told (ThrottleOptions.Keying). Rows written before have
	// them empty, and are not compared.
	`ALTER TABLE idemproxy_replicas
		ADD COLUMN provider text NOT NULL DEFAULT '',
		ADD COLUMN keying   text NOT NULL DEFAULT '';`,
	// 7: the request as first sent upstream (store.Outcome.Sent), kept
	// while the outcome is unknown so that a resume sends the same bytes.
	// NULL sent_body: none kept (rows written before, or by an older
	// replica, which leaves the columns alone).
	`ALTER TABLE idemproxy_records
		ADD COLUMN sent_body     bytea,
		ADD COLUMN sent_type     text,
		ADD COLUMN sent_encoding text;`,
}

// migrate creates or upgrades the schema under an advisory lock, released
// within unlockWithin even when ctx has ended.
func migrate(ctx context.Context, pool *pgxpool.Pool, unlockWithin time.Duration) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// Before the lock, which is the session's: taken and released through
	// a pooler in transaction mode, each could run on another server
	// connection, and the lock be left held on one for ever.
	if err := checkSessionKept(ctx, pool, conn); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(schemaLock)); err != nil {
		return err
	}
	defer func() {
		// The unlock runs when ctx has ended too, but within a bound: on
		// a database that stopped answering it would otherwise wait for
		// ever. An unlock cut short drops the connection, and the lock
		// goes with the session.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockWithin)
		defer cancel()
		conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(schemaLock))
	}()
	// CREATE TABLE IF NOT EXISTS needs the CREATE privilege even when the
	// table exists: a user with only the tables' grants may start once
	// the schema is in place (README, Privileges).
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('idemproxy_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS idemproxy_schema (version integer NOT NULL)`); err != nil {
			return privilegeRefused(ctx, conn, 0, err)
		}
	}
	var version int
	err = conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM idemproxy_schema`).Scan(&version)
	if err != nil {
		return err
	}
	if version > len(migrations) {
		// An older build's replica restarted during a rolling update, or
		// a rollback across the upgrade. Lowering the version by hand
		// would make the newer build run its upgrade again at its next
		// start, and stop on it (the columns exist).
		return fmt.Errorf("schema version %d is newer than this build's %d: a newer idemproxy has upgraded this database, "+
			"and a build of an older schema cannot run on it (a rollback across a schema upgrade is not possible): "+
			"run that version or a newer one; do not lower the version in idemproxy_schema by hand, "+
			"the newer build would then stop at its next start, running its upgrade again", version, len(migrations))
	}
	for v := version; v < len(migrations); {
		err := upgrade(ctx, conn, v)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available
			// Replicas of the older build are using the table. Waiting
			// in the lock's queue would hold up all their statements
			// behind this one: let them run and try again.
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w: schema upgrade to version %d: %w", errTablesBusy, v+1, ctx.Err())
			case <-time.After(upgradeLockWait/2 + rand.N(upgradeLockWait)):
			}
			continue
		}
		if err != nil {
			return privilegeRefused(ctx, conn, v, err)
		}
		v++
	}
	return checkGrants(ctx, conn)
}

// privilegeRefused explains a creation (v = 0) or an upgrade from version v
// that the database refused for want of a privilege (42501): PostgreSQL's
// own "permission denied for schema public" or "must be owner of table"
// names neither the user nor what to grant. Any other error is returned as
// it is.
func privilegeRefused(ctx context.Context, conn *pgxpool.Conn, v int, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		return err
	}
	var user, schema, db string
	q := `SELECT current_user, coalesce(current_schema(), 'public'), current_database()`
	if qerr := conn.QueryRow(ctx, q).Scan(&user, &schema, &db); qerr != nil {
		return err
	}
	grant := fmt.Sprintf("GRANT CREATE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), pgx.Identifier{user}.Sanitize())
	if v == 0 {
		return fmt.Errorf("the database user %q may not create idemproxy's tables in schema %q of database %q: "+
			"grant it CREATE on that schema for the first start and upgrades (%s), "+
			"or start idemproxy once as a user that has it and grant %q SELECT, INSERT, UPDATE, DELETE on the idemproxy_ tables: %w",
			user, schema, db, grant, user, err)
	}
	return fmt.Errorf("the database user %q may not upgrade idemproxy's tables from schema version %d to %d in schema %q of database %q: "+
		"an upgrade needs the tables' owner, with CREATE on the schema (%s); "+
		"start this version once as the owner of the idemproxy_ tables: %w",
		user, v, len(migrations), schema, db, grant, err)
}

// upgradeLockWait bounds how long one schema upgrade waits for a table's
// lock. An ALTER TABLE waits for every running statement on the table, and
// while it waits every later statement waits behind it: the replicas still
// running the older build would stall for as long as it queued.
const upgradeLockWait = 500 * time.Millisecond

// errTablesBusy is migrate's answer when the tables stayed in use for as
// long as ctx allowed: not a refusal, tried again later.
var errTablesBusy = errors.New("tables busy")

// upgrade runs migrations[v] and records version v+1 in one transaction,
// failing with lock_not_available after upgradeLockWait on a busy table.
func upgrade(ctx context.Context, conn *pgxpool.Conn, v int) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", upgradeLockWait.Milliseconds())); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, migrations[v]); err != nil {
		return fmt.Errorf("schema upgrade to version %d: %w", v+1, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM idemproxy_schema`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO idemproxy_schema VALUES ($1)`, v+1); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// grantsMissing lists, one row per table, the privileges on idemproxy's
// tables that the session's user lacks: SELECT, INSERT, UPDATE and DELETE on
// the tables every request and the throttle write, SELECT on the schema's
// version.
const grantsMissing = `SELECT t, string_agg(p, ', ' ORDER BY o)
	FROM (VALUES ('idemproxy_records'), ('idemproxy_throttle'), ('idemproxy_replicas')) tables (t),
		(VALUES (1, 'SELECT'), (2, 'INSERT'), (3, 'UPDATE'), (4, 'DELETE')) privileges (o, p)
	WHERE NOT has_table_privilege(t, p)
	GROUP BY t
	UNION ALL
	SELECT 'idemproxy_schema', 'SELECT' WHERE NOT has_table_privilege('idemproxy_schema', 'SELECT')
	ORDER BY 1`

// checkGrants refuses a user who may read the schema but lacks a privilege
// the request path needs: without it every protected request would fail
// with 503 store_unavailable while /readyz said ready.
func checkGrants(ctx context.Context, conn *pgxpool.Conn) error {
	rows, err := conn.Query(ctx, grantsMissing)
	if err != nil {
		return err
	}
	missing, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var table, privileges string
		err := row.Scan(&table, &privileges)
		return privileges + " on " + table, err
	})
	if err != nil {
		return err
	}
	if len(missing) == 0 {
		return nil
	}
	var user string
	if err := conn.QueryRow(ctx, `SELECT current_user`).Scan(&user); err != nil {
		return err
	}
	return fmt.Errorf("%w: the database user %q lacks %s; grant it SELECT, INSERT, UPDATE, DELETE on the idemproxy_ tables",
		errMissingGrants, user, strings.Join(missing, "; "))
}

// errMissingGrants is checkGrants' refusal.
var errMissingGrants = errors.New("missing privileges")

// errSessionNotKept is Open's refusal when the connections do not keep their
// sessions between transactions: a pooler in transaction or statement mode
// (PgBouncer's pool_mode = transaction) between idemproxy and PostgreSQL.
// The store needs its sessions: synchronous_commit on and the timeouts are
// session settings, which would be lost, or leak to the pooler's other
// clients; pgx's prepared statements, the schema's advisory lock and the
// throttle's LISTEN are the session's too.
var errSessionNotKept = errors.New("the database connection does not keep its session between transactions: " +
	"a pooler in transaction or statement mode (PgBouncer pool_mode = transaction or statement) is in front of PostgreSQL, " +
	"and idemproxy's records would lose synchronous_commit = on and its timeouts; " +
	"use pool_mode = session for idemproxy's database, or connect to PostgreSQL directly")

// sessionMark is the custom setting checkSessionKept writes and reads.
const sessionMark = "idemproxy.session_check"

// checkSessionKept fails with errSessionNotKept when held, a connection of
// pool, does not keep its session between transactions. It sets a mark on
// held's session, then reads it on another connection of the pool and on
// held again, each its own transaction: PostgreSQL, or a pooler in session
// mode, gives each client connection its own session for as long as it is
// open, so the other never sees the mark and held always does. A pooler in
// transaction mode runs each transaction on whichever server connection is
// free: the other sees the mark when it gets held's last one (PgBouncer
// hands out the last freed first), or held does not when it gets another.
// Simple protocol: no prepared statement, which such a pooler would lose.
func checkSessionKept(ctx context.Context, pool *pgxpool.Pool, held *pgxpool.Conn) error {
	var b [16]byte
	crand.Read(b[:])
	mark := hex.EncodeToString(b[:])
	if _, err := simpleQuery(ctx, held, `SELECT set_config('`+sessionMark+`', '`+mark+`', false)`); err != nil {
		return err
	}
	other, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer other.Release()
	const read = `SELECT coalesce(current_setting('` + sessionMark + `', true), '')`
	seen, err := simpleQuery(ctx, other, read)
	if err != nil {
		return err
	}
	kept, err := simpleQuery(ctx, held, read)
	if err != nil {
		return err
	}
	if seen == mark || kept != mark {
		return errSessionNotKept
	}
	return nil
}

// simpleQuery runs sql, a query of one row and one column, with the simple
// protocol and returns its value as text. (pgx's own simple protocol mode
// refuses a database whose encoding is not UTF-8; the values here are
// ASCII.)
func simpleQuery(ctx context.Context, conn *pgxpool.Conn, sql string) (string, error) {
	res, err := conn.Conn().PgConn().Exec(ctx, sql).ReadAll()
	if err != nil {
		return "", err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return "", fmt.Errorf("%s: not one value", sql)
	}
	return string(res[0].Rows[0][0]), nil
}
