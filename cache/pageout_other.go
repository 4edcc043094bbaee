//go:build !linux

package cache

import "errors"

// pageOutTables is Linux only.
func (s *Store) pageOutTables() (int, error) {
	return 0, errors.ErrUnsupported
}
