package store

import "errors"

// ErrUnreadable is wrapped by the error of every method that finds id's
// record but cannot read its stored value: written by a newer version (a
// format this one does not know, after a downgrade), or damaged. The record
// is kept as it is: its operation may have reached the provider, so its key
// is refused (503 store_unavailable) with nothing sent, and an operator
// settles it.
var ErrUnreadable = errors.New("store: the record's stored value cannot be read")

// Unreadable is what List knows of a record whose stored value cannot be
// read (see ErrUnreadable). List returns such a record in the state the
// store keeps beside its value, with Record.Unreadable set and nothing else
// but ID (when it could still be read) and ExpiresAt, instead of failing
// the whole page: an operator looking for what a crash left must see the
// other records, and this one.
type Unreadable struct {
	// StoreKey names the record in the store, in hex as the store's List
	// cursors spell it (a Badger key; a PostgreSQL row's client and key),
	// also when its ID could not be read.
	StoreKey string
	// Err says why its value cannot be read; it wraps ErrUnreadable.
	Err error
}
