package cache

import (
	"fmt"
	"os"
	"syscall"
)

// datasync is fdatasync: Badger sizes a WAL when it creates it, so after the
// first round only data and block maps change, and fdatasync skips the
// journal commit that a timestamp-only change would cost fsync.
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}

// unlinked says whether f's file was deleted (no name links to it any more).
// An fstat allocates nothing, where a stat of the path would.
func unlinked(f *os.File, _ string) (bool, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false, err
	}
	return st.Nlink == 0, nil
}

// pathExists says whether path names a file (without following a symlink);
// it allocates only the path's C string.
func pathExists(path string) (bool, error) {
	var st syscall.Stat_t
	err := syscall.Lstat(path, &st)
	if err == syscall.ENOENT {
		return false, nil
	}
	return err == nil, err
}

// preallocate gives every block of f's length real storage (fallocate), so
// that writes through Badger's mapping of its WAL never need a block from the
// file system: Badger creates a WAL as a sparse file and writes it through
// mmap, and on a full file system a write fault into a hole kills the process
// with SIGBUS instead of returning ENOSPC. done is true once there is nothing
// left to do: allocated, or the file system cannot preallocate.
func preallocate(f *os.File) (done bool, err error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false, err
	}
	if st.Size == 0 { // created, not yet sized by Badger
		return false, nil
	}
	for {
		switch err := syscall.Fallocate(int(f.Fd()), 0, 0, st.Size); err {
		case nil, syscall.EOPNOTSUPP, syscall.ENOSYS:
			return true, nil
		case syscall.EINTR:
			continue
		default:
			return false, err
		}
	}
}

// dirWritable fails unless this process may create files in dir (faccessat(2),
// write and search). Badger creates a write-ahead log each time its memtable
// fills: one it cannot create (the data directory made read-only, chmod
// 0500, under the running process) leaves it without a memtable for good,
// every later read panicking on it (the client's connection dropped without
// an answer) and the next write ending the process ("Assert failed", exit
// status 1). So every write looks first. It allocates only the path's C
// string.
//
// It asks with the effective user, group and capabilities (AT_EACCESS), as
// creating a file is judged.
func dirWritable(dir string) error {
	const wOK, xOK, atFDCWD, atEACCESS = 2, 1, -100, 0x200
	if err := syscall.Faccessat(atFDCWD, dir, wOK|xOK, atEACCESS); err != nil {
		return fmt.Errorf("the data directory %s is not writable (%w): the store takes no write until it is "+
			"(its files are kept; give the process's user write access again, no restart needed)", dir, err)
	}
	return nil
}
