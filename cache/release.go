package cache

import (
	"context"
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

// ReleaseInFlight releases every in-flight record and returns how many it
// released. Badger lets only one process open a directory, so at start every
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
// Its ID is returned in kept, for the caller to log. Once its dead owner's
// lease has run out, the first request with the same fingerprint takes it
// over, and the proxy resumes it as an operation whose outcome is unknown,
// first sent when an earlier sequence was, else when it was claimed, as
// after a release; the next start with space releases it.
//
// It also takes the expiry off every Unknown record that has one: a
// version before unknown records stopped expiring wrote them with the TTL,
// and forgotten, their operation would start afresh as a new one, past the
// retention guard and the probe. Those are not counted.
func (s *Store) ReleaseInFlight() (released int, kept []store.ID, err error) {
	const op = "release in-flight"
	if err := s.enter(op); err != nil {
		return 0, nil, err
	}
	defer s.life.RUnlock()
	keys, err := s.inFlightKeys()
	if err != nil {
		return 0, nil, fmt.Errorf("cache: %s: scan: %w", op, err)
	}
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), releaseChunk)]
		keys = keys[len(chunk):]
		n, k, err := s.release(chunk)
		released += n
		kept = append(kept, k...)
		if err != nil {
			return released, kept, fmt.Errorf("cache: %s: %w", op, err)
		}
	}
	return released, kept, nil
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
// transaction; left lists those left in flight for lack of space.
func (s *Store) release(keys [][]byte) (n int, left []store.ID, err error) {
	err = s.update(context.Background(), "release", func(txn *badger.Txn, now time.Time) (bool, error) {
		n, left = 0, nil
		kept := false
		for _, k := range keys {
			item, err := txn.Get(k)
			if errors.Is(err, badger.ErrKeyNotFound) {
				continue // gone since the scan
			}
			if err != nil {
				return false, err
			}
			if expiringUnknown(item) {
				if err := s.keepUnknown(txn, k, item, now); err != nil {
					return false, err
				}
				kept = true
				continue
			}
			if item.UserMeta() != byte(store.InFlight) {
				continue
			}
			id, err := s.releaseOne(txn, k, item, now)
			if errors.Is(err, store.ErrNoSpace) {
				left = append(left, id)
				continue
			}
			if err != nil {
				return false, err
			}
			n++
		}
		return n > 0 || kept, nil
	})
	if err != nil {
		return 0, nil, err
	}
	return n, left, nil
}

// releaseOne parks the in-flight record at k as Unknown, with what a dead
// process leaves known: an earlier sequence's outcome, or else the claim
// time as the first send. A record that cannot be decoded is deleted, and so
// is a fingerprint-window anchor (store.IsWindowAnchor), which nothing was
// sent for: the next request of its window anchors its period again.
//
// On a disk below the free-space reserve it returns store.ErrNoSpace with
// the record's ID and writes nothing: the record stays in flight, since it
// may have been sent (see ReleaseInFlight), and the start goes on.
func (s *Store) releaseOne(txn *badger.Txn, k []byte, item *badger.Item, now time.Time) (store.ID, error) {
	var rec store.Record
	err := item.Value(func(v []byte) (err error) {
		rec, err = decodeRecord(v)
		return err
	})
	if err != nil || store.IsWindowAnchor(rec.ID) {
		return rec.ID, txn.Delete(k)
	}
	if rec.Outcome.FirstSentAt.IsZero() { // also when the outcome holds attempts or an error
		rec.Outcome.FirstSentAt = rec.CreatedAt
	}
	rec.Outcome.LastError = processDied
	rec.State, rec.LeaseUntil = store.Unknown, time.Time{}
	// put checks the space before it sets anything in txn: a refusal leaves
	// the record as it was.
	return rec.ID, s.put(txn, k, nil, &rec, now)
}

// expiringUnknown says whether item is an Unknown record with an expiry,
// which only a version before unknown records stopped expiring wrote.
func expiringUnknown(item *badger.Item) bool {
	return item.UserMeta() == byte(store.Unknown) && item.ExpiresAt() != 0
}

// keepUnknown writes the Unknown record at k again as it is, which put
// does without an expiry. One that cannot be decoded is left as it is.
func (s *Store) keepUnknown(txn *badger.Txn, k []byte, item *badger.Item, now time.Time) error {
	var rec store.Record
	if err := item.Value(func(v []byte) (err error) {
		rec, err = decodeRecord(v)
		return err
	}); err != nil {
		return nil
	}
	if err := s.put(txn, k, nil, &rec, now); err != nil && !errors.Is(err, store.ErrNoSpace) {
		return err // a start must not fail on a nearly full disk: it is kept as it was
	}
	return nil
}
