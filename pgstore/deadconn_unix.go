//go:build unix

package pgstore

import (
	"errors"
	"syscall"
)

// peekPending peeks at one byte of sc without waiting (Go's sockets are
// non-blocking): true if one is there or the peer closed its side. It runs
// under Control, not Read: Read would wait for a read pgconn's background
// reader may still have pending on the idle connection (after a large
// write), which ends only when the server sends something.
func peekPending(sc syscall.Conn) bool {
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	pending := false
	rc.Control(func(fd uintptr) {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK)
		switch {
		case err == nil:
			pending = true // a byte (n 1), or the end of the stream (n 0)
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK), errors.Is(err, syscall.EINTR):
		default:
			pending = true // a reset: let the ping find out
		}
	})
	return pending
}
