package ratelimit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkGateFullLine measures what a line of 64 waiting attempts gets
// out of a 2,000-a-second gate with a burst of 1, on the real clock: the
// reported rate-ratio is attempts per second over the configured rate (1 is
// the whole rate). On two cores at load average 7, alternated: 0.73-0.77
// before a line's next token was counted through the wake-up of the one
// before it (Gate.reserve), 0.86-0.93 after.
func BenchmarkGateFullLine(b *testing.B) {
	const perSecond, waiters = 2000, 64
	g := New(perSecond, 1)
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range waiters {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if _, err := g.Wait(context.Background()); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds()/perSecond, "rate-ratio")
}
