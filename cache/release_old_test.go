package cache

import (
	"errors"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// TestUnknownOfThePreviousVersionKeptAfterStart: a version before unknown
// records stopped expiring wrote them with the TTL. After an upgrade, the
// start's release takes that expiry off, so the record outlives the TTL and
// its retry resumes it (first send and attempts kept, for the retention
// guard and the probe) instead of starting afresh as a new operation.
func TestUnknownOfThePreviousVersionKeptAfterStart(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	const ttl = time.Hour
	s := openStore(t, dir, c, ttl)
	id := store.ID{Tenant: "acme", Key: "timed-out"}
	mustBegin(t, s, id, fpA, "p1")
	sent := c.Now().Add(-time.Minute)
	if err := s.Park(ctx, id, "p1", store.Outcome{FirstSentAt: sent, Attempts: 2, LastError: "timeout"}); err != nil {
		t.Fatal(err)
	}
	// Give the record the expiry the previous version's Park gave it.
	err := s.db.Update(func(txn *badger.Txn) (err error) {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(recordPrefix)})
		defer it.Close()
		var k, v []byte
		for it.Rewind(); it.Valid(); it.Next() {
			if it.Item().UserMeta() == byte(store.Unknown) {
				k = it.Item().KeyCopy(nil)
				if v, err = it.Item().ValueCopy(nil); err != nil {
					return err
				}
			}
		}
		if k == nil {
			return errors.New("no unknown record")
		}
		e := badger.NewEntry(k, v).WithMeta(byte(store.Unknown))
		e.ExpiresAt = uint64(c.Now().Add(ttl).Unix())
		return txn.SetEntry(e)
	})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, id); err != nil || rec.ExpiresAt.IsZero() {
		t.Fatalf("record as the previous version left it = %+v, %v; want unknown with an expiry", rec, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, dir, c, ttl)
	if rel, err := s.ReleaseInFlight(); err != nil || rel.Released != 0 {
		t.Fatalf("ReleaseInFlight = %+v, %v; want 0 released", rel, err)
	}
	c.Advance(2 * ttl)
	rec, err := s.Get(ctx, id)
	if err != nil || rec.State != store.Unknown || !rec.ExpiresAt.IsZero() {
		t.Fatalf("unknown record past the TTL = %+v, %v; want it kept, without expiry", rec, err)
	}
	got, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "p2", time.Minute)
	if err != nil || !created || got.Fence != 2 || got.Outcome.Attempts != 2 || !got.Outcome.FirstSentAt.Equal(sent) {
		t.Fatalf("retry = %+v created %v, %v; want the unknown operation resumed with its first send and attempts", got, created, err)
	}
}
