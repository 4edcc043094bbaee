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

// TestDamagedRecords runs the contract's suite for records kept that cannot
// be read: their values' format version set to one no build wrote, and a
// record moved to a state no build wrote yet (4, in its value and its
// UserMeta). Before, the one in the newer state was listed nowhere.
func TestDamagedRecords(t *testing.T) {
	storetest.RunDamaged(t, func(t *testing.T, ttl time.Duration) (store.Store, func(time.Duration)) {
		c := newClock()
		return openStore(t, t.TempDir(), c, ttl), c.Advance
	}, func(t *testing.T, st store.Store, id store.ID, d storetest.Damage) {
		s := st.(*Store)
		v, meta, err := raw(t, s, id)
		if err != nil {
			t.Fatal(err)
		}
		switch d {
		case storetest.Undecodable:
			v[0] = recordVersion + 1
		case storetest.NewerState:
			v[1], meta = 4, 4
		default:
			t.Fatalf("damage %d", d)
		}
		setRaw(t, s, id, v, meta, 0)
	})
}
