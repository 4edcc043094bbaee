package cache

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// When Begin's claim is committed but its sync fails (out of file
// descriptors, say), the caller answers 503 and sends nothing: the key must
// be free for the next try at once, not blocked for the whole lease. A
// record taken over is put back as it was.
func TestBeginSyncFailureLeavesKeyFree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	c := newClock()
	s := openStore(t, dir, c, 0)
	real := s.group.sync
	fail := func(uint64) error { return syscall.EMFILE }

	id := store.ID{Key: "fresh"}
	s.group.sync = fail
	if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o1", time.Minute); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("Begin with a failing sync = %v, want EMFILE", err)
	}
	s.group.sync = real
	if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after a failed Begin, Get = %v; want no record", err)
	}
	if rec, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o2", time.Minute); err != nil || !created || rec.Owner != "o2" {
		t.Fatalf("next Begin = %+v, %v, %v; want a fresh claim", rec, created, err)
	}

	// A record parked as Unknown keeps its outcome when a takeover's sync fails.
	parked := store.ID{Key: "parked"}
	mustBegin(t, s, parked, fpA, "p1")
	out := store.Outcome{FirstSentAt: c.Now(), Attempts: 3, LastError: "timeout after send"}
	if err := s.Park(ctx, parked, "p1", out); err != nil {
		t.Fatal(err)
	}
	s.group.sync = fail
	if _, _, err := s.Begin(ctx, parked, store.Request{Fingerprint: fpA}, "p2", time.Minute); err == nil {
		t.Fatal("takeover with a failing sync succeeded")
	}
	s.group.sync = real
	rec, err := s.Get(ctx, parked)
	if err != nil || rec.State != store.Unknown || rec.Outcome.Attempts != 3 || rec.Outcome.LastError != out.LastError || rec.Owner != "p1" {
		t.Fatalf("parked record after a failed takeover = %+v, %v; want it Unknown as before", rec, err)
	}
	if _, created, err := s.Begin(ctx, parked, store.Request{Fingerprint: fpA}, "p3", time.Minute); err != nil || !created {
		t.Fatalf("takeover after the failure = %v, %v; want it resumed", created, err)
	}
}
