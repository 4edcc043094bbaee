package cache

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// madvPageout is MADV_PAGEOUT (Linux 5.4): reclaim the pages of a range.
// Unlike MADV_DONTNEED it never discards anonymous memory, so a range that
// Badger unmapped and something else mapped since /proc/self/maps was read
// comes to no harm.
const madvPageout = 21

// pageOutTables reclaims the resident pages of the store's table files and
// memtable WALs that this process maps. Badger writes and reads tables
// through shared mmaps and keeps every table mapped until compaction deletes
// it, so without this the process's resident set grows with the store; each
// WAL is a mapping of twice the memtable size that stays resident as it
// fills (docs/design/memory.md).
// It returns the number of mappings advised.
func (s *Store) pageOutTables() (int, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	dir := []byte(filepath.Clean(s.dir) + "/")
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		line := sc.Bytes()
		i := bytes.IndexByte(line, '/')
		if i < 0 || !bytes.HasPrefix(line[i:], dir) || !bytes.HasSuffix(line, []byte(".sst")) && !bytes.HasSuffix(line, []byte(".mem")) {
			continue
		}
		rng, _, _ := bytes.Cut(line, []byte(" "))
		lo, hi, _ := bytes.Cut(rng, []byte("-"))
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		_, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvPageout)
		if errno == syscall.EINVAL {
			return n, errors.ErrUnsupported // kernel older than 5.4
		}
		n++ // ENOMEM: unmapped since the read; nothing to do
	}
	return n, sc.Err()
}

// statm reads the process's file-backed resident bytes: the third field
// of /proc/self/statm ("shared", RssFile + RssShmem, in pages), which the
// kernel answers from counters, unlike a walk of /proc/self/maps (proc(5)).
// The page-out loop keeps the file open and reads it again from offset 0 at
// each check: statm is a seq_file that a read at offset 0 fills afresh, so
// a check costs a pread (and the one that finds the end), not an open,
// read and close. It belongs to the page-out loop.
type statm struct {
	f   *os.File // nil until open succeeds
	buf [128]byte
}

// open opens /proc/self/statm if it is not open.
func (r *statm) open() error {
	if r.f != nil {
		return nil
	}
	f, err := os.Open("/proc/self/statm")
	if err != nil {
		return err
	}
	r.f = f
	return nil
}

// fileResident returns the file-backed resident bytes now, opening the file
// first if it is not open (an open at the start of the loop can fail at the
// open-files limit).
func (r *statm) fileResident() (int64, error) {
	if err := r.open(); err != nil {
		return 0, err
	}
	n, err := r.f.ReadAt(r.buf[:], 0)
	if err != nil && (err != io.EOF || n == 0) {
		return 0, err
	}
	// size resident shared text lib data dt
	fields := bytes.Fields(r.buf[:n])
	if len(fields) < 3 {
		return 0, fmt.Errorf("cache: /proc/self/statm: %q", r.buf[:n])
	}
	pages, err := strconv.ParseInt(string(fields[2]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cache: /proc/self/statm: %w", err)
	}
	return pages * int64(os.Getpagesize()), nil
}

// close closes the file if open.
func (r *statm) close() {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
}
