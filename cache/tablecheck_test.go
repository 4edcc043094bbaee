package cache

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
