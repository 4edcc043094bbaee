package cache

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// setRaw replaces the value of id's record with val, in state meta, expiring
// at exp (Unix seconds, 0 for never), behind the store's back.
func setRaw(t *testing.T, s *Store, id store.ID, val []byte, meta store.State, exp uint64) {
	t.Helper()
	err := s.db.Update(func(txn *badger.Txn) error {
		e := badger.NewEntry(appendRecordKey(nil, id), val).WithMeta(byte(meta))
		e.ExpiresAt = exp
		return txn.SetEntry(e)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// raw returns the value and state of id's record as the store holds them.
func raw(t *testing.T, s *Store, id store.ID) ([]byte, store.State, error) {
	t.Helper()
	var val []byte
	var meta store.State
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(appendRecordKey(nil, id))
		if err != nil {
			return err
		}
		meta = store.State(item.UserMeta())
		val, err = item.ValueCopy(nil)
		return err
	})
	return val, meta, err
}

// TestReleaseKeepsDamagedRecords: a start finds records a dead process left
// whose value this build cannot decode: one in flight written by a newer
// build (a format version it does not know, fields added at the end), one in
// flight cut short, and one unknown with the expiry an old version gave it,
// damaged too. The release must delete none of them and rewrite none as
// unknown (their operations may have reached the provider: deleted, the
// app's retry would be a first send), keep their bytes as they are, take the
// expiry off the unknown one, and name each in Damaged: by client and key
// when they still read and hash to the record's store key, else by the
// store key. A request for either in-flight key then fails to read its
// record, and claims nothing. A damaged fingerprint-window anchor, for
// which nothing was sent, is still deleted. Before, the release deleted
// every in-flight record it could not decode, and the unknown one expired.
func TestReleaseKeepsDamagedRecords(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	const ttl = time.Hour
	s := openStore(t, dir, c, ttl)
	newer := store.ID{Tenant: "acme", Key: "written-by-a-newer-build"}
	short := store.ID{Tenant: "acme", Key: "cut-short"}
	old := store.ID{Tenant: "acme", Key: "unknown-of-an-old-version"}
	anchor := store.ID{Tenant: "default", Key: store.WindowAnchorPrefix + "0a0a/600000000000/2948"}
	for _, id := range []store.ID{newer, short, old, anchor} {
		mustBegin(t, s, id, fpA, "dead-process")
	}
	if err := s.Park(ctx, old, "dead-process", store.Outcome{FirstSentAt: c.Now(), Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	vals := map[store.ID][]byte{}
	for _, id := range []store.ID{newer, short, old, anchor} {
		v, _, err := raw(t, s, id)
		if err != nil {
			t.Fatal(err)
		}
		switch id {
		case newer, anchor:
			v = append(v, 0) // a field a newer version added
			v[0] = recordVersion + 1
		case short:
			v = v[:len(v)/3] // before its client and key
		case old:
			v = v[:len(v)-1]
		}
		vals[id] = v
	}
	setRaw(t, s, newer, vals[newer], store.InFlight, 0)
	setRaw(t, s, short, vals[short], store.InFlight, 0)
	setRaw(t, s, anchor, vals[anchor], store.InFlight, 0)
	setRaw(t, s, old, vals[old], store.Unknown, uint64(c.Now().Add(ttl).Unix()))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, dir, c, ttl)
	rel, err := s.ReleaseInFlight()
	if err != nil || len(rel.Kept) != 0 {
		t.Fatalf("ReleaseInFlight = %+v, %v", rel, err)
	}
	if rel.Released != 1 {
		t.Errorf("ReleaseInFlight released %d, want 1 (the anchor deleted)", rel.Released)
	}
	want := map[string]Damaged{
		hex.EncodeToString(appendRecordKey(nil, newer)): {ID: newer, State: store.InFlight},
		hex.EncodeToString(appendRecordKey(nil, short)): {State: store.InFlight},
		hex.EncodeToString(appendRecordKey(nil, old)):   {ID: old, State: store.Unknown},
	}
	if len(rel.Damaged) != len(want) {
		t.Errorf("Damaged = %+v, want %d records", rel.Damaged, len(want))
	}
	for _, d := range rel.Damaged {
		w, ok := want[d.StoreKey]
		if !ok || d.ID != w.ID || d.State != w.State || !errors.Is(d.Err, ErrCorrupt) {
			t.Errorf("Damaged has %+v; want one of %+v, with an ErrCorrupt", d, want)
		}
	}

	c.Advance(2 * ttl) // past the expiry the old version gave
	for _, id := range []store.ID{newer, short, old} {
		v, meta, err := raw(t, s, id)
		if err != nil || !bytes.Equal(v, vals[id]) {
			t.Errorf("%s after the release = %x, %v; want its bytes kept as they were (%x)", id.Key, v, err, vals[id])
			continue
		}
		if want := map[store.ID]store.State{newer: store.InFlight, short: store.InFlight, old: store.Unknown}[id]; meta != want {
			t.Errorf("%s after the release is %s, want %s", id.Key, meta, want)
		}
		if _, err := s.Get(ctx, id); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Get(%s) past the TTL = %v, want ErrCorrupt: the record kept, not expired", id.Key, err)
		}
	}
	for _, id := range []store.ID{newer, short} {
		if rec, created, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "new-process", time.Minute); !errors.Is(err, ErrCorrupt) || created {
			t.Errorf("retry of %s = %+v created %v, %v; want ErrCorrupt, nothing claimed", id.Key, rec, created, err)
		}
	}
	if _, _, err := raw(t, s, anchor); !errors.Is(err, badger.ErrKeyNotFound) {
		t.Errorf("damaged anchor after the release: %v, want it deleted", err)
	}
}
