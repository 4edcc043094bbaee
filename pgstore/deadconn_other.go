//go:build !unix

package pgstore

import "syscall"

// peekPending cannot peek here; pgxpool's own ping after a second idle
// remains.
func peekPending(syscall.Conn) bool { return false }
