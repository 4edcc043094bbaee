//go:build !(linux || darwin || freebsd || dragonfly)

package cache

import "math"

// lockDir relies on Badger's own directory lock where flock is unavailable.
func lockDir(string) (func() error, dirMark, error) {
	return func() error { return nil }, dirMark{}, nil
}

// dirMark tells nothing where the store keeps no lock file.
type dirMark struct{}

func (dirMark) check() error { return nil }

// freeBytes reports unlimited space where statfs is unavailable, which turns
// the free-space guard off.
func freeBytes(string) (uint64, error) { return math.MaxUint64, nil }
