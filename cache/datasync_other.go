//go:build !linux

package cache

import (
	"errors"
	"io/fs"
	"os"
)

// datasync is fsync where fdatasync is not available.
func datasync(f *os.File) error { return f.Sync() }

// unlinked says whether the file opened as f at path was deleted.
func unlinked(_ *os.File, path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	return false, err
}

// pathExists says whether path names a file (without following a symlink).
func pathExists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// preallocate does nothing here (see the Linux version).
func preallocate(*os.File) (done bool, err error) { return true, nil }

// dirWritable looks at nothing here (see the Linux version).
func dirWritable(string) error { return nil }
