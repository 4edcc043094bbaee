package storetest

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// testRequestFields: what Begin is told of the request (method, path, key
// sent upstream) is kept through every write and shown by Get and List; with
// no TTL a record never expires (zero ExpiresAt).
func testRequestFields(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	id := newID("app-key")
	req := store.Request{Fingerprint: fpA, Method: "POST", Path: "/v1/pay%2Fouts", UpstreamKey: "bound-3f9a"}
	check := func(what string, rec store.Record) {
		t.Helper()
		if rec.Method != req.Method || rec.Path != req.Path || rec.UpstreamKey != req.UpstreamKey {
			t.Fatalf("%s: method %q path %q upstream key %q, want %q %q %q",
				what, rec.Method, rec.Path, rec.UpstreamKey, req.Method, req.Path, req.UpstreamKey)
		}
		if !rec.ExpiresAt.IsZero() {
			t.Fatalf("%s: ExpiresAt %v in a store without TTL, want zero", what, rec.ExpiresAt)
		}
	}
	rec, created, err := s.Begin(ctx, id, req, "o1", Long)
	if err != nil || !created {
		t.Fatalf("Begin = %v, %v", created, err)
	}
	check("Begin", rec)
	check("Get in flight", get(t, s, id))
	if err := s.Park(ctx, id, "o1", store.Outcome{Attempts: 1, LastError: "504 from upstream"}); err != nil {
		t.Fatal(err)
	}
	check("Get unknown", get(t, s, id))
	recs, _, err := s.List(ctx, store.Filter{State: store.Unknown, Keep: func(r *store.Record) bool { return r.ID == id }}, "", 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("List = %d records, %v; want the one", len(recs), err)
	}
	check("List", recs[0])
	rec, created, err = s.Begin(ctx, id, req, "o2", Long)
	if err != nil || !created {
		t.Fatalf("resume = %v, %v", created, err)
	}
	check("resume", rec)
	if err := s.Complete(ctx, id, "o2", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	check("Get final", get(t, s, id))
	if rec, _ := begin(t, s, id, fpB, "o3", Long); rec.Method != req.Method || rec.UpstreamKey != req.UpstreamKey {
		t.Fatalf("Begin with another request changed the record's: %+v", rec)
	}
}

// testTakeoverKeepsUpstreamKey: a Begin that takes a record over (its
// outcome unknown, or its lease run out) keeps the upstream key the record
// was claimed with, whatever key it is given (another replica binds keys
// with another secret, or the secret was changed): the operation may have
// run under the first key, and a resume under another would run it again.
// Only a record that expired starts over with the key given.
func testTakeoverKeepsUpstreamKey(t *testing.T, s store.Store, advance func(time.Duration)) {
	ctx := context.Background()
	id := newID("app-key")
	first := store.Request{Fingerprint: fpA, Method: "POST", Path: "/payments", UpstreamKey: "bound-by-a"}
	other := first
	other.UpstreamKey = "bound-by-b"
	if _, created, err := s.Begin(ctx, id, first, "o1", Long); err != nil || !created {
		t.Fatalf("Begin = %v, %v", created, err)
	}
	if err := s.Park(ctx, id, "o1", store.Outcome{Attempts: 1, LastError: "status 504 from upstream"}); err != nil {
		t.Fatal(err)
	}
	rec, created, err := s.Begin(ctx, id, other, "o2", short)
	if err != nil || !created {
		t.Fatalf("resume = %v, %v", created, err)
	}
	if rec.UpstreamKey != first.UpstreamKey || get(t, s, id).UpstreamKey != first.UpstreamKey {
		t.Fatalf("resume of an unknown record: upstream key %q, then %q; want the first claim's %q",
			rec.UpstreamKey, get(t, s, id).UpstreamKey, first.UpstreamKey)
	}
	advance(2 * short)
	rec, created, err = s.Begin(ctx, id, other, "o3", Long)
	if err != nil || !created {
		t.Fatalf("takeover after the lease = %v, %v", created, err)
	}
	if rec.UpstreamKey != first.UpstreamKey || get(t, s, id).UpstreamKey != first.UpstreamKey {
		t.Fatalf("takeover of an in-flight record: upstream key %q, then %q; want the first claim's %q",
			rec.UpstreamKey, get(t, s, id).UpstreamKey, first.UpstreamKey)
	}

	// A record without a method (a window anchor, which names the key of
	// the operation its period belongs to) takes the new owner's.
	anchor := newID("anchor")
	if _, created, err := s.Begin(ctx, anchor, store.Request{Fingerprint: fpA, UpstreamKey: "named-first"}, "o1", short); err != nil || !created {
		t.Fatalf("Begin anchor = %v, %v", created, err)
	}
	advance(2 * short)
	rec, created, err = s.Begin(ctx, anchor, store.Request{Fingerprint: fpA, UpstreamKey: "named-again"}, "o2", Long)
	if err != nil || !created || rec.UpstreamKey != "named-again" || get(t, s, anchor).UpstreamKey != "named-again" {
		t.Fatalf("takeover of an anchor = %v, %v, upstream key %q; want it taken with the new owner's key", created, err, rec.UpstreamKey)
	}
}

// testLastBody: Park keeps the last ambiguous answer's body for the next
// owner, a Park without one (a timeout) keeps the earlier body, and Complete
// drops it.
func testLastBody(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	body := []byte(`{"payment_id":"pay_42","status":"processing"}`)
	mustBegin(t, s, id, fpA, "o1", Long)
	if err := s.Park(ctx, id, "o1", store.Outcome{Attempts: 2, LastError: "status 504 from upstream", LastBody: body}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, id).Outcome.LastBody; !bytes.Equal(got, body) {
		t.Fatalf("after Park: LastBody %q, want %q", got, body)
	}
	rec := mustBegin(t, s, id, fpA, "o2", Long)
	if !bytes.Equal(rec.Outcome.LastBody, body) {
		t.Fatalf("resume: LastBody %q, want %q", rec.Outcome.LastBody, body)
	}
	if err := s.Park(ctx, id, "o2", store.Outcome{Attempts: 1, LastError: "timeout after send"}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, id).Outcome; !bytes.Equal(got.LastBody, body) || got.Attempts != 3 {
		t.Fatalf("after a Park without a body: %+v, want the earlier body and 3 attempts", got)
	}
	newer := []byte(`{"payment_id":"pay_42","status":"pending"}`)
	mustBegin(t, s, id, fpA, "o3", Long)
	if err := s.Park(ctx, id, "o3", store.Outcome{Attempts: 1, LastBody: newer}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, id).Outcome.LastBody; !bytes.Equal(got, newer) {
		t.Fatalf("after a Park with a newer body: %q, want %q", got, newer)
	}
	mustBegin(t, s, id, fpA, "o4", Long)
	if err := s.Complete(ctx, id, "o4", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, id).Outcome; got.LastBody != nil || got.Attempts != 4 {
		t.Fatalf("after Complete: %+v, want no LastBody, 4 attempts", got)
	}
}

// testExpiresAt: a final record's ExpiresAt is its TTL after its last
// write, by the store's clock; an in-flight or superseded record has none.
func testExpiresAt(t *testing.T, s store.Store, ttl time.Duration) {
	ctx := context.Background()
	id := newID("k")
	before := time.Now()
	rec := mustBegin(t, s, id, fpA, "o", Long)
	// The store's clock may be another machine's, and may round to the
	// second: allow a minute of skew, as for leases.
	near := func(what string, got time.Time) {
		t.Helper()
		if d := got.Sub(before); d < ttl-time.Minute || d > ttl+time.Minute {
			t.Fatalf("%s: ExpiresAt %v is %v after the write, want about %v", what, got, d, ttl)
		}
	}
	if !rec.ExpiresAt.IsZero() || !get(t, s, id).ExpiresAt.IsZero() {
		t.Fatalf("in-flight record: ExpiresAt %v, then %v; want zero (never)", rec.ExpiresAt, get(t, s, id).ExpiresAt)
	}
	if err := s.Complete(ctx, id, "o", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	near("Get final", get(t, s, id).ExpiresAt)
	sup, err := s.Supersede(ctx, id, "o")
	if err != nil {
		t.Fatal(err)
	}
	if !sup.ExpiresAt.IsZero() || !get(t, s, id).ExpiresAt.IsZero() {
		t.Fatalf("superseded record: ExpiresAt %v, then %v; want zero (never)", sup.ExpiresAt, get(t, s, id).ExpiresAt)
	}
}
