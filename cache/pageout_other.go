//go:build !linux

package cache

import "errors"

// pageOutTables is Linux only.
func (s *Store) pageOutTables() (int, error) {
	return 0, errors.ErrUnsupported
}

// statm is Linux only.
type statm struct{}

func (*statm) open() error                  { return errors.ErrUnsupported }
func (*statm) fileResident() (int64, error) { return 0, errors.ErrUnsupported }
func (*statm) close()                       {}
