package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeShared is a Shared whose answers the test gives; it records the calls.
type fakeShared struct {
	pause func(d time.Duration) error
	take  func(n int, maxWait time.Duration) (time.Duration, error)

	mu    sync.Mutex
	takes []int
}

func (f *fakeShared) Pause(_ context.Context, d time.Duration) error { return f.pause(d) }

func (f *fakeShared) Take(_ context.Context, n int, _ float64, _ int, maxWait time.Duration) (time.Duration, error) {
	f.mu.Lock()
	f.takes = append(f.takes, n)
	f.mu.Unlock()
	return f.take(n, maxWait)
}

func (f *fakeShared) takeCalls() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.takes)
}

// A pause is shared with the other replicas once per extension: a shorter
// pause is not sent again.
func TestGateSharesPause(t *testing.T) {
	g, c := newTestGate(0, 1)
	sent := make(chan time.Duration, 3)
	g.Shared = &fakeShared{pause: func(d time.Duration) error { sent <- d; return nil }}
	g.PauseUntil(c.Now().Add(2 * time.Second))
	if d := <-sent; d != 2*time.Second {
		t.Errorf("shared pause %v, want 2s", d)
	}
	g.PauseUntil(c.Now().Add(time.Second)) // shorter: not sent
	g.PauseUntil(c.Now().Add(5 * time.Second))
	if d := <-sent; d != 5*time.Second {
		t.Errorf("second shared pause %v, want 5s (the shorter one is not sent)", d)
	}
	if got := g.PausedUntil(); !got.Equal(c.Now().Add(5 * time.Second)) {
		t.Errorf("local pause until %v, want 5s from now", got)
	}
}

// A pause another replica set holds here and is not sent back.
func TestGatePeerPause(t *testing.T) {
	g, c := newTestGate(0, 1)
	g.Rand = func() float64 { return 0 }
	g.Shared = &fakeShared{pause: func(time.Duration) error { t.Error("a peer's pause was shared again"); return nil }}
	if !g.PeerPause(c.Now().Add(3 * time.Second)) {
		t.Error("PeerPause did not extend an empty pause")
	}
	if g.PeerPause(c.Now().Add(time.Second)) {
		t.Error("PeerPause shortened the pause")
	}
	if w, err := g.Wait(context.Background()); err != nil || w != 3*time.Second {
		t.Errorf("Wait = %v, %v; want 3s", w, err)
	}
}

// Tokens of the shared bucket: the lead the store returns delays the first;
// the burst leaves at once; one Take serves every attempt that was waiting
// when it started.
func TestGateSharedBucket(t *testing.T) {
	t.Run("lead", func(t *testing.T) {
		g, _ := newTestGate(10, 1)
		g.Shared = &fakeShared{take: func(int, time.Duration) (time.Duration, error) { return time.Second, nil }}
		if w, err := g.Wait(context.Background()); err != nil || w != time.Second {
			t.Errorf("Wait = %v, %v; want the lead, 1s", w, err)
		}
	})
	t.Run("burst and pacing", func(t *testing.T) {
		g, _ := newTestGate(10, 2)
		f := &fakeShared{take: func(int, time.Duration) (time.Duration, error) { return 0, nil }}
		g.Shared = f
		// One Take per Wait here (one attempt at a time): tokens 0 and 1
		// of a bucket with tokens saved leave at once.
		for i := range 2 {
			if w, err := g.Wait(context.Background()); err != nil || w != 0 {
				t.Errorf("Wait %d = %v, %v; want 0", i, w, err)
			}
		}
	})
	t.Run("one Take for the waiting attempts", func(t *testing.T) {
		g := New(1000, 1)
		release := make(chan struct{})
		f := &fakeShared{take: func(n int, _ time.Duration) (time.Duration, error) {
			if n == 1 {
				<-release // the first Take runs while the others queue
			}
			return 0, nil
		}}
		g.Shared = f
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := g.Wait(context.Background()); err != nil {
				t.Error(err)
			}
		})
		for len(f.takeCalls()) == 0 {
			time.Sleep(time.Millisecond)
		}
		for range 4 {
			wg.Go(func() {
				if _, err := g.Wait(context.Background()); err != nil {
					t.Error(err)
				}
			})
		}
		for g.waitingForTake() < 4 {
			time.Sleep(time.Millisecond)
		}
		close(release)
		wg.Wait()
		if got := f.takeCalls(); !slices.Equal(got, []int{1, 4}) {
			t.Errorf("Take calls for n = %v, want [1 4]: the four waiting attempts share one", got)
		}
	})
}

func (g *Gate) waitingForTake() int { return g.inLine() }

// Leased tokens not spent soon after their time are dropped: a token taken,
// then held by a pause, is not spent after the pause; a new one is taken.
func TestGateLeasedTokenDroppedAfterPause(t *testing.T) {
	g, c := newTestGate(1, 1)
	f := &fakeShared{take: func(int, time.Duration) (time.Duration, error) { return 0, nil }}
	f.pause = func(time.Duration) error { return nil }
	g.Shared = f
	if _, err := g.Wait(context.Background()); err != nil { // token 0 of a lease, at once
		t.Fatal(err)
	}
	f.take = func(int, time.Duration) (time.Duration, error) { return time.Second, nil }
	start := c.Now()
	c.OnSleep = func(n int) {
		if n == 1 { // woke for the token; a 429 pauses everyone
			g.PauseUntil(start.Add(3 * time.Second))
		}
	}
	w, err := g.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := f.takeCalls(); len(got) != 3 {
		t.Errorf("Take calls %v, want 3: the token held across the pause is dropped and a new one taken", got)
	}
	// 1 s for the first token, 2 s more of pause, 1 s lead of the new one.
	if w != 4*time.Second {
		t.Errorf("waited %v, want 4s", w)
	}
}

// While the shared store fails, the Gate uses its local share of the rate
// (rate and burst divided by the replicas last seen) and does not call the
// store again for a while; the failure is reported.
func TestGateSharedFallback(t *testing.T) {
	g, _ := newTestGate(10, 4)
	f := &fakeShared{take: func(int, time.Duration) (time.Duration, error) { return 0, errors.New("database down") }}
	g.Shared = f
	var reported []error
	g.OnSharedError = func(err error) { reported = append(reported, err) }
	g.SetReplicas(2) // 5 per second, burst 2
	var waits []time.Duration
	for range 4 {
		w, err := g.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		waits = append(waits, w)
	}
	if want := []time.Duration{0, 0, 200 * time.Millisecond, 200 * time.Millisecond}; !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v (5 per second, burst 2)", waits, want)
	}
	if got := f.takeCalls(); len(got) != 1 {
		t.Errorf("Take called %d times, want once: the store is not asked again for a while", len(got))
	}
	if len(reported) != 1 {
		t.Errorf("%d failures reported, want 1", len(reported))
	}
}

// A replica whose store fails before its first heartbeat does not know its
// share of the rate: it does not pace alone (its local bucket would be the
// whole rate, on top of the other replicas taking the whole rate from the
// store). The attempt waits for the store's next try and leaves on the
// store's token; one whose deadline comes first ends with ErrDeadline,
// having used no local token.
func TestGateSharedFallbackUnknownShare(t *testing.T) {
	g, c := newTestGate(10, 4)
	calls := 0
	f := &fakeShared{take: func(int, time.Duration) (time.Duration, error) {
		calls++
		if calls <= 2 {
			return 0, errors.New("database down")
		}
		return 0, nil
	}}
	g.Shared = f
	var reported []error
	g.OnSharedError = func(err error) { reported = append(reported, err) }
	ctx, cancel := context.WithDeadline(context.Background(), c.Now().Add(2*time.Second))
	defer cancel()
	if w, err := g.Wait(ctx); !errors.Is(err, ErrDeadline) {
		t.Errorf("Wait with a 2s deadline = %v, %v; want ErrDeadline: no local token before the share is known", w, err)
	}
	start := c.Now()
	if _, err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The store failed once more at its next try, and answered at the one
	// after: two retries' time.
	if got := c.Now().Sub(start); got != 2*sharedRetry {
		t.Errorf("Wait left %v after it began, want %v: at the store's token, after its next two tries", got, 2*sharedRetry)
	}
	if got := f.takeCalls(); len(got) != 3 {
		t.Errorf("Take called %d times, want 3: the attempt left on the store's token", len(got))
	}
	if len(reported) != 2 {
		t.Errorf("%d failures reported, want 2", len(reported))
	}
}

// A Take that times out (a slow store, or this replica starved of CPU) is
// not a store that failed: the other replicas may be taking the whole rate
// from it meanwhile, so a local share on top would exceed the provider's
// limit. The Gate takes again and the attempt leaves on the store's token;
// no local token is spent, and the slowness is reported, not a failure.
func TestGateSharedSlowTakeWaits(t *testing.T) {
	g, _ := newTestGate(10, 1)
	calls := 0
	f := &fakeShared{take: func(int, time.Duration) (time.Duration, error) {
		calls++
		if calls == 1 {
			return 0, fmt.Errorf("pgstore: take: %w", context.DeadlineExceeded)
		}
		return 300 * time.Millisecond, nil
	}}
	g.Shared = f
	var failed, slow []error
	g.OnSharedError = func(err error) { failed = append(failed, err) }
	g.OnSharedSlow = func(err error) { slow = append(slow, err) }
	g.SetReplicas(2)
	w, err := g.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if w != 300*time.Millisecond {
		t.Errorf("waited %v, want the store's lead of 300ms (not a token of the local share)", w)
	}
	if got := f.takeCalls(); len(got) != 2 {
		t.Errorf("Take called %d times, want twice: again after the one that timed out", len(got))
	}
	if len(failed) != 0 || len(slow) != 1 {
		t.Errorf("reported %d failures and %d slow takes, want 0 and 1: %v %v", len(failed), len(slow), failed, slow)
	}
}

// A store that never answers (its host hung, or its packets dropped: every
// Take times out) is down, not slow: after Takes have timed out for
// sharedRetry in a row the replica paces alone with its share, as when the
// store refuses, and goes on doing so while the Takes keep timing out. It
// used to take again for ever: with the database's processes stopped
// (SIGSTOP), three replicas sent nothing to the provider and every
// unprotected request waited its whole 2 min retry budget for a 502.
func TestGateSharedHungStoreFallsBack(t *testing.T) {
	g, c := newTestGate(10, 1)
	f := &fakeShared{take: func(int, time.Duration) (time.Duration, error) {
		c.Advance(sharedTimeout) // the call's timeout, spent
		return 0, fmt.Errorf("pgstore: take: %w", context.DeadlineExceeded)
	}}
	g.Shared = f
	var failed, slow []error
	g.OnSharedError = func(err error) { failed = append(failed, err) }
	g.OnSharedSlow = func(err error) { slow = append(slow, err) }
	g.SetReplicas(2) // 5 per second
	// Real time bounds the test; the fake clock runs a second per Take.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := c.Now()
	if _, err := g.Wait(ctx); err != nil {
		t.Fatalf("Wait = %v after %v, want a token of the local share", err, c.Now().Sub(start))
	}
	if took := c.Now().Sub(start); took > sharedRetry+sharedTimeout {
		t.Errorf("the first attempt left after %v, want at most %v", took, sharedRetry+sharedTimeout)
	}
	if len(failed) != 1 || len(slow) != 1 {
		t.Errorf("reported %d failures and %d slow takes, want 1 and 1: %v %v", len(failed), len(slow), failed, slow)
	}
	// The local share holds for sharedRetry; the store's next Take times
	// out too and the replica paces alone again at once.
	c.Advance(sharedRetry)
	calls := len(f.takeCalls())
	again := c.Now()
	if _, err := g.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if took := c.Now().Sub(again); took > sharedTimeout {
		t.Errorf("after the local share's time, the next attempt left after %v, want at most one Take's %v", took, sharedTimeout)
	}
	if got := len(f.takeCalls()) - calls; got != 1 {
		t.Errorf("Take called %d times after the local share's time, want once", got)
	}
	if len(failed) != 2 {
		t.Errorf("reported %d failures, want 2", len(failed))
	}
}

// A store that says the first token is beyond the attempt's deadline ends the
// wait at once with ErrDeadline.
func TestGateSharedDeadline(t *testing.T) {
	g, c := newTestGate(10, 1)
	g.Shared = &fakeShared{take: func(_ int, maxWait time.Duration) (time.Duration, error) {
		if maxWait > 2*time.Second {
			t.Errorf("maxWait %v, want the deadline's 2s at most", maxWait)
		}
		return 0, ErrDeadline
	}}
	ctx, cancel := context.WithDeadline(context.Background(), c.Now().Add(2*time.Second))
	defer cancel()
	if _, err := g.Wait(ctx); !errors.Is(err, ErrDeadline) {
		t.Errorf("Wait = %v, want ErrDeadline", err)
	}
}

// A leased token whose attempt gives up goes back to the lease for the next
// attempt, instead of being dropped and a new one taken from the store (where
// the one dropped stays booked, delaying every replica).
func TestGateLeasedTokenGivenBack(t *testing.T) {
	g, _ := newTestGate(10, 1)
	f := &fakeShared{take: func(int, time.Duration) (time.Duration, error) { return time.Second, nil }}
	g.Shared = f
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 { // each takes its token, a second away, and gives up
		if _, err := g.Wait(gone); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want context.Canceled", err)
		}
	}
	if w, err := g.Wait(context.Background()); err != nil || w != time.Second {
		t.Errorf("Wait = %v, %v; want the lease's first token, 1s", w, err)
	}
	if got := f.takeCalls(); !slices.Equal(got, []int{1}) {
		t.Errorf("Take calls for n = %v, want [1]: the tokens given up go back to the lease", got)
	}
}

// givingShared is a fakeShared that takes tokens back (Giver), slowly, and
// records the order of Takes and Gives.
type givingShared struct {
	fakeShared
	emu    sync.Mutex
	events []string
}

func (f *givingShared) log(e string) {
	f.emu.Lock()
	f.events = append(f.events, e)
	f.emu.Unlock()
}

func (f *givingShared) Take(ctx context.Context, n int, perSecond float64, burst int, maxWait time.Duration) (time.Duration, error) {
	f.log(fmt.Sprint("take ", n))
	return f.fakeShared.Take(ctx, n, perSecond, burst, maxWait)
}

func (f *givingShared) Give(_ context.Context, n int, _ float64) error {
	time.Sleep(20 * time.Millisecond)
	f.log(fmt.Sprint("give ", n))
	return nil
}

// When the line empties with leased tokens no attempt took (their attempts
// left), they go back to the shared bucket, so that other replicas need not
// wait for them; the next Take waits for that Give, which is of the last one.
func TestGateGivesRestBack(t *testing.T) {
	g, _ := newTestGate(10, 1)
	f := &givingShared{fakeShared: fakeShared{take: func(int, time.Duration) (time.Duration, error) { return time.Second, nil }}}
	g.Shared = f
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Wait(gone); !errors.Is(err, context.Canceled) { // takes its token, a second away, and leaves
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	if w, err := g.Wait(context.Background()); err != nil || w != time.Second {
		t.Errorf("Wait = %v, %v; want a new token, 1s", w, err)
	}
	f.emu.Lock()
	defer f.emu.Unlock()
	if want := []string{"take 1", "give 1", "take 1"}; !slices.Equal(f.events, want) {
		t.Errorf("calls %q, want %q", f.events, want)
	}
}
