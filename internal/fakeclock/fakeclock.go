// Package fakeclock is a clock that tests move by hand, to be injected where
// code takes a Now func and a Sleep func: Sleep advances the clock at once and
// records the wait, so a test can assert the waits code asked for without
// sleeping.
package fakeclock

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Clock is a settable clock, safe for concurrent use. Create it with New.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	// OnSleep, if set, is called after the n-th Sleep (1-based), outside the
	// lock, so that a test can act in the middle of a wait. Set it before the
	// clock is in use.
	OnSleep func(n int)
}

// New returns a clock reading start. Code that also derives real context
// deadlines from it needs a start close to the real time.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t, forward or back.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Sleep returns ctx's error if ctx is done; otherwise it advances the clock by
// d at once, records d and returns nil.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.sleeps = append(c.sleeps, d)
	n, hook := len(c.sleeps), c.OnSleep
	c.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	return nil
}

// Sleeps returns the waits Sleep was asked for, in order.
func (c *Clock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sleeps)
}
