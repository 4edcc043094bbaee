// Package ratelimit paces outbound attempts to one provider: a token bucket
// for the configured requests per second, and a provider-wide pause that a
// 429/503 Retry-After sets, during which no attempt leaves at all: the
// provider asked for a pause of all traffic, not of the one request.
//
// One replica keeps both in its process (golang.org/x/time/rate). Replicas
// sharing a store keep them in the store through [Shared], so that the pause
// holds for all and the rate is the provider's total.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// ErrDeadline is returned by [Gate.Wait] when the attempt could not leave
// before the context's deadline. Wait returns it at once instead of sleeping
// into a deadline it cannot meet: a wait that would overrun the retry budget
// ends the attempt sequence (docs/retries.md: a total budget).
var ErrDeadline = errors.New("ratelimit: wait would pass the deadline")

// ErrClosed is returned by [Gate.Wait] once [Gate.Close] was called: the
// process is shutting down and the attempt must not leave.
var ErrClosed = errors.New("ratelimit: gate closed for shutdown")

// DefaultSpread is the window over which attempts held by a pause resume
// when no rate limit paces them (see [Gate.Spread]).
const DefaultSpread = time.Second

// Gate paces outbound attempts and holds the provider-wide pause. All its
// methods are safe for concurrent use. Create it with [New]; set Now and Sleep
// before first use, if at all.
type Gate struct {
	// Now returns the current time. If nil, time.Now is used.
	Now func() time.Time
	// Sleep waits for d or until ctx is done, returning ctx's error in the
	// latter case. If nil, a timer that honours ctx is used.
	Sleep func(ctx context.Context, d time.Duration) error
	// Spread is the window over which attempts held by a pause resume when
	// no rate limit paces them: each waits a random part of it (at most the
	// time it was held) after the pause ends, so that hundreds of queued
	// attempts do not reach the provider in the same milliseconds right
	// after it said 429. Zero means DefaultSpread; negative disables it.
	Spread time.Duration
	// Rand returns a float in [0, 1) for the spread. If nil, math/rand/v2.
	Rand func() float64
	// Shared, if set, holds the pause and the token bucket together with the
	// other replicas sharing a store. While a call to it fails, the Gate
	// works alone for a few seconds at a time: the pause it knows, and a
	// local bucket of the rate divided by the replica count last given to
	// SetReplicas. Nil means this process is the only one.
	Shared Shared
	// OnSharedError, if set, is called when a call to Shared fails (at most
	// once per few seconds for the bucket), for logs.
	OnSharedError func(error)

	perSecond float64
	burst     int
	limiter   *rate.Limiter // nil = no rate limit; with Shared, the fallback share

	mu          sync.Mutex
	pausedUntil time.Time
	published   time.Time // the latest pause end given to Shared

	smu       sync.Mutex    // the shared bucket's lease
	lease     lease         // tokens of the last Take
	leasing   chan struct{} // non-nil while a Take runs; closed when it returns
	waiting   int           // attempts waiting for the running Take
	downUntil time.Time     // Shared failed: the local share until then

	closed    chan struct{} // closed by Close
	closeOnce sync.Once
}

// New returns a Gate allowing perSecond attempts per second with the given
// burst. perSecond <= 0 means no rate limit (the pause still works); a burst
// below 1 is raised to 1, because a zero burst would refuse every attempt.
func New(perSecond float64, burst int) *Gate {
	g := &Gate{closed: make(chan struct{}), perSecond: perSecond, burst: max(burst, 1)}
	if perSecond > 0 {
		g.limiter = rate.NewLimiter(rate.Limit(perSecond), g.burst)
	}
	return g
}

// SetReplicas sets how many replicas share the provider, n >= 1: the local
// bucket used while Shared fails then allows the rate and the burst divided
// by n (the burst at least 1), so that together they stay near the total.
func (g *Gate) SetReplicas(n int) {
	if g.limiter == nil || n < 1 {
		return
	}
	g.limiter.SetLimit(rate.Limit(g.perSecond / float64(n)))
	g.limiter.SetBurst(max(g.burst/n, 1))
}

// Wait blocks until the pause, if any, is over and a rate token is available,
// and reports how long it waited. If ctx has a deadline that comes before the
// attempt could leave, Wait returns an error wrapping [ErrDeadline] at once,
// without sleeping. If ctx is done while waiting, Wait returns ctx's error.
// A pause set or extended while Wait sleeps is honoured: it re-checks after
// every sleep.
func (g *Gate) Wait(ctx context.Context) (time.Duration, error) {
	var (
		waited time.Duration
		held   time.Duration // time spent in a pause
		tk     ticket        // the token held once taken; kept across re-checks
	)
	for {
		if g.isClosed() {
			g.giveBack(tk)
			return waited, ErrClosed
		}
		d, paused, err := g.delay(ctx, &tk)
		if err != nil {
			return waited, err
		}
		now := g.now()
		if d <= 0 && held > 0 {
			d, held = g.spread(held), 0 // once, after the pause
		}
		if d <= 0 {
			return waited, nil
		}
		if err := g.sleepWithin(ctx, now, d); err != nil {
			g.giveBack(tk)
			return waited, err
		}
		waited += d
		if paused {
			held += d
		}
	}
}

// giveBack returns a locally reserved token so that a failed wait does not
// slow the others. A leased token cannot go back: it is dropped.
func (g *Gate) giveBack(tk ticket) {
	if tk.res != nil {
		tk.res.CancelAt(g.now())
	}
}

// spread is the extra wait of an attempt held for held by a pause: none when
// a rate limit paces the resumption anyway, else a random part of
// min(Spread, held).
func (g *Gate) spread(held time.Duration) time.Duration {
	w := g.Spread
	if w == 0 {
		w = DefaultSpread
	}
	if g.limiter != nil || w < 0 {
		return 0
	}
	rnd := g.Rand
	if rnd == nil {
		rnd = rand.Float64
	}
	return time.Duration(rnd() * float64(min(w, held)))
}

// Close makes every Wait, running or to come, return ErrClosed at once:
// attempts still queued at shutdown are refused instead of being held until
// the grace runs out. Calling it again does nothing.
func (g *Gate) Close() {
	if g.closed != nil { // a Gate not made by New cannot be closed
		g.closeOnce.Do(func() { close(g.closed) })
	}
}

// Free says whether Wait would return at once without waiting: the Gate is
// open, no pause holds attempts and no rate limit paces them. A caller that
// would build a context only for Wait checks it first.
func (g *Gate) Free() bool {
	return !g.isClosed() && g.limiter == nil && !g.PausedUntil().After(g.now())
}

func (g *Gate) isClosed() bool {
	select {
	case <-g.closed:
		return true
	default:
		return false
	}
}

// delay reports how long the caller must still wait from now: the rest of the
// pause first (paused is true then), then the wait for its token. It takes
// the token on the first call after the pause is over and keeps it in tk, so
// that re-checks do not spend two; a leased token whose time passed during a
// pause is dropped and a new one taken, so that held tokens do not all leave
// together when the pause ends.
func (g *Gate) delay(ctx context.Context, tk *ticket) (d time.Duration, paused bool, err error) {
	now := g.now()
	if p := g.PausedUntil().Sub(now); p > 0 {
		return p, true, nil
	}
	if g.limiter == nil {
		return 0, false, nil
	}
	if tk.none(now) {
		if *tk, err = g.reserve(ctx, now); err != nil {
			return 0, false, err
		}
		now = g.now()
	}
	return tk.at.Sub(now), false, nil
}

// reserve takes one token: from the shared bucket when there is one and it
// answers, else from the local one.
func (g *Gate) reserve(ctx context.Context, now time.Time) (ticket, error) {
	if g.Shared != nil {
		tk, ok, err := g.sharedTicket(ctx)
		if err != nil || ok {
			return tk, err
		}
		now = g.now()
	}
	// ReserveN, not Wait: the limiter reads our clock, so tests fix time.
	// burst >= 1 and n == 1, so the reservation is always OK.
	res := g.limiter.ReserveN(now, 1)
	return ticket{at: now.Add(res.DelayFrom(now)), res: res}, nil
}

// sleepWithin sleeps d unless that would reach ctx's deadline, in which case
// it fails at once with ErrDeadline.
func (g *Gate) sleepWithin(ctx context.Context, now time.Time, d time.Duration) error {
	if deadline, ok := ctx.Deadline(); ok && !now.Add(d).Before(deadline) {
		return fmt.Errorf("ratelimit: wait %v: %w", d, ErrDeadline)
	}
	ctx, cancel := g.UntilClosed(ctx)
	defer cancel()
	if err := g.sleep(ctx, d); err != nil {
		if errors.Is(context.Cause(ctx), ErrClosed) {
			return ErrClosed
		}
		return fmt.Errorf("ratelimit: wait %v: %w", d, err)
	}
	return nil
}

// UntilClosed returns a copy of ctx that is also done once Close is called,
// with [ErrClosed] as its cause (context.Cause), and the function that
// releases it. A caller that sleeps before its next Wait (a retry's backoff
// or Retry-After) sleeps on it: after Close, Wait lets no attempt out, so
// sleeping on would only hold the answer until the shutdown grace ran out.
func (g *Gate) UntilClosed(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	if g.closed == nil { // a Gate not made by New never closes
		return ctx, func() { cancel(nil) }
	}
	stop := context.AfterFunc(closedContext{g.closed}, func() { cancel(ErrClosed) })
	return ctx, func() { stop(); cancel(nil) }
}

// closedContext is a context done when the gate closes, so that a sleeping
// Wait wakes up at Close.
type closedContext struct{ done chan struct{} }

func (c closedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c closedContext) Done() <-chan struct{}       { return c.done }
func (c closedContext) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}
func (c closedContext) Value(any) any { return nil }

// PauseUntil pauses all attempts until t, and with Shared, those of the other
// replicas too. It only ever extends the pause: a t before the current pause
// end is ignored, so a short Retry-After from one response cannot cut short a
// longer one from another.
func (g *Gate) PauseUntil(t time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.After(g.pausedUntil) {
		g.pausedUntil = t
	}
	if g.Shared != nil && t.After(g.published) {
		g.published = t
		g.publish(t.Sub(g.now()))
	}
}

// PeerPause pauses this replica's attempts until t because another replica
// paused the provider (see [Shared]). Like PauseUntil it only extends the
// pause; it reports whether it did.
func (g *Gate) PeerPause(t time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !t.After(g.pausedUntil) {
		return false
	}
	g.pausedUntil = t
	return true
}

// PausedUntil returns the end of the pause; the zero time if none was set.
// A time in the past means the pause is over.
func (g *Gate) PausedUntil() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pausedUntil
}

func (g *Gate) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

func (g *Gate) sleep(ctx context.Context, d time.Duration) error {
	if g.Sleep != nil {
		return g.Sleep(ctx, d)
	}
	return SleepContext(ctx, d)
}

// SleepContext waits for d or until ctx is done, whichever comes first, and
// returns ctx's error in the latter case. It is the default Sleep of [Gate]
// and of the retry transport.
func SleepContext(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
