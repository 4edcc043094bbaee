package cache

import (
	"bytes"
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

// killedLog is killedCopy's directory and log, the log's bytes and the end
// of its entries (zeros follow).
func killedLog(t *testing.T, n int) (dir, wal string, b []byte, end int) {
	t.Helper()
	dir, wal = killedCopy(t, n)
	b, err := os.ReadFile(wal)
	if err != nil {
		t.Fatal(err)
	}
	end = walEnd(b)
	if end <= walHeaderSize || !allZero(b[end:]) {
		t.Fatalf("walEnd = %d of a %d-byte log: not the end of its entries", end, len(b))
	}
	return dir, wal, b, end
}

// A write-ahead log cut short is refused, naming it, and left as it was;
// one cut where Badger's own replay truncates it (the end of its last whole
// entry: a start killed after the replay) opens with every record. The cut
// one byte shorter is refused: Badger would have dropped the last record.
func TestOpenRefusesCutWAL(t *testing.T) {
	const n = 50
	dir, wal, b, end := killedLog(t, n)
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

// Damage in the middle of a write-ahead log of full size (a bit flipped by
// the disk, bytes changed in a copy): Badger replayed the log up to the
// damaged entry, truncated it there and started, every record after it
// gone. It is refused, naming the log, and left as it was. What a crash
// leaves is still opened: an entry not whole whose missing part is zeros,
// a SIGKILL's (the rest of the log never written) or a power loss's (a
// sector not written, entries after it whole), and garbage after the last
// entry with no whole entry after it.
func TestOpenRefusesWALDamagedInTheMiddle(t *testing.T) {
	const n = 50
	dir, wal, b, end := killedLog(t, n)
	// The offsets of the entries, to aim at one in the middle.
	var offs []int
	for off := walHeaderSize; off < end; {
		_, size := walEntry(b[off:])
		offs = append(offs, off)
		off += size
	}
	mid, next := offs[len(offs)/2], offs[len(offs)/2+1]
	open := func(t *testing.T, damaged []byte) error {
		t.Helper()
		writeFile(t, wal, damaged)
		s, err := Open(Options{Dir: dir, SyncWrites: true, MemTableSize: 8 << 20, MinFreeBytes: -1})
		if err == nil {
			s.Close()
		}
		return err
	}
	for _, c := range []struct {
		name string
		at   int
	}{
		{"a bit of its key or value", (mid + next) / 2},
		{"a bit of its length", mid + 2},
		{"a bit of its checksum", next - 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			damaged := bytes.Clone(b)
			damaged[c.at] ^= 0x10
			err := open(t, damaged)
			if err == nil || !strings.Contains(err.Error(), wal+" is damaged") || !strings.Contains(err.Error(), "does not match its checksum") {
				t.Fatalf("Open with a bit flipped at byte %d of the entry at %d: %v; want it refused, naming the log", c.at, mid, err)
			}
			if got, err := os.ReadFile(wal); err != nil || !bytes.Equal(got, damaged) {
				t.Fatalf("the refused Open changed %s (%v)", wal, err)
			}
		})
	}

	for _, c := range []struct {
		name   string
		damage func(d []byte)
	}{
		{"a power loss: a sector of an entry not written, whole entries after it", func(d []byte) {
			// The sector holding the entry's middle as it was before the
			// entry was written: zeros from there to the sector's end.
			at := (mid + next) / 2
			clear(d[at : at-at%walSector+walSector])
		}},
		{"a SIGKILL during the copy of the last entry", func(d []byte) {
			clear(d[offs[len(offs)-1]+10 : end])
		}},
		{"garbage after the last entry", func(d []byte) {
			for i := end; i < end+300; i++ {
				d[i] = byte(i*7 + 1)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			damaged := bytes.Clone(b)
			c.damage(damaged)
			if err := open(t, damaged); err != nil {
				t.Fatalf("Open after %s: %v; want it opened", c.name, err)
			}
		})
	}
}
