package cache

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// A data directory deleted and made anew, or moved away, while the store
// runs: every write fails with ErrDirGone instead of being acknowledged into
// files that are gone or elsewhere (seen with the binary: the directory
// removed and made again, 10 of 10 orders answered 201 and /readyz 200, then
// 0 of 10 replayed after a restart). Moved back, the store writes again.
func TestWritesRefusedOnceDirectoryGone(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "db")
	s, err := Open(Options{Dir: dir, SyncWrites: true, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustBegin(t, s, store.ID{Key: "before"}, fpA, "o")
	mustComplete(t, s, store.ID{Key: "before"}, "o")

	write := func(key string) error {
		_, _, err := s.Begin(ctx, store.ID{Key: key}, store.Request{Fingerprint: fpA}, "o", time.Minute)
		return err
	}
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := write("moved"); !errors.Is(err, ErrDirGone) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Begin with the directory moved away = %v, want ErrDirGone naming %s", err, dir)
	}
	if err := s.Ping(ctx); !errors.Is(err, ErrDirGone) {
		t.Fatalf("Ping with the directory moved away = %v, want ErrDirGone", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := write("made anew"); !errors.Is(err, ErrDirGone) {
		t.Fatalf("Begin with a new, empty directory in its place = %v, want ErrDirGone", err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}
	if err := write("moved back"); err != nil {
		t.Fatalf("Begin with the directory moved back: %v", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := write("deleted"); !errors.Is(err, ErrDirGone) {
		t.Fatalf("Begin with the directory deleted and made anew = %v, want ErrDirGone", err)
	}
	if rec, err := s.Get(ctx, store.ID{Key: "before"}); err != nil || rec.State != store.Final {
		t.Fatalf("a record stored before = %v %v; want still read (replayed)", rec.State, err)
	}
}
