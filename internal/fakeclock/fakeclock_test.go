package fakeclock

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := New(start)
	var hooked []int
	c.OnSleep = func(n int) { hooked = append(hooked, n) }
	c.Advance(time.Second)
	if err := c.Sleep(context.Background(), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Sleep(context.Background(), 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Now(), start.Add(6*time.Second); !got.Equal(want) {
		t.Errorf("Now = %v, want %v", got, want)
	}
	if got := c.Sleeps(); !slices.Equal(got, []time.Duration{2 * time.Second, 3 * time.Second}) {
		t.Errorf("Sleeps = %v", got)
	}
	if !slices.Equal(hooked, []int{1, 2}) {
		t.Errorf("OnSleep saw %v, want [1 2]", hooked)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Sleep(ctx, time.Hour); err != context.Canceled {
		t.Errorf("Sleep on a cancelled context = %v, want context.Canceled", err)
	}
	if got, want := c.Now(), start.Add(6*time.Second); !got.Equal(want) || len(c.Sleeps()) != 2 {
		t.Errorf("a cancelled Sleep moved the clock (%v) or was recorded (%v)", got, c.Sleeps())
	}
	c.Set(start)
	if got := c.Now(); !got.Equal(start) {
		t.Errorf("after Set(start): Now = %v", got)
	}
}
