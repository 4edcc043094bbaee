package cache

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4/fb"

	"github.com/idemproxy/idemproxy/store"
)

// A SIGKILL during a flush or a compaction leaves table files the MANIFEST
// does not name: empty, or cut short. Badger deletes them at open; the store
// must open as Badger would, with every record intact, instead of refusing
// the directory as damaged.
func TestOpenIgnoresOrphanTables(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	s := openStore(t, dir, newClock(), 0)
	const n = 50
	for i := range n {
		id := store.ID{Key: fmt.Sprint(i)}
		mustBegin(t, s, id, fpA, "o")
		mustComplete(t, s, id, "o")
	}
	if err := s.Close(); err != nil { // flushes the memtable to a table
		t.Fatal(err)
	}
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	if len(tables) == 0 {
		t.Fatal("Close wrote no table")
	}
	whole, err := os.ReadFile(tables[0])
	if err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "000900.sst")
	truncated := filepath.Join(dir, "000901.sst")
	writeFile(t, empty, nil)
	writeFile(t, truncated, whole[:len(whole)/2])

	s, err = Open(Options{Dir: dir, SyncWrites: true, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("Open with orphan tables: %v", err)
	}
	defer s.Close()
	for i := range n {
		rec, err := s.Get(ctx, store.ID{Key: fmt.Sprint(i)})
		if err != nil || rec.State != store.Final || string(rec.Response.Body) != string(okRes.Body) {
			t.Fatalf("record %d after reopen = %+v, %v; want the final answer", i, rec, err)
		}
	}
	for _, f := range []string{empty, truncated} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("orphan %s still on disk (stat: %v); Badger should have removed it", f, err)
		}
	}
}

// A table the MANIFEST names is still checked: damage there is refused with
// an error naming the file, not a crash inside Badger.
func TestOpenRefusesDamagedReferencedTable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	s := openStore(t, dir, newClock(), 0)
	mustBegin(t, s, store.ID{Key: "k"}, fpA, "o")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ids, ok := manifestTables(readManifest(dir, badgerOptions(withDefaults(Options{Dir: dir}))))
	if !ok || len(ids) == 0 {
		t.Fatalf("manifestTables = %v, %v; want the flushed table", ids, ok)
	}
	path := filepath.Join(dir, fmt.Sprintf("%06d.sst", ids[0]))
	writeFile(t, path, nil)
	s, err := Open(Options{Dir: dir})
	if err == nil {
		s.Close()
		t.Fatal("Open with an empty referenced table succeeded")
	}
	if want := fmt.Sprintf("table %s is damaged", path); !strings.Contains(err.Error(), want) {
		t.Fatalf("Open error %q, want it to say %q", err, want)
	}
}

// A kill between the creation of a write-ahead or value-log file and its
// sizing leaves it empty; Badger alone refuses such a directory. The store
// removes the empty files (they hold nothing) and opens with every record.
func TestOpenRemovesEmptyLogFiles(t *testing.T) {
	for _, name := range []string{"00105.mem", "000007.vlog"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "db")
			s := openStore(t, dir, newClock(), 0)
			for i := range 20 {
				id := store.ID{Key: fmt.Sprint(i)}
				mustBegin(t, s, id, fpA, "o")
				mustComplete(t, s, id, "o")
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(dir, name), nil)
			s, err := Open(Options{Dir: dir, SyncWrites: true, MinFreeBytes: -1})
			if err != nil {
				t.Fatalf("Open with an empty %s: %v", name, err)
			}
			defer s.Close()
			for i := range 20 {
				rec, err := s.Get(ctx, store.ID{Key: fmt.Sprint(i)})
				if err != nil || rec.State != store.Final {
					t.Fatalf("record %d after reopen = %+v, %v; want final", i, rec, err)
				}
			}
		})
	}
}

// Garbage inside a data block of a table (not its index, which the footer
// check covers): Badger reads no block checksum by default and parses the
// garbage, so a key whose bytes were hit is "not found" (the audit: 19 of
// 3,336 stored orders sent upstream again) or its record does not decode;
// with Badger's OnBlockRead every key of the block is "not found" and a
// compaction drops the rest of the table. The start must refuse the
// directory, naming the table and the block, and keep every file: with the
// block repaired (from a backup) every record is there.
func TestOpenRefusesDamagedDataBlock(t *testing.T) {
	for _, c := range []struct {
		name string
		at   func(off, n int64) (int64, int) // where in the block, how many bytes
	}{
		{"first key", func(off, _ int64) (int64, int) { return off + 4, 16 }}, // past the entry header: the block's base key
		{"mid block", func(off, n int64) (int64, int) { return off + n/2, 64 }},
		{"trailer", func(off, n int64) (int64, int) { return off + n - 8, 8 }}, // checksum and its length
		{"one byte", func(off, n int64) (int64, int) { return off + n/3, 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "db")
			const n = 500
			tables := closedStore(t, dir, n)
			if len(tables) != 1 {
				t.Fatalf("tables = %v, want one", tables)
			}
			path := tables[0]
			whole, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			off, size := blockAt(t, path, 1)
			at, k := c.at(off, size)
			damaged := slices.Clone(whole)
			for i := range k {
				damaged[at+int64(i)] ^= 0xa5
			}
			writeFile(t, path, damaged)

			s, err := Open(Options{Dir: dir, MinFreeBytes: -1})
			if err == nil {
				lost, bad := 0, 0
				for i := range n {
					_, err := s.Get(ctx, store.ID{Key: fmt.Sprint(i)})
					switch {
					case errors.Is(err, store.ErrNotFound):
						lost++
					case err != nil:
						bad++
					}
				}
				s.Close()
				t.Fatalf("Open with a damaged data block succeeded; Get then said %d of %d stored records were not found "+
					"(each would be sent upstream again) and failed on %d", lost, n, bad)
			}
			for _, want := range []string{"table " + path + " is damaged", fmt.Sprintf("block 1 at offset %d", off)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Open error %q does not say %q", err, want)
				}
			}
			if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, damaged) {
				t.Fatalf("the refused start changed or removed %s (%v)", path, err)
			}

			writeFile(t, path, whole) // repaired
			s, err = Open(Options{Dir: dir, MinFreeBytes: -1})
			if err != nil {
				t.Fatalf("Open after the repair: %v", err)
			}
			defer s.Close()
			for i := range n {
				rec, err := s.Get(ctx, store.ID{Key: fmt.Sprint(i)})
				if err != nil || rec.State != store.Final || string(rec.Response.Body) != string(okRes.Body) {
					t.Fatalf("record %d after the repair = %+v, %v; want the final answer", i, rec, err)
				}
			}
		})
	}
}

// blockAt returns the offset and length of block i of the table at path,
// from its verified index.
func blockAt(t *testing.T, path string, i int) (off, n int64) {
	t.Helper()
	index, _, err := readIndex(path)
	if err != nil {
		t.Fatal(err)
	}
	ti := fb.GetRootAsTableIndex(index, 0)
	var bo fb.BlockOffset
	if !ti.Offsets(&bo, i) {
		t.Fatalf("%s has %d blocks, no block %d", path, ti.OffsetsLength(), i)
	}
	return int64(bo.Offset()), int64(bo.Len())
}
