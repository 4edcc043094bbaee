package cache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// checkLogHeaders refuses a write-ahead log (*.mem) or value log (*.vlog)
// whose header names an encryption key. Badger starts each such file with
// the id of the key its entries are encrypted with (8 bytes, big-endian)
// and an IV; the store encrypts nothing, so the id is always 0, and Badger
// refuses any other ("While opening vlog file 1 err: Error for the KEY ID
// 11936128518282651045 err: Invalid datakey id", said of a write-ahead log
// too), which tells the operator neither that the file is damaged nor what
// to do. A file shorter than the header is left to the other checks and to
// Badger.
//
// What to do differs: a write-ahead log holds acknowledged records, so the
// directory must come from a backup; a value log holds none, since every
// value the store writes is kept below Badger's value threshold (see
// valueThreshold) and lives in the LSM tree, so removing the file loses
// nothing (Badger creates a new one).
func checkLogHeaders(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	for _, name := range names {
		wal := strings.HasSuffix(name, ".mem")
		if !wal && !strings.HasSuffix(name, ".vlog") {
			continue
		}
		path := filepath.Join(dir, name)
		id, ok, err := logKeyID(path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if errors.Is(err, fs.ErrPermission) {
				return fmt.Errorf("log %s: %w", path, err) // not damage: the caller names the fix
			}
			return fmt.Errorf("read log %s: %w", path, err)
		}
		if !ok || id == 0 {
			continue
		}
		if wal {
			return fmt.Errorf("write-ahead log %s is damaged: its header names encryption key %d, and the store "+
				"encrypts nothing; the store is not opened, so that none of its records is lost or sent again, and "+
				"nothing in the directory was changed: restore the directory from a backup", path, id)
		}
		return fmt.Errorf("value log %s is damaged: its header names encryption key %d, and the store encrypts "+
			"nothing; the store keeps no record in value logs (every value stays in the tables and write-ahead "+
			"logs), so removing the file loses nothing: remove it and start again (nothing in the directory was "+
			"changed)", path, id)
	}
	return nil
}

// logKeyID returns the key id in the header of the log at path; ok is
// false when the file is shorter than the id or not a regular file.
func logKeyID(path string) (id uint64, ok bool, err error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0, false, err
	}
	if !fi.Mode().IsRegular() || fi.Size() < walHeaderSize {
		return 0, false, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	var b [8]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return 0, false, err
	}
	return binary.BigEndian.Uint64(b[:]), true, nil
}
