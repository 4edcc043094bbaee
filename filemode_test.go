package main

import (
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// A data directory the operator made (mkdir: mode 0755, a bind mount
// chowned to the container's user) or the image's /data (1777): the
// store's files hold every stored answer, a card issue's included, and
// Badger created its tables and logs 0644 under the usual umask 022, so
// that any user of the host could read them. Every file the process makes
// in the directory is its user's only.
func TestBinaryDataDirFilesAreOwnerOnly(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	for _, mode := range []os.FileMode{0o755, os.ModeSticky | 0o777} {
		dir := filepath.Join(t.TempDir(), "data")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		storeAndStop(t, baseEnv(up.URL, dir), prov, "mode")
		n := 0
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || path == dir {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			n++
			if info.Mode().Perm()&0o077 != 0 {
				t.Errorf("directory of mode %v: %s is mode %v, readable by others than its owner", mode, d.Name(), info.Mode().Perm())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("directory of mode %v: no file made", mode)
		}
	}
}
