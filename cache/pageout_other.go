//go:build !linux

package cache

import "errors"

// pageOutTables is Linux only.
func (s *Store) pageOutTables() (int, error) {
	return 0, errors.ErrUnsupported
}

// fileResident is Linux only.
func fileResident() (int64, error) {
	return 0, errors.ErrUnsupported
}
