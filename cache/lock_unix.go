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
// stale lock behind.
func lockDir(dir string) (release func() error, err error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return nil, fmt.Errorf("%w: %s is in use by another process or Store", ErrLocked, dir)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f.Close, nil
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
