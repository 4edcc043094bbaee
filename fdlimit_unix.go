//go:build unix

package main

import "syscall"

// openFileLimit returns the soft RLIMIT_NOFILE (which Go raises to the hard
// limit at start), 0 when unknown or unlimited (RLIM_INFINITY).
func openFileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur >= 1<<62 {
		return 0
	}
	return uint64(rl.Cur)
}
