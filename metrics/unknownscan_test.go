package metrics

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A walk of the unknown records of a large Badger store takes tens of
// seconds. It is not cut by a deadline of the gauges' own (one of 10 s cut
// it every time, and the gauges said 0 for ever), and its figures are
// reused for four times as long as it took, so that scrapes do not keep a
// core walking the store.
func TestUnknownScanUnboundedAndReusedByItsLength(t *testing.T) {
	var mu sync.Mutex
	clock := time.Unix(1_000_000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	var scans atomic.Int32
	var bounded atomic.Bool
	m := New("test")
	m.UnknownOperations(func(ctx context.Context) (int, time.Time, error) {
		if _, ok := ctx.Deadline(); ok {
			bounded.Store(true)
		}
		n := scans.Add(1)
		advance(20 * time.Second) // the walk of a large store
		return int(n), time.Time{}, nil
	}, now)
	unknown := func() float64 {
		t.Helper()
		families, err := m.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "idemproxy_operations_unknown" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no idemproxy_operations_unknown")
		return 0
	}
	if got := unknown(); got != 1 {
		t.Fatalf("first scrape: %v unknown, want the first scan's 1", got)
	}
	advance(40 * time.Second) // 60 s after the scan began: past 30 s, within 4 × 20 s
	if got := unknown(); got != 1 || scans.Load() != 1 {
		t.Errorf("60 s after a scan of 20 s: %v unknown after %d scans, want the first scan's figures reused", got, scans.Load())
	}
	advance(25 * time.Second) // 85 s after it began
	if got := unknown(); got != 2 {
		t.Errorf("85 s after a scan of 20 s: %v unknown, want a new scan's 2", got)
	}
	if bounded.Load() {
		t.Error("the scan was given a deadline by the gauges; a walk longer than it never ended")
	}
}
