package cache

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// snapshot returns every file in dir and what it holds (of a store open in
// dir: what a SIGKILL at that moment would leave). The files are read one
// after the other while the store may still be flushing a log to a table in
// the background, and a copy taken across such a change can hold a state no
// kill leaves (a MANIFEST naming a table read as absent a moment before), so
// the directory is read until two reads in a row agree.
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	same := func(a, b []byte) bool { return string(a) == string(b) }
	last := read(t, dir)
	for deadline := time.Now().Add(10 * time.Second); ; {
		files := read(t, dir)
		if maps.EqualFunc(files, last, same) {
			return files
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still changing 10 s on", dir)
		}
		last = files
		time.Sleep(10 * time.Millisecond)
	}
}

// read returns every file in dir and what it holds, as read one by one.
func read(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) { // deleted by the open store meanwhile
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = b
	}
	return files
}

// restore makes dir hold exactly files.
func restore(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		writeFile(t, filepath.Join(dir, name), b)
	}
}

func openWriters(t *testing.T, dir string) (*Store, error) {
	t.Helper()
	return Open(Options{Dir: dir, SyncWrites: true, MemTableSize: 1 << 20, MinFreeBytes: -1})
}

// A write-ahead log that held synced records, zeroed, or zeroed after its
// header (what a file system that lost its blocks, or a
// copy that stopped short, leaves) is refused at start, naming it, and left
// as it was. Badger took each for a log that never held anything and
// started without its records: every acknowledged answer in it gone without
// a word. Put back, every record the killed writer acknowledged is there.
func TestOpenRefusesEmptiedWAL(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	done := killWriter(t, dir, 300)
	h, err := readHeld(dir)
	if err != nil || h.fid == 0 {
		t.Fatalf("after a writer acknowledged %d records, %s = %+v, %v; want the newest log noted", len(done), heldName, h, err)
	}
	wal := filepath.Join(dir, walName(h.fid))
	whole := snapshot(t, dir)
	b := whole[walName(h.fid)]
	if len(b) == 0 {
		t.Fatalf("the noted log %s is not in the directory", wal)
	}
	for _, c := range []struct {
		name, says string
		damaged    []byte
	}{
		{"zeroed", "lost its header and every entry (zeroed)", make([]byte, len(b))},
		{"zeroed after its header", "holds no entry", append(append([]byte(nil), b[:walHeaderSize]...), make([]byte, len(b)-walHeaderSize)...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			restore(t, dir, whole)
			writeFile(t, wal, c.damaged)
			before := snapshot(t, dir)
			s, err := openWriters(t, dir)
			if err == nil {
				s.Close()
				t.Fatalf("Open with the noted log %s succeeded", c.name)
			}
			if !strings.Contains(err.Error(), wal+" is damaged") || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Open error %q does not name the log and say it %s", err, c.says)
			}
			if after := snapshot(t, dir); !maps.EqualFunc(before, after, func(a, b []byte) bool { return string(a) == string(b) }) {
				t.Fatal("the refused Open changed the directory")
			}
		})
	}

	restore(t, dir, whole)
	s, err := openWriters(t, dir)
	if err != nil {
		t.Fatalf("Open of the directory as the writer left it: %v", err)
	}
	defer s.Close()
	for _, key := range done {
		if rec, err := s.Get(ctx, store.ID{Tenant: "crash", Key: key}); err != nil || rec.State != store.Final {
			t.Fatalf("acknowledged record %s = %v %v; want final", key, rec.State, err)
		}
	}
}

// What a SIGKILL leaves is never refused by the note: the noted log at 0
// bytes once flushed (a kill while Badger deletes it: it truncates before it
// removes), a log that Badger created after the noted one and that holds
// nothing yet (a kill right after a start), one a kill left at 0 bytes or
// zeroed before its header was written, and the same after a clean close,
// when Badger numbers logs from 1 again.
func TestOpenAcceptsFreshWALsAfterKill(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	done := killWriter(t, dir, 300)
	h, _ := readHeld(dir)

	// A start killed before any write, once Badger has flushed the writer's
	// logs to a table (a copy of the open directory taken during that
	// flush would hold a table half written): the directory as it is then,
	// with the noted log as the writer left it (a kill after the flush's
	// MANIFEST entry, before the log's deletion), or at 0 bytes (a kill in
	// the middle of its deletion: Badger truncates before it removes).
	pre := snapshot(t, dir)
	s, err := openWriters(t, dir)
	if err != nil {
		t.Fatalf("Open after the writer's kill: %v", err)
	}
	noted := filepath.Join(dir, walName(h.fid))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(noted); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not flushed and deleted 10 s after the start", noted)
		}
	}
	post := snapshot(t, dir)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	killed := maps.Clone(post)
	killed[walName(h.fid)] = pre[walName(h.fid)]
	deleting := maps.Clone(post)
	deleting[walName(h.fid)] = nil
	restore(t, dir, deleting)
	s, err = openWriters(t, dir)
	if err != nil {
		t.Fatalf("Open of a kill during the deletion of the noted log: %v", err)
	}
	for _, key := range done {
		if rec, err := s.Get(ctx, store.ID{Tenant: "crash", Key: key}); err != nil || rec.State != store.Final {
			t.Fatalf("acknowledged record %s = %v %v; want final", key, rec.State, err)
		}
	}
	s.Close()

	var fresh []string
	for name := range killed {
		if strings.HasSuffix(name, ".mem") && name > walName(h.fid) {
			fresh = append(fresh, name)
		}
	}
	if len(fresh) != 1 {
		t.Fatalf("logs newer than the noted %s while open: %v, want one", walName(h.fid), fresh)
	}
	for _, c := range []struct {
		name    string
		damaged func(b []byte) []byte
	}{
		{"as left", func(b []byte) []byte { return b }},
		{"0 bytes", func([]byte) []byte { return nil }},
		{"zeroed", func(b []byte) []byte { return make([]byte, len(b)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			restore(t, dir, killed)
			writeFile(t, filepath.Join(dir, fresh[0]), c.damaged(killed[fresh[0]]))
			s, err := openWriters(t, dir)
			if err != nil {
				t.Fatalf("Open of what a kill leaves: %v", err)
			}
			defer s.Close()
			for _, key := range done {
				if rec, err := s.Get(ctx, store.ID{Tenant: "crash", Key: key}); err != nil || rec.State != store.Final {
					t.Fatalf("acknowledged record %s = %v %v; want final", key, rec.State, err)
				}
			}
		})
	}

	// After a clean close the logs are gone, the note names one that is
	// not there, and Badger numbers the next log 1 again.
	restore(t, dir, killed)
	s, err = openWriters(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = openWriters(t, dir)
	if err != nil {
		t.Fatalf("Open after a clean close: %v", err)
	}
	reused := snapshot(t, dir)
	s.Close()
	restore(t, dir, reused)
	for name, b := range reused {
		if strings.HasSuffix(name, ".mem") {
			writeFile(t, filepath.Join(dir, name), make([]byte, len(b)))
		}
	}
	s, err = openWriters(t, dir)
	if err != nil {
		t.Fatalf("Open of a start killed before its log's header was written, after a clean close: %v", err)
	}
	s.Close()
}
