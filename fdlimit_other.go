//go:build !unix

package main

// openFileLimit is unknown off Unix: no connection bound is derived.
func openFileLimit() uint64 { return 0 }
