package pgstore

import (
	"context"
	"fmt"

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
}

// migrate creates or upgrades the schema under an advisory lock.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(schemaLock)); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(schemaLock))
	// CREATE TABLE IF NOT EXISTS needs the CREATE privilege even when the
	// table exists: a user with only the tables' grants may start once
	// the schema is in place (README, Privileges).
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('idemproxy_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS idemproxy_schema (version integer NOT NULL)`); err != nil {
			return err
		}
	}
	var version int
	err = conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM idemproxy_schema`).Scan(&version)
	if err != nil {
		return err
	}
	if version > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this build's %d: run a newer idemproxy", version, len(migrations))
	}
	for v := version; v < len(migrations); v++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, migrations[v]); err != nil {
			tx.Rollback(ctx)
			return fmt.Errorf("schema upgrade to version %d: %w", v+1, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM idemproxy_schema`); err != nil {
			tx.Rollback(ctx)
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO idemproxy_schema VALUES ($1)`, v+1); err != nil {
			tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}
