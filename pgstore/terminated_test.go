package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestWriteTerminatedMidStatementIsSentAgain: a DBA ends the session of a
// replica's batched write while its statement runs (pg_terminate_backend:
// FATAL 57P01, the statement aborted, nothing written). The write is sent
// again on another connection instead of failing: a final answer's failed,
// after the provider had acted, and the app got 503 for an operation that
// ran (12 to 44 of 400 orders through two replicas while 3 to 10 write
// backends were ended); a claim's failed with 503 store_unavailable.
func TestWriteTerminatedMidStatementIsSentAgain(t *testing.T) {
	url := pgtest.Database(t)
	ctx := context.Background()
	s := open(t, url, time.Hour)
	req := store.Request{Fingerprint: []byte("fp")}
	done := store.ID{Key: "to-complete"}
	if _, created, err := s.Begin(ctx, done, req, "o", time.Minute); err != nil || !created {
		t.Fatalf("Begin = %v, %v", created, err)
	}
	admin := session(t, url)
	other := session(t, url)

	// terminate ends the store's session once it waits for admin's lock,
	// then releases the lock.
	terminate := func(t *testing.T, tx pgx.Tx) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var n int
			if err := other.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'idemproxy' AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the store's statement never waited for the lock")
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("final answer", func(t *testing.T) {
		tx, err := admin.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM idemproxy_records WHERE key = $1 FOR UPDATE`, []byte(done.Key)); err != nil {
			t.Fatal(err)
		}
		res := make(chan error, 1)
		go func() {
			res <- s.Complete(ctx, done, "o", store.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, time.Now())
		}()
		terminate(t, tx)
		if err := <-res; err != nil {
			t.Fatalf("Complete whose statement's session was ended: %v; want it sent again and stored", err)
		}
		if rec, err := s.Get(ctx, done); err != nil || rec.State != store.Final {
			t.Fatalf("record = %+v, %v; want final", rec, err)
		}
	})

	t.Run("claim", func(t *testing.T) {
		id := store.ID{Key: "to-claim"}
		tx, err := admin.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// An uncommitted row under the key: the claim's insert waits for it.
		if _, err := tx.Exec(ctx, `INSERT INTO idemproxy_records (tenant, key, state, fingerprint, owner, fence, lease_until, created_at)
			VALUES ('', $1, 1, 'x', 'admin', 1, now(), now())`, []byte(id.Key)); err != nil {
			t.Fatal(err)
		}
		type claimed struct {
			created bool
			err     error
		}
		res := make(chan claimed, 1)
		go func() {
			_, created, err := s.Begin(ctx, id, req, "o", time.Minute)
			res <- claimed{created, err}
		}()
		terminate(t, tx)
		if r := <-res; r.err != nil || !r.created {
			t.Fatalf("claim whose statement's session was ended = %v, %v; want it sent again and claimed", r.created, r.err)
		}
	})
}
