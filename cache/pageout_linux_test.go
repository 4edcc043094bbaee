package cache

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestPageOutTrigger: a pass is due after the period, or as soon as the
// file-backed resident size has grown by the threshold over its lowest since
// the last pass.
func TestPageOutTrigger(t *testing.T) {
	const mib = 1 << 20
	t0 := time.Unix(1_000_000, 0)
	for _, c := range []struct {
		name      string
		growth    int64
		residents []int64 // checked 50 ms apart after a pass and a first check of 10 MiB
		want      bool    // whether the last check is due
	}{
		{"no growth", 16 * mib, []int64{10 * mib, 12 * mib}, false},
		{"growth below", 16 * mib, []int64{20 * mib, 25 * mib}, false},
		{"growth reached", 16 * mib, []int64{20 * mib, 26 * mib}, true},
		{"growth over the lowest since the pass", 16 * mib, []int64{4 * mib, 20 * mib}, true},
		{"growth off", -1, []int64{100 * mib, 900 * mib}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := newPageOutTrigger(time.Second, c.growth, t0)
			tr.ran(t0)
			if tr.due(t0.Add(pageOutCheck), 10*mib) {
				t.Fatal("due at the first check after a pass")
			}
			var due bool
			for i, r := range c.residents {
				due = tr.due(t0.Add(time.Duration(i+2)*pageOutCheck), r)
			}
			if due != c.want {
				t.Errorf("due = %v, want %v", due, c.want)
			}
			if !tr.due(t0.Add(time.Second), 0) {
				t.Error("not due after the period")
			}
		})
	}
}

// TestPageOutOnGrowth: with a period of an hour, a table file mapped and
// read by the process (32 MiB resident) is paged out by the growth trigger.
// The test makes the loop's checks itself (pageOutIfDue), one before the
// table is read and one after: a check of the running loop could fall in
// the middle of the reading, and a pass there leaves the rest of the growth
// to the next one (the lowest size is taken afresh after a pass), which on a
// loaded machine made the test fail with most of the table still resident.
func TestPageOutOnGrowth(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, PageOutInterval: -1, MinFreeBytes: -1}) // no loop: the test checks
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.pageOutTables(); errors.Is(err, errors.ErrUnsupported) {
		t.Skip("kernel without MADV_PAGEOUT")
	}
	s.pageOut = newPageOutTrigger(time.Hour, 8<<20, time.Now())
	defer s.statm.close()
	if err := s.pageOutIfDue(time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := s.PageOuts(); n != 0 {
		t.Fatalf("%d page-out passes before any growth, want none", n)
	}

	// A table file of Badger's naming in the store's directory, on disk
	// (clean pages), mapped shared as Badger maps its tables.
	const size = 32 << 20
	path := filepath.Join(dir, "999999.sst")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte(strings.Repeat("t", size))); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(data)
	addr := uintptr(unsafe.Pointer(&data[0]))
	var sum byte
	for i := 0; i < size; i += os.Getpagesize() {
		sum += data[i]
	}
	if sum == 0 && data[0] != 't' {
		t.Fatal("read nothing")
	}
	if rss := mappingRSS(t, addr); rss < size/2 {
		t.Fatalf("the read table has only %d KiB resident; the test needs it resident", rss>>10)
	}

	if err := s.pageOutIfDue(time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := s.PageOuts(); n != 1 {
		t.Fatalf("%d page-out passes after 32 MiB of growth, want 1", n)
	}
	if rss := mappingRSS(t, addr); rss >= size/8 {
		t.Fatalf("mapped table still has %d KiB resident after the page-out pass", rss>>10)
	}
}

// mappingRSS is the Rss of the mapping of this process that starts at addr
// (/proc/self/smaps).
func mappingRSS(t *testing.T, addr uintptr) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prefix := fmt.Sprintf("%x-", addr)
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, prefix) {
			found = true
		}
		if kb, ok := strings.CutPrefix(line, "Rss:"); found && ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(kb, "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n << 10
		}
	}
	t.Fatalf("no mapping at %x in /proc/self/smaps (%v)", addr, sc.Err())
	return 0
}

// BenchmarkFileResident is the cost of one growth check (the page-out loop
// makes 20 a second) on the file the loop keeps open.
func BenchmarkFileResident(b *testing.B) {
	var r statm
	defer r.close()
	for b.Loop() {
		if _, err := r.fileResident(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStatmRereads: a read of the open /proc/self/statm from offset 0 sees
// the file-backed resident size of now, not of the first read: it grows by
// a table file's size when the process maps and reads the file.
func TestStatmRereads(t *testing.T) {
	var r statm
	defer r.close()
	before, err := r.fileResident()
	if err != nil {
		t.Fatal(err)
	}
	const size = 32 << 20
	f, err := os.Create(filepath.Join(t.TempDir(), "1.sst"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte(strings.Repeat("t", size))); err != nil {
		t.Fatal(err)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(data)
	var sum byte
	for i := 0; i < size; i += os.Getpagesize() {
		sum += data[i]
	}
	if sum == 0 && data[0] != 't' {
		t.Fatal("read nothing")
	}
	after, err := r.fileResident()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < size/2 {
		t.Errorf("file-backed resident %d KiB after mapping and reading %d KiB, %d KiB before", after>>10, size>>10, before>>10)
	}
}

// TestPageOutGrowthOffReadsNoStatm: with the growth trigger off only the
// period decides, so neither a check nor a pass opens /proc/self/statm;
// with it on, a check does.
func TestPageOutGrowthOffReadsNoStatm(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), PageOutInterval: -1, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t0 := time.Unix(1_000_000, 0)
	s.pageOut = newPageOutTrigger(time.Second, -1, t0)
	for _, now := range []time.Time{t0.Add(pageOutCheck), t0.Add(time.Second), t0.Add(time.Second + pageOutCheck)} {
		if err := s.pageOutIfDue(now); errors.Is(err, errors.ErrUnsupported) {
			t.Skip("kernel without MADV_PAGEOUT")
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if s.PageOuts() != 1 {
		t.Errorf("%d passes with growth off after one period, want 1", s.PageOuts())
	}
	if s.statm.f != nil {
		t.Error("growth off, yet /proc/self/statm was opened")
	}

	s.pageOut = newPageOutTrigger(time.Second, 16<<20, t0)
	if err := s.pageOutIfDue(t0.Add(pageOutCheck)); err != nil {
		t.Fatal(err)
	}
	if s.statm.f == nil {
		t.Error("growth on, yet a check did not open /proc/self/statm")
	}
	s.statm.close()
}

// TestPageOutStopsOnlyWhenUnsupported: a kernel without MADV_PAGEOUT ends
// the page-out loop; running out of file descriptors for /proc (as a busy
// proxy at its open-files limit can) does not, the next tick tries again.
func TestPageOutStopsOnlyWhenUnsupported(t *testing.T) {
	emfile := &os.PathError{Op: "open", Path: "/proc/self/statm", Err: syscall.EMFILE}
	if pageOutStops(emfile) {
		t.Errorf("pageOutStops(%v) = true; a transient failure must not end page-out", emfile)
	}
	if !pageOutStops(errors.ErrUnsupported) {
		t.Errorf("pageOutStops(ErrUnsupported) = false; want the loop to stop")
	}
}
