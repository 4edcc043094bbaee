package cache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dgraph-io/badger/v4"
)

// ErrForeignDir is returned by Open when the directory holds no store yet
// but files that neither Badger nor the store writes: it belongs to another
// program (a mistyped IDEMPROXY_DATA_DIR, a volume shared with something
// else). Creating a store there would scatter Badger's files among that
// program's, and the records written would be lost from view once the
// setting is corrected.
var ErrForeignDir = errors.New("cache: directory holds files of another program")

// checkOwnDir refuses a directory without a MANIFEST that holds entries other
// than the files Badger and the store create, a file system's lost+found and
// hidden (dot) entries. A directory with a MANIFEST is an existing store and
// is left to checkTables and Badger, whatever else is in it: a store made by
// an earlier version, or restored with Badger's tool, opens as before.
func checkOwnDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var foreign []string
	for _, e := range entries {
		name := e.Name()
		if name == badger.ManifestFilename {
			return nil
		}
		if !ownEntry(name) {
			foreign = append(foreign, name)
		}
	}
	if len(foreign) == 0 {
		return nil
	}
	slices.Sort(foreign)
	shown := foreign
	if len(shown) > 5 {
		shown = append(slices.Clone(shown[:5]), fmt.Sprintf("and %d more", len(foreign)-5))
	}
	return fmt.Errorf("%w: %s holds no store but %s; give the store a directory of its own (empty, or the one it used before)",
		ErrForeignDir, dir, strings.Join(shown, ", "))
}

// ownEntry reports whether name is one the store, Badger or the file system
// puts in a store directory.
func ownEntry(name string) bool {
	switch name {
	case "idemproxy.lock", heldName, "LOCK", "KEYREGISTRY", "REWRITE-KEYREGISTRY", "MANIFEST-REWRITE", "DISCARD", "lost+found":
		return true
	}
	if strings.HasPrefix(name, ".") {
		return true
	}
	switch filepath.Ext(name) {
	case ".sst", ".vlog", ".mem":
		return true
	}
	return false
}
