package cache

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// heldName is the file in which the store notes the newest write-ahead log
// (*.mem) it has synced holding a whole entry: "<fid> <header in hex>\n",
// the header being the log's first walHeaderSize bytes (key id and a random
// IV, so it tells that log from a later one given the same number).
//
// Without it nothing tells a log that lost its entries from a fresh one. A
// log zeroed, or zeroed after its header (what a file system that lost the
// log's blocks, or a copy that stopped short, leaves), looks exactly like
// what a SIGKILL leaves when it comes between Badger's sizing a new log and
// writing its header, or before the log's first write: Badger starts as if
// the log had never held anything, and every answer in it is gone without a
// word, each order sent to the provider again (measured with the binary: 0
// of 100 acknowledged answers replayed in both cases, the start logging
// nothing).
//
// A SIGKILL can leave such a log only as the newest, before it held an entry:
// Badger creates a log only after the previous one is sized and written, and
// the store notes a log only once an entry of it is synced. So at start
// (checkHeldWALs) the noted log, and every older one still there, must hold a
// whole entry; one that does not is refused, naming it.
//
// A log of 0 bytes is not refused: it is also what a SIGKILL leaves in the
// middle of Badger's deleting a log whose entries are in a table already
// (ristretto's MmapFile.Delete truncates the file to 0 before it removes
// it), for any log, the noted one included, so it tells nothing.
const heldName = "idemproxy.wal"

// heldWAL is what heldName says: fid 0 when there is nothing noted.
type heldWAL struct {
	fid    int
	header [walHeaderSize]byte
}

// readHeld reads dir's note; a missing note, or one this version cannot
// parse (written by no version of the store), is no note.
func readHeld(dir string) (heldWAL, error) {
	b, err := os.ReadFile(filepath.Join(dir, heldName))
	if errors.Is(err, fs.ErrNotExist) {
		return heldWAL{}, nil
	}
	if err != nil {
		return heldWAL{}, err
	}
	num, hx, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	fid, err := strconv.Atoi(num)
	header, herr := hex.DecodeString(hx)
	if !ok || err != nil || fid <= 0 || herr != nil || len(header) != walHeaderSize {
		return heldWAL{}, nil
	}
	var h heldWAL
	h.fid = fid
	copy(h.header[:], header)
	return h, nil
}

// writeHeld notes h durably: a new file, synced, renamed over the note and
// the directory synced.
func writeHeld(dir string, h heldWAL) error {
	tmp := filepath.Join(dir, "."+heldName+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%d %x\n", h.fid, h.header)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, heldName))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return fsyncDir(dir)
}

// checkHeldWALs refuses the directory when the log its note names, or an
// older one, no longer holds a whole entry (see heldName). It runs before
// any other start check changes a file. When the noted log is gone (Badger
// flushed it to a table and deleted it), the note is removed, durably,
// before Badger opens: Badger may then give a new log that number.
func checkHeldWALs(dir string) error {
	h, err := readHeld(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", filepath.Join(dir, heldName), err)
	}
	if h.fid == 0 {
		return nil
	}
	noted := filepath.Join(dir, walName(h.fid))
	header, n, err := readHeader(noted)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.Remove(filepath.Join(dir, heldName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return fsyncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("read write-ahead log %s: %w", noted, err)
	}
	if n == walHeaderSize && header != h.header && !allZero(header[:]) {
		// Another log with the number (a version that keeps no note ran
		// since): the note says nothing about it.
		return nil
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		return err
	}
	for _, path := range paths {
		fid, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(path), ".mem"))
		if err != nil || fid > h.fid {
			continue
		}
		whole, size, err := holdsEntry(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read write-ahead log %s: %w", path, err)
		}
		if size == 0 {
			continue // a deleted log's state too (see heldName)
		}
		if !whole {
			what := "holds no entry"
			if fid == h.fid && allZero(header[:]) {
				what = "lost its header and every entry (zeroed)"
			}
			return fmt.Errorf("write-ahead log %s is damaged: it %s, but it held synced records when the store "+
				"last ran (%s names it); the store is not opened, so that none of its records is lost or sent "+
				"again, and nothing in the directory was changed: restore the directory from a backup",
				path, what, heldName)
		}
	}
	return nil
}

// readHeader returns the first walHeaderSize bytes of the log at path and
// how many of them it has.
func readHeader(path string) (h [walHeaderSize]byte, n int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return h, 0, err
	}
	defer f.Close()
	n, err = io.ReadFull(f, h[:])
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	return h, n, err
}

// holdsEntry says whether the log at path holds a whole entry that Badger's
// replay keeps, and its size.
func holdsEntry(path string) (whole bool, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return false, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, 0, err
	}
	whole, err = hasEntry(f, fi.Size())
	return whole, fi.Size(), err
}

// hasEntry says whether the log f of size bytes starts with a whole entry
// (or transaction) that Badger's replay keeps. It reads 64 KiB, and the
// whole log only when an entry may run past that.
func hasEntry(f io.ReaderAt, size int64) (bool, error) {
	n := min(size, 64<<10)
	for {
		b := make([]byte, n)
		if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
			return false, err
		}
		if walEnd(b) > walHeaderSize {
			return true, nil
		}
		if n == size || allZero(b[min(len(b), walHeaderSize):]) {
			return false, nil
		}
		n = size
	}
}
