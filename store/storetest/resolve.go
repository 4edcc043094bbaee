package storetest

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// parked returns id's record parked as unknown after one attempt.
func parked(t *testing.T, s store.Store, id store.ID, owner string) {
	t.Helper()
	mustBegin(t, s, id, fpA, owner, Long)
	o := store.Outcome{FirstSentAt: time.Now().Add(-time.Hour).UTC().Truncate(time.Second), Attempts: 2,
		LastError: "timeout after send", LastBody: []byte(`{"payment_id":"p"}`)}
	if err := s.Park(context.Background(), id, owner, o); err != nil {
		t.Fatalf("Park: %v", err)
	}
}

// testResolve: only an unknown record can be resolved. Not executed, it is
// gone and the next Begin starts afresh; executed, it is final with the
// operator's answer, replayed to the next Begin.
func testResolve(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	answer := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Idemproxy-Reconciled": {"true"}},
		Body: []byte(`{"id":"pay_9"}`)}

	id := newID("k")
	for _, resp := range []*store.Response{nil, &answer} {
		_, err := s.Resolve(ctx, id, resp)
		wantErr(t, "Resolve of a missing record", err, store.ErrNotFound)
	}
	mustBegin(t, s, id, fpA, "o1", Long)
	for _, resp := range []*store.Response{nil, &answer} {
		_, err := s.Resolve(ctx, id, resp)
		wantErr(t, "Resolve in flight", err, store.ErrNotUnknown)
	}
	if rec := get(t, s, id); rec.State != store.InFlight || rec.Owner != "o1" {
		t.Fatalf("in-flight record after a refused Resolve: %+v", rec)
	}
	if err := s.Complete(ctx, id, "o1", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	for _, resp := range []*store.Response{nil, &answer} {
		_, err := s.Resolve(ctx, id, resp)
		wantErr(t, "Resolve of a final record", err, store.ErrNotUnknown)
	}
	wantResponse(t, "final record after a refused Resolve", get(t, s, id).Response, ok)

	// Not executed: deleted; the next Begin creates the record anew, with
	// nothing of the earlier sequences.
	gone := newID("not-executed")
	parked(t, s, gone, "o1")
	rec, err := s.Resolve(ctx, gone, nil)
	if err != nil || rec.State != store.Unknown || rec.ID != gone || rec.Outcome.Attempts != 2 {
		t.Fatalf("Resolve(not executed) = %+v, %v; want the unknown record it removed", rec, err)
	}
	_, err = s.Get(ctx, gone)
	wantErr(t, "Get after Resolve(not executed)", err, store.ErrNotFound)
	_, err = s.Resolve(ctx, gone, nil)
	wantErr(t, "second Resolve(not executed)", err, store.ErrNotFound)
	if rec := mustBegin(t, s, gone, fpA, "o2", Long); rec.Fence != 1 || !rec.Outcome.IsZero() {
		t.Fatalf("Begin after Resolve(not executed) = %+v, want a new record (fence 1, no outcome)", rec)
	}

	// Executed: final with the answer given, its outcome kept but for the
	// last body; the same request gets it, another body a conflict.
	done := newID("executed")
	parked(t, s, done, "o1")
	before := get(t, s, done)
	rec, err = s.Resolve(ctx, done, &answer)
	if err != nil || rec.State != store.Final || rec.ID != done {
		t.Fatalf("Resolve(executed) = %+v, %v", rec, err)
	}
	wantResponse(t, "Resolve(executed)'s record", rec.Response, answer)
	got := get(t, s, done)
	if got.State != store.Final || !got.LeaseUntil.IsZero() || got.Outcome.Attempts != 2 ||
		!got.Outcome.FirstSentAt.Equal(before.Outcome.FirstSentAt) || got.Outcome.LastBody != nil ||
		!got.CreatedAt.Equal(before.CreatedAt) {
		t.Fatalf("after Resolve(executed): %+v, want final keeping the outcome of %+v but for its last body", got, before)
	}
	wantResponse(t, "resolved record", got.Response, answer)
	if rec, created := begin(t, s, done, fpA, "o3", Long); created || rec.State != store.Final {
		t.Fatalf("Begin after Resolve(executed) = %+v, created %v; want the final record", rec, created)
	}
	if rec, created := begin(t, s, done, fpB, "o4", Long); created || rec.State != store.Final {
		t.Fatalf("Begin of another body after Resolve(executed) = %+v, created %v; want the final record", rec, created)
	}
	_, err = s.Resolve(ctx, done, &answer)
	wantErr(t, "second Resolve(executed)", err, store.ErrNotUnknown)

	// Too large: nothing written.
	big := newID("big")
	parked(t, s, big, "o1")
	huge := store.Response{Status: 200, Body: make([]byte, int(s.MaxBodyBytes())+(1<<20))}
	_, err = s.Resolve(ctx, big, &huge)
	wantErr(t, "Resolve(executed) over the limit", err, store.ErrTooLarge)
	if rec := get(t, s, big); rec.State != store.Unknown {
		t.Fatalf("after ErrTooLarge: %+v, want still unknown", rec)
	}
}

// testResolveRacesResume: a Resolve and a Begin that resumes the same
// unknown record run at once; exactly one of them wins, and a Resolve never
// overwrites the record a request holds.
func testResolveRacesResume(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	answer := store.Response{Status: 200, Body: []byte(`{"status":"succeeded"}`)}
	for i := range 10 {
		for _, resp := range []*store.Response{nil, &answer} {
			id := newID("race")
			parked(t, s, id, "o1")
			var wg sync.WaitGroup
			var resolveErr error
			var rec store.Record
			var created bool
			var beginErr error
			wg.Go(func() { _, resolveErr = s.Resolve(ctx, id, resp) })
			wg.Go(func() { rec, created, beginErr = s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o2", Long) })
			wg.Wait()
			if beginErr != nil {
				t.Fatalf("round %d: Begin: %v", i, beginErr)
			}
			if resolveErr != nil && !errors.Is(resolveErr, store.ErrNotUnknown) {
				t.Fatalf("round %d: Resolve: %v", i, resolveErr)
			}
			resolved := resolveErr == nil
			switch {
			case !resolved && (!created || rec.Fence != 2):
				t.Fatalf("round %d: Resolve refused, but Begin = %+v, created %v; want it resumed (fence 2)", i, rec, created)
			case resolved && resp == nil && (!created || rec.Fence != 1):
				t.Fatalf("round %d: Resolve(not executed) won, but Begin = %+v, created %v; want a new record", i, rec, created)
			case resolved && resp != nil && (created || rec.State != store.Final):
				t.Fatalf("round %d: Resolve(executed) won, but Begin = %+v, created %v; want the final record", i, rec, created)
			}
			cur := get(t, s, id)
			if created && (cur.State != store.InFlight || cur.Owner != "o2") {
				t.Fatalf("round %d: the resumed record was overwritten: %+v", i, cur)
			}
		}
	}
}
