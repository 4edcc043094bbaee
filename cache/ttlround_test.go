package cache

import (
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/fakeclock"
	"github.com/idemproxy/idemproxy/store"
)

// TestFinalRecordKeptForTheWholeTTL: a final record is kept for the whole
// TTL counted from its write, not cut to the second before. Badger keeps an
// expiry in whole Unix seconds, and one rounded down made a record written
// at x.9 s disappear 0.9 s early: a fingerprint window's anchor written with
// RECORD_TTL equal to the window (which start allows) was gone in the last
// second of its window, and an identical request then was a new operation
// with a new key.
func TestFinalRecordKeptForTheWholeTTL(t *testing.T) {
	const ttl = 3 * time.Second
	// Ahead of the real clock (Badger also hides entries by it), 900 ms
	// into a second.
	c := fakeclock.New(time.Now().Truncate(time.Second).Add(time.Second + 900*time.Millisecond))
	s := openStore(t, t.TempDir(), c, ttl)
	id := store.ID{Tenant: "acme", Key: "anchor"}
	written := c.Now()
	if _, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o", time.Minute); err != nil || !created {
		t.Fatalf("Begin = created %v, %v", created, err)
	}
	if err := s.Complete(ctx, id, "o", okRes, time.Time{}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.ExpiresAt.Before(written.Add(ttl)) {
		t.Errorf("ExpiresAt %v is before the write + TTL %v", rec.ExpiresAt, written.Add(ttl))
	}
	c.Set(written.Add(ttl - 200*time.Millisecond))
	if _, err := s.Get(ctx, id); err != nil {
		t.Fatalf("Get %v after the write, within the TTL %v: %v; want the record", ttl-200*time.Millisecond, ttl, err)
	}
	if recs, _, err := s.List(ctx, store.Filter{State: store.Final}, "", 10); err != nil || len(recs) != 1 {
		t.Fatalf("List within the TTL = %d records, %v; want the record", len(recs), err)
	}
	c.Set(written.Add(ttl + time.Second))
	if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get a second past the TTL: %v; want ErrNotFound", err)
	}
}
