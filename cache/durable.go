package cache

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/dgraph-io/badger/v4"
)

// The store opens Badger with SyncWrites=false and makes writes durable
// itself: Badger's own SyncWrites syncs once per commit and can acknowledge
// an unsynced value-log write. docs/design/durability.md has the analysis;
// in short, every value stays in the LSM tree and its WALs, and one shared
// round (syncFiles, led through groupSync) makes everything committed before
// it durable.

// syncFiles is one group-commit round, run by one goroutine at a time
// (groupSync's leader). Every commit at or below ts was in a WAL before the
// round started (its callers' word: durableTs, or a version a reader saw).
//
//  1. sync every WAL not yet flushed (db.Sync reaches only the active one);
//  2. fsync the directory if a WAL appeared since the last round (Badger
//     creates WALs without syncing the directory);
//  3. check that the directory is still the one the store opened
//     (dirMark.check): writes into a deleted or replaced one are lost;
//  4. publish ts as syncedTs.
func (s *Store) syncFiles(ts uint64) error {
	if err := s.wals.sync(); err != nil {
		return err
	}
	// After the sync: a directory deleted during it loses what it synced.
	if err := s.mark.check(); err != nil {
		return err
	}
	if ts > s.syncedTs.Load() {
		s.syncedTs.Store(ts)
	}
	return nil
}

// walSet tracks Badger's memtable WAL files (NNNNN.mem) without listing the
// directory each round: Badger numbers new WALs one above the last, so a
// round looks only for the next number. Each WAL stays open from the round
// that found it until the round (or dropFlushed) that sees it deleted, so a
// round opens nothing. Used by the group-sync leader, dropFlushed and Close.
type walSet struct {
	mu       sync.Mutex // held by sync, dropFlushed and close
	dir      string
	live     []walFile // ascending fid; not yet seen deleted
	next     int       // the fid the next new WAL will have
	nextPath string    // its path, kept so that a round allocates nothing
	dirDirty bool      // a WAL appeared since the directory was last fsynced
	held     int       // the fid heldName notes: the newest WAL synced with an entry
}

type walFile struct {
	fid       int
	path      string
	f         *os.File // nil until the first round that syncs it
	allocated bool     // preallocate is done with it
	entry     bool     // it held a whole entry before its last sync (probed until noted)
	header    [walHeaderSize]byte
}

// walName is Badger's WAL file name for fid (memtable.go: "%05d.mem").
func walName(fid int) string {
	s := strconv.Itoa(fid)
	if len(s) < 5 {
		s = strings.Repeat("0", 5-len(s)) + s
	}
	return s + ".mem"
}

// load lists dir once (at open, and if a WAL was missed); the directory is
// fsynced at the next round because Badger may just have created a WAL.
func (w *walSet) load() error {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", w.dir, err)
	}
	open := map[int]*os.File{}
	for _, f := range w.live {
		if f.f != nil {
			open[f.fid] = f.f
		}
	}
	w.live = w.live[:0]
	for _, e := range entries {
		num, ok := strings.CutSuffix(e.Name(), ".mem")
		fid, err := strconv.Atoi(num)
		if !ok || err != nil {
			continue
		}
		w.live = append(w.live, walFile{fid: fid, path: filepath.Join(w.dir, e.Name()), f: open[fid]})
		delete(open, fid)
		w.next = max(w.next, fid+1)
	}
	for _, f := range open { // tracked, but no longer in the directory
		f.Close()
	}
	w.nextPath = ""
	slices.SortFunc(w.live, func(a, b walFile) int { return a.fid - b.fid })
	w.dirDirty = true
	h, err := readHeld(w.dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", filepath.Join(w.dir, heldName), err)
	}
	w.held = max(w.held, h.fid)
	return nil
}

// sync syncs every live WAL, picking up new ones and dropping flushed ones.
func (w *walSet) sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.syncLocked()
}

func (w *walSet) syncLocked() error {
	for {
		if w.nextPath == "" {
			w.nextPath = filepath.Join(w.dir, walName(w.next))
		}
		exists, err := pathExists(w.nextPath)
		if err != nil {
			return fmt.Errorf("stat %s: %w", w.nextPath, err)
		}
		if !exists {
			break
		}
		w.live = append(w.live, walFile{fid: w.next, path: w.nextPath})
		w.next, w.nextPath = w.next+1, ""
		w.dirDirty = true
	}
	kept := w.live[:0]
	newestGone := false
	n := len(w.live)
	for i := range n {
		// Only the newest WAL takes writes: the older ones wait for their flush.
		newest := i == n-1
		gone, err := w.live[i].sync(newest, newest && w.live[i].fid > w.held)
		if err != nil {
			kept = append(kept, w.live[i:]...) // still tracked (and closed by close)
			clear(w.live[len(kept):n])
			w.live = kept
			return err
		}
		if gone {
			// A flushed WAL: Badger msynced its L0 table and recorded it in the
			// fsynced MANIFEST before deleting it.
			newestGone = newestGone || i == n-1
			continue
		}
		kept = append(kept, w.live[i])
	}
	clear(w.live[len(kept):n])
	w.live = kept
	if newestGone {
		// The newest WAL is never deleted while Badger runs unless a newer one
		// exists, so one was missed: fall back to listing.
		if err := w.load(); err != nil {
			return err
		}
		return w.syncLocked()
	}
	if w.dirDirty {
		if err := fsyncDir(w.dir); err != nil {
			return err
		}
		w.dirDirty = false
	}
	if len(w.live) > 0 {
		if f := &w.live[len(w.live)-1]; f.entry && f.fid > w.held {
			// Best effort: the note is written once per WAL, and a round
			// that cannot write it (a full disk) leaves it to the next.
			if writeHeld(w.dir, heldWAL{fid: f.fid, header: f.header}) == nil {
				w.held = f.fid
			}
		}
	}
	return nil
}

// sync makes the WAL's data durable, opening it on first use; gone reports
// that the file no longer exists (flushed to an L0 table by Badger), and
// then it is closed. With allocate, the WAL's blocks are first allocated
// (preallocate), once. With probe, it first looks whether the WAL holds a
// whole entry (entry), which the sync then makes durable.
func (f *walFile) sync(allocate, probe bool) (gone bool, err error) {
	if f.f == nil {
		file, err := os.OpenFile(f.path, os.O_RDWR, 0) // writable, for fallocate
		if errors.Is(err, fs.ErrNotExist) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("open %s for sync: %w", f.path, err)
		}
		f.f = file
	}
	gone, err = unlinked(f.f, f.path)
	if err == nil && !gone && allocate && !f.allocated {
		// Best effort: failing means that the file system is nearly full, and
		// then checkSpace refuses writes anyway. The next round tries again.
		f.allocated, _ = preallocate(f.f)
	}
	if err == nil && !gone && probe && !f.entry {
		err = f.probe()
	}
	if err == nil && !gone {
		err = datasync(f.f)
	}
	if err != nil {
		return false, fmt.Errorf("sync %s: %w", f.path, err)
	}
	if gone {
		f.f.Close()
		f.f = nil
	}
	return gone, nil
}

// dropFlushed closes the WALs Badger has deleted since the last round, so
// that an idle store, where no round runs, does not hold their (allocated)
// blocks. The next round forgets them.
func (w *walSet) dropFlushed() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.live {
		f := &w.live[i]
		if f.f == nil {
			continue
		}
		if gone, err := unlinked(f.f, f.path); err == nil && gone {
			f.f.Close()
			f.f = nil
		}
	}
}

// close closes the open WALs (the store is closing).
func (w *walSet) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.live {
		if f := w.live[i].f; f != nil {
			f.Close()
			w.live[i].f = nil
		}
	}
}

// fsyncDir makes the directory's entries durable.
func fsyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s for fsync: %w", dir, err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// waitDurable blocks until everything committed at or before version has been
// synced; a no-op when SyncWrites is off. version is one a read returned:
// the read's transaction waited for every commit at or below it.
func (s *Store) waitDurable(version uint64) error {
	if s.group == nil || version <= s.syncedTs.Load() {
		return nil
	}
	return s.group.wait(version)
}

// durableTs is what a writer whose transaction txn has just committed
// passes to its sync round: a timestamp at or below its commit's, every
// commit up to which is in a WAL. Badger gives a commit a timestamp above
// every earlier read timestamp, so above txn's; and it writes commits one
// batch at a time in timestamp order (under one lock, by one goroutine),
// returning from Commit once the commit's own batch is written: every commit
// at or below txn's read timestamp + 1 is written by then. When nothing
// else committed during txn, that is the commit's own timestamp, so a read
// of the record after the round finds it synced without another round.
// (Taking a fresh read timestamp per round instead costs a transaction, about
// 3.5 allocations per round.)
func durableTs(txn *badger.Txn) uint64 { return txn.ReadTs() + 1 }

// probe sets entry when the WAL holds a whole entry, and header.
func (f *walFile) probe() error {
	fi, err := f.f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < walHeaderSize {
		return nil
	}
	if _, err := f.f.ReadAt(f.header[:], 0); err != nil {
		return err
	}
	f.entry, err = hasEntry(f.f, fi.Size())
	return err
}
