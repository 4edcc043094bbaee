package cache

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// defaultListLimit is List's page size when the caller gives none.
const defaultListLimit = 100

// List implements store.Store.List. Records are visited in key order (the
// hash of tenant and key), state read from UserMeta so that other states
// cost no value read, and values read one at a time (no prefetch): a record
// Keep leaves out, or the one that would take the page past
// store.MaxListBytes, is dropped as soon as it is judged; without
// f.Bodies, a record's bodies are dropped as it is decoded (decodeListed),
// so they neither stay in memory nor count towards the page's bytes. The
// value is still read whole: a record is one Badger value. The cursor is the
// hex of the last key returned. A
// record whose value does not decode (a newer build's, or damaged; kept so
// by ReleaseInFlight) is listed as store.Record.Unreadable, named by its
// client and key where they still read, instead of failing the page; one in
// a state this build does not know (a newer build's) is listed so with the
// unknown records, in its own state: its operation may have reached the
// provider. Past f.Budget, the page ends at a record read past.
func (s *Store) List(ctx context.Context, f store.Filter, cursor string, limit int) ([]store.Record, string, error) {
	const op = "list"
	if limit <= 0 {
		limit = defaultListLimit
	}
	start := []byte(recordPrefix)
	if cursor != "" {
		k, err := hex.DecodeString(cursor)
		if err != nil || len(k) != keyLen || !bytes.HasPrefix(k, start) {
			return nil, "", fmt.Errorf("cache: %s: %w", op, store.ErrBadCursor)
		}
		start = append(k, 0) // strictly after the last key returned
	}
	if err := s.enter(op); err != nil {
		return nil, "", err
	}
	defer s.life.RUnlock()
	var out []store.Record
	var next string
	var last []byte // the key of out's last record
	size := 0       // what out's records hold (store.MaxListBytes)
	now := s.now()
	began := time.Now() // f.Budget is of the wall clock, whatever s.now is
	// spent says, for a record read past, whether f.Budget is spent: the
	// page then ends, and the next starts after that record. Only records
	// read past count: those listed are at most limit.
	spent := func(item *badger.Item) bool {
		if f.Budget > 0 && time.Since(began) >= f.Budget {
			next = hex.EncodeToString(item.Key())
			return true
		}
		return false
	}
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(recordPrefix)})
		defer it.Close()
		for it.Seek(start); it.Valid(); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			meta := store.State(item.UserMeta())
			if meta != f.State && (f.State != store.Unknown || knownState(meta)) {
				if spent(item) {
					return nil
				}
				continue
			}
			if exp := item.ExpiresAt(); exp != 0 && uint64(now.Unix()) >= exp {
				if spent(item) {
					return nil
				}
				continue
			}
			var rec store.Record
			err := item.Value(func(v []byte) error {
				var err error
				rec, err = decodeListed(v, f.Bodies)
				if err == nil && !knownState(meta) {
					err = fmt.Errorf("%w: state %d is not one this build knows", ErrCorrupt, meta)
				}
				if err != nil {
					rec = unreadable(item.Key(), v, meta, err)
				}
				return nil
			})
			if err != nil {
				return err
			}
			rec.ExpiresAt = expiresAt(item.ExpiresAt())
			if f.Keep != nil && rec.Unreadable == nil && !f.Keep(&rec) {
				if spent(item) {
					return nil
				}
				continue
			}
			n := rec.Size()
			if len(out) > 0 && size+n > store.MaxListBytes {
				next = hex.EncodeToString(last) // this record starts the next page
				return nil
			}
			out, size, last = append(out, rec), size+n, item.KeyCopy(last[:0])
			if len(out) == limit {
				next = hex.EncodeToString(last)
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("cache: %s: %w", op, translate(err))
	}
	return out, next, nil
}

// knownState says whether s is a state this build writes.
func knownState(s store.State) bool {
	return s == store.InFlight || s == store.Final || s == store.Unknown
}

// unreadable is what List shows of the record at k, in state, whose value
// v failed to decode with err.
func unreadable(k, v []byte, state store.State, err error) store.Record {
	return store.Record{ID: salvageID(k, v), State: state,
		Unreadable: &store.Unreadable{StoreKey: hex.EncodeToString(k), Err: err}}
}

// Supersede implements store.Store.Supersede in one transaction: the
// record is written only while it is owner's claim, final and not
// superseded yet; a Begin or another Supersede that
// claimed it anew meanwhile conflicts with the transaction, which then reads
// it again and refuses.
func (s *Store) Supersede(ctx context.Context, id store.ID, owner string) (store.Record, error) {
	return s.edit(ctx, "supersede", id, func(txn *badger.Txn, key []byte, val *[]byte, cur *store.Record, now time.Time) error {
		if cur.Owner != owner {
			return fmt.Errorf("%w: record is another claim's", store.ErrNotOwner)
		}
		if cur.State != store.Final {
			return fmt.Errorf("%w: record is %s", store.ErrNotFinal, cur.State)
		}
		if cur.Superseded {
			return store.ErrSuperseded // another renew moved the order on first
		}
		cur.Superseded = true
		return s.put(txn, key, val, cur, now)
	})
}

// Resolve implements store.Store.Resolve in one transaction: the record is
// read and written (or deleted) only while it is unknown, and a Begin that
// resumed it meanwhile conflicts with the transaction, which then reads it
// again and refuses.
func (s *Store) Resolve(ctx context.Context, id store.ID, resp *store.Response) (store.Record, error) {
	return s.edit(ctx, "resolve", id, func(txn *badger.Txn, key []byte, val *[]byte, cur *store.Record, now time.Time) error {
		if cur.State != store.Unknown {
			return fmt.Errorf("%w: record is %s", store.ErrNotUnknown, cur.State)
		}
		if resp == nil {
			return txn.Delete(key)
		}
		cur.State = store.Final
		cur.LeaseUntil = time.Time{}
		cur.Response = *resp
		cur.Outcome.LastBody, cur.Outcome.Sent = nil, nil
		return s.put(txn, key, val, cur, now)
	})
}

// Reviewed implements store.Store.Reviewed in one transaction: the record
// is marked and written with its expiry from now only while it awaits
// review; one a request or another operator changed meanwhile conflicts
// with the transaction, which then reads it again.
func (s *Store) Reviewed(ctx context.Context, id store.ID) (store.Record, bool, error) {
	var marked bool
	rec, err := s.edit(ctx, "reviewed", id, func(txn *badger.Txn, key []byte, val *[]byte, cur *store.Record, now time.Time) error {
		marked = false // a conflict runs it again
		switch {
		case cur.State != store.Final:
			return fmt.Errorf("%w: record is %s", store.ErrNotFinal, cur.State)
		case !store.NeedsReview(cur.Response.Body):
			return store.ErrNoReview
		case cur.Reviewed:
			return nil // marked already: its expiry stays
		}
		cur.Reviewed, marked = true, true
		return s.put(txn, key, val, cur, now)
	})
	return rec, marked && err == nil, err
}

// edit is an operator's change to id's record (Supersede, Resolve, Reviewed), in one
// transaction: change refuses the record as it reads it, or writes it (or
// deletes it) through txn; the record as change left it is returned.
func (s *Store) edit(ctx context.Context, op string, id store.ID,
	change func(txn *badger.Txn, key []byte, val *[]byte, cur *store.Record, now time.Time) error) (store.Record, error) {
	if err := checkID(op, id); err != nil {
		return store.Record{}, err
	}
	if err := s.enter(op); err != nil {
		return store.Record{}, err
	}
	defer s.life.RUnlock()
	key, b := getKey(id)
	defer opBufs.Put(b)
	var rec store.Record
	err := s.update(ctx, op, func(txn *badger.Txn, now time.Time) (bool, error) {
		cur, _, err := s.read(txn, key, now)
		if err != nil {
			return false, err
		}
		if cur.ID == (store.ID{}) {
			cur.ID = id // written by a build that did not keep it
		}
		if err := change(txn, key, &b.val, &cur, now); err != nil {
			return false, err
		}
		rec = cur
		return true, nil
	})
	if err != nil {
		return store.Record{}, fmt.Errorf("cache: %s: %w", op, err)
	}
	return rec, nil
}

// Discard implements store.Store.Discard in one transaction: the record is
// deleted only while its value does not decode (or its state is one this
// build does not know); a write that replaced it meanwhile conflicts with
// the transaction, which then reads it again.
func (s *Store) Discard(ctx context.Context, id store.ID) (store.Record, error) {
	const op = "discard"
	if err := checkID(op, id); err != nil {
		return store.Record{}, err
	}
	if err := s.enter(op); err != nil {
		return store.Record{}, err
	}
	defer s.life.RUnlock()
	key, b := getKey(id)
	defer opBufs.Put(b)
	var rec store.Record
	err := s.update(ctx, op, func(txn *badger.Txn, now time.Time) (bool, error) {
		item, err := txn.Get(key)
		if err != nil {
			return false, translate(err)
		}
		if exp := item.ExpiresAt(); exp != 0 && uint64(now.Unix()) >= exp {
			return false, store.ErrNotFound
		}
		meta := store.State(item.UserMeta())
		rec = store.Record{}
		if err := item.Value(func(v []byte) error {
			_, err := decodeRecord(v)
			if err == nil && !knownState(meta) {
				err = fmt.Errorf("%w: state %d is not one this build knows", ErrCorrupt, meta)
			}
			if err != nil {
				rec = unreadable(item.Key(), v, meta, err)
			}
			return nil
		}); err != nil {
			return false, err
		}
		if rec.Unreadable == nil {
			return false, store.ErrReadable
		}
		if rec.ID == (store.ID{}) {
			rec.ID = id // its value does not say
		}
		rec.ExpiresAt = expiresAt(item.ExpiresAt())
		return true, txn.Delete(key)
	})
	if err != nil {
		return store.Record{}, fmt.Errorf("cache: %s: %w", op, err)
	}
	return rec, nil
}
