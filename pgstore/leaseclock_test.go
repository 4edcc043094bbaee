package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// A record's lease is judged by the database's clock (store.Record.ReadAt),
// not by the caller's: every record a claim or a read hands out carries the
// database's now(), so that a replica whose clock is hours off the
// database's still sees a lease live exactly while the database does. The
// lease ends are written relative to the database's now() by SQL, as
// another replica's claim and renewals write them.
func TestLeaseJudgedByDatabaseClock(t *testing.T) {
	url := pgtest.Database(t)
	s := open(t, url, time.Hour)
	ctx := context.Background()
	admin := session(t, url)
	setLease := func(id store.ID, sql string) {
		t.Helper()
		tag, err := admin.Exec(ctx, `UPDATE idemproxy_records SET lease_until = `+sql+` WHERE key = $1 AND state = 1`, []byte(id.Key))
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("setting the lease: %v, %d rows", err, tag.RowsAffected())
		}
	}
	behind, ahead := time.Now().Add(-2*time.Hour), time.Now().Add(2*time.Hour)
	req := store.Request{Fingerprint: []byte("fp-0123456789abcdef0123456789abc"), Method: "POST", Path: "/v1/payments"}
	id := store.ID{Key: "k1"}

	claim, created, err := s.Begin(ctx, id, req, "owner-1", time.Minute)
	if err != nil || !created {
		t.Fatalf("Begin = %v, %v", created, err)
	}
	if claim.ReadAt.IsZero() || claim.LeaseUntil.Sub(claim.ReadAt) != time.Minute || !claim.LeaseLive(ahead) {
		t.Fatalf("claimed record: ReadAt %v, LeaseUntil %v, live for a clock ahead %v; want the database's now a lease before LeaseUntil, live",
			claim.ReadAt, claim.LeaseUntil, claim.LeaseLive(ahead))
	}

	setLease(id, `now() - interval '1 second'`) // over by the database's clock
	rec, err := s.Get(ctx, id)
	if err != nil || rec.ReadAt.IsZero() || rec.LeaseLive(behind) {
		t.Fatalf("Get after the lease ran out: %+v, %v; want it over for a clock two hours behind the database's", rec, err)
	}
	recs, _, err := s.List(ctx, store.Filter{State: store.InFlight}, "", 10)
	if err != nil || len(recs) != 1 || recs[0].LeaseLive(behind) {
		t.Fatalf("List after the lease ran out: %+v, %v; want the record, its lease over", recs, err)
	}

	setLease(id, `now() + interval '1 hour'`) // live by the database's clock
	rec, err = s.Get(ctx, id)
	if err != nil || !rec.LeaseLive(ahead) {
		t.Fatalf("Get under a live lease: %+v, %v; want it live for a clock two hours ahead of the database's", rec, err)
	}
	// A Begin that claims nothing returns the record as read.
	other, created, err := s.Begin(ctx, id, req, "owner-2", time.Minute)
	if err != nil || created || other.Owner != "owner-1" || !other.LeaseLive(ahead) {
		t.Fatalf("Begin under a live lease = %+v, %v, %v; want owner-1's record, live for a clock ahead", other, created, err)
	}

	// A claim sent in one statement with a final answer (writeBatch's
	// both): one write statement at a time, the first held on a row lock
	// while the claim and the final answer queue behind it.
	s.writes.slots = 1
	held := store.ID{Key: "k0"}
	if _, _, err := s.Begin(ctx, held, req, "owner-0", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Park(ctx, held, "owner-0", store.Outcome{Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM idemproxy_records WHERE key = $1 FOR UPDATE`, []byte(held.Key)); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { _, _, err := s.Begin(ctx, held, req, "owner-00", time.Minute); first <- err }()
	settle(t, s.writes, 1, 0)
	done := make(chan error, 1)
	go func() { done <- s.Complete(ctx, id, "owner-1", store.Response{Status: 201}, time.Time{}) }()
	settle(t, s.writes, 1, 1)
	type claimed struct {
		rec     store.Record
		created bool
		err     error
	}
	second := make(chan claimed, 1)
	go func() {
		rec, created, err := s.Begin(ctx, store.ID{Key: "k2"}, req, "owner-2", time.Minute)
		second <- claimed{rec, created, err}
	}()
	settle(t, s.writes, 1, 2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c := <-second
	if c.err != nil || !c.created || c.rec.ReadAt.IsZero() || c.rec.LeaseUntil.Sub(c.rec.ReadAt) != time.Minute {
		t.Fatalf("claim sent with a final answer: %+v, %v, %v; want the database's now a lease before LeaseUntil", c.rec, c.created, c.err)
	}
}
