package storetest

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// review is a cards provider's answer for an operation it reviews by hand,
// and reviewData another provider's, with the status under "data".
var (
	review = store.Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"op_1","kind":"issue","status":"needs_review"}`)}
	reviewData = store.Response{Status: 202, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"data":{"id":"op_2","status":"needs_review"}}`)}
)

// testReviewKept: a final answer that needs review, stored by Complete or
// by Resolve, outlives the TTL (replayed, listed), while an ordinary answer
// written at the same time expires. Once marked Reviewed it expires a TTL
// later like any final record, its answer replayed until then; a record
// created anew after that awaits review again.
func testReviewKept(t *testing.T, s store.Store, advance func(time.Duration)) {
	ctx := context.Background()
	base := newID("")
	id := func(k string) store.ID { return store.ID{Tenant: base.Tenant, Key: k} }
	plain, completed, nested, resolved := id("plain"), id("completed"), id("nested"), id("resolved")
	for _, c := range []struct {
		id   store.ID
		resp store.Response
	}{{plain, ok}, {completed, review}, {nested, reviewData}} {
		mustBegin(t, s, c.id, fpA, "o", Long)
		if err := s.Complete(ctx, c.id, "o", c.resp, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	parked(t, s, resolved, "o")
	if _, err := s.Resolve(ctx, resolved, &review); err != nil {
		t.Fatal(err)
	}
	held := []store.ID{completed, nested, resolved}
	for _, id := range held {
		if rec := get(t, s, id); !rec.ExpiresAt.IsZero() || !rec.AwaitsReview() || rec.Reviewed {
			t.Fatalf("%s: final answer that needs review = %+v, want it awaiting review, never expiring", id.Key, rec)
		}
	}
	if rec := get(t, s, plain); rec.ExpiresAt.IsZero() {
		t.Fatalf("ordinary final answer = %+v, want an expiry", rec)
	}

	advance(4 * time.Second) // twice the TTL: past any rounding of expiry times
	_, err := s.Get(ctx, plain)
	wantErr(t, "Get of an ordinary final record after the TTL", err, store.ErrNotFound)
	for _, id := range held {
		// The app's retry gets the stored answer: nothing is sent again.
		rec, created := begin(t, s, id, fpA, "retry", Long)
		if created || rec.State != store.Final || !rec.AwaitsReview() {
			t.Fatalf("%s: Begin past the TTL = created %v, %+v; want the answer that needs review, kept", id.Key, created, rec)
		}
	}
	wantResponse(t, "answer that needs review past the TTL", get(t, s, completed).Response, review)
	if got := listAwaitingReview(t, s, base.Tenant); !slices.Equal(got, []string{"completed", "nested", "resolved"}) {
		t.Fatalf("listed awaiting review past the TTL: %v, want completed, nested and resolved", got)
	}

	// Marked reviewed: it expires from now, its answer kept until then.
	rec, marked, err := s.Reviewed(ctx, completed)
	if err != nil || !marked || !rec.Reviewed || rec.AwaitsReview() || rec.ExpiresAt.IsZero() || rec.ID != completed {
		t.Fatalf("Reviewed = %+v, marked %v, %v; want it marked, with an expiry", rec, marked, err)
	}
	// At once: the record expires one TTL (2 s) from Reviewed, and a loaded
	// machine can take that long over the checks below.
	if rec, created := begin(t, s, completed, fpA, "retry", Long); created || rec.State != store.Final {
		t.Fatalf("Begin after Reviewed, before its TTL = created %v, %+v; want the answer replayed", created, rec)
	}
	wantResponse(t, "Reviewed's record", rec.Response, review)
	got := get(t, s, completed)
	if !got.Reviewed || !got.ExpiresAt.Equal(rec.ExpiresAt) {
		t.Fatalf("after Reviewed: %+v, want it marked, expiring at %v", got, rec.ExpiresAt)
	}
	again, marked, err := s.Reviewed(ctx, completed)
	if err != nil || marked || !again.Reviewed || !again.ExpiresAt.Equal(rec.ExpiresAt) {
		t.Fatalf("second Reviewed = %+v, marked %v, %v; want it unchanged, expiring at %v, not marked by this call", again, marked, err, rec.ExpiresAt)
	}
	if got := listAwaitingReview(t, s, base.Tenant); !slices.Equal(got, []string{"nested", "resolved"}) {
		t.Fatalf("listed awaiting review after Reviewed: %v, want nested and resolved", got)
	}

	advance(4 * time.Second)
	_, err = s.Get(ctx, completed)
	wantErr(t, "Get of a reviewed record after its TTL", err, store.ErrNotFound)
	for _, id := range []store.ID{nested, resolved} {
		if rec := get(t, s, id); !rec.AwaitsReview() {
			t.Fatalf("%s: unmarked answer after another TTL = %+v, want it still awaiting review", id.Key, rec)
		}
	}
	// Created anew, the record is not reviewed: a new answer that needs
	// review is kept again.
	if rec := mustBegin(t, s, completed, fpA, "o2", Long); rec.Fence != 1 || rec.Reviewed {
		t.Fatalf("Begin after the reviewed record expired = %+v, want a new record, not reviewed", rec)
	}
	if err := s.Complete(ctx, completed, "o2", review, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if rec := get(t, s, completed); !rec.AwaitsReview() || !rec.ExpiresAt.IsZero() {
		t.Fatalf("new answer that needs review under the key = %+v, want it awaiting review, never expiring", rec)
	}
}

// listAwaitingReview lists the final records of tenant that await review,
// as the operators' listing filters them, and returns their keys in order.
func listAwaitingReview(t *testing.T, s store.Store, tenant string) []string {
	t.Helper()
	var keys []string
	for _, r := range listAll(t, s, store.Final, tenant) {
		if r.AwaitsReview() {
			keys = append(keys, r.ID.Key)
		}
	}
	slices.Sort(keys)
	return keys
}

// testReviewed: only a final record whose answer needs review can be
// marked reviewed; the others are refused and left as they were. With no
// TTL a marked record still never expires.
func testReviewed(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	_, _, err := s.Reviewed(ctx, id)
	wantErr(t, "Reviewed of a missing record", err, store.ErrNotFound)
	mustBegin(t, s, id, fpA, "o1", Long)
	_, _, err = s.Reviewed(ctx, id)
	wantErr(t, "Reviewed in flight", err, store.ErrNotFinal)
	if err := s.Park(ctx, id, "o1", store.Outcome{Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Reviewed(ctx, id)
	wantErr(t, "Reviewed of an unknown record", err, store.ErrNotFinal)
	if rec := get(t, s, id); rec.State != store.Unknown || rec.Reviewed {
		t.Fatalf("unknown record after a refused Reviewed: %+v", rec)
	}
	mustBegin(t, s, id, fpA, "o2", Long)
	if err := s.Complete(ctx, id, "o2", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Reviewed(ctx, id)
	wantErr(t, "Reviewed of an answer that needs no review", err, store.ErrNoReview)
	if rec := get(t, s, id); rec.Reviewed {
		t.Fatalf("ordinary final record after a refused Reviewed: %+v", rec)
	}

	rid := newID("review")
	mustBegin(t, s, rid, fpA, "o", Long)
	if err := s.Complete(ctx, rid, "o", review, time.Time{}); err != nil {
		t.Fatal(err)
	}
	rec, marked, err := s.Reviewed(ctx, rid)
	if err != nil || !marked || !rec.Reviewed || !rec.ExpiresAt.IsZero() {
		t.Fatalf("Reviewed with no TTL = %+v, marked %v, %v; want it marked, never expiring", rec, marked, err)
	}
	if got := get(t, s, rid); !got.Reviewed || got.AwaitsReview() || !got.ExpiresAt.IsZero() {
		t.Fatalf("after Reviewed with no TTL: %+v", got)
	}
}
