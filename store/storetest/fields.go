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

// testSent: Park keeps the request as first sent (Outcome.Sent) for the
// owner that resumes the record; a later Park keeps the first one; a
// request sent without a body is kept as one (Sent not nil); a record
// without one reads none; List leaves it out without bodies; Complete and
// Resolve drop it; and a record that would not fit with it is parked
// without it rather than refused.
func testSent(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	first := &store.Sent{Body: []byte(`{"order_id":"o-1","amount":100}`), ContentType: "application/json", ContentEncoding: "identity"}
	id := newID("k")
	mustBegin(t, s, id, fpA, "o1", Long)
	if err := s.Park(ctx, id, "o1", store.Outcome{Attempts: 1, LastError: "timeout after send", Sent: first}); err != nil {
		t.Fatal(err)
	}
	wantSent(t, "after Park", get(t, s, id).Outcome.Sent, first)
	rec := mustBegin(t, s, id, fpA, "o2", Long)
	wantSent(t, "resume", rec.Outcome.Sent, first)
	wantSent(t, "read while resumed", get(t, s, id).Outcome.Sent, first)
	second := &store.Sent{Body: []byte(`{"amount":100,"order_id":"o-1"}`), ContentType: "application/json; charset=utf-8"}
	if err := s.Park(ctx, id, "o2", store.Outcome{Attempts: 1, LastError: "status 504 from upstream", Sent: second}); err != nil {
		t.Fatal(err)
	}
	wantSent(t, "after a second Park", get(t, s, id).Outcome.Sent, first)
	page, _, err := s.List(ctx, store.Filter{State: store.Unknown, Bodies: true, Keep: func(r *store.Record) bool { return r.ID == id }}, "", 1000)
	if err != nil || len(page) != 1 {
		t.Fatalf("List with bodies = %d records, %v", len(page), err)
	}
	wantSent(t, "listed with bodies", page[0].Outcome.Sent, first)
	page, _, err = s.List(ctx, store.Filter{State: store.Unknown, Keep: func(r *store.Record) bool { return r.ID == id }}, "", 1000)
	if err != nil || len(page) != 1 || page[0].Outcome.Sent != nil {
		t.Fatalf("List without bodies = %d records, %v; want one without Sent", len(page), err)
	}
	mustBegin(t, s, id, fpA, "o3", Long)
	if err := s.Complete(ctx, id, "o3", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, id).Outcome; got.Sent != nil || got.Attempts != 2 {
		t.Fatalf("after Complete: Sent %+v, %d attempts; want none, 2", got.Sent, got.Attempts)
	}

	empty := newID("empty")
	mustBegin(t, s, empty, fpA, "o1", Long)
	if err := s.Park(ctx, empty, "o1", store.Outcome{Attempts: 1, Sent: &store.Sent{ContentType: "text/plain"}}); err != nil {
		t.Fatal(err)
	}
	wantSent(t, "an empty body", get(t, s, empty).Outcome.Sent, &store.Sent{ContentType: "text/plain"})
	if _, err := s.Resolve(ctx, empty, &ok); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, empty).Outcome.Sent; got != nil {
		t.Fatalf("after Resolve: Sent %+v, want none", got)
	}

	none := newID("none")
	mustBegin(t, s, none, fpA, "o1", Long)
	if err := s.Park(ctx, none, "o1", store.Outcome{Attempts: 1, LastError: "timeout after send"}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, none).Outcome.Sent; got != nil {
		t.Fatalf("parked without Sent: read %+v, want none", got)
	}
	mustBegin(t, s, none, fpA, "o2", Long)
	if err := s.Park(ctx, none, "o2", store.Outcome{Attempts: 1, Sent: second}); err != nil {
		t.Fatal(err)
	}
	wantSent(t, "a record that kept none takes the next Park's", get(t, s, none).Outcome.Sent, second)

	large := newID("large")
	mustBegin(t, s, large, fpA, "o1", Long)
	big := &store.Sent{Body: bytes.Repeat([]byte{'x'}, int(s.MaxBodyBytes())), ContentType: "application/octet-stream"}
	if err := s.Park(ctx, large, "o1", store.Outcome{Attempts: 1, LastBody: bytes.Repeat([]byte{'y'}, store.MaxLastBody), Sent: big}); err != nil {
		t.Fatalf("Park of a record too large to keep its request: %v, want it parked", err)
	}
	if got := get(t, s, large); got.State != store.Unknown || got.Outcome.Sent != nil && !bytes.Equal(got.Outcome.Sent.Body, big.Body) {
		t.Fatalf("large record parked %s with a request of %d bytes; want unknown, its request whole or none", got.State, len(got.Outcome.Sent.Body))
	}
}

func wantSent(t *testing.T, what string, got, want *store.Sent) {
	t.Helper()
	if got == nil || !bytes.Equal(got.Body, want.Body) || len(got.Body) == 0 && got.Body != nil ||
		got.ContentType != want.ContentType || got.ContentEncoding != want.ContentEncoding {
		t.Fatalf("%s: Sent %+v, want %+v", what, got, want)
	}
}
