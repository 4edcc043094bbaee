package cache

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/store"
)

// killedCopy writes n final records into a store in dir and copies the
// directory while the store is open, to a new directory it returns: the
// state a SIGKILL leaves (the records in the write-ahead log only, synced).
func killedCopy(t *testing.T, n int) (dir, wal string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "db")
	s := openStore(t, src, newClock(), 0)
	for i := range n {
		id := store.ID{Key: fmt.Sprint(i)}
		mustBegin(t, s, id, fpA, "o")
		mustComplete(t, s, id, "o")
	}
	dir = filepath.Join(t.TempDir(), "copy")
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	wals, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	if len(wals) != 1 {
		t.Fatalf("write-ahead logs of the open store: %v, want one", wals)
	}
	return dir, wals[0]
}

// A write-ahead log cut short is refused, naming it, and left as it was;
// one cut where Badger's own replay truncates it (the end of its last whole
// entry: a start killed after the replay) opens with every record. The cut
// one byte shorter is refused: Badger would have dropped the last record.
func TestOpenRefusesCutWAL(t *testing.T) {
	const n = 50
	dir, wal := killedCopy(t, n)
	b, err := os.ReadFile(wal)
	if err != nil {
		t.Fatal(err)
	}
	end := walEnd(b)
	if end <= walHeaderSize || !allZero(b[end:]) {
		t.Fatalf("walEnd = %d of a %d-byte log: not the end of its entries", end, len(b))
	}
	for _, cut := range []int{end - 1, end / 2, walHeaderSize + 1, walHeaderSize - 1, 1} {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			writeFile(t, wal, b[:cut])
			s, err := Open(Options{Dir: dir, SyncWrites: true, MemTableSize: 8 << 20, MinFreeBytes: -1})
			if err == nil {
				s.Close()
				t.Fatalf("Open with the log cut to %d of %d bytes succeeded", cut, end)
			}
			if !strings.Contains(err.Error(), wal+" is damaged") || !strings.Contains(err.Error(), "cut short") {
				t.Fatalf("Open error %q does not name the cut log", err)
			}
			if got, err := os.ReadFile(wal); err != nil || len(got) != cut {
				t.Fatalf("the refused Open changed %s (%d bytes, %v)", wal, len(got), err)
			}
		})
	}

	writeFile(t, wal, b[:end]) // what Badger's replay leaves
	s, err := Open(Options{Dir: dir, SyncWrites: true, MemTableSize: 8 << 20, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("Open with the log ending at its last entry: %v", err)
	}
	defer s.Close()
	for i := range n {
		if rec, err := s.Get(ctx, store.ID{Key: fmt.Sprint(i)}); err != nil || rec.State != store.Final {
			t.Fatalf("record %d = %+v, %v; want final", i, rec, err)
		}
	}
}
