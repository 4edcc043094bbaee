//go:build linux || darwin || freebsd || dragonfly

package cache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockFileName is the store's own lock file inside the Badger directory.
// Badger takes a flock too, but reports failure only as text; this one lets
// Open return ErrLocked.
const lockFileName = "idemproxy.lock"

// lockDir takes an exclusive, non-blocking flock on dir's lock file. The
// kernel drops the lock when the process dies, so a crash never leaves a
// stale lock behind. The lock file is also the mark (dirMark) by which the
// store tells that dir is still the directory it opened.
func lockDir(dir string) (release func() error, mark dirMark, err error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, dirMark{}, fmt.Errorf("open lock file: %w", err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return nil, dirMark{}, fmt.Errorf("%w: %s is in use by another process or Store", ErrLocked, dir)
	}
	if err != nil {
		f.Close()
		return nil, dirMark{}, fmt.Errorf("lock %s: %w", dir, err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, dirMark{}, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f.Close, dirMark{path: path, dev: uint64(st.Dev), ino: uint64(st.Ino)}, nil
}

// dirMark is the store's lock file as it was opened: its path, device and
// inode.
type dirMark struct {
	path     string
	dev, ino uint64
}

// check fails unless the mark's path still names the file opened: a data
// directory deleted, emptied, replaced or moved away while the store runs
// no longer holds it. Badger writes on into its open files, which are then
// gone or elsewhere: every answer stored from then on would be acknowledged
// and missing after a restart. It allocates only the path's C string.
func (m dirMark) check() error {
	if m.path == "" {
		return nil
	}
	var st syscall.Stat_t
	err := syscall.Lstat(m.path, &st)
	if err == nil && uint64(st.Dev) == m.dev && uint64(st.Ino) == m.ino {
		return nil
	}
	what := "holds another file there"
	if err != nil {
		what = "no longer holds it (" + err.Error() + ")"
	}
	return fmt.Errorf("%w: the store's lock file %s %s: the data directory was deleted, emptied, replaced or "+
		"moved while the process runs, and nothing written now could be found after a restart; put the "+
		"directory back, or restart the process on the directory it should use", ErrDirGone, m.path, what)
}

// freeBytes returns the bytes available to an unprivileged writer on dir's
// file system.
func freeBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return uint64(st.Bavail) * uint64(st.Bsize), nil
}
