package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestBeginOnReadOnlyDatabase: the database turns read-only (a failover to
// a standby, or default_transaction_read_only set by a managed service whose
// disk fills) after answers were stored. Every claim is refused (25006), but
// the records read: a Begin for a key whose record no claim would take (a
// final answer, another request's record, one in flight under a live lease)
// returns it, not created, as it does when the database takes writes, so
// that the stored answer is replayed, another body is a conflict and a
// repeat waits for the operation in flight. Only a key the claim would have
// taken (none, an unknown outcome, a lease run out) fails ErrUnavailable.
// Before, every Begin failed, and the app that repeated a payment already
// made got 503 instead of its answer.
func TestBeginOnReadOnlyDatabase(t *testing.T) {
	_, url := pgtest.Own(t, pgtest.Options{})
	ctx := context.Background()
	s := open(t, url, time.Hour)
	fp, other := []byte("fp-1"), []byte("fp-2")
	req := store.Request{Fingerprint: fp, Method: "POST", Path: "/p"}
	resp := store.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}
	begin := func(key string, r store.Request, lease time.Duration) (store.Record, bool, error) {
		return s.Begin(ctx, store.ID{Key: key}, r, "owner-"+key, lease)
	}
	if _, created, err := begin("final", req, time.Minute); err != nil || !created {
		t.Fatal(created, err)
	}
	if err := s.Complete(ctx, store.ID{Key: "final"}, "owner-final", resp, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, created, err := begin("live", req, time.Hour); err != nil || !created {
		t.Fatal(created, err)
	}
	if _, created, err := begin("ended", req, time.Millisecond); err != nil || !created {
		t.Fatal(created, err)
	}
	if _, created, err := begin("unknown", req, time.Minute); err != nil || !created {
		t.Fatal(created, err)
	}
	if err := s.Park(ctx, store.ID{Key: "unknown"}, "owner-unknown", store.Outcome{Attempts: 1, FirstSentAt: time.Now(), LastError: "timeout"}); err != nil {
		t.Fatal(err)
	}

	admin := session(t, url)
	if _, err := admin.Exec(ctx, `SET default_transaction_read_only = off`); err != nil {
		t.Fatal(err)
	}
	readOnly := func(on bool) {
		t.Helper()
		for _, q := range []string{fmt.Sprintf(`ALTER SYSTEM SET default_transaction_read_only = %t`, on), `SELECT pg_reload_conf()`} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	readOnly(true)
	defer readOnly(false)
	for deadline := time.Now().Add(30 * time.Second); s.Ping(ctx) == nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Ping still succeeds 30 s after the database turned read-only")
		}
	}

	rec, created, err := begin("final", req, time.Minute)
	if err != nil || created || rec.State != store.Final || rec.Response.Status != 201 || !bytes.Equal(rec.Response.Body, resp.Body) {
		t.Errorf("Begin of a stored answer's key on a read-only database = state %v status %d, created %v, %v; want the final record, not created", rec.State, rec.Response.Status, created, err)
	}
	rec, created, err = begin("final", store.Request{Fingerprint: other}, time.Minute)
	if err != nil || created || !bytes.Equal(rec.Fingerprint, fp) {
		t.Errorf("Begin with another body on a read-only database = state %v fingerprint %q, created %v, %v; want the record (a conflict), not created", rec.State, rec.Fingerprint, created, err)
	}
	rec, created, err = begin("live", req, time.Minute)
	if err != nil || created || !rec.LeaseLive(time.Now()) {
		t.Errorf("Begin of a key in flight under a live lease on a read-only database = state %v lease until %v, created %v, %v; want the record, not created", rec.State, rec.LeaseUntil, created, err)
	}
	for _, key := range []string{"new", "ended", "unknown"} {
		if _, _, err := begin(key, req, time.Minute); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("Begin of %q, which a claim would take, on a read-only database = %v, want ErrUnavailable", key, err)
		}
	}
}
