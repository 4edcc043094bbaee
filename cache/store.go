// Package cache is idemproxy's durable record store: one record per
// (tenant, idempotency key), kept in an embedded Badger v4 database on local
// disk. A record is in flight while an upstream operation runs (with an owner
// token and a lease) and final once the upstream's final response is stored
// for replay. See docs/design/durability.md for what a returned nil
// guarantees.
package cache

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/idemproxy/idemproxy/store"
)

// Errors of the Badger store beyond the contract's (package store): every
// method may also return store.ErrNotFound, store.ErrNotOwner,
// store.ErrTooLarge, store.ErrNoSpace and store.ErrClosed as documented there.
var (
	// ErrLocked is returned by Open when another process or Store has the
	// directory open.
	ErrLocked = errors.New("cache: store directory is locked")

	// ErrDirGone is returned by a write once the store's directory is no
	// longer the one it opened (dirMark.check).
	ErrDirGone = errors.New("cache: store directory gone")
)

// Options configures Open. Dir or InMemory must be set; the other zero
// values are the defaults stated on each field (SyncWrites off).
type Options struct {
	// Dir is the Badger directory, created (mode 0700) if missing. Ignored
	// when InMemory is set.
	Dir string
	// InMemory keeps everything in memory; for tests and benchmarks only.
	InMemory bool
	// SyncWrites makes Begin, Complete, Abandon and Ping return only after
	// their write is fsynced; concurrent writers share each fsync
	// (docs/design/durability.md).
	SyncWrites bool
	// TTL is the lifetime of final records, counted from their last write
	// (in-flight, unknown and superseded ones never expire). 0 keeps records
	// forever.
	TTL time.Duration
	// GCInterval is the period of the value-log GC loop. 0 means 5 minutes; a
	// negative value disables the loop.
	GCInterval time.Duration
	// ReclaimInterval is how often the store checks whether every record has
	// expired with none written since, and then gives their disk space back.
	// 0 means a tenth of TTL, between 10 seconds and 5 minutes; a negative
	// value disables it.
	ReclaimInterval time.Duration
	// PageOutInterval is the longest time between two hand-backs of the
	// resident pages of Badger's table files and WALs to the kernel (Linux).
	// 0 means 500 ms; a negative value disables page-out altogether, and the
	// resident set then grows with the store.
	PageOutInterval time.Duration
	// PageOutGrowth starts a hand-back before PageOutInterval when the
	// process's file-backed resident size has grown by this many bytes since
	// the last one (checked every 50 ms). 0 means 16 MiB; a negative value
	// leaves only the period.
	PageOutGrowth int64
	// Logger receives Badger's warnings and errors and the GC loop's failures.
	// nil discards them.
	Logger *slog.Logger
	// Now is the clock for leases, CreatedAt and TTL. nil means time.Now.
	// Badger also hides entries by the real clock, so Now must not run behind
	// real time by more than TTL.
	Now func() time.Time
	// MemTableSize is Badger's memtable size in bytes; 0 means 8 MiB. Up to
	// three memtables are in memory at once. A record's encoding must stay
	// below 15% of it and below 1 MiB (so from 7 MiB up the limit is 1 MiB);
	// Complete fails with store.ErrTooLarge above.
	MemTableSize int64
	// BlockCacheSize is Badger's block cache in bytes; 0 means 8 MiB.
	BlockCacheSize int64
	// IndexCacheSize bounds memory for table indexes and bloom filters; 0
	// means 16 MiB.
	IndexCacheSize int64
	// MinFreeBytes refuses writes with store.ErrNoSpace while the file system has
	// less space available. Badger writes through mmap into sparse files, and
	// a full disk kills the process with SIGBUS (seen in compaction's
	// table.CreateTable on a full tmpfs, also during Close) instead of
	// returning ENOSPC, so the reserve must hold the largest compaction of
	// what is already stored. It is a guard, not a guarantee: another writer
	// can still fill the disk. 0 means twice Badger's largest L0→L1
	// compaction, 2 × (15 × MemTableSize + 10 MiB): 260 MiB by default;
	// negative disables the check.
	MinFreeBytes int64
}

// Defaults sized for a small container (docs/design/memory.md). The
// memtable stays at 8 MiB because a record (up to 1 MiB) must fit in 15% of
// it; one full memtable may wait for its flush; tables are small because
// compaction buffers up to 8+splits of them at once.
const (
	defaultMemTableSize   = 8 << 20
	defaultBlockCacheSize = 8 << 20
	defaultIndexCacheSize = 8 << 20
	// baseTableSize is Badger's L1 table size (default 2 MiB). Compaction
	// builds up to 8+splits tables at once, each buffering about twice its
	// size, so smaller tables cap that peak.
	baseTableSize     = 512 << 10
	defaultGCInterval = 5 * time.Minute
	// defaultPageOutInterval bounds how much of the tables written or read
	// in the meantime stays resident. A large compaction moves over 100 MiB
	// a second through mapped tables; a pass costs a read of
	// /proc/self/maps and one madvise per table (docs/design/memory.md).
	defaultPageOutInterval = 500 * time.Millisecond
	// defaultPageOutGrowth starts a pass as soon as this much more of the
	// files is resident: a compaction can map over 100 MiB of tables within
	// one period (docs/design/memory.md).
	defaultPageOutGrowth = 16 << 20
	// numMemtables is how many full memtables may wait for flushing.
	numMemtables = 1
	// maxValueSize is Badger's largest ValueThreshold (1 MiB).
	maxValueSize = 1 << 20
)

// walCheckInterval is how often WALs that Badger deleted while no sync round
// ran (an idle store) are closed, giving their blocks back. A variable for
// tests.
var walCheckInterval = 10 * time.Second

// defaultMinFree is twice the most an L0→L1 compaction writes before it
// deletes its inputs: every L0 table (up to NumLevelZeroTablesStall = 15, one
// memtable each) plus all of L1 (BaseLevelSize = 10 MiB), Badger's defaults.
func defaultMinFree(memTableSize int64) int64 {
	return 2 * (15*memTableSize + 10<<20)
}

// valueThreshold is the ValueThreshold the store gives Badger: the largest
// it accepts, which is also capped at Badger's per-transaction size (15% of
// the memtable). Every value is kept strictly below it, so that it lives in
// the LSM tree and never in the value log (docs/design/durability.md).
func valueThreshold(memTableSize int64) int64 {
	return min(maxValueSize, 15*memTableSize/100)
}

// Store is the Badger-backed record store. It is safe for concurrent use.
// Open creates it; Close releases the directory.
type Store struct {
	db          *badger.DB
	dir         string
	ttl         time.Duration
	now         func() time.Time
	log         *slog.Logger
	minFree     uint64       // 0 = no free-space check
	headroom    atomic.Int64 // record bytes writable before free space is looked at again
	maxHeadroom int64        // cap of headroom (checkSpace)
	maxValue    int          // values must be shorter (valueThreshold)
	unlock      func() error
	mark        dirMark // the lock file: checked by every sync round

	group    *groupSync    // nil unless SyncWrites on disk
	syncedTs atomic.Uint64 // every commit at or below it is on disk
	wals     walSet        // used by the group-sync leader only

	lastPut     atomic.Int64  // store-clock UnixNano of the last record written; Open counts as one
	puts        atomic.Uint64 // records written since Open
	reclaimedAt uint64        // puts when reclaimExpired last dropped the records (its loop only)

	pageOut       pageOutTrigger // the page-out loop's only
	pageOutWarned time.Time      // the page-out loop's: when it last logged a failure
	statm         statm          // the page-out loop's: /proc/self/statm, open while growth is on
	pageOuts      atomic.Uint64  // page-out passes since Open

	life   sync.RWMutex // read-held by every operation, write-held by Close
	closed bool
	stop   chan struct{}
	gcDone sync.WaitGroup
}

// Open opens (or creates) the store. It fails with ErrLocked when another
// process or Store has the directory, and with a plain error when it is
// damaged (a corrupt MANIFEST, a table whose index or one of whose data
// blocks does not match its checksum: checkTables); it never panics on a bad
// directory.
func Open(opts Options) (*Store, error) {
	opts = withDefaults(opts)
	s := &Store{
		dir:  opts.Dir,
		ttl:  opts.TTL,
		now:  opts.Now,
		log:  opts.Logger,
		stop: make(chan struct{}),

		maxValue:    int(valueThreshold(opts.MemTableSize)),
		maxHeadroom: opts.MemTableSize / 8,
	}
	if err := s.open(opts); err != nil {
		return nil, err
	}
	if opts.SyncWrites && !opts.InMemory {
		s.wals = walSet{dir: opts.Dir}
		// One round at once preallocates the WAL Badger writes to (walFile.sync).
		err := s.wals.load()
		if err == nil {
			err = s.wals.sync()
		}
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("cache: open: %w", err)
		}
		s.group = &groupSync{sync: s.syncFiles}
		s.every(walCheckInterval, func() bool { s.wals.dropFlushed(); return true })
	}
	if opts.GCInterval > 0 && !opts.InMemory {
		s.every(opts.GCInterval, s.gcTick)
	}
	// Records from before the start may be live for a TTL: Open counts as a put.
	s.lastPut.Store(s.now().UnixNano())
	s.puts.Store(1)
	if opts.ReclaimInterval > 0 && !opts.InMemory && opts.TTL > 0 {
		s.every(opts.ReclaimInterval, s.reclaimTick)
	}
	if opts.PageOutInterval > 0 && !opts.InMemory {
		s.pageOut = newPageOutTrigger(opts.PageOutInterval, opts.PageOutGrowth, time.Now())
		check := opts.PageOutInterval
		if opts.PageOutGrowth > 0 {
			check = min(check, pageOutCheck)
		}
		s.gcDone.Add(1)
		go s.pageOutLoop(check)
	}
	if s.minFree > 0 {
		s.every(spaceInterval, s.spaceTick)
		// Said at start: behind a readiness check no request comes to log
		// the refusal, and a volume smaller than the reserve never gets ready.
		if free, err := freeBytes(s.dir); err == nil && free < s.minFree {
			s.log.Warn("the data directory's file system has less free space than the store keeps in reserve: "+
				"every write is refused (503 store_unavailable, nothing sent) and /readyz says 503 until there is more",
				"dir", s.dir, "free_bytes", free, "reserve_bytes", s.minFree)
		}
	}
	return s, nil
}

func withDefaults(opts Options) Options {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.GCInterval == 0 {
		opts.GCInterval = defaultGCInterval
	}
	if opts.ReclaimInterval == 0 {
		opts.ReclaimInterval = min(max(opts.TTL/10, 10*time.Second), 5*time.Minute)
	}
	if opts.PageOutInterval == 0 {
		opts.PageOutInterval = defaultPageOutInterval
	}
	if opts.PageOutGrowth == 0 {
		opts.PageOutGrowth = defaultPageOutGrowth
	}
	if opts.MemTableSize <= 0 {
		opts.MemTableSize = defaultMemTableSize
	}
	if opts.BlockCacheSize <= 0 {
		opts.BlockCacheSize = defaultBlockCacheSize
	}
	if opts.IndexCacheSize <= 0 {
		opts.IndexCacheSize = defaultIndexCacheSize
	}
	if opts.MinFreeBytes == 0 {
		opts.MinFreeBytes = defaultMinFree(opts.MemTableSize)
	}
	return opts
}

// open creates and locks the directory, then opens Badger.
func (s *Store) open(opts Options) error {
	bopts := badgerOptions(opts)
	if opts.InMemory {
		s.unlock = func() error { return nil }
		db, err := openBadger(bopts)
		s.db = db
		return err
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return fmt.Errorf("cache: open: create %s: %w", opts.Dir, err)
	}
	if err := checkOwnDir(opts.Dir); err != nil {
		return fmt.Errorf("cache: open: %w", err)
	}
	unlock, mark, err := lockDir(opts.Dir)
	if err != nil {
		return fmt.Errorf("cache: open: %w", err)
	}
	if err := checkTables(opts.Dir, bopts); err != nil {
		unlock()
		return fmt.Errorf("cache: open %s: %w", opts.Dir, err)
	}
	if opts.MinFreeBytes > 0 {
		if err := checkReplaySpace(opts.Dir, opts.MemTableSize); err != nil {
			unlock()
			return fmt.Errorf("cache: open %s: %w", opts.Dir, err)
		}
	}
	db, err := openBadger(bopts)
	if err != nil {
		unlock()
		return err
	}
	s.db, s.unlock, s.mark = db, unlock, mark
	if opts.MinFreeBytes > 0 {
		s.minFree = uint64(opts.MinFreeBytes)
	}
	return nil
}

func badgerOptions(opts Options) badger.Options {
	dir := opts.Dir
	if opts.InMemory {
		dir = ""
	}
	return badger.DefaultOptions(dir).
		WithInMemory(opts.InMemory).
		WithSyncWrites(false). // the store syncs itself (docs/design/durability.md)
		WithValueThreshold(valueThreshold(opts.MemTableSize)).
		WithMemTableSize(opts.MemTableSize).
		WithNumMemtables(numMemtables).
		WithBlockCacheSize(opts.BlockCacheSize).
		WithIndexCacheSize(opts.IndexCacheSize).
		WithNumCompactors(2).
		WithValueLogFileSize(64 << 20).
		WithBaseTableSize(baseTableSize).
		// No compression: a Snappy table builder keeps every compressed
		// block next to the raw one until the table is done, and sizes tables
		// by compressed bytes, so its buffers grow with the ratio. Measured
		// (1e6 records): 640 MiB anonymous peak with Snappy, 270 MiB without.
		// Bigger tables cost disk and reclaimable page cache instead.
		WithCompression(options.None).
		// Block checksums are checked at start instead (checkTables): with
		// OnBlockRead Badger takes a failed block for the end of its table, in
		// lookups ("not found") and in compactions (the rest of the table
		// dropped for good).
		WithChecksumVerificationMode(options.NoVerification).
		WithMetricsEnabled(false).
		WithLogger(badgerLogger{opts.Logger})
}

// openBadger opens Badger, turning a panic on a damaged directory into an
// error (Badger panics on some malformed files instead of returning one).
func openBadger(bopts badger.Options) (db *badger.DB, err error) {
	defer func() {
		if p := recover(); p != nil {
			db, err = nil, fmt.Errorf("cache: open %s: badger panicked: %v", bopts.Dir, p)
		}
	}()
	db, err = badger.Open(bopts)
	if err != nil {
		if strings.Contains(err.Error(), fs.ErrPermission.Error()) {
			err = deniedError{err}
		}
		return nil, fmt.Errorf("cache: open %s: %w", bopts.Dir, err)
	}
	return db, nil
}

// deniedError is an error of Badger's that says "permission denied" (its
// LOCK file in a directory the process may not write in, a value log it may
// not write): Badger flattens the os error into its text, so that errors.Is
// no longer finds fs.ErrPermission, and the caller would not tell the
// operator which user needs the directory. It restores that.
type deniedError struct{ error }

func (e deniedError) Unwrap() []error { return []error{e.error, fs.ErrPermission} }

// Close stops the GC loop and closes Badger. Operations still running finish
// first; later calls return store.ErrClosed. Calling Close again returns nil.
//
// On a file system with less free space than the reserve (MinFreeBytes),
// with SyncWrites, Close leaves Badger open instead (see leaveOpen): the
// process must then exit, as the directory stays locked until it does. So
// does a Close once the directory is gone (ErrDirGone), which returns that.
func (s *Store) Close() error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.stop)
	s.gcDone.Wait()
	if s.group != nil {
		if err := s.mark.check(); err != nil {
			// Badger's Close would flush the memtable into a table in
			// whatever is at the path now (or retry for ever where there is
			// nothing), and no MANIFEST there would name it.
			s.wals.close()
			return fmt.Errorf("cache: close: left Badger open: %w", err)
		}
	}
	if s.group != nil && s.minFree > 0 {
		if free, err := freeBytes(s.dir); err != nil || free < s.minFree {
			return s.leaveOpen(free, err)
		}
	}
	err := s.db.Close()
	s.wals.close()
	if uerr := s.unlock(); err == nil {
		err = uerr
	}
	if err != nil {
		return fmt.Errorf("cache: close: %w", err)
	}
	return nil
}

// enter marks an operation as running so that Close waits for it; the
// caller ends it with s.life.RUnlock (a returned func value would be an
// allocation per operation).
func (s *Store) enter(op string) error {
	s.life.RLock()
	if s.closed {
		s.life.RUnlock()
		return fmt.Errorf("cache: %s: %w", op, store.ErrClosed)
	}
	return nil
}

// Size returns the on-disk size of Badger's LSM tree and value log in bytes,
// as of Badger's last size refresh (about once a minute); 0, 0 after Close.
func (s *Store) Size() (lsm, vlog int64) {
	if err := s.enter("size"); err != nil {
		return 0, 0
	}
	defer s.life.RUnlock()
	return s.db.Size()
}

// headerRoom is what MaxBodyBytes leaves for a record's other fields (status,
// headers, fingerprint, owner) within the value size limit.
const headerRoom = 64 << 10

// MaxBodyBytes is the largest response body a record can hold: a larger answer
// cannot be stored (Complete returns store.ErrTooLarge), so callers cap what they
// accept from the upstream below it.
func (s *Store) MaxBodyBytes() int64 { return int64(s.maxValue) - headerRoom }

// leaveOpen ends the store without closing Badger, on a disk below the
// reserve. Badger's Close flushes the memtable into a new table written
// through mmap, and a full file system turns that into SIGBUS: the process
// dies mid-shutdown, and a restart policy would find it crashing again.
//
// Skipping the flush loses nothing. With SyncWrites every write the store
// acknowledged was in a WAL that a sync round made durable before the
// acknowledgement (durable.go), and the round below covers anything later.
// The next Open replays the WALs, as it does after a SIGKILL: the state left
// is exactly a kill's, which the crash loop test shows the store recovers
// from. The WAL Badger writes to is preallocated, so nothing here writes into
// a hole. Badger's files and both directory locks stay held until the
// process exits; Badger's compactions may still run meanwhile, which is why
// the caller must exit promptly.
func (s *Store) leaveOpen(free uint64, statErr error) error {
	err := s.syncFiles(0) // nothing is read after this round
	s.wals.close()
	if err != nil {
		return fmt.Errorf("cache: close: left Badger open on a full disk; final WAL sync: %w", err)
	}
	why := []any{"free_bytes", free, "reserve_bytes", s.minFree}
	if statErr != nil {
		why = []any{"err", statErr}
	}
	s.log.Warn("store left without flushing Badger's memtable: the disk is below its free-space reserve; "+
		"the write-ahead log holds every write and the next start replays it", append(why, "dir", s.dir)...)
	return nil
}

// checkReplaySpace refuses to open a directory whose WALs Badger could not
// flush for lack of space. Badger replays the WALs a kill (or leaveOpen) left
// and writes them to L0 tables at once, through memory maps: on a full disk
// that is SIGBUS during Open, and a restart policy would crash again and
// again. Each flush needs at most its WAL's size (twice the memtable), and
// the new WAL as much again. A clear error instead names the cause; nothing
// is lost meanwhile, and the store opens once there is space.
func checkReplaySpace(dir string, memTableSize int64) error {
	wals, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil || len(wals) == 0 {
		return err
	}
	need := uint64(len(wals)+1) * 2 * uint64(memTableSize)
	free, err := freeBytes(dir)
	if err != nil {
		return err
	}
	if free < need {
		return fmt.Errorf("%w: %d bytes free, and replaying the %d write-ahead logs of the last run needs up to %d; "+
			"free space, then start again (the stored records are kept)", store.ErrNoSpace, free, len(wals), need)
	}
	return nil
}
