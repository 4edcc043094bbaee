package cache

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// reclaimExpired gives the disk back once every record has expired and none
// was written since: Badger drops expired entries only when a compaction
// rewrites their table, and an idle store does not compact, so without this
// an idle store would keep its size forever (docs/design/disk.md). It
// returns whether it dropped the records.
//
// Nothing live is lost: the scan finds no record that is still live by the
// store's clock, the records are dropped while no operation runs (the
// life lock, taken only if free, so that Close is never blocked), and no
// record was written between the scan and the drop.
func (s *Store) reclaimExpired() (bool, error) {
	if s.ttl <= 0 {
		return false, nil
	}
	puts := s.puts.Load()
	if puts == s.reclaimedAt || s.now().Sub(time.Unix(0, s.lastPut.Load())) < s.ttl {
		return false, nil // nothing new to reclaim, or something may be live
	}
	live, err := s.anyLive()
	if err != nil || live {
		return false, err
	}
	if !s.life.TryLock() {
		return false, nil // an operation is running: not idle
	}
	defer s.life.Unlock()
	if s.closed || s.puts.Load() != puts {
		return false, nil
	}
	if err := dirWritable(s.dir); err != nil { // DropPrefix makes a new memtable and its log
		return false, fmt.Errorf("cache: drop expired records: %w", err)
	}
	if s.minFree > 0 {
		// DropPrefix first flushes the memtable into a new table, written
		// through mmap: on a full file system that is SIGBUS, the process
		// killed while idle (measured: a 300 MiB tmpfs filled by another
		// program, the sweep 13 s after the last order ended it, exit
		// status 2). The writes' reserve guards it as it guards theirs; the
		// next tick tries again.
		s.headroom.Store(0)
		if err := s.checkSpace(1); err != nil {
			return false, fmt.Errorf("cache: drop expired records: %w", err)
		}
	}
	// DropPrefix does nothing unless it sees a live key with the prefix, and
	// every record has expired: a short-lived placeholder record is that key,
	// and goes with the rest.
	now := s.now()
	err = s.db.Update(func(txn *badger.Txn) error {
		e := badger.NewEntry(reclaimKey, appendRecord(nil, &store.Record{State: store.Final, CreatedAt: now})).
			WithMeta(byte(store.Final))
		e.ExpiresAt = uint64(now.Add(time.Minute).Unix())
		return txn.SetEntry(e)
	})
	if err == nil {
		err = s.db.DropPrefix([]byte(recordPrefix))
	}
	if err != nil {
		return false, fmt.Errorf("cache: drop expired records: %w", err)
	}
	s.reclaimedAt = puts
	return true, nil
}

// reclaimKey is the placeholder record reclaimExpired writes: a record key
// (prefix and length) that no idempotency key hashes to in practice.
var reclaimKey = append([]byte(recordPrefix), make([]byte, keyLen-len(recordPrefix))...)

// anyLive reports whether some record is not yet expired by the store's clock
// (Badger's iterator already hides those expired by the real clock).
func (s *Store) anyLive() (bool, error) {
	now := uint64(s.now().Unix())
	live := false
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(recordPrefix)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if exp := it.Item().ExpiresAt(); exp == 0 || now < exp {
				live = true
				return nil
			}
		}
		return nil
	})
	return live, err
}

// reclaimTick runs reclaimExpired and logs what it did.
func (s *Store) reclaimTick() bool {
	dropped, err := s.reclaimExpired()
	switch {
	case err != nil:
		s.log.LogAttrs(context.Background(), slog.LevelWarn, "reclaiming expired records failed",
			slog.String("component", "cache"), slog.String("error", err.Error()))
	case dropped:
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "every record had expired: disk space given back",
			slog.String("component", "cache"))
	}
	return true
}
