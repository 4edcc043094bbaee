package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/fakeclock"
	"github.com/idemproxy/idemproxy/store"
)

// newClock is the tests' clock for Options.Now, moved by Advance. It starts at
// the real time, because Badger itself hides entries whose TTL ran out by the
// real clock.
func newClock() *fakeclock.Clock { return fakeclock.New(time.Now().Truncate(time.Second)) }

// openStore opens a durable store in dir with the test's clock, closed at
// the end of the test.
func openStore(t testing.TB, dir string, c *fakeclock.Clock, ttl time.Duration) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, SyncWrites: true, TTL: ttl, Now: c.Now, MemTableSize: 8 << 20, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var (
	ctx   = context.Background()
	fpA   = bytes.Repeat([]byte{0xa}, 32)
	fpB   = bytes.Repeat([]byte{0xb}, 32)
	okRes = store.Response{
		Status: 201,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"pay_1"}`),
	}
)

func TestBeginCompleteGet(t *testing.T) {
	c := newClock()
	s := openStore(t, t.TempDir(), c, 0)
	id := store.ID{Tenant: "acme", Key: "k1"}

	rec, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "owner-1", 30*time.Second)
	if err != nil || !created {
		t.Fatalf("first Begin = created %v, %v; want created", created, err)
	}
	want := store.Record{ID: id, State: store.InFlight, Fingerprint: fpA, Owner: "owner-1", Fence: 1, LeaseUntil: c.Now().Add(30 * time.Second), CreatedAt: c.Now()}
	assertRecord(t, "Begin", rec, want)
	got, err := s.Get(ctx, id)
	if err != nil {
		t.Fatalf("Get in flight: %v", err)
	}
	assertRecord(t, "Get in flight", got, want)

	rec, created, err = s.Begin(ctx, id, store.Request{Fingerprint: fpB}, "owner-2", 30*time.Second)
	if err != nil || created {
		t.Fatalf("second Begin = created %v, %v; want existing", created, err)
	}
	assertRecord(t, "second Begin", rec, want)

	c.Advance(time.Second)
	if err := s.Complete(ctx, id, "owner-1", okRes, time.Time{}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	final := store.Record{ID: id, State: store.Final, Fingerprint: fpA, Owner: "owner-1", Fence: 1, CreatedAt: want.CreatedAt, Response: okRes}
	got, err = s.Get(ctx, id)
	if err != nil {
		t.Fatalf("Get final: %v", err)
	}
	assertRecord(t, "Get final", got, final)

	rec, created, err = s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "owner-3", 30*time.Second)
	if err != nil || created {
		t.Fatalf("Begin on final = created %v, %v; want existing", created, err)
	}
	assertRecord(t, "Begin on final", rec, final)
}

func TestGetMissing(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	_, err := s.Get(ctx, store.ID{Tenant: "acme", Key: "nope"})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get missing = %v, want store.ErrNotFound", err)
	}
}

func TestAbandon(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	id := store.ID{Tenant: "acme", Key: "k1"}
	mustBegin(t, s, id, fpA, "owner-1")
	if err := s.Abandon(ctx, id, "owner-1"); err != nil {
		t.Fatalf("Abandon: %v", err)
	}
	if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after Abandon = %v, want store.ErrNotFound", err)
	}
	rec := mustBegin(t, s, id, fpB, "owner-2")
	if !bytes.Equal(rec.Fingerprint, fpB) || rec.Owner != "owner-2" {
		t.Fatalf("Begin after Abandon kept old data: %+v", rec)
	}
}

func TestNotOwner(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, s *Store, id store.ID)
		op    func(s *Store, id store.ID) error
	}{
		{"complete by another owner", func(t *testing.T, s *Store, id store.ID) { mustBegin(t, s, id, fpA, "owner-1") },
			func(s *Store, id store.ID) error { return s.Complete(ctx, id, "intruder", okRes, time.Time{}) }},
		{"abandon by another owner", func(t *testing.T, s *Store, id store.ID) { mustBegin(t, s, id, fpA, "owner-1") },
			func(s *Store, id store.ID) error { return s.Abandon(ctx, id, "intruder") }},
		{"complete twice", func(t *testing.T, s *Store, id store.ID) {
			mustBegin(t, s, id, fpA, "owner-1")
			mustComplete(t, s, id, "owner-1")
		},
			func(s *Store, id store.ID) error { return s.Complete(ctx, id, "owner-1", okRes, time.Time{}) }},
		{"abandon a final record", func(t *testing.T, s *Store, id store.ID) {
			mustBegin(t, s, id, fpA, "owner-1")
			mustComplete(t, s, id, "owner-1")
		},
			func(s *Store, id store.ID) error { return s.Abandon(ctx, id, "owner-1") }},
		{"complete a missing record", func(*testing.T, *Store, store.ID) {},
			func(s *Store, id store.ID) error { return s.Complete(ctx, id, "owner-1", okRes, time.Time{}) }},
		{"abandon a missing record", func(*testing.T, *Store, store.ID) {},
			func(s *Store, id store.ID) error { return s.Abandon(ctx, id, "owner-1") }},
	}
	s := openStore(t, t.TempDir(), newClock(), 0)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := store.ID{Tenant: "acme", Key: fmt.Sprint("k", i)}
			tt.setup(t, s, id)
			before, beforeErr := s.Get(ctx, id)
			if err := tt.op(s, id); !errors.Is(err, store.ErrNotOwner) {
				t.Fatalf("got %v, want store.ErrNotOwner", err)
			}
			after, afterErr := s.Get(ctx, id)
			if !reflect.DeepEqual(before, after) || fmt.Sprint(afterErr) != fmt.Sprint(beforeErr) {
				t.Fatalf("record changed by a refused call: %+v (%v) -> %+v (%v)", before, beforeErr, after, afterErr)
			}
		})
	}
}

func TestConcurrentBeginCreatesOnce(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	id := store.ID{Tenant: "acme", Key: "contended"}
	const n = 64
	var created atomic.Int32
	owners := make([]string, n)
	errs := make(chan error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			rec, ok, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, fmt.Sprint("owner-", i), time.Minute)
			if err != nil {
				errs <- err
				return
			}
			if ok {
				created.Add(1)
			}
			owners[i] = rec.Owner
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Begin: %v", err)
	}
	if got := created.Load(); got != 1 {
		t.Fatalf("%d Begins created the record, want exactly 1", got)
	}
	for i, o := range owners {
		if o != owners[0] {
			t.Fatalf("caller %d saw owner %q, caller 0 saw %q", i, o, owners[0])
		}
	}
}

func TestLeaseTakeover(t *testing.T) {
	c := newClock()
	s := openStore(t, t.TempDir(), c, 0)
	id := store.ID{Tenant: "acme", Key: "k1"}
	first := mustBegin(t, s, id, fpA, "owner-1")

	c.Advance(9 * time.Second)
	if _, created, _ := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "owner-2", 10*time.Second); created {
		t.Fatal("Begin took over a lease that had not expired")
	}

	c.Advance(time.Second) // exactly at LeaseUntil: expired
	// Another request under the same key never takes the lease: it must get
	// the existing record (and the proxy a 409), not be sent upstream.
	other, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fpB}, "owner-3", 10*time.Second)
	if err != nil || created || other.Owner != "owner-1" {
		t.Fatalf("Begin with another fingerprint after expiry = %+v, created %v, %v; want the record untouched", other, created, err)
	}
	rec, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "owner-2", 10*time.Second)
	if err != nil || !created {
		t.Fatalf("Begin after lease expiry = created %v, %v; want takeover", created, err)
	}
	want := store.Record{ID: id, State: store.InFlight, Fingerprint: fpA, Owner: "owner-2", Fence: 2, LeaseUntil: c.Now().Add(10 * time.Second), CreatedAt: first.CreatedAt}
	assertRecord(t, "takeover", rec, want)

	if err := s.Complete(ctx, id, "owner-1", okRes, time.Time{}); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete by the old owner = %v, want store.ErrNotOwner", err)
	}
	if err := s.Complete(ctx, id, "owner-2", okRes, time.Time{}); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
}

func TestTTL(t *testing.T) {
	c := newClock()
	s := openStore(t, t.TempDir(), c, time.Hour)
	final := store.ID{Tenant: "acme", Key: "final"}
	inflight := store.ID{Tenant: "acme", Key: "in-flight"}
	mustBegin(t, s, final, fpA, "owner-1")
	c.Advance(30 * time.Minute)
	mustComplete(t, s, final, "owner-1") // TTL restarts at completion
	mustBegin(t, s, inflight, fpA, "owner-2")

	c.Advance(59 * time.Minute)
	for _, id := range []store.ID{final, inflight} {
		if _, err := s.Get(ctx, id); err != nil {
			t.Fatalf("Get %s before TTL: %v", id.Key, err)
		}
	}
	c.Advance(time.Minute)
	if _, err := s.Get(ctx, final); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get final after TTL = %v, want store.ErrNotFound", err)
	}
	if err := s.Complete(ctx, final, "owner-1", okRes, time.Time{}); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete final after TTL = %v, want store.ErrNotOwner", err)
	}
	rec, created, err := s.Begin(ctx, final, store.Request{Fingerprint: fpB}, "owner-3", time.Minute)
	if err != nil || !created || !bytes.Equal(rec.Fingerprint, fpB) {
		t.Fatalf("Begin final after TTL = %+v created %v, %v; want a fresh record", rec, created, err)
	}
	// An in-flight record never expires: its owner still completes it.
	if rec, err := s.Get(ctx, inflight); err != nil || rec.State != store.InFlight {
		t.Fatalf("Get in-flight after TTL = %+v, %v; want it kept", rec, err)
	}
	mustComplete(t, s, inflight, "owner-2")
}

func TestTenantIsolation(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	a := store.ID{Tenant: "acme", Key: "order-1"}
	b := store.ID{Tenant: "globex", Key: "order-1"}
	mustBegin(t, s, a, fpA, "owner-a")
	if _, err := s.Get(ctx, b); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("other tenant sees the record: %v", err)
	}
	if _, created, err := s.Begin(ctx, b, store.Request{Fingerprint: fpB}, "owner-b", time.Minute); err != nil || !created {
		t.Fatalf("other tenant's Begin on the same key = created %v, %v; want its own record", created, err)
	}
	mustComplete(t, s, a, "owner-a")
	if err := s.Complete(ctx, b, "owner-a", okRes, time.Time{}); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("owner of tenant A completed tenant B's record: %v", err)
	}
	rec, err := s.Get(ctx, b)
	if err != nil || rec.State != store.InFlight || rec.Owner != "owner-b" {
		t.Fatalf("tenant B's record = %+v, %v; want its own in-flight record", rec, err)
	}
}

func TestReleaseInFlightAfterReopen(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := openStore(t, dir, c, 0)
	inflight := []store.ID{{Tenant: "acme", Key: "crashed-1"}, {Tenant: "globex", Key: "crashed-2"}}
	final := store.ID{Tenant: "acme", Key: "done"}
	for _, id := range inflight {
		mustBegin(t, s, id, fpA, "dead-process")
	}
	mustBegin(t, s, final, fpA, "dead-process")
	mustComplete(t, s, final, "dead-process")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s = openStore(t, dir, c, 0)
	rel, err := s.ReleaseInFlight()
	if err != nil || rel.Released != len(inflight) {
		t.Fatalf("ReleaseInFlight = %+v, %v; want %d released", rel, err, len(inflight))
	}
	for _, id := range inflight {
		// Kept unknown (the dead process may have sent it), first sent at
		// the earliest at its claim.
		rec, err := s.Get(ctx, id)
		if err != nil || rec.State != store.Unknown || !rec.LeaseUntil.IsZero() ||
			!rec.Outcome.FirstSentAt.Equal(rec.CreatedAt) || rec.Outcome.LastError != processDied {
			t.Fatalf("in-flight %s after release = %+v, %v; want unknown, first sent at its claim", id.Key, rec, err)
		}
		got, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "new-process", time.Minute)
		if err != nil || !created || !got.Outcome.FirstSentAt.Equal(rec.CreatedAt) {
			t.Fatalf("retry of %s = %+v created %v, %v; want it resumed at once with its first send", id.Key, got, created, err)
		}
	}
	rec, err := s.Get(ctx, final)
	if err != nil || rec.State != store.Final || !reflect.DeepEqual(rec.Response, okRes) {
		t.Fatalf("final record after release = %+v, %v", rec, err)
	}
	if rel, err := s.ReleaseInFlight(); err != nil || rel.Released != len(inflight) {
		t.Fatalf("second ReleaseInFlight = %+v, %v; want the %d new records", rel, err, len(inflight))
	}
}

// diesWhileResumed parks id with o (its first sequence ends unknown), claims
// it again (resumed), and then "crashes": s is closed with the record in
// flight, the store in dir is opened again and released, which must release
// exactly that record. It returns the new store.
func diesWhileResumed(t *testing.T, s *Store, dir string, c *fakeclock.Clock, id store.ID, o store.Outcome) *Store {
	t.Helper()
	mustBegin(t, s, id, fpA, "p1")
	if err := s.Park(ctx, id, "p1", o); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, s, id, fpA, "p2") // resumed, then the process dies
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, c, 0)
	if rel, err := s.ReleaseInFlight(); err != nil || rel.Released != 1 {
		t.Fatalf("ReleaseInFlight = %+v, %v; want 1 released", rel, err)
	}
	return s
}

// TestReleaseKeepsUnknownOutcome: a process that dies while it resumes an
// operation whose outcome was unknown leaves it unknown, first send kept,
// not deleted.
func TestReleaseKeepsUnknownOutcome(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := openStore(t, dir, c, 0)
	id := store.ID{Tenant: "acme", Key: "resumed"}
	sent := c.Now().Add(-time.Hour)
	s = diesWhileResumed(t, s, dir, c, id, store.Outcome{FirstSentAt: sent, Attempts: 2, LastError: "504 from upstream"})
	rec, err := s.Get(ctx, id)
	if err != nil || rec.State != store.Unknown || !rec.Outcome.FirstSentAt.Equal(sent) || rec.Outcome.Attempts != 2 || !rec.LeaseUntil.IsZero() {
		t.Fatalf("after release = %+v, %v; want unknown with the first send kept", rec, err)
	}
	if got, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "p3", time.Minute); err != nil || !created || !got.Outcome.FirstSentAt.Equal(sent) {
		t.Fatalf("retry = %+v created %v, %v; want it resumed with its outcome", got, created, err)
	}
}

// TestReleaseDeletesWindowAnchors: a fingerprint-window anchor caught in
// flight by a crash (between the Begin and the Complete that anchor a
// period) is deleted at release, not listed unknown: nothing was sent for
// it. An ordinary record in flight beside it is kept unknown.
func TestReleaseDeletesWindowAnchors(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := openStore(t, dir, c, 0)
	anchor := store.ID{Tenant: "default", Key: store.WindowAnchorPrefix + "0a0a/600000000000/2948"}
	op := store.ID{Tenant: "default", Key: "crashed"}
	mustBegin(t, s, anchor, fpA, "dead-process")
	mustBegin(t, s, op, fpA, "dead-process")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, c, 0)
	if rel, err := s.ReleaseInFlight(); err != nil || rel.Released != 2 {
		t.Fatalf("ReleaseInFlight = %+v, %v; want 2 released", rel, err)
	}
	if rec, err := s.Get(ctx, anchor); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("anchor after release = %+v, %v; want it deleted", rec, err)
	}
	unknown, _, err := s.List(ctx, store.Filter{State: store.Unknown}, "", 10)
	if err != nil || len(unknown) != 1 || unknown[0].ID != op {
		t.Errorf("unknown list after release = %+v, %v; want only %v", unknown, err, op)
	}
}

// TestReleaseOnFullDiskKeepsInFlight: a start on a disk below the
// free-space reserve (here a reserve above the free space) cannot rewrite an
// in-flight record as unknown. It keeps it in flight as it was, returned in
// kept, never deleted (its operation may have been sent); a window anchor,
// for which nothing was sent, is still deleted, which the reserve allows.
// Once its lease has run out, the same request takes it over (Fence 2, the
// claim time kept, which the proxy reads as an unknown outcome); a start
// with space releases it as unknown.
func TestReleaseOnFullDiskKeepsInFlight(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := openStore(t, dir, c, 0)
	op := store.ID{Tenant: "acme", Key: "crashed"}
	anchor := store.ID{Tenant: "default", Key: store.WindowAnchorPrefix + "0a0a/600000000000/2948"}
	claim := mustBegin(t, s, op, fpA, "dead-process")
	mustBegin(t, s, anchor, fpA, "dead-process")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	free, err := freeBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Without SyncWrites, Close closes Badger even below the reserve.
	full, err := Open(Options{Dir: dir, Now: c.Now, MinFreeBytes: int64(free) + 1<<30})
	if err != nil {
		t.Fatal(err)
	}
	rel, err := full.ReleaseInFlight()
	if err != nil || rel.Released != 1 || !reflect.DeepEqual(rel.Kept, []store.ID{op}) {
		t.Fatalf("ReleaseInFlight below the reserve = %d released, kept %v, %v; want the anchor deleted and %v kept", rel.Released, rel.Kept, err, op)
	}
	rec, err := full.Get(ctx, op)
	if err != nil || rec.State != store.InFlight || rec.Owner != "dead-process" || !rec.LeaseUntil.Equal(claim.LeaseUntil) ||
		rec.Fence != 1 || !rec.CreatedAt.Equal(claim.CreatedAt) {
		t.Fatalf("record after a release below the reserve = %+v, %v; want it in flight as claimed (%+v)", rec, err, claim)
	}
	if rec, err := full.Get(ctx, anchor); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("anchor after a release below the reserve = %+v, %v; want it deleted", rec, err)
	}
	if err := full.Close(); err != nil {
		t.Fatal(err)
	}

	// Its lease over, the same request takes it over as a resumed claim.
	c.Advance(time.Minute)
	s = openStore(t, dir, c, 0)
	got, created, err := s.Begin(ctx, op, store.Request{Fingerprint: fpA}, "new-process", time.Minute)
	if err != nil || !created || got.Fence != 2 || !got.CreatedAt.Equal(claim.CreatedAt) {
		t.Fatalf("takeover after the lease = %+v created %v, %v; want Fence 2 and the claim time kept", got, created, err)
	}
	// A start with space releases it as unknown, first sent at its claim.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, c, 0)
	if rel, err := s.ReleaseInFlight(); err != nil || rel.Released != 1 || len(rel.Kept) != 0 {
		t.Fatalf("ReleaseInFlight with space = %d released, kept %v, %v; want 1, none kept", rel.Released, rel.Kept, err)
	}
	rec, err = s.Get(ctx, op)
	if err != nil || rec.State != store.Unknown || !rec.Outcome.FirstSentAt.Equal(claim.CreatedAt) {
		t.Fatalf("record released with space = %+v, %v; want unknown, first sent at its claim", rec, err)
	}
}

// TestReleaseGivesFirstSendToAnOutcomeWithoutOne: a record released at start
// whose outcome says something but has no first send (attempts counted, no
// send time) gets the claim time as its first send, as a record with no
// outcome does, so that the provider key retention check runs on its resume.
func TestReleaseGivesFirstSendToAnOutcomeWithoutOne(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := openStore(t, dir, c, 0)
	id := store.ID{Tenant: "acme", Key: "no-first-send"}
	s = diesWhileResumed(t, s, dir, c, id, store.Outcome{Attempts: 2, LastError: "status 500 from upstream"})
	rec, err := s.Get(ctx, id)
	if err != nil || rec.State != store.Unknown || rec.Outcome.FirstSentAt.IsZero() ||
		!rec.Outcome.FirstSentAt.Equal(rec.CreatedAt) || rec.Outcome.Attempts != 2 {
		t.Fatalf("after release = %+v, %v; want unknown, first sent at its claim, attempts kept", rec, err)
	}
}

func TestReleaseInFlightManyChunks(t *testing.T) {
	s, err := Open(Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 2*releaseChunk + 17
	for i := range n {
		mustBegin(t, s, store.ID{Key: fmt.Sprint(i)}, fpA, "o")
	}
	mustComplete(t, s, store.ID{Key: "0"}, "o")
	if rel, err := s.ReleaseInFlight(); err != nil || rel.Released != n-1 {
		t.Fatalf("ReleaseInFlight = %d, %v; want %d", rel.Released, err, n-1)
	}
}

func TestOpenLockedDirectory(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, newClock(), 0)
	_, err := Open(Options{Dir: dir})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s2.Close()
}

func TestOpenCorruptDirectory(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(t *testing.T, dir string)
	}{
		{"garbage MANIFEST", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "MANIFEST"), bytes.Repeat([]byte("garbage!"), 64))
		}},
		{"truncated MANIFEST", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "MANIFEST"), []byte("Bdgr"))
		}},
		{"garbage KEYREGISTRY", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "KEYREGISTRY"), bytes.Repeat([]byte{0xff}, 100))
		}},
		{"garbage table files", func(t *testing.T, dir string) {
			tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
			if len(tables) == 0 {
				t.Fatal("no table file to corrupt")
			}
			for _, f := range tables {
				writeFile(t, f, bytes.Repeat([]byte{0x5a}, 4096))
			}
		}},
		{"zeroed table files", func(t *testing.T, dir string) {
			tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
			for _, f := range tables {
				writeFile(t, f, make([]byte, 4096))
			}
		}},
		{"truncated table files", func(t *testing.T, dir string) {
			tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
			for _, f := range tables {
				fi, err := os.Stat(f)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(f, fi.Size()/2); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"garbage WAL file", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "00099.mem"), bytes.Repeat([]byte{0x5a}, 4096))
		}},
		{"path is a file", func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			writeFile(t, dir, []byte("not a directory"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "db")
			s := openStore(t, dir, newClock(), 0)
			mustBegin(t, s, store.ID{Key: "k"}, fpA, "o")
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			tt.corrupt(t, dir)
			s, err := Open(Options{Dir: dir})
			if err == nil {
				s.Close()
				t.Fatal("Open on a corrupt directory succeeded")
			}
			t.Logf("Open error: %v", err)
			if !strings.Contains(err.Error(), dir) {
				t.Fatalf("Open error %q does not name the directory", err)
			}
		})
	}
}

func TestClose(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, GCInterval: time.Millisecond, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	mustBegin(t, s, store.ID{Key: "k"}, fpA, "o")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	calls := map[string]error{
		"Begin": func() error {
			_, _, err := s.Begin(ctx, store.ID{Key: "k"}, store.Request{Fingerprint: fpA}, "o", time.Minute)
			return err
		}(),
		"Complete": s.Complete(ctx, store.ID{Key: "k"}, "o", okRes, time.Time{}),
		"Abandon":  s.Abandon(ctx, store.ID{Key: "k"}, "o"),
		"Get":      func() error { _, err := s.Get(ctx, store.ID{Key: "k"}); return err }(),
		"Ping":     s.Ping(ctx),
		"Release":  func() error { _, err := s.ReleaseInFlight(); return err }(),
	}
	for name, err := range calls {
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close = %v, want store.ErrClosed", name, err)
		}
	}
}

func TestPing(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	for range 3 {
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	}
}

func TestArgumentErrors(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	tests := map[string]error{
		"empty key": func() error {
			_, _, err := s.Begin(ctx, store.ID{Tenant: "t"}, store.Request{Fingerprint: fpA}, "o", time.Minute)
			return err
		}(),
		"empty owner": func() error {
			_, _, err := s.Begin(ctx, store.ID{Key: "k"}, store.Request{Fingerprint: fpA}, "", time.Minute)
			return err
		}(),
		"zero lease": func() error {
			_, _, err := s.Begin(ctx, store.ID{Key: "k"}, store.Request{Fingerprint: fpA}, "o", 0)
			return err
		}(),
		"cancelled context": func() error {
			c, cancel := context.WithCancel(ctx)
			cancel()
			_, _, err := s.Begin(c, store.ID{Key: "k"}, store.Request{Fingerprint: fpA}, "o", time.Minute)
			return err
		}(),
	}
	for name, err := range tests {
		if err == nil {
			t.Errorf("%s: Begin succeeded", name)
		}
	}
	if _, err := s.Get(ctx, store.ID{Key: "k"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused Begin wrote a record: %v", err)
	}
}

func TestCompleteTooLarge(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	id := store.ID{Key: "big"}
	mustBegin(t, s, id, fpA, "o")
	err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: make([]byte, maxValueSize)}, time.Time{})
	if !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("Complete with a 1 MiB body = %v, want store.ErrTooLarge", err)
	}
	// Just under the limit still fits, in the LSM tree.
	body := make([]byte, maxValueSize-200)
	if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
		t.Fatalf("Complete just under the limit: %v", err)
	}
	rec, err := s.Get(ctx, id)
	if err != nil || len(rec.Response.Body) != len(body) {
		t.Fatalf("Get large record = %d bytes, %v", len(rec.Response.Body), err)
	}
}

func TestDurableAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := openStore(t, dir, c, 0)
	const n = 300
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := store.ID{Tenant: "acme", Key: fmt.Sprint(i)}
			if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o", time.Minute); err != nil {
				errs <- err
				return
			}
			errs <- s.Complete(ctx, id, "o", okRes, time.Time{})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, c, 0)
	for i := range n {
		rec, err := s.Get(ctx, store.ID{Tenant: "acme", Key: fmt.Sprint(i)})
		if err != nil || rec.State != store.Final {
			t.Fatalf("record %d after reopen = %+v, %v", i, rec, err)
		}
	}
}

func mustBegin(t testing.TB, s *Store, id store.ID, fp []byte, owner string) store.Record {
	t.Helper()
	rec, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fp}, owner, 10*time.Second)
	if err != nil || !created {
		t.Fatalf("Begin %+v = created %v, %v; want created", id, created, err)
	}
	return rec
}

func mustComplete(t testing.TB, s *Store, id store.ID, owner string) {
	t.Helper()
	if err := s.Complete(ctx, id, owner, okRes, time.Time{}); err != nil {
		t.Fatalf("Complete %+v: %v", id, err)
	}
}

func assertRecord(t *testing.T, what string, got, want store.Record) {
	t.Helper()
	if !reflect.DeepEqual(normalize(got), normalize(want)) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestPageOutTables: the store finds its table files and WALs among the
// process's mappings and hands their pages back; every record still reads
// back, and writes go on.
func TestPageOutTables(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), MemTableSize: 1 << 20, PageOutInterval: -1, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	body := []byte(strings.Repeat("z", 4000))
	const n = 2000 // 8 MB through a 1 MiB memtable: several flushed tables
	for i := range n {
		id := store.ID{Key: fmt.Sprint(i)}
		mustBegin(t, s, id, fpA, "o")
		if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	tables, err := filepath.Glob(filepath.Join(s.dir, "*.sst"))
	if err != nil || len(tables) == 0 {
		t.Fatalf("no table flushed (%v)", err)
	}
	advised, err := s.pageOutTables()
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip("no MADV_PAGEOUT here (not Linux, or a kernel before 5.4)")
	}
	if err != nil {
		t.Fatal(err)
	}
	if advised == 0 {
		t.Fatalf("%d tables on disk, none found mapped", len(tables))
	}
	// The active WAL was paged out too: writing on into it faults its pages
	// back in.
	for i := n; i < n+200; i++ {
		id := store.ID{Key: fmt.Sprint(i)}
		mustBegin(t, s, id, fpA, "o")
		if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n + 200 {
		rec, err := s.Get(ctx, store.ID{Key: fmt.Sprint(i)})
		if err != nil || !bytes.Equal(rec.Response.Body, body) {
			t.Fatalf("record %d after page-out: %v", i, err)
		}
	}
}
