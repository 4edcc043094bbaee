package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// errNotSynced wraps the error of a write that was committed but whose sync
// failed: it is visible to later transactions, yet may not survive a crash.
var errNotSynced = errors.New("committed but not synced")

// maxConflictRetries bounds the retries of one operation on ErrConflict. A
// conflict means another transaction wrote the key, so every retry sees newer
// data; the bound only stops a bug from spinning forever.
const maxConflictRetries = 1000

// Begin implements store.Store.Begin. The in-flight record is durable before
// Begin returns (with SyncWrites), and so is an existing record it returns.
func (s *Store) Begin(ctx context.Context, id store.ID, req store.Request, owner string, lease time.Duration) (store.Record, bool, error) {
	const op = "begin"
	if err := checkArgs(op, id, owner); err != nil {
		return store.Record{}, false, err
	}
	if lease <= 0 {
		return store.Record{}, false, fmt.Errorf("cache: %s: lease %v is not positive", op, lease)
	}
	if len(req.Fingerprint) == 0 {
		return store.Record{}, false, fmt.Errorf("cache: %s: empty request fingerprint", op)
	}
	if err := s.enter(op); err != nil {
		return store.Record{}, false, err
	}
	defer s.life.RUnlock()

	var rec, prev store.Record
	var created, existed bool
	var version uint64
	key, b := getKey(id)
	defer opBufs.Put(b) // after undoBegin
	err := s.update(ctx, op, func(txn *badger.Txn, now time.Time) (bool, error) {
		cur, ver, err := s.read(txn, key, now)
		existed = err == nil
		switch {
		case errors.Is(err, store.ErrNotFound):
			cur = store.Record{Fingerprint: req.Fingerprint, CreatedAt: now} // shared, as store.Request allows
		case err != nil:
			return false, err
		case resumable(cur, req.Fingerprint, now):
			prev = cur
		default:
			rec, created, version = cur, false, ver
			return false, nil
		}
		cur.State, cur.Owner, cur.LeaseUntil = store.InFlight, owner, now.Add(lease)
		cur.ID = id
		if cur.UpstreamKey == "" || cur.Method == "" { // a takeover keeps the key its operation may have been sent with (see store.Store.Begin)
			cur.UpstreamKey = req.UpstreamKey
		}
		cur.Method, cur.Path = req.Method, req.Path
		cur.Fence++
		err = s.put(txn, key, &b.val, &cur, now)
		rec, created = cur, true
		return true, err
	})
	if errors.Is(err, errNotSynced) && created {
		// The claim is committed but its sync failed: the caller answers 503
		// and sends nothing, so the key must not stay claimed for a lease.
		s.undoBegin(key, &b.val, owner, prev, existed)
	}
	if err == nil && !created {
		err = s.waitDurable(version)
	}
	if err != nil {
		return store.Record{}, false, fmt.Errorf("cache: %s: %w", op, err)
	}
	return rec, created, nil
}

// undoBegin puts back what Begin replaced, if owner still holds the claim:
// the record taken over, or nothing. It does not wait for a sync (the one
// that just failed would likely fail again); if the undo is lost in a crash,
// the in-flight claim is released at the next start anyway.
func (s *Store) undoBegin(key []byte, buf *[]byte, owner string, prev store.Record, existed bool) {
	_, _, err := s.try(func(txn *badger.Txn, now time.Time) (bool, error) {
		cur, _, err := s.read(txn, key, now)
		if err != nil || cur.State != store.InFlight || cur.Owner != owner {
			return false, err
		}
		if !existed {
			return true, txn.Delete(key)
		}
		return true, s.put(txn, key, buf, &prev, now)
	})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Error("cache: undoing a claim whose sync failed", "err", err)
	}
}

// resumable says whether Begin takes cur over: an in-flight record whose
// owner's lease ran out (it crashed or hung), or an Unknown one — but only for
// the same request: another body under this key must get the existing record
// (and a conflict), never be sent.
func resumable(cur store.Record, fp []byte, now time.Time) bool {
	if !bytes.Equal(cur.Fingerprint, fp) {
		return false
	}
	return cur.State == store.Unknown || cur.State == store.InFlight && !now.Before(cur.LeaseUntil)
}

// Complete turns owner's in-flight record into a store.Final one holding resp,
// with a fresh TTL. It returns store.ErrNotOwner if owner does not hold the
// in-flight record, and store.ErrTooLarge if the record would exceed the size
// limit (1 MiB with the default MemTableSize).
func (s *Store) Complete(ctx context.Context, id store.ID, owner string, resp store.Response, sent time.Time) error {
	const op = "complete"
	return s.ownerUpdate(ctx, op, id, owner, func(cur store.Record, _ time.Time) (store.Record, bool) {
		cur.State = store.Final
		cur.LeaseUntil = time.Time{}
		cur.Response = resp
		cur.Outcome.LastBody, cur.Outcome.Sent = nil, nil
		if kept := cur.Outcome.FirstSentAt; !sent.IsZero() && (kept.IsZero() || sent.Before(kept)) {
			cur.Outcome.FirstSentAt = sent
		}
		return cur, true
	})
}

// Abandon deletes owner's in-flight record without a final response, so the
// next Begin starts afresh. It returns store.ErrNotOwner if owner does not hold the
// in-flight record.
func (s *Store) Abandon(ctx context.Context, id store.ID, owner string) error {
	const op = "abandon"
	return s.ownerUpdate(ctx, op, id, owner, func(cur store.Record, _ time.Time) (store.Record, bool) { return cur, false })
}

// Renew implements store.Store.Renew.
func (s *Store) Renew(ctx context.Context, id store.ID, owner string, lease time.Duration) error {
	const op = "renew"
	if lease <= 0 {
		return fmt.Errorf("cache: %s: lease %v is not positive", op, lease)
	}
	return s.ownerUpdate(ctx, op, id, owner, func(cur store.Record, now time.Time) (store.Record, bool) {
		cur.LeaseUntil = now.Add(lease)
		return cur, true
	})
}

// Park implements store.Store.Park.
func (s *Store) Park(ctx context.Context, id store.ID, owner string, o store.Outcome) error {
	return s.ownerUpdate(ctx, "park", id, owner, func(cur store.Record, _ time.Time) (store.Record, bool) {
		cur.State, cur.LeaseUntil = store.Unknown, time.Time{}
		cur.Outcome = cur.Outcome.Merge(o)
		if cur.Outcome.Sent != nil && encodedSize(&cur) >= s.maxValue {
			// Parked without the request's bytes rather than not at all
			// (store.Store.Park): the resume sends its own request's.
			s.log.Warn("cache: the record of an operation whose outcome is unknown is too large to keep its request's bytes; a resume sends those of the request that resumes it",
				"bytes", len(cur.Outcome.Sent.Body), "limit", s.maxValue)
			cur.Outcome.Sent = nil
		}
		return cur, true
	})
}

// ownerUpdate applies change to id's record if owner holds it in flight, and
// writes the changed record, or deletes it when change returns false. change
// takes and returns the record by value: through a pointer, the record would
// escape to the heap (an allocation of its size on every final answer).
func (s *Store) ownerUpdate(ctx context.Context, op string, id store.ID, owner string,
	change func(cur store.Record, now time.Time) (changed store.Record, keep bool)) error {
	if err := checkArgs(op, id, owner); err != nil {
		return err
	}
	if err := s.enter(op); err != nil {
		return err
	}
	defer s.life.RUnlock()
	key, b := getKey(id)
	defer opBufs.Put(b)
	err := s.update(ctx, op, func(txn *badger.Txn, now time.Time) (bool, error) {
		cur, _, err := s.read(txn, key, now)
		if errors.Is(err, store.ErrNotFound) {
			return false, fmt.Errorf("%w: no record", store.ErrNotOwner)
		}
		if err != nil {
			return false, err
		}
		if cur.State != store.InFlight || cur.Owner != owner {
			return false, fmt.Errorf("%w: record is %s", store.ErrNotOwner, cur.State)
		}
		cur, keep := change(cur, now)
		if !keep {
			return true, txn.Delete(key)
		}
		return true, s.put(txn, key, &b.val, &cur, now)
	})
	if err != nil {
		return fmt.Errorf("cache: %s: %w", op, err)
	}
	return nil
}

// Get returns id's record, or store.ErrNotFound if it is missing or expired. A
// record is returned only once it is durable (with SyncWrites).
func (s *Store) Get(ctx context.Context, id store.ID) (store.Record, error) {
	const op = "get"
	if err := checkID(op, id); err != nil {
		return store.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Record{}, fmt.Errorf("cache: %s: %w", op, err)
	}
	if err := s.enter(op); err != nil {
		return store.Record{}, err
	}
	defer s.life.RUnlock()
	var rec store.Record
	var version uint64
	var err error
	key, b := getKey(id)
	defer opBufs.Put(b)
	err = s.db.View(func(txn *badger.Txn) error {
		rec, version, err = s.read(txn, key, s.now())
		return err
	})
	if err == nil {
		err = s.waitDurable(version)
	}
	if err != nil {
		return store.Record{}, fmt.Errorf("cache: %s: %w", op, err)
	}
	return rec, nil
}

// Ping checks that the store is writable (readiness): it writes and deletes
// a probe key and, with SyncWrites, syncs. A nearly full disk fails it with
// store.ErrNoSpace.
func (s *Store) Ping(ctx context.Context) error {
	const op = "ping"
	if err := s.enter(op); err != nil {
		return err
	}
	defer s.life.RUnlock()
	key := []byte("p/ping")
	for _, write := range []func(*badger.Txn) error{
		func(txn *badger.Txn) error {
			s.headroom.Store(0) // readiness looks at the disk itself
			if err := s.checkSpace(1); err != nil {
				return err
			}
			return txn.Set(key, []byte{1})
		},
		func(txn *badger.Txn) error { return txn.Delete(key) },
	} {
		err := s.update(ctx, op, func(txn *badger.Txn, _ time.Time) (bool, error) { return true, write(txn) })
		if err != nil {
			return fmt.Errorf("cache: %s: %w", op, err)
		}
	}
	return nil
}

// update runs fn in a read-write transaction stamped with one clock reading,
// commits it, retries on ErrConflict, and, if fn reported a write, waits for
// the commit to be durable.
func (s *Store) update(ctx context.Context, op string, fn func(*badger.Txn, time.Time) (bool, error)) error {
	if s.group != nil {
		if err := dirWritable(s.dir); err != nil { // before Badger may need a new log (dirWritable)
			if merr := s.mark.check(); merr != nil {
				return merr // not the directory the store opened: that says more
			}
			return err
		}
	}
	for range maxConflictRetries {
		if err := ctx.Err(); err != nil {
			return err
		}
		wrote, ts, err := s.try(fn)
		if errors.Is(err, badger.ErrConflict) {
			continue
		}
		if err != nil || !wrote || s.group == nil {
			return err
		}
		if err := s.group.wait(ts); err != nil {
			return fmt.Errorf("%w: %w", errNotSynced, err)
		}
		return nil
	}
	return fmt.Errorf("%s still conflicting after %d retries", op, maxConflictRetries)
}

// try runs fn once and commits; wrote is fn's report that it wrote, ts the
// commit's durableTs.
func (s *Store) try(fn func(*badger.Txn, time.Time) (bool, error)) (wrote bool, ts uint64, err error) {
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	wrote, err = fn(txn, s.now().UTC()) // UTC, as decodeRecord returns times
	if err == nil {
		err = txn.Commit()
	}
	return wrote, durableTs(txn), translate(err)
}

// read returns the live record at key and its commit version. An entry whose
// ExpiresAt has passed by the store's clock counts as missing (Badger only
// checks the real clock).
func (s *Store) read(txn *badger.Txn, key []byte, now time.Time) (store.Record, uint64, error) {
	item, err := txn.Get(key)
	if err != nil {
		return store.Record{}, 0, translate(err)
	}
	if exp := item.ExpiresAt(); exp != 0 && uint64(now.Unix()) >= exp {
		return store.Record{}, 0, store.ErrNotFound
	}
	var rec store.Record
	err = item.Value(func(v []byte) error {
		rec, err = decodeRecord(v)
		return err
	})
	if err != nil {
		return store.Record{}, 0, err
	}
	rec.ExpiresAt = expiresAt(item.ExpiresAt())
	return rec, item.Version(), nil
}

// expiresAt is a Badger entry's ExpiresAt (Unix seconds, 0 for never) as a
// time.
func expiresAt(exp uint64) time.Time {
	if exp == 0 {
		return time.Time{}
	}
	return time.Unix(int64(exp), 0).UTC()
}

// expiryAfter is a Badger ExpiresAt (whole Unix seconds) no earlier than
// now + ttl: rounded up, so that a record is kept for its whole TTL. Rounded
// down, one written at x.9 s went 0.9 s early, and a fingerprint window's
// anchor kept for a RECORD_TTL equal to its window was gone before the
// window ended.
func expiryAfter(now time.Time, ttl time.Duration) uint64 {
	at := now.Add(ttl)
	sec := at.Unix()
	if at.Nanosecond() > 0 {
		sec++
	}
	return uint64(sec)
}

// put writes rec at key with the store's TTL counted from now, if it
// expires. UserMeta
// carries the state so ReleaseInFlight can scan without reading values.
// ExpiresAt is what Entry.WithTTL sets, but taken from the store's clock.
// Only puts check free space: reads, replays and deletes still work on a
// nearly full disk.
//
// rec is encoded into *buf, an operation's buffer (opBuf.val) that no other
// write of txn uses, which keeps it if it grew within maxPooledValue; with
// a nil buf, into a new slice.
func (s *Store) put(txn *badger.Txn, key []byte, buf *[]byte, rec *store.Record, now time.Time) error {
	var val []byte
	if buf == nil {
		val = appendRecord(nil, rec)
	} else if val = appendRecord((*buf)[:0], rec); cap(val) <= maxPooledValue {
		*buf = val
	}
	if len(val) >= s.maxValue {
		return fmt.Errorf("%w: %d bytes encoded, limit %d", store.ErrTooLarge, len(val), s.maxValue-1)
	}
	if err := s.checkSpace(int64(len(key) + len(val))); err != nil {
		return err
	}
	s.lastPut.Store(now.UnixNano())
	s.puts.Add(1)
	e := badger.NewEntry(key, val).WithMeta(byte(rec.State))
	// Only a final record expires (store.Record.Expires). A superseded one
	// is kept for good, one that awaits review until an operator marks it,
	// and an in-flight or unknown one until it is final: forgotten, its
	// operation would be sent again as a new one.
	if s.ttl > 0 && rec.Expires() {
		e.ExpiresAt = expiryAfter(now, s.ttl)
	}
	rec.ExpiresAt = expiresAt(e.ExpiresAt)
	return translate(txn.SetEntry(e))
}

// translate maps Badger's sentinels to the package's at the edge.
func translate(err error) error {
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		return store.ErrNotFound
	case errors.Is(err, badger.ErrTxnTooBig):
		return fmt.Errorf("%w: %w", store.ErrTooLarge, err)
	case errors.Is(err, badger.ErrDBClosed):
		return fmt.Errorf("%w: %w", store.ErrClosed, err)
	}
	return err
}

// checkSpace refuses a write while free space is below the reserve, before
// Badger's mmapped writes could hit a full disk.
//
// A statfs per write was about 4% of the CPU of a new-key request
// (BENCHMARKS.md), so a look at the disk buys headroom for the next writes:
// 1/spareShare of the spare space above the reserve, counted in record bytes.
// The share covers Badger's write amplification (WAL, flush, compactions);
// near the reserve the headroom shrinks and every write looks again.
//
// Another writer can fill the disk meanwhile, so the headroom is also capped
// at an eighth of a memtable (a memtable flush, which would fault on a full
// disk, comes only after several looks) and dropped every second
// (spaceTick): a write after a quiet spell looks at the disk as it is now.
func (s *Store) checkSpace(n int64) error {
	if s.minFree == 0 || s.headroom.Add(-n) > 0 {
		return nil
	}
	free, err := freeBytes(s.dir)
	if err != nil {
		return err
	}
	if free < s.minFree {
		return fmt.Errorf("%w: %d bytes free in %s, reserve is %d", store.ErrNoSpace, free, s.dir, s.minFree)
	}
	s.headroom.Store(min(int64((free-s.minFree)/spareShare), s.maxHeadroom))
	return nil
}

// spareShare and spaceInterval: see checkSpace.
const (
	spareShare    = 64
	spaceInterval = time.Second
)

// spaceTick drops the headroom, so that the next write looks at the disk.
func (s *Store) spaceTick() bool {
	s.headroom.Store(0)
	return true
}

// checkArgs rejects an empty key or owner token.
func checkArgs(op string, id store.ID, owner string) error {
	if err := checkID(op, id); err != nil {
		return err
	}
	if owner == "" {
		return fmt.Errorf("cache: %s: empty owner token", op)
	}
	return nil
}

// checkID rejects an empty idempotency key.
func checkID(op string, id store.ID) error {
	if id.Key == "" {
		return fmt.Errorf("cache: %s: empty idempotency key", op)
	}
	return nil
}
