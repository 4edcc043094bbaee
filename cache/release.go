package cache

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// processDied is the LastError of a record released at start: its process
// ended while its attempt sequence ran.
const processDied = "the process ended while the operation was in flight; an attempt may have reached the provider"

// releaseChunk is how many writes go into one transaction, far below
// Badger's per-transaction limit.
const releaseChunk = 1000

// Release is what ReleaseInFlight did with the records a dead process
// left.
type Release struct {
	// Released counts the in-flight records parked as unknown, and the
	// window anchors deleted.
	Released int
	// Kept lists the in-flight records left in flight because the disk is
	// below the free-space reserve.
	Kept []store.ID
	// Damaged lists the records left as they are because their value cannot
	// be read.
	Damaged []Damaged
}

// Damaged is a record whose stored value this build cannot read: written by
// a newer build (a format version it does not know), or damaged.
type Damaged struct {
	// ID is the record's client and key when the value still reads as far
	// as them and they hash to the record's store key; else it is zero.
	ID store.ID
	// StoreKey is the record's key in the store, in hex (as List's cursors
	// are): it names the record when ID cannot.
	StoreKey string
	// State is the record's state, which the store keeps beside the value.
	State store.State
	// Err says why the value cannot be read.
	Err error
}

// ReleaseInFlight releases every in-flight record and says what it did.
// Badger lets only one process open a directory, so at start every
// in-flight record belongs to a dead process (crash): the caller runs this
// once, before serving, so that the first retry resumes at once with the
// SAME key (docs/contract.md, Crash safety). Running it while serving would release live
// operations. A released record becomes Unknown: the dead process may have
// sent an attempt, and the provider acted on it. Its first send time (that
// of an earlier sequence's Outcome, else the claim time, the earliest it
// may have been sent) is kept, and with it the status probe and the
// provider key retention guard that come before its re-send.
//
// On a disk below the free-space reserve (store.ErrNoSpace) a record cannot
// be rewritten, and is left in flight as it is, never deleted: deleted, the
// app's retry would be a first send, with no probe and no retention check.
// Its ID is returned in Kept, for the caller to log. Once its dead owner's
// lease has run out, the first request with the same fingerprint takes it
// over, and the proxy resumes it as an operation whose outcome is unknown,
// first sent when an earlier sequence was, else when it was claimed, as
// after a release; the next start with space releases it.
//
// An in-flight record whose value cannot be read (a newer build's format
// after a downgrade, or damage) is left exactly as it is, and returned in
// Damaged for the caller to log. Deleting it would forget an operation that
// may have run; rewriting it as unknown would trust a fingerprint, a claim
// time and a first send read from bytes known to be bad (a wrong first send
// defeats the retention guard), and would replace a newer build's record
// with what this build understands of it. Kept unreadable, every request
// for its key fails to read it and is refused with nothing sent, until an
// operator settles it.
//
// It also takes the expiry off every Unknown record that has one: a
// version before unknown records stopped expiring wrote them with the TTL,
// and forgotten, their operation would start afresh as a new one, past the
// retention guard and the probe. Those are not counted; one whose value
// cannot be read keeps its bytes as they are, without the expiry, and is
// returned in Damaged.
func (s *Store) ReleaseInFlight() (Release, error) {
	const op = "release in-flight"
	if err := s.enter(op); err != nil {
		return Release{}, err
	}
	defer s.life.RUnlock()
	keys, err := s.inFlightKeys()
	if err != nil {
		return Release{}, fmt.Errorf("cache: %s: scan: %w", op, err)
	}
	var all Release
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), releaseChunk)]
		keys = keys[len(chunk):]
		r, err := s.release(chunk)
		all.Released += r.Released
		all.Kept = append(all.Kept, r.Kept...)
		all.Damaged = append(all.Damaged, r.Damaged...)
		if err != nil {
			return all, fmt.Errorf("cache: %s: %w", op, err)
		}
	}
	return all, nil
}

// inFlightKeys lists the keys of in-flight records, and of unknown ones
// that expire (expiringUnknown), from UserMeta alone, without reading values.
func (s *Store) inFlightKeys() ([][]byte, error) {
	var keys [][]byte
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(recordPrefix)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if it.Item().UserMeta() == byte(store.InFlight) || expiringUnknown(it.Item()) {
				keys = append(keys, it.Item().KeyCopy(nil))
			}
		}
		return nil
	})
	return keys, err
}

// release parks the keys that are still in flight as Unknown, in one
// transaction; r says what it did with each.
func (s *Store) release(keys [][]byte) (r Release, err error) {
	err = s.update(context.Background(), "release", func(txn *badger.Txn, now time.Time) (bool, error) {
		r = Release{}
		wrote := false
		for _, k := range keys {
			item, err := txn.Get(k)
			if errors.Is(err, badger.ErrKeyNotFound) {
				continue // gone since the scan
			}
			if err != nil {
				return false, err
			}
			if item.UserMeta() != byte(store.InFlight) && !expiringUnknown(item) {
				continue
			}
			var rec store.Record
			if err := item.Value(func(v []byte) (err error) {
				rec, err = decodeRecord(v)
				return err
			}); err != nil {
				d := damaged(k, item, err)
				if item.UserMeta() == byte(store.InFlight) && store.IsWindowAnchor(d.ID) {
					// Nothing was sent for an anchor: deleted as releaseOne does.
					if err := txn.Delete(k); err != nil {
						return false, err
					}
					r.Released++
					wrote = true
					continue
				}
				r.Damaged = append(r.Damaged, d)
				if expiringUnknown(item) {
					w, err := s.unexpire(txn, k, item)
					if err != nil {
						return false, err
					}
					wrote = wrote || w
				}
				continue
			}
			if expiringUnknown(item) {
				w, err := s.keepUnknown(txn, k, &rec, now)
				if err != nil {
					return false, err
				}
				wrote = wrote || w
				continue
			}
			err = s.releaseOne(txn, k, &rec, now)
			if errors.Is(err, store.ErrNoSpace) {
				r.Kept = append(r.Kept, rec.ID)
				continue
			}
			if err != nil {
				return false, err
			}
			r.Released++
			wrote = true
		}
		return wrote, nil
	})
	if err != nil {
		return Release{}, err
	}
	return r, nil
}

// releaseOne parks the in-flight record rec, read at k, as Unknown, with
// what a dead process leaves known: an earlier sequence's outcome, or else
// the claim time as the first send. A fingerprint-window anchor
// (store.IsWindowAnchor), which nothing was sent for, is deleted: the next
// request of its window anchors its period again.
//
// On a disk below the free-space reserve it returns store.ErrNoSpace and
// writes nothing: the record stays in flight, since it may have been sent
// (see ReleaseInFlight), and the start goes on.
func (s *Store) releaseOne(txn *badger.Txn, k []byte, rec *store.Record, now time.Time) error {
	if store.IsWindowAnchor(rec.ID) {
		return txn.Delete(k)
	}
	if rec.Outcome.FirstSentAt.IsZero() { // also when the outcome holds attempts or an error
		rec.Outcome.FirstSentAt = rec.CreatedAt
	}
	rec.Outcome.LastError = processDied
	rec.State, rec.LeaseUntil = store.Unknown, time.Time{}
	// put checks the space before it sets anything in txn: a refusal leaves
	// the record as it was.
	return s.put(txn, k, nil, rec, now)
}

// expiringUnknown says whether item is an Unknown record with an expiry,
// which only a version before unknown records stopped expiring wrote.
func expiringUnknown(item *badger.Item) bool {
	return item.UserMeta() == byte(store.Unknown) && item.ExpiresAt() != 0
}

// keepUnknown writes the Unknown record rec at k again as it is, which put
// does without an expiry. On a disk below the free-space reserve it is left
// as it was: a start must not fail on a nearly full disk.
func (s *Store) keepUnknown(txn *badger.Txn, k []byte, rec *store.Record, now time.Time) (wrote bool, err error) {
	err = s.put(txn, k, nil, rec, now)
	if errors.Is(err, store.ErrNoSpace) {
		return false, nil
	}
	return err == nil, err
}

// unexpire writes the value at k again byte for byte, without its expiry,
// for a record whose value cannot be read: it keeps what it holds, and does
// not expire, like every unknown record. A value that cannot even be read
// out, or a disk below the free-space reserve, leaves it as it was.
func (s *Store) unexpire(txn *badger.Txn, k []byte, item *badger.Item) (wrote bool, err error) {
	v, err := item.ValueCopy(nil)
	if err != nil {
		return false, nil
	}
	err = s.checkSpace(int64(len(k) + len(v)))
	if errors.Is(err, store.ErrNoSpace) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, translate(txn.SetEntry(badger.NewEntry(k, v).WithMeta(item.UserMeta())))
}

// damaged describes the record at k whose value failed to read with err.
func damaged(k []byte, item *badger.Item, err error) Damaged {
	d := Damaged{StoreKey: hex.EncodeToString(k), State: store.State(item.UserMeta()), Err: err}
	_ = item.Value(func(v []byte) error {
		d.ID = salvageID(k, v)
		return nil
	})
	return d
}

// salvageID reads the client and key of a value decodeRecord refused, as
// far as the layout it knows goes (a newer format that only added fields
// keeps it), and returns them only if they hash to the record's store key k,
// which proves they were read where they were written; else a zero ID.
func salvageID(k, v []byte) store.ID {
	if len(v) < 2 || v[0] < 3 { // versions 1 and 2 did not keep them
		return store.ID{}
	}
	b := bytes.Clone(v[1:])
	b[0] = byte(store.InFlight) // the state byte may be what is wrong
	d := decoder{buf: b}
	r := d.record()
	d.outcome(&r)
	d.identity(&r, v[0]) // its flags may fail: the ID is read before them
	if r.ID.Key == "" || !bytes.Equal(appendRecordKey(nil, r.ID), k) {
		return store.ID{}
	}
	return r.ID
}
