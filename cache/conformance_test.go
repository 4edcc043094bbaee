package cache

import (
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/storetest"
)

var _ store.Store = (*Store)(nil)

// TestConformance runs the store contract's suite on a durable store in a
// temporary directory, with a fake clock that advance moves.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, ttl time.Duration) (store.Store, func(time.Duration)) {
		c := newClock()
		return openStore(t, t.TempDir(), c, ttl), c.Advance
	})
}
