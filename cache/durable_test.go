package cache

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// writerEnv makes the test binary act as a writer process that
// TestRecordsSurviveSIGKILL kills.
const writerEnv = "IDEMPROXY_CACHE_TEST_WRITER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(writerEnv); dir != "" {
		runWriter(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runWriter writes records from 8 goroutines until killed, printing
// "done <key>" once Complete has returned nil. A 1 MiB memtable makes WALs
// rotate while it runs.
func runWriter(dir string) {
	s, err := Open(Options{Dir: dir, SyncWrites: true, MemTableSize: 1 << 20, MinFreeBytes: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var mu sync.Mutex
	body := []byte(strings.Repeat("x", 1000))
	for w := range 8 {
		go func() {
			for i := 0; ; i++ {
				id := store.ID{Tenant: "crash", Key: fmt.Sprintf("%d-%d", w, i)}
				if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "writer", time.Minute); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(3)
				}
				if err := s.Complete(ctx, id, "writer", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(3)
				}
				mu.Lock()
				fmt.Fprintf(os.Stdout, "done %s\n", id.Key)
				mu.Unlock()
			}
		}()
	}
	select {}
}

// killWriter runs a writer process (runWriter) on dir, SIGKILLs it once it
// has acknowledged n records and returns the keys of those it acknowledged.
func killWriter(t *testing.T, dir string, n int) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), writerEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var done []string
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		done = append(done, strings.TrimPrefix(lines.Text(), "done "))
		if len(done) == n {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("writer ended with %v after %d records, want killed by SIGKILL", err, len(done))
	}
	return done
}

// TestRecordsSurviveSIGKILL kills a writing process and checks that every
// record it acknowledged is there after reopening. SIGKILL keeps the page
// cache, so this checks recovery from an unclosed directory (WAL replay,
// rotated WALs), not fsync itself; docs/design/durability.md argues the
// power-loss case.
func TestRecordsSurviveSIGKILL(t *testing.T) {
	dir := t.TempDir()
	done := killWriter(t, dir, 1500)

	// Reopened with the writer's memtable size, as the store always is: a
	// WAL shorter than the store makes them would be taken for one cut short.
	s, err := Open(Options{Dir: dir, SyncWrites: true, MemTableSize: 1 << 20, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	if _, err := s.ReleaseInFlight(); err != nil {
		t.Fatalf("ReleaseInFlight: %v", err)
	}
	for _, key := range done {
		rec, err := s.Get(ctx, store.ID{Tenant: "crash", Key: key})
		if err != nil || rec.State != store.Final || len(rec.Response.Body) != 1000 {
			t.Fatalf("acknowledged record %s after SIGKILL = %v %v; want final (%d acknowledged)", key, rec.State, err, len(done))
		}
	}
	t.Logf("%d acknowledged records all present after SIGKILL", len(done))
}

// TestWriteFailsWhenSyncFails: a write whose sync fails is reported with the
// operation's name, never as success.
func TestWriteFailsWhenSyncFails(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	id := store.ID{Key: "k"}
	mustBegin(t, s, id, fpA, "o")
	eio := errors.New("fsync: input/output error")
	s.group.sync = func(uint64) error { return eio }

	calls := map[string]error{
		"cache: begin": func() error {
			_, _, err := s.Begin(ctx, store.ID{Key: "other"}, store.Request{Fingerprint: fpA}, "o", time.Minute)
			return err
		}(),
		"cache: complete": s.Complete(ctx, id, "o", okRes, time.Time{}),
		"cache: ping":     s.Ping(ctx),
	}
	for prefix, err := range calls {
		if !errors.Is(err, eio) || !strings.HasPrefix(err.Error(), prefix) {
			t.Errorf("got %v, want %q wrapping the fsync error", err, prefix)
		}
	}
}

// TestReadsWaitForSync: a record is returned only once synced, so a client
// never sees a response that a crash could take back.
func TestReadsWaitForSync(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	id := store.ID{Key: "k"}
	mustBegin(t, s, id, fpA, "o")
	mustComplete(t, s, id, "o")
	var version uint64
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(appendRecordKey(nil, id))
		if err == nil {
			version = item.Version()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if synced := s.syncedTs.Load(); synced < version {
		t.Fatalf("Complete returned with syncedTs %d below its commit %d", synced, version)
	}

	// Pretend the commit is not synced yet: Get must sync before answering.
	s.syncedTs.Store(0)
	eio := errors.New("fsync: input/output error")
	s.group.sync = func(uint64) error { return eio }
	if _, err := s.Get(ctx, id); !errors.Is(err, eio) {
		t.Fatalf("Get of an unsynced record = %v, want the sync error", err)
	}
	if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o2", time.Minute); !errors.Is(err, eio) {
		t.Fatalf("Begin returning an unsynced record = %v, want the sync error", err)
	}
}

// TestWALRotation: with a 1 MiB memtable the WAL rotates many times; every
// round must sync all WALs present and the directory once per new one.
func TestWALRotation(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, MemTableSize: 1 << 20, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	body := []byte(strings.Repeat("y", 4000))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := range 100 {
				id := store.ID{Key: fmt.Sprintf("%d-%d", w, i)}
				if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o", time.Minute); err != nil {
					errs <- err
					return
				}
				if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	wals, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	slices.Sort(wals)
	if len(wals) == 0 {
		t.Fatal("no WAL in the directory")
	}
	if newest := filepath.Base(wals[len(wals)-1]); newest <= "00001.mem" {
		t.Fatalf("3 MiB written through a 1 MiB memtable but the WAL never rotated (newest %s)", newest)
	}
	// One more round, then the tracked set must be exactly the WALs on disk
	// that existed when it ran (a WAL flushed since may still be tracked).
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	var tracked []string
	for _, f := range s.wals.live {
		tracked = append(tracked, f.path)
	}
	now, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	for _, w := range now {
		if !slices.Contains(tracked, w) {
			t.Fatalf("WAL %s on disk is not tracked (tracked %v)", w, tracked)
		}
	}
	if s.wals.dirDirty {
		t.Fatal("directory not fsynced after the last new WAL")
	}
}

// TestWALMissedFallsBackToListing: if a WAL number is skipped, the round that
// sees the newest tracked WAL gone lists the directory and syncs the new one.
func TestWALMissedFallsBackToListing(t *testing.T) {
	dir := t.TempDir()
	w := walSet{dir: dir}
	defer w.close()
	write := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("00003.mem")
	write("00003.sst")
	if err := w.load(); err != nil {
		t.Fatal(err)
	}
	if err := w.sync(); err != nil {
		t.Fatal(err)
	}
	if len(w.live) != 1 || w.next != 4 {
		t.Fatalf("after load: live %v next %d, want [00003.mem] and 4", w.live, w.next)
	}
	write("00004.mem") // the next number: found by the probe
	if err := w.sync(); err != nil || len(w.live) != 2 {
		t.Fatalf("probe: live %v, %v", w.live, err)
	}
	write("00009.mem") // a skipped number, then the older ones flushed
	os.Remove(filepath.Join(dir, "00003.mem"))
	os.Remove(filepath.Join(dir, "00004.mem"))
	if err := w.sync(); err != nil {
		t.Fatal(err)
	}
	if len(w.live) != 1 || filepath.Base(w.live[0].path) != "00009.mem" || w.next != 10 || w.dirDirty {
		t.Fatalf("after fallback: live %v next %d dirDirty %v, want [00009.mem] 10 false", w.live, w.next, w.dirDirty)
	}
}

// TestNoSpace: writes are refused with store.ErrNoSpace before the disk is full,
// because Badger's mmapped writes turn a full disk into SIGBUS.
func TestNoSpace(t *testing.T) {
	t.Run("reserve above free space", func(t *testing.T) {
		s, err := Open(Options{Dir: t.TempDir(), SyncWrites: true, MinFreeBytes: math.MaxInt64})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		assertNoSpace(t, s)
	})
	t.Run("tmpfs fills up", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "mnt")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=160m"); err != nil {
			// Not root or no CAP_SYS_ADMIN: check the guard on the real
			// file system with a reserve just above its free space.
			free, ferr := freeBytes(dir)
			if ferr != nil {
				t.Fatal(ferr)
			}
			t.Logf("tmpfs unavailable (%v); reserve set above the %d free bytes instead", err, free)
			s, err := Open(Options{Dir: dir, MinFreeBytes: int64(free) + 1<<30})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			assertNoSpace(t, s)
			return
		}
		t.Cleanup(func() { syscall.Unmount(dir, 0) })
		// The default reserve for 1 MiB memtables is 50 MiB. Badger's
		// compactions keep running after the last write and during Close;
		// a reserve too small for them crashes the test with SIGBUS.
		s, err := Open(Options{Dir: dir, MemTableSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		body := make([]byte, 16<<10)
		rand.Read(body) // incompressible, so the disk fills quickly
		var i int
		for i = 0; i < 200_000; i++ {
			id := store.ID{Key: fmt.Sprint(i)}
			_, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o", time.Minute)
			if err == nil {
				err = s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{})
			}
			if errors.Is(err, store.ErrNoSpace) {
				break
			}
			if err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
		}
		if i == 0 || i == 200_000 {
			t.Fatalf("store.ErrNoSpace after %d records, want after some but before 200000", i)
		}
		t.Logf("refused after %d records", i)
		// What Badger does after the refusal (a flushed memtable's WAL
		// deleted, compacted tables replacing larger ones) may lift the
		// disk back over the reserve, and the store then rightly accepts
		// the next write. So the next Begin must be refused unless the
		// disk was over the reserve around it. (Filling the reserve from
		// outside to keep the disk below it is no test: the compactions
		// the reserve is kept for then fault with SIGBUS on the tmpfs.)
		before, err := freeBytes(dir)
		if err != nil {
			t.Fatal(err)
		}
		after := store.ID{Key: "after the refusal"}
		_, _, err = s.Begin(ctx, after, store.Request{Fingerprint: fpA}, "o", time.Minute)
		freeAfter, ferr := freeBytes(dir)
		if ferr != nil {
			t.Fatal(ferr)
		}
		switch {
		case errors.Is(err, store.ErrNoSpace):
			if !strings.HasPrefix(err.Error(), "cache: begin: ") {
				t.Errorf("Begin = %v, want cache: begin: ... store.ErrNoSpace", err)
			}
			if _, err := s.Get(ctx, after); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Get after a refused Begin = %v, want store.ErrNotFound", err)
			}
		case err == nil && max(before, freeAfter) >= s.minFree:
			t.Logf("Begin accepted after Badger freed space: %d, then %d bytes free, reserve %d", before, freeAfter, s.minFree)
		default:
			t.Fatalf("Begin after the refusal = %v with %d, then %d bytes free; want store.ErrNoSpace below the reserve of %d", err, before, freeAfter, s.minFree)
		}
		if _, err := s.Get(ctx, store.ID{Key: "0"}); err != nil {
			t.Fatalf("Get on a full disk: %v", err)
		}
	})
}

func assertNoSpace(t *testing.T, s *Store) {
	t.Helper()
	_, _, err := s.Begin(ctx, store.ID{Key: "refused"}, store.Request{Fingerprint: fpA}, "o", time.Minute)
	if !errors.Is(err, store.ErrNoSpace) || !strings.HasPrefix(err.Error(), "cache: begin: ") {
		t.Fatalf("Begin = %v, want cache: begin: ... store.ErrNoSpace", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrNoSpace) {
		t.Fatalf("Ping = %v, want store.ErrNoSpace", err)
	}
	if _, err := s.Get(ctx, store.ID{Key: "refused"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after a refused Begin = %v, want store.ErrNotFound", err)
	}
}

// TestNoSpaceStillReplays: on a nearly full disk a repeat still gets its
// stored response, and an owner can still abandon.
func TestNoSpaceStillReplays(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := openStore(t, dir, c, 0)
	final, inflight := store.ID{Key: "final"}, store.ID{Key: "in-flight"}
	mustBegin(t, s, final, fpA, "o")
	mustComplete(t, s, final, "o")
	mustBegin(t, s, inflight, fpA, "o")
	s.minFree = math.MaxUint64

	rec, created, err := s.Begin(ctx, final, store.Request{Fingerprint: fpA}, "o2", time.Minute)
	if err != nil || created || rec.State != store.Final {
		t.Fatalf("Begin on a stored final record with a full disk = %v created %v, %v; want the replay", rec.State, created, err)
	}
	if err := s.Complete(ctx, inflight, "o", okRes, time.Time{}); !errors.Is(err, store.ErrNoSpace) {
		t.Fatalf("Complete with a full disk = %v, want store.ErrNoSpace", err)
	}
	if err := s.Abandon(ctx, inflight, "o"); err != nil {
		t.Fatalf("Abandon with a full disk: %v", err)
	}
}

// TestWALPreallocated: the WAL Badger writes to has all its blocks, from Open
// and after each new WAL, so that a write through Badger's mapping never
// needs a block from a file system another writer may have filled (a SIGBUS
// there, not an error).
func TestWALPreallocated(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("WALs are preallocated on Linux only")
	}
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, MemTableSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkNewest := func(when string) {
		t.Helper()
		wals, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
		slices.Sort(wals)
		if len(wals) == 0 {
			t.Fatalf("%s: no WAL in %s", when, dir)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(wals[len(wals)-1], &st); err != nil {
			t.Fatal(err)
		}
		if st.Blocks*512 < st.Size {
			t.Fatalf("%s: %s has %d of its %d bytes allocated, want all", when, wals[len(wals)-1], st.Blocks*512, st.Size)
		}
	}
	checkNewest("after Open")
	body := make([]byte, 64<<10)
	for i := range 64 { // 4 MiB through 1 MiB memtables: several new WALs
		id := store.ID{Key: fmt.Sprint(i)}
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	checkNewest("after the memtable was flushed")
}

// TestHeadroomBounded: between two looks at the disk the store accepts at
// most an eighth of a memtable of records, and a tick makes the next write
// look again, so a disk another writer filled is seen before a memtable flush
// (which would fault) and after a quiet spell.
func TestHeadroomBounded(t *testing.T) {
	const memTable = 1 << 20
	s, err := Open(Options{Dir: t.TempDir(), SyncWrites: true, MemTableSize: memTable, MinFreeBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	free, err := freeBytes(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if (free-1)/spareShare <= memTable/8 {
		t.Skipf("only %d bytes free: the cap would not show", free)
	}
	mustBegin(t, s, store.ID{Key: "a"}, fpA, "o")
	if h := s.headroom.Load(); h <= 0 || h > memTable/8 {
		t.Fatalf("headroom after a look at %d free bytes = %d, want within (0, %d]", free, h, memTable/8)
	}
	s.spaceTick()
	if h := s.headroom.Load(); h != 0 {
		t.Fatalf("headroom after a tick = %d, want 0", h)
	}
}

// TestReplaySpace: a directory whose WALs Badger could not flush for lack of
// space is refused with store.ErrNoSpace, not opened into a SIGBUS.
func TestReplaySpace(t *testing.T) {
	dir := t.TempDir()
	free, err := freeBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	huge := int64(min(free, math.MaxInt64/8)) // one flush alone would not fit
	if err := checkReplaySpace(dir, huge); err != nil {
		t.Fatalf("no WAL to replay: %v, want nil", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "00001.mem"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkReplaySpace(dir, huge); !errors.Is(err, store.ErrNoSpace) {
		t.Fatalf("a WAL to replay without the space to flush it: %v, want store.ErrNoSpace", err)
	}
	if err := checkReplaySpace(dir, 1<<20); err != nil && free > 8<<20 {
		t.Fatalf("a WAL to replay with %d bytes free: %v, want nil", free, err)
	}
}

// TestFlushedWALsClosedWhileIdle: a WAL Badger deletes after its flush while
// no sync round runs (an idle store dropping its expired records) is closed
// by dropFlushed, so its blocks go back to the file system; a later write
// still syncs.
func TestFlushedWALsClosedWhileIdle(t *testing.T) {
	defer func(d time.Duration) { walCheckInterval = d }(walCheckInterval)
	walCheckInterval = time.Hour // dropFlushed is called below, not by the store's loop
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 10 {
		mustBegin(t, s, store.ID{Key: fmt.Sprint(i)}, fpA, "o")
	}
	deletedOpen := func() []string {
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
			if err == nil && strings.HasPrefix(target, dir) && strings.HasSuffix(target, ".mem (deleted)") {
				out = append(out, target)
			}
		}
		return out
	}
	// What reclaimExpired does on an idle store: Badger flushes the
	// memtable and deletes the WAL the last round opened.
	if err := s.db.DropPrefix([]byte(recordPrefix)); err != nil {
		t.Fatal(err)
	}
	if len(deletedOpen()) == 0 {
		t.Fatal("no deleted WAL held open after DropPrefix: nothing to test")
	}
	s.wals.dropFlushed()
	if held := deletedOpen(); len(held) > 0 {
		t.Fatalf("deleted WALs still open after dropFlushed: %v", held)
	}
	id := store.ID{Key: "after"}
	mustBegin(t, s, id, fpA, "o")
	if err := s.Complete(ctx, id, "o", store.Response{Status: 200}, time.Time{}); err != nil {
		t.Fatal(err)
	}
}
