package ratelimit

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/fakeclock"
)

// newTestGate returns a Gate on a fake clock that starts at the real time, so
// that real context deadlines derived from it lie in the future.
func newTestGate(perSecond float64, burst int) (*Gate, *fakeclock.Clock) {
	c := fakeclock.New(time.Now())
	g := New(perSecond, burst)
	g.Now, g.Sleep = c.Now, c.Sleep
	return g, c
}

func TestGateRatePacing(t *testing.T) {
	tests := []struct {
		name      string
		perSecond float64
		burst     int
		calls     int
		want      []time.Duration // waits reported by each call
	}{
		{"2 per second, burst 1", 2, 1, 4, []time.Duration{0, 500 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond}},
		{"10 per second, burst 3", 10, 3, 5, []time.Duration{0, 0, 0, 100 * time.Millisecond, 100 * time.Millisecond}},
		{"burst 0 is raised to 1", 1, 0, 2, []time.Duration{0, time.Second}},
		{"no limit", 0, 0, 5, []time.Duration{0, 0, 0, 0, 0}},
		{"negative rate is no limit", -1, 5, 3, []time.Duration{0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, c := newTestGate(tt.perSecond, tt.burst)
			var got []time.Duration
			for range tt.calls {
				w, err := g.Wait(context.Background())
				if err != nil {
					t.Fatalf("Wait: %v", err)
				}
				got = append(got, w)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("waits = %v, want %v", got, tt.want)
			}
			var wantSleeps []time.Duration
			for _, w := range tt.want {
				if w > 0 {
					wantSleeps = append(wantSleeps, w)
				}
			}
			if s := c.Sleeps(); !slices.Equal(s, wantSleeps) {
				t.Errorf("sleeps = %v, want %v", s, wantSleeps)
			}
		})
	}
}

// An attempt held by a pause leaves after it, plus its share of the spread
// window (Rand 0.25 of min(DefaultSpread, 2 s held) = 250 ms) when no rate
// limit paces the resumption.
func TestGatePause(t *testing.T) {
	g, c := newTestGate(0, 1)
	g.Rand = func() float64 { return 0.25 }
	start := c.Now()
	g.PauseUntil(start.Add(2 * time.Second))
	w, err := g.Wait(context.Background())
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	const want = 2*time.Second + 250*time.Millisecond
	if w != want {
		t.Errorf("waited %v, want %v", w, want)
	}
	if !c.Now().Equal(start.Add(want)) {
		t.Errorf("left at %v after start, want %v", c.Now().Sub(start), want)
	}
	// The pause is over: the next attempt leaves at once.
	if w, err := g.Wait(context.Background()); err != nil || w != 0 {
		t.Errorf("second Wait = %v, %v; want 0, nil", w, err)
	}
}

func TestGatePauseOnlyExtends(t *testing.T) {
	g, c := newTestGate(0, 1)
	long := c.Now().Add(5 * time.Second)
	g.PauseUntil(long)
	g.PauseUntil(c.Now().Add(time.Second))
	if got := g.PausedUntil(); !got.Equal(long) {
		t.Errorf("PausedUntil = +%v, want +5s", got.Sub(c.Now()))
	}
	if got := New(1, 1).PausedUntil(); !got.IsZero() {
		t.Errorf("new gate PausedUntil = %v, want zero", got)
	}
}

// A pause extended while an attempt already sleeps is honoured: Wait
// re-checks after waking instead of leaving at the old pause end.
func TestGatePauseExtendedWhileWaiting(t *testing.T) {
	g, c := newTestGate(0, 1)
	g.Spread = -1 // no spread: the sleeps are the pause's alone
	start := c.Now()
	g.PauseUntil(start.Add(2 * time.Second))
	c.OnSleep = func(n int) {
		if n == 1 {
			g.PauseUntil(start.Add(5 * time.Second))
		}
	}
	w, err := g.Wait(context.Background())
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if want := []time.Duration{2 * time.Second, 3 * time.Second}; !slices.Equal(c.Sleeps(), want) {
		t.Errorf("sleeps = %v, want %v", c.Sleeps(), want)
	}
	if w != 5*time.Second {
		t.Errorf("waited %v, want 5s", w)
	}
}

// The token reserved before a pause is kept through it: a rate-limited
// attempt caught by a pause does not reserve a second token afterwards.
func TestGatePauseWhileHoldingToken(t *testing.T) {
	g, c := newTestGate(1, 1)
	if _, err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	start := c.Now()
	c.OnSleep = func(n int) {
		if n == 1 { // woke for the token; a 429 elsewhere pauses everyone
			g.PauseUntil(start.Add(3 * time.Second))
		}
	}
	w, err := g.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{time.Second, 2 * time.Second}; !slices.Equal(c.Sleeps(), want) {
		t.Errorf("sleeps = %v, want %v", c.Sleeps(), want)
	}
	if w != 3*time.Second {
		t.Errorf("waited %v, want 3s", w)
	}
}

func TestGateDeadline(t *testing.T) {
	tests := []struct {
		name  string
		setup func(g *Gate, now time.Time)
	}{
		{"pause ends after the deadline", func(g *Gate, now time.Time) {
			g.PauseUntil(now.Add(2 * time.Hour))
		}},
		{"pause ends exactly at the deadline", func(g *Gate, now time.Time) {
			g.PauseUntil(now.Add(time.Hour))
		}},
		{"token comes after the deadline", func(g *Gate, now time.Time) {
			g.limiter.SetLimitAt(now, 1.0/7200) // one token per two hours
			if _, err := g.Wait(context.Background()); err != nil {
				panic(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, c := newTestGate(1, 1)
			tt.setup(g, c.Now())
			ctx, cancel := context.WithDeadline(context.Background(), c.Now().Add(time.Hour))
			defer cancel()
			w, err := g.Wait(ctx)
			if !errors.Is(err, ErrDeadline) {
				t.Fatalf("Wait err = %v, want ErrDeadline", err)
			}
			if w != 0 || len(c.Sleeps()) != 0 {
				t.Errorf("waited %v with sleeps %v; want an immediate error", w, c.Sleeps())
			}
		})
	}
}

// A wait that fails on the deadline gives its token back, so the next
// attempt is not delayed by a token nobody used.
func TestGateDeadlineReturnsToken(t *testing.T) {
	g, c := newTestGate(1, 1)
	if _, err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), c.Now().Add(500*time.Millisecond))
	defer cancel()
	if _, err := g.Wait(ctx); !errors.Is(err, ErrDeadline) {
		t.Fatalf("Wait err = %v, want ErrDeadline", err)
	}
	w, err := g.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if w != time.Second {
		t.Errorf("waited %v after a cancelled reservation, want 1s", w)
	}
}

func TestGateContextCanceled(t *testing.T) {
	g := New(0, 1) // real clock and sleep
	g.PauseUntil(time.Now().Add(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait err = %v, want context.Canceled", err)
	}
}

// Concurrent waiters behind one pause all leave after it ends (real clock;
// the assertion compares instants, not durations, so it is not timed).
func TestGateConcurrentPause(t *testing.T) {
	g := New(1000, 8)
	end := time.Now().Add(50 * time.Millisecond)
	g.PauseUntil(end)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := g.Wait(context.Background()); err != nil {
				t.Error(err)
				return
			}
			if left := time.Now(); left.Before(end) {
				t.Errorf("left %v before the pause ended", end.Sub(left))
			}
		})
	}
	wg.Wait()
}

func TestSleepContext(t *testing.T) {
	if err := SleepContext(context.Background(), 0); err != nil {
		t.Errorf("SleepContext(0) = %v", err)
	}
	if err := SleepContext(context.Background(), time.Millisecond); err != nil {
		t.Errorf("SleepContext(1ms) = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := SleepContext(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("SleepContext(canceled) = %v, want context.Canceled", err)
	}
}

// No stampede when a pause ends: 300 attempts queued behind a 1 s pause
// resume spread over the following second, not within milliseconds of its
// end (500 requests once reached the provider within 70 ms of a 5 s pause,
// right after it said 429). Real time; the margins are wide: uniform spread
// puts about 10% in the first 100 ms, a stampede nearly all of them.
func TestGateNoStampedeAfterPause(t *testing.T) {
	g := New(0, 1)
	const n = 300
	end := time.Now().Add(time.Second)
	g.PauseUntil(end)
	left := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := g.Wait(context.Background()); err != nil {
				t.Error(err)
			}
			left[i] = time.Since(end)
		})
	}
	wg.Wait()
	early := 0
	for _, d := range left {
		if d < 0 {
			t.Fatalf("an attempt left %v before the pause ended", -d)
		}
		if d < 100*time.Millisecond {
			early++
		}
	}
	if early > n/2 {
		t.Errorf("%d of %d attempts left within 100 ms of the pause end; want them spread out", early, n)
	}
}

// A rate limit paces the resumption itself: no spread is added.
func TestGateRateLimitPacesAfterPause(t *testing.T) {
	g, c := newTestGate(10, 1)
	g.Rand = func() float64 { return 0.9 }
	g.PauseUntil(c.Now().Add(2 * time.Second))
	if w, err := g.Wait(context.Background()); err != nil || w != 2*time.Second {
		t.Errorf("Wait = %v, %v; want the pause alone, 2s", w, err)
	}
}

// Close refuses attempts still queued, at once, for shutdown.
func TestGateClose(t *testing.T) {
	g := New(0, 1)
	g.PauseUntil(time.Now().Add(time.Hour))
	errc := make(chan error, 1)
	go func() { _, err := g.Wait(context.Background()); errc <- err }()
	g.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("Wait during Close = %v, want ErrClosed", err)
	}
	if _, err := g.Wait(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after Close = %v, want ErrClosed", err)
	}
	g.Close() // twice is fine
}

// Free is true exactly when Wait would return at once: not with a rate
// limit, a pause in effect or a closed gate.
func TestGateFree(t *testing.T) {
	g, c := newTestGate(0, 1)
	if !g.Free() {
		t.Error("a gate without rate limit or pause is not free")
	}
	g.PauseUntil(c.Now().Add(time.Second))
	if g.Free() {
		t.Error("free during a pause")
	}
	c.Advance(time.Second)
	if !g.Free() {
		t.Error("not free once the pause is over")
	}
	if limited, _ := newTestGate(5, 1); limited.Free() {
		t.Error("a rate-limited gate is free")
	}
	g.Close()
	if g.Free() {
		t.Error("a closed gate is free")
	}
}

// Attempts that give up while queued for a token use none: 30 attempts at 10
// per second whose callers all hang up after 100 ms, then one more. It leaves within a
// few tokens' time; it waited for the tokens of all 30 (about 2.9 s) when
// each held its own reservation, because the rate package gives nothing back
// for a reservation that later ones counted on, and the earliest left first.
// Real clock; the bound is 10 tokens' time.
func TestGateLeaversUseNoTokens(t *testing.T) {
	const rate, leavers = 10, 30
	g := New(rate, 1)
	if w, err := g.Wait(context.Background()); err != nil || w != 0 {
		t.Fatalf("first Wait = %v, %v; want the burst at once", w, err)
	}
	var wg sync.WaitGroup
	left := 0
	var mu sync.Mutex
	for range leavers {
		wg.Go(func() {
			// Its client hangs up: canceled, not a deadline (a wait
			// past a deadline is refused at once, reserving nothing).
			ctx, cancel := context.WithCancel(context.Background())
			defer time.AfterFunc(100*time.Millisecond, cancel).Stop()
			if _, err := g.Wait(ctx); err != nil {
				mu.Lock()
				left++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if left < leavers-2 {
		t.Fatalf("%d of %d attempts left the line, want all but the one or two whose token came", left, leavers)
	}
	start := time.Now()
	if _, err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if took, bound := time.Since(start), 10*time.Second/rate; took > bound {
		t.Errorf("the next attempt waited %v after %d left the line, want at most %v", took.Round(time.Millisecond), left, bound)
	}
}

// Attempts leave in the order they came, a pause or not.
func TestGateFirstComeFirstServed(t *testing.T) {
	g := New(200, 1)
	g.PauseUntil(time.Now().Add(50 * time.Millisecond))
	const n = 20
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range n {
		wg.Go(func() {
			if _, err := g.Wait(context.Background()); err != nil {
				t.Error(err)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		})
		for g.holding() < i+1 { // the first is the head; the others queue in turn
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("attempts left in order %v, want their arrival order", order)
		}
	}
}

// holding counts the attempts at the Gate: the head and those in line.
func (g *Gate) holding() int {
	g.qmu.Lock()
	defer g.qmu.Unlock()
	if !g.busy {
		return 0
	}
	return 1 + g.queued
}

// An attempt queued behind others whose tokens come after its deadline is
// refused at once with ErrDeadline, as is one in line when a pause past its
// deadline is set; one that can make it waits its turn.
func TestGateDeadlineInLine(t *testing.T) {
	g, c := newTestGate(1, 1)
	if _, err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The head sleeps for its token until released.
	sleeping, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	g.Sleep = func(ctx context.Context, d time.Duration) error {
		once.Do(func() { close(sleeping); <-release })
		return c.Sleep(ctx, d)
	}
	head := make(chan error, 1)
	go func() { _, err := g.Wait(context.Background()); head <- err }()
	<-sleeping
	// Its token comes in 1 s; the next one in 2 s.
	ctx, cancel := context.WithDeadline(context.Background(), c.Now().Add(1500*time.Millisecond))
	defer cancel()
	if w, err := g.Wait(ctx); !errors.Is(err, ErrDeadline) || w != 0 {
		t.Errorf("Wait in line past the deadline = %v, %v; want ErrDeadline at once", w, err)
	}
	ctx, cancel = context.WithDeadline(context.Background(), c.Now().Add(time.Hour))
	defer cancel()
	queued := make(chan error, 1)
	go func() { _, err := g.Wait(ctx); queued <- err }()
	for g.inLine() < 1 {
		time.Sleep(time.Millisecond)
	}
	g.PauseUntil(c.Now().Add(2 * time.Hour))
	if err := <-queued; !errors.Is(err, ErrDeadline) {
		t.Errorf("Wait in line when a pause past its deadline is set = %v, want ErrDeadline", err)
	}
	if n := g.inLine(); n != 0 {
		t.Errorf("%d attempts still in line, want none", n)
	}
	close(release)
	if err := <-head; err != nil {
		t.Errorf("head: %v", err)
	}
}

// A line of attempts keeps to the rate when every wake-up is late by more
// than the interval between tokens (here 15 ms at 100 a second, as on busy
// cores at 2,000 a second): the head takes its token only after the one
// before it woke up and left, and with a burst of 1 the bucket did not count
// the time of that wake-up. Before, 40 attempts took 500 ms, the rate of
// 80 a second; now 400 ms, and never fewer than the rate allows.
func TestGateLineKeepsRateThroughLateWakeUps(t *testing.T) {
	const (
		perSecond = 100
		n         = 40
		late      = 15 * time.Millisecond
	)
	interval := time.Second / perSecond
	g, c := newTestGate(perSecond, 1)
	if w, err := g.Wait(context.Background()); err != nil || w != 0 {
		t.Fatalf("first Wait = %v, %v; want the burst at once", w, err)
	}
	start := make(chan struct{})
	g.Sleep = func(ctx context.Context, d time.Duration) error {
		<-start // the whole line is in place first
		return c.Sleep(ctx, d+late)
	}
	t0 := c.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, err := g.Wait(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	for g.holding() < n {
		time.Sleep(time.Millisecond)
	}
	close(start)
	wg.Wait()
	took := c.Now().Sub(t0)
	if limit := n*interval + late; took > limit {
		t.Errorf("%d attempts in line took %v, want at most %v (the rate, and one wake-up)", n, took, limit)
	}
	if least := (n - 1) * interval; took < least {
		t.Errorf("%d attempts in line took %v, want at least %v: faster than the rate", n, took, least)
	}
}

// AfterClose runs its functions once, at Close, or at once after it; a Gate
// not made by New never closes and never runs them.
func TestGateAfterClose(t *testing.T) {
	g := New(0, 1)
	var ran []string
	g.AfterClose(func() { ran = append(ran, "before") })
	if len(ran) != 0 {
		t.Fatalf("ran %q before Close", ran)
	}
	g.Close()
	g.Close()
	g.AfterClose(func() { ran = append(ran, "after") })
	if !slices.Equal(ran, []string{"before", "after"}) {
		t.Errorf("ran %q, want before (at Close, once) and after (at once)", ran)
	}
	var zero Gate
	zero.AfterClose(func() { t.Error("a Gate not made by New ran an AfterClose function") })
	zero.Close()
}

// An attempt that held a token when a pause began takes a new one after the
// pause: the bucket refilled to its burst meanwhile, so keeping the old token
// let burst+1 attempts leave at the pause end. With the provider's own limit
// at the same rate and burst (the sandbox, payments at 20/s burst 2), the
// extra one was refused with 429 at every pause end, which paused everyone
// again: the real binary sent 2 successes a second instead of 20.
func TestGatePauseEndLeavesNoMoreThanBurst(t *testing.T) {
	g, c := newTestGate(20, 2)
	for range 2 { // the burst is spent
		if w, err := g.Wait(context.Background()); err != nil || w != 0 {
			t.Fatalf("Wait = %v, %v; want the burst at once", w, err)
		}
	}
	end := c.Now().Add(time.Second)
	c.OnSleep = func(n int) {
		if n == 1 { // woke for its token; a 429 elsewhere pauses everyone
			g.PauseUntil(end)
		}
	}
	if _, err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !c.Now().Equal(end) {
		t.Fatalf("the held attempt left at %v, want the pause end %v", c.Now(), end)
	}
	c.OnSleep = nil
	at := []time.Duration{0}
	for range 2 {
		if _, err := g.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		at = append(at, c.Now().Sub(end))
	}
	if at[2] < 50*time.Millisecond {
		t.Errorf("attempts left at %v after the pause end; want at most the burst (2) at once, the third one interval (50ms) later", at)
	}
}
