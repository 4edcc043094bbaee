package cache

import (
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
