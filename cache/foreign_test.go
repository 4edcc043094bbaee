package cache

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/store"
)

// A directory another program uses is refused before anything is written in
// it; one that is empty but for what a file system or Badger leaves, or that
// holds a store already, opens.
func TestOpenRefusesForeignDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "config.json"), []byte(`{"x":1}`))
	writeFile(t, filepath.Join(dir, "db.sqlite"), []byte("data"))
	_, err := Open(Options{Dir: dir, SyncWrites: true, MinFreeBytes: -1})
	if !errors.Is(err, ErrForeignDir) {
		t.Fatalf("Open on another program's directory = %v, want ErrForeignDir", err)
	}
	for _, want := range []string{dir, "config.json", "db.sqlite"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open error %q does not name %s", err, want)
		}
	}
	names := dirNames(t, dir)
	if !slices.Equal(names, []string{"config.json", "db.sqlite"}) {
		t.Errorf("the refused Open left %v in the directory, want only the program's two files", names)
	}

	// A fresh volume: lost+found and hidden entries are no program's data.
	fresh := t.TempDir()
	if err := os.Mkdir(filepath.Join(fresh, "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(fresh, ".keep"), nil)
	s, err := Open(Options{Dir: fresh, SyncWrites: true, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("Open on a fresh volume: %v", err)
	}
	mustBegin(t, s, store.ID{Key: "k"}, fpA, "o")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// An existing store opens whatever else was put in it since.
	writeFile(t, filepath.Join(fresh, "notes.txt"), []byte("ops notes"))
	s, err = Open(Options{Dir: fresh, SyncWrites: true, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("Open on an existing store with another file in it: %v", err)
	}
	if _, err := s.Get(t.Context(), store.ID{Key: "k"}); err != nil {
		t.Errorf("record after reopen: %v", err)
	}
	s.Close()
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
