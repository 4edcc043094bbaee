// Package storetest is the conformance suite of the store contract: every
// store.Store implementation runs Run in its own tests, on a real instance.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// Factory opens a store whose records live ttl after their last write (0:
// forever), closed by the factory's own t.Cleanup. advance moves the
// store's clocks (lease and TTL) forward by at least d: a store on a fake
// clock moves it, a store on a real clock (a database's) sleeps. Stores from
// one Factory may share data; the suite uses a new tenant in every test.
type Factory func(t *testing.T, ttl time.Duration) (s store.Store, advance func(d time.Duration))

// Long is a lease no test outlives.
const Long = 10 * time.Minute

// short is a lease the tests let run out with advance.
const short = 200 * time.Millisecond

var (
	fpA = bytes.Repeat([]byte{0xa}, 32)
	fpB = bytes.Repeat([]byte{0xb}, 32)
	ok  = store.Response{
		Status: 201,
		Header: http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}},
		Body:   []byte(`{"id":"pay_1"}`),
	}
)

// Run runs the conformance suite against the stores newStore opens.
func Run(t *testing.T, newStore Factory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store, advance func(time.Duration))
	}{
		{"BeginCreates", testBeginCreates},
		{"BeginReturnsLiveRecord", testBeginReturnsLive},
		{"CompleteThenReplay", testCompleteReplay},
		{"Abandon", testAbandon},
		{"NotOwner", testNotOwner},
		{"TakeoverSameFingerprint", testTakeover},
		{"NoTakeoverOtherFingerprint", testNoTakeoverOtherFingerprint},
		{"ExpiredLeaseStillOwnedUntilTakenOver", testExpiredLeaseStillOwned},
		{"Renew", testRenew},
		{"ParkUnknownAndResume", testPark},
		{"ParkSentAnew", testParkSentAnew},
		{"ConcurrentBegin", testConcurrentBegin},
		{"ConcurrentTakeover", testConcurrentTakeover},
		{"TooLarge", testTooLarge},
		{"TenantIsolation", testTenants},
		{"ArgumentErrors", testArguments},
		{"List", testList},
		{"ListKeepFullPages", testListKeepFullPages},
		{"ListByBytes", testListByBytes},
		{"ListWithoutBodies", testListWithoutBodies},
		{"ListBudget", testListBudget},
		{"RequestFields", testRequestFields},
		{"TakeoverKeepsUpstreamKey", testTakeoverKeepsUpstreamKey},
		{"LastBody", testLastBody},
		{"Sent", testSent},
		{"Supersede", testSupersede},
		{"Resolve", testResolve},
		{"ResolveRacesResume", testResolveRacesResume},
		{"Reviewed", testReviewed},
		{"Ping", func(t *testing.T, s store.Store, _ func(time.Duration)) {
			if err := s.Ping(context.Background()); err != nil {
				t.Fatalf("Ping on a healthy store: %v", err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, advance := newStore(t, 0)
			tc.fn(t, s, advance)
		})
	}
	t.Run("Expiry", func(t *testing.T) {
		s, advance := newStore(t, 2*time.Second)
		testExpiry(t, s, advance)
	})
	t.Run("ExpiresAt", func(t *testing.T) {
		s, _ := newStore(t, time.Hour)
		testExpiresAt(t, s, time.Hour)
	})
	t.Run("SupersededOutlivesTTL", func(t *testing.T) {
		s, advance := newStore(t, 2*time.Second)
		testSupersededKept(t, s, advance)
	})
	t.Run("SupersedeReclaimed", func(t *testing.T) {
		s, advance := newStore(t, 2*time.Second)
		testSupersedeReclaimed(t, s, advance)
	})
	t.Run("NeedsReviewOutlivesTTL", func(t *testing.T) {
		s, advance := newStore(t, 2*time.Second)
		testReviewKept(t, s, advance)
	})
	t.Run("Close", func(t *testing.T) {
		s, _ := newStore(t, 0)
		testClose(t, s)
	})
}

// newID returns an ID in a tenant of its own.
func newID(key string) store.ID {
	b := make([]byte, 8)
	rand.Read(b)
	return store.ID{Tenant: "t-" + hex.EncodeToString(b), Key: key}
}

func begin(t *testing.T, s store.Store, id store.ID, fp []byte, owner string, lease time.Duration) (store.Record, bool) {
	t.Helper()
	rec, created, err := s.Begin(context.Background(), id, store.Request{Fingerprint: fp}, owner, lease)
	if err != nil {
		t.Fatalf("Begin(%q, %s): %v", id.Key, owner, err)
	}
	return rec, created
}

func mustBegin(t *testing.T, s store.Store, id store.ID, fp []byte, owner string, lease time.Duration) store.Record {
	t.Helper()
	rec, created := begin(t, s, id, fp, owner, lease)
	if !created {
		t.Fatalf("Begin(%q, %s) did not claim the key; record %+v", id.Key, owner, rec)
	}
	return rec
}

func get(t *testing.T, s store.Store, id store.ID) store.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%q): %v", id.Key, err)
	}
	return rec
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s = %v, want %v", what, err, want)
	}
}

func wantResponse(t *testing.T, what string, got, want store.Response) {
	t.Helper()
	// A nil Header is returned as an empty one.
	sameHeader := len(got.Header) == 0 && len(want.Header) == 0 || reflect.DeepEqual(got.Header, want.Header)
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || !sameHeader {
		t.Fatalf("%s response = %d %v %q, want %d %v %q", what, got.Status, got.Header, got.Body, want.Status, want.Header, want.Body)
	}
}

func testBeginCreates(t *testing.T, s store.Store, _ func(time.Duration)) {
	id := newID("k1")
	before := time.Now()
	rec := mustBegin(t, s, id, fpA, "owner-1", Long)
	if rec.State != store.InFlight || rec.Owner != "owner-1" || rec.Fence != 1 || !bytes.Equal(rec.Fingerprint, fpA) {
		t.Fatalf("Begin record = %+v, want in flight, owner-1, fence 1, fingerprint A", rec)
	}
	// The lease runs from the store's clock, which may be another machine's:
	// allow a minute of skew, not more.
	if d := rec.LeaseUntil.Sub(before); d < Long-time.Minute || d > Long+time.Minute {
		t.Fatalf("LeaseUntil is %v after Begin, want about %v", d, Long)
	}
	if rec.CreatedAt.IsZero() || !rec.Outcome.IsZero() {
		t.Fatalf("new record: CreatedAt %v, Outcome %+v; want set, zero", rec.CreatedAt, rec.Outcome)
	}
	got := get(t, s, id)
	if got.State != store.InFlight || got.Owner != "owner-1" || got.Fence != 1 || !got.LeaseUntil.Equal(rec.LeaseUntil) || !got.CreatedAt.Equal(rec.CreatedAt) {
		t.Fatalf("Get = %+v, want what Begin returned, %+v", got, rec)
	}
	_, err := s.Get(context.Background(), newID("never-written"))
	wantErr(t, "Get of a missing key", err, store.ErrNotFound)
}

func testBeginReturnsLive(t *testing.T, s store.Store, _ func(time.Duration)) {
	id := newID("k")
	first := mustBegin(t, s, id, fpA, "owner-1", Long)
	for _, fp := range [][]byte{fpA, fpB} {
		rec, created := begin(t, s, id, fp, "owner-2", Long)
		if created || rec.Owner != "owner-1" || rec.State != store.InFlight || !rec.LeaseUntil.Equal(first.LeaseUntil) {
			t.Fatalf("Begin on a live lease = created %v, %+v; want owner-1's record unchanged", created, rec)
		}
		if !bytes.Equal(rec.Fingerprint, fpA) {
			t.Fatalf("returned fingerprint %x, want the first request's", rec.Fingerprint)
		}
	}
}

func testCompleteReplay(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	mustBegin(t, s, id, fpA, "owner-1", Long)
	if err := s.Complete(ctx, id, "owner-1", ok, time.Time{}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for _, fp := range [][]byte{fpA, fpB} {
		rec, created := begin(t, s, id, fp, "owner-2", Long)
		if created || rec.State != store.Final || !rec.LeaseUntil.IsZero() || !bytes.Equal(rec.Fingerprint, fpA) {
			t.Fatalf("Begin after Complete = created %v, %+v; want the final record", created, rec)
		}
		wantResponse(t, "Begin after Complete", rec.Response, ok)
	}
	wantResponse(t, "Get", get(t, s, id).Response, ok)
	wantErr(t, "second Complete", s.Complete(ctx, id, "owner-1", ok, time.Time{}), store.ErrNotOwner)

	// Empty header and body come back empty.
	id2 := newID("empty")
	mustBegin(t, s, id2, fpA, "o", Long)
	if err := s.Complete(ctx, id2, "o", store.Response{Status: 204}, time.Time{}); err != nil {
		t.Fatalf("Complete empty: %v", err)
	}
	r := get(t, s, id2).Response
	if r.Status != 204 || len(r.Body) != 0 || len(r.Header) != 0 {
		t.Fatalf("empty response read back as %d %v %q", r.Status, r.Header, r.Body)
	}
}

func testAbandon(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	mustBegin(t, s, id, fpA, "owner-1", Long)
	if err := s.Abandon(ctx, id, "owner-1"); err != nil {
		t.Fatalf("Abandon: %v", err)
	}
	_, err := s.Get(ctx, id)
	wantErr(t, "Get after Abandon", err, store.ErrNotFound)
	rec := mustBegin(t, s, id, fpB, "owner-2", Long)
	if rec.Fence != 1 || !bytes.Equal(rec.Fingerprint, fpB) {
		t.Fatalf("Begin after Abandon = %+v, want a new record (fence 1, fingerprint B)", rec)
	}
}

func testNotOwner(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	ops := func(owner string) map[string]error {
		return map[string]error{
			"Complete": s.Complete(ctx, id, owner, ok, time.Time{}),
			"Abandon":  s.Abandon(ctx, id, owner),
			"Renew":    s.Renew(ctx, id, owner, Long),
			"Park":     s.Park(ctx, id, owner, store.Outcome{Attempts: 1}),
		}
	}
	for op, err := range ops("owner-1") {
		wantErr(t, op+" of a missing record", err, store.ErrNotOwner)
	}
	mustBegin(t, s, id, fpA, "owner-1", Long)
	for op, err := range ops("intruder") {
		wantErr(t, op+" by another owner", err, store.ErrNotOwner)
	}
	if rec := get(t, s, id); rec.State != store.InFlight || rec.Owner != "owner-1" {
		t.Fatalf("after failed calls by another owner: %+v, want owner-1 in flight", rec)
	}
	if err := s.Complete(ctx, id, "owner-1", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	for op, err := range ops("owner-1") {
		wantErr(t, op+" of a final record", err, store.ErrNotOwner)
	}
	wantResponse(t, "final after failed calls", get(t, s, id).Response, ok)
}

func testTakeover(t *testing.T, s store.Store, advance func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	first := mustBegin(t, s, id, fpA, "owner-1", short)
	advance(2 * short)
	rec := mustBegin(t, s, id, fpA, "owner-2", Long)
	if rec.Owner != "owner-2" || rec.Fence != 2 || !rec.CreatedAt.Equal(first.CreatedAt) || rec.State != store.InFlight {
		t.Fatalf("takeover = %+v, want owner-2, fence 2, CreatedAt kept", rec)
	}
	// Fencing: the old owner can do nothing any more.
	wantErr(t, "Complete by the old owner", s.Complete(ctx, id, "owner-1", ok, time.Time{}), store.ErrNotOwner)
	wantErr(t, "Abandon by the old owner", s.Abandon(ctx, id, "owner-1"), store.ErrNotOwner)
	wantErr(t, "Renew by the old owner", s.Renew(ctx, id, "owner-1", Long), store.ErrNotOwner)
	wantErr(t, "Park by the old owner", s.Park(ctx, id, "owner-1", store.Outcome{}), store.ErrNotOwner)
	mine := store.Response{Status: 200, Body: []byte("owner-2")}
	if err := s.Complete(ctx, id, "owner-2", mine, time.Time{}); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
	wantErr(t, "late Complete by the old owner", s.Complete(ctx, id, "owner-1", ok, time.Time{}), store.ErrNotOwner)
	got := get(t, s, id)
	wantResponse(t, "after takeover", got.Response, mine)
	if got.Fence != 2 {
		t.Fatalf("final fence = %d, want 2", got.Fence)
	}
}

func testNoTakeoverOtherFingerprint(t *testing.T, s store.Store, advance func(time.Duration)) {
	id := newID("k")
	mustBegin(t, s, id, fpA, "owner-1", short)
	advance(2 * short)
	rec, created := begin(t, s, id, fpB, "owner-2", Long)
	if created || rec.Owner != "owner-1" || !bytes.Equal(rec.Fingerprint, fpA) {
		t.Fatalf("Begin with another fingerprint on an expired lease = created %v, %+v; want the record unchanged", created, rec)
	}
}

func testExpiredLeaseStillOwned(t *testing.T, s store.Store, advance func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	mustBegin(t, s, id, fpA, "owner-1", short)
	advance(2 * short)
	if err := s.Complete(ctx, id, "owner-1", ok, time.Time{}); err != nil {
		t.Fatalf("Complete after the lease ran out, nobody took over: %v", err)
	}
	rec, created := begin(t, s, id, fpA, "owner-2", Long)
	if created || rec.State != store.Final {
		t.Fatalf("Begin after a late Complete = created %v, %+v; want the final record", created, rec)
	}
}

func testRenew(t *testing.T, s store.Store, advance func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	first := mustBegin(t, s, id, fpA, "owner-1", short)
	if err := s.Renew(ctx, id, "owner-1", Long); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	advance(2 * short)
	rec, created := begin(t, s, id, fpA, "owner-2", Long)
	if created || rec.Owner != "owner-1" || !rec.LeaseUntil.After(first.LeaseUntil) {
		t.Fatalf("Begin after Renew = created %v, %+v; want owner-1 still holding a longer lease", created, rec)
	}
	if err := s.Renew(ctx, id, "owner-1", 0); err == nil {
		t.Fatal("Renew with a zero lease succeeded")
	}
}

func testPark(t *testing.T, s store.Store, advance func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	first := mustBegin(t, s, id, fpA, "owner-1", Long)
	sent := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := s.Park(ctx, id, "owner-1", store.Outcome{FirstSentAt: sent, Attempts: 3, LastError: "504 from upstream"}); err != nil {
		t.Fatalf("Park: %v", err)
	}
	rec := get(t, s, id)
	want := store.Outcome{FirstSentAt: sent, Attempts: 3, LastError: "504 from upstream"}
	if rec.State != store.Unknown || !rec.LeaseUntil.IsZero() || !rec.CreatedAt.Equal(first.CreatedAt) || !sameOutcome(rec.Outcome, want) {
		t.Fatalf("after Park: %+v, want unknown, no lease, CreatedAt kept, outcome %+v", rec, want)
	}
	wantErr(t, "Complete of an unknown record", s.Complete(ctx, id, "owner-1", ok, time.Time{}), store.ErrNotOwner)

	// Another request under the key gets the record, and is not sent.
	got, created := begin(t, s, id, fpB, "owner-2", Long)
	if created || got.State != store.Unknown {
		t.Fatalf("Begin with another fingerprint = created %v, %+v; want the unknown record", created, got)
	}
	// The same request resumes it at once, without waiting for a lease.
	got = mustBegin(t, s, id, fpA, "owner-3", Long)
	if got.State != store.InFlight || got.Fence != 2 || got.Owner != "owner-3" || !sameOutcome(got.Outcome, want) {
		t.Fatalf("resume = %+v, want in flight, fence 2, owner-3, outcome kept", got)
	}
	// A second Park merges: earliest send, attempts added, last error replaced.
	later := sent.Add(time.Hour)
	if err := s.Park(ctx, id, "owner-3", store.Outcome{FirstSentAt: later, Attempts: 2, LastError: "timeout after send"}); err != nil {
		t.Fatalf("second Park: %v", err)
	}
	want = store.Outcome{FirstSentAt: sent, Attempts: 5, LastError: "timeout after send"}
	if rec := get(t, s, id); !sameOutcome(rec.Outcome, want) {
		t.Fatalf("after a second Park: outcome %+v, want %+v", rec.Outcome, want)
	}
	mustBegin(t, s, id, fpA, "owner-4", Long)
	// The resumed sequence's own first send is later: the earliest stays.
	if err := s.Complete(ctx, id, "owner-4", ok, later.Add(time.Hour)); err != nil {
		t.Fatalf("Complete after resume: %v", err)
	}
	if rec := get(t, s, id); rec.State != store.Final || rec.Fence != 3 || !sameOutcome(rec.Outcome, want) {
		t.Fatalf("final after resume: %+v, want final, fence 3, outcome kept", rec)
	}

	// A final answer in its first sequence: Complete gives the first send;
	// none when nothing says it was sent.
	for _, at := range []time.Time{sent, {}} {
		id := newID("first-sequence")
		mustBegin(t, s, id, fpA, "o", Long)
		if err := s.Complete(ctx, id, "o", ok, at); err != nil {
			t.Fatal(err)
		}
		if rec := get(t, s, id); !rec.Outcome.FirstSentAt.Equal(at) || rec.Outcome.Attempts != 0 || rec.Outcome.LastError != "" {
			t.Fatalf("completed with first send %v: outcome %+v, want that first send alone", at, rec.Outcome)
		}
	}

	// Never sent: a zero FirstSentAt stays zero until a Park gives one.
	id2 := newID("never-sent")
	mustBegin(t, s, id2, fpA, "o", Long)
	if err := s.Park(ctx, id2, "o", store.Outcome{Attempts: 1, LastError: "dial refused"}); err != nil {
		t.Fatal(err)
	}
	if rec := get(t, s, id2); !rec.Outcome.FirstSentAt.IsZero() {
		t.Fatalf("FirstSentAt = %v, want zero", rec.Outcome.FirstSentAt)
	}
}

// testParkSentAnew: a Park whose sequence sent the operation anew (the
// status probe said it had not happened) replaces the first send the record
// keeps, later or not, where any other Park keeps the earliest; one that
// gives no first send keeps the kept one.
func testParkSentAnew(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	id := newID("anew")
	sent := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	mustBegin(t, s, id, fpA, "owner-1", Long)
	if err := s.Park(ctx, id, "owner-1", store.Outcome{FirstSentAt: sent, Attempts: 1, LastError: "504 from upstream",
		LastBody: []byte(`{"payment_id":"pay_1"}`)}); err != nil {
		t.Fatal(err)
	}
	later := sent.Add(49 * time.Hour)
	mustBegin(t, s, id, fpA, "owner-2", Long)
	if err := s.Park(ctx, id, "owner-2", store.Outcome{FirstSentAt: later, Attempts: 1, LastError: "timeout after send", SentAnew: true}); err != nil {
		t.Fatal(err)
	}
	// The answer that filled the probe told 404 is not kept (a timeout gave
	// no newer one).
	want := store.Outcome{FirstSentAt: later, Attempts: 2, LastError: "timeout after send"}
	if rec := get(t, s, id); rec.State != store.Unknown || !sameOutcome(rec.Outcome, want) || rec.Outcome.SentAnew ||
		rec.Outcome.LastBody != nil {
		t.Fatalf("after a Park sent anew: %+v, want unknown, outcome %+v, no last body", rec, want)
	}
	// A later Park that did not send anew keeps the earliest, now the new one.
	mustBegin(t, s, id, fpA, "owner-3", Long)
	if err := s.Park(ctx, id, "owner-3", store.Outcome{FirstSentAt: later.Add(time.Hour), Attempts: 1, LastError: "504 from upstream"}); err != nil {
		t.Fatal(err)
	}
	want = store.Outcome{FirstSentAt: later, Attempts: 3, LastError: "504 from upstream"}
	if rec := get(t, s, id); !sameOutcome(rec.Outcome, want) {
		t.Fatalf("after a later Park: outcome %+v, want %+v", rec.Outcome, want)
	}
	// Sent anew with no first send given: the kept one stays; its answer's
	// body replaces the kept one.
	mustBegin(t, s, id, fpA, "owner-4", Long)
	if err := s.Park(ctx, id, "owner-4", store.Outcome{Attempts: 1, LastError: "x", SentAnew: true,
		LastBody: []byte(`{"payment_id":"pay_2"}`)}); err != nil {
		t.Fatal(err)
	}
	if rec := get(t, s, id); !rec.Outcome.FirstSentAt.Equal(later) || string(rec.Outcome.LastBody) != `{"payment_id":"pay_2"}` {
		t.Fatalf("after a Park sent anew with no first send: FirstSentAt %v, last body %s; want %v kept, pay_2's",
			rec.Outcome.FirstSentAt, rec.Outcome.LastBody, later)
	}
}

func sameOutcome(a, b store.Outcome) bool {
	return a.FirstSentAt.Equal(b.FirstSentAt) && a.Attempts == b.Attempts && a.LastError == b.LastError
}

// race runs n Begins on id at once and returns the owners that claimed it and
// the owners the others saw.
func race(t *testing.T, s store.Store, id store.ID, n int, lease time.Duration) (claimed []string, seen map[string]int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	seen = map[string]int{}
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			owner := fmt.Sprintf("owner-%d", i)
			<-start
			rec, created, err := s.Begin(context.Background(), id, store.Request{Fingerprint: fpA}, owner, lease)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if created {
				claimed = append(claimed, owner)
			} else {
				seen[rec.Owner]++
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Begin: %v", err)
	}
	return claimed, seen
}

func testConcurrentBegin(t *testing.T, s store.Store, _ func(time.Duration)) {
	const n = 16
	id := newID("k")
	claimed, seen := race(t, s, id, n, Long)
	if len(claimed) != 1 || seen[claimed[0]] != n-1 {
		t.Fatalf("%d concurrent Begins: claimed by %v, others saw %v; want exactly one owner, seen by all others", n, claimed, seen)
	}
}

func testConcurrentTakeover(t *testing.T, s store.Store, advance func(time.Duration)) {
	const n = 16
	id := newID("k")
	mustBegin(t, s, id, fpA, "dead", short)
	advance(2 * short)
	claimed, seen := race(t, s, id, n, Long)
	if len(claimed) != 1 || seen[claimed[0]] != n-1 {
		t.Fatalf("%d concurrent takeovers: claimed by %v, others saw %v; want exactly one", n, claimed, seen)
	}
	if rec := get(t, s, id); rec.Fence != 2 || rec.Owner != claimed[0] {
		t.Fatalf("after the takeover race: %+v, want fence 2 and owner %s", rec, claimed[0])
	}
}

func testTooLarge(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	limit := s.MaxBodyBytes()
	if limit < 64<<10 {
		t.Fatalf("MaxBodyBytes = %d, want at least 64 KiB", limit)
	}
	id := newID("big")
	mustBegin(t, s, id, fpA, "o", Long)
	huge := store.Response{Status: 200, Body: bytes.Repeat([]byte{'x'}, int(limit)+(1<<20))}
	wantErr(t, "Complete over the limit", s.Complete(ctx, id, "o", huge, time.Time{}), store.ErrTooLarge)
	if rec := get(t, s, id); rec.State != store.InFlight || rec.Owner != "o" {
		t.Fatalf("after ErrTooLarge: %+v, want still in flight for o", rec)
	}
	// The largest body with a 64 KiB header budget fits.
	fits := store.Response{Status: 200, Header: http.Header{"X-Pad": {string(bytes.Repeat([]byte{'h'}, 60<<10))}},
		Body: bytes.Repeat([]byte{'y'}, int(limit))}
	if err := s.Complete(ctx, id, "o", fits, time.Time{}); err != nil {
		t.Fatalf("Complete at MaxBodyBytes: %v", err)
	}
	wantResponse(t, "largest record", get(t, s, id).Response, fits)
}

func testTenants(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	a := newID("same-key")
	b := store.ID{Tenant: a.Tenant + "-other", Key: a.Key}
	empty := store.ID{Tenant: "", Key: a.Key + "\x00é"}
	mustBegin(t, s, a, fpA, "oa", Long)
	if err := s.Complete(ctx, a, "oa", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, b); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's Get = %v, want ErrNotFound", err)
	}
	mustBegin(t, s, b, fpB, "ob", Long)
	// The empty tenant is a tenant; the key is binary-safe.
	mustBegin(t, s, empty, fpA, "oe", Long)
	if err := s.Abandon(ctx, empty, "oe"); err != nil {
		t.Fatal(err)
	}
	wantResponse(t, "tenant a", get(t, s, a).Response, ok)
}

func testArguments(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	if _, _, err := s.Begin(ctx, store.ID{Tenant: "t"}, store.Request{Fingerprint: fpA}, "o", Long); err == nil {
		t.Error("Begin with an empty key succeeded")
	}
	if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "", Long); err == nil {
		t.Error("Begin with an empty owner succeeded")
	}
	if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o", 0); err == nil {
		t.Error("Begin with a zero lease succeeded")
	}
	for _, fp := range [][]byte{nil, {}} {
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fp}, "o", Long); err == nil {
			t.Errorf("Begin with the empty fingerprint %#v succeeded", fp)
		}
	}
	if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get after refused Begins = %v, want ErrNotFound: nothing written", err)
	}
	if _, err := s.Get(ctx, store.ID{}); err == nil || errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get with an empty key = %v, want an argument error", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := s.Begin(done, id, store.Request{Fingerprint: fpA}, "o", Long); err == nil {
		t.Error("Begin with a cancelled context succeeded")
	}
}

func testExpiry(t *testing.T, s store.Store, advance func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	mustBegin(t, s, id, fpA, "o", Long)
	if err := s.Complete(ctx, id, "o", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	parked := newID("parked")
	mustBegin(t, s, parked, fpA, "p", Long)
	if err := s.Park(ctx, parked, "p", store.Outcome{Attempts: 1, LastBody: []byte(`{"payment_id":"p"}`)}); err != nil {
		t.Fatal(err)
	}
	inflight := newID("inflight")
	mustBegin(t, s, inflight, fpA, "i", Long)
	if rec := get(t, s, inflight); !rec.ExpiresAt.IsZero() {
		t.Fatalf("in-flight record expires at %v, want never", rec.ExpiresAt)
	}
	advance(4 * time.Second) // twice the TTL: past any rounding of expiry times
	_, err := s.Get(ctx, id)
	wantErr(t, "Get of a final record after the TTL", err, store.ErrNotFound)
	// Expired is missing: a new request with another body starts afresh.
	rec := mustBegin(t, s, id, fpB, "o2", Long)
	if rec.Fence != 1 || !bytes.Equal(rec.Fingerprint, fpB) {
		t.Fatalf("Begin after expiry = %+v, want a new record", rec)
	}
	// An in-flight record never expires: its operation may have reached the
	// provider (a replica that died mid-operation leaves it so), and
	// forgotten it would be sent again as a new one. Its owner still holds it.
	if rec, created := begin(t, s, inflight, fpA, "i2", Long); created || rec.Owner != "i" || rec.State != store.InFlight {
		t.Fatalf("Begin of an in-flight record past the TTL = created %v, %+v; want it kept, held by its owner", created, rec)
	}
	if err := s.Renew(ctx, inflight, "i", Long); err != nil {
		t.Fatalf("Renew past the TTL: %v", err)
	}
	if rec := get(t, s, inflight); !rec.ExpiresAt.IsZero() {
		t.Fatalf("renewed in-flight record expires at %v, want never", rec.ExpiresAt)
	}
	if err := s.Complete(ctx, inflight, "i", ok, time.Time{}); err != nil {
		t.Fatalf("Complete of an in-flight record past the TTL: %v", err)
	}
	if rec := get(t, s, inflight); rec.State != store.Final || rec.ExpiresAt.IsZero() {
		t.Fatalf("completed record = %+v, want final with an expiry", rec)
	}
	// An unknown record never expires: forgetting it would let the next
	// request send the operation as a new one, long after the provider may
	// have forgotten its key. It is resumed, outcome and all.
	if rec := get(t, s, parked); rec.State != store.Unknown || !rec.ExpiresAt.IsZero() || rec.Outcome.Attempts != 1 {
		t.Fatalf("unknown record after the TTL = %+v, want it kept, unknown, never expiring", rec)
	}
	if rec := mustBegin(t, s, parked, fpA, "p2", Long); rec.Fence != 2 || rec.Outcome.Attempts != 1 ||
		string(rec.Outcome.LastBody) != `{"payment_id":"p"}` {
		t.Fatalf("Begin of an unknown record past the TTL = %+v, want it resumed (fence 2) with its outcome", rec)
	}
}

func testClose(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := s.Get(ctx, newID("k"))
	wantErr(t, "Get after Close", err, store.ErrClosed)
	_, _, err = s.Begin(ctx, newID("k"), store.Request{Fingerprint: fpA}, "o", Long)
	wantErr(t, "Begin after Close", err, store.ErrClosed)
}
