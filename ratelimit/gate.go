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
	"sync/atomic"
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
	// SetReplicas. A Take that only times out is no failure: the attempt
	// waits for the store (see lead). Nil means this process is the only
	// one.
	Shared Shared
	// OnSharedError, if set, is called when a call to Shared fails (at most
	// once per few seconds for the bucket), for logs.
	OnSharedError func(error)
	// OnSharedSlow, if set, is called when a Take from Shared did not
	// answer in time (at most once per few seconds), for logs: the attempts
	// wait for the store rather than pace alone.
	OnSharedSlow func(error)

	perSecond float64
	burst     int
	limiter   *rate.Limiter // nil = no rate limit; with Shared, the fallback share
	bmu       sync.Mutex    // orders the calls that change limiter (see bucketTime)
	asked     time.Time     // the latest time given to such a call

	mu          sync.Mutex
	pausedUntil time.Time
	published   time.Time     // the latest pause end given to Shared
	extended    chan struct{} // closed when the pause is extended (see pauseSet)

	// The line of attempts waiting for a token (see Wait).
	qmu         sync.Mutex
	busy        bool    // an attempt is at the head: it alone may hold a token
	first, last *waiter // the attempts behind it, in arrival order
	queued      int

	smu       sync.Mutex    // the shared bucket's lease
	lease     lease         // tokens of the last Take
	leases    int           // Takes so far, to tell a token of the last one
	giving    chan struct{} // non-nil while a Give runs; closed when it returns
	downUntil time.Time     // Shared failed: the local share until then
	shareSet  atomic.Bool   // SetReplicas was called: the local share is known
	slowUntil time.Time     // a slow Take was reported: the next is not until then
	slowSince time.Time     // the first of the Takes timing out in a row; zero after any other end

	closed    chan struct{} // closed by Close
	closeOnce sync.Once
	cmu       sync.Mutex
	onClose   []func() // AfterClose's; nil once Close ran them
	didClose  bool
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
// Until it is first called, a Gate whose Shared fails does not pace alone:
// its attempts wait for the store (see sharedTicket).
func (g *Gate) SetReplicas(n int) {
	if g.limiter == nil || n < 1 {
		return
	}
	defer g.shareSet.Store(true)
	g.bmu.Lock()
	defer g.bmu.Unlock()
	now := g.bucketTime(g.now())
	g.limiter.SetLimitAt(now, rate.Limit(g.perSecond/float64(n)))
	g.limiter.SetBurstAt(now, max(g.burst/n, 1))
}

// PacesAlone says what the Gate does with its attempts while Shared fails:
// true when it paces them alone with its local share of the rate (a rate
// limit is set and SetReplicas was called), false when they wait for the
// store (no share known yet) or when no rate limit paces them at all.
func (g *Gate) PacesAlone() bool {
	return g.limiter != nil && g.shareSet.Load()
}

// RateLimited says whether a rate limit paces the attempts.
func (g *Gate) RateLimited() bool { return g.limiter != nil }

// bucketTime returns t, or the latest time given to limiter if that is later,
// and records it as the latest, with bmu held. The bucket counts the tokens
// of the time between two calls: a call given a time before the last one's
// would have it count some of that time again.
func (g *Gate) bucketTime(t time.Time) time.Time {
	if t.Before(g.asked) {
		t = g.asked
	}
	g.asked = t
	return t
}

// allow takes a token now if the local bucket has one.
func (g *Gate) allow(now time.Time) bool {
	g.bmu.Lock()
	defer g.bmu.Unlock()
	return g.limiter.AllowN(g.bucketTime(now), 1)
}

// Wait blocks until the pause, if any, is over and a rate token is available,
// and reports how long it waited. If ctx has a deadline that comes before the
// attempt could leave, Wait returns an error wrapping [ErrDeadline] at once,
// without sleeping. If ctx is done while waiting, Wait returns ctx's error.
// A pause set or extended while Wait sleeps is honoured: it re-checks after
// every sleep.
//
// With a rate limit, attempts wait in line, first come first served, and only
// the one at the head holds a token (a reservation of the local bucket or a
// token of the shared bucket's lease). An attempt that leaves the line uses
// none: one behind the head had taken nothing, and the head gives its token
// back, to the local bucket or to the lease for the next in line. (A local
// reservation made behind others' cannot be given back whole: the rate
// package restores only what no later reservation counted on, so attempts
// that all reserved at once and left in order returned nothing, and the next
// one waited for the tokens of every attempt that had left.)
func (g *Gate) Wait(ctx context.Context) (time.Duration, error) {
	if g.limiter == nil {
		return g.pass(ctx, 0, false)
	}
	g.qmu.Lock()
	if g.busy {
		w, err := g.enqueue(ctx) // unlocks qmu
		if err != nil {
			return 0, err
		}
		waited, err := g.awaitTurn(ctx, w)
		if err != nil {
			return waited, err
		}
		defer g.passTurn()
		return g.pass(ctx, waited, true)
	}
	// No one in line: a token available now is taken at once, without a
	// reservation (nothing allocated); otherwise this attempt is the head.
	if now := g.now(); g.Shared == nil && !g.isClosed() && !g.PausedUntil().After(now) && g.allow(now) {
		g.qmu.Unlock()
		return 0, nil
	}
	g.busy = true
	g.qmu.Unlock()
	defer g.passTurn()
	return g.pass(ctx, 0, false)
}

// pass is the wait of the head of the line (or of any attempt, without a
// rate limit): the pause, then its token. waited is the time already spent
// in line; next says the attempt became the head as the one before it left
// (see reserve).
func (g *Gate) pass(ctx context.Context, waited time.Duration, next bool) (time.Duration, error) {
	var (
		held time.Duration // time spent in a pause
		tk   ticket        // the token held once taken; kept across re-checks
	)
	for {
		if g.isClosed() {
			g.giveBack(tk)
			return waited, ErrClosed
		}
		d, paused, err := g.delay(ctx, &tk, next && held == 0)
		if err != nil {
			return waited, err
		}
		if paused {
			// A token held from before the pause is not spent at its end: the
			// bucket refills to its burst meanwhile, and that token on top of
			// it would send burst+1 attempts at once, one more than a provider
			// with the same limit lets through (its 429 pauses everyone again).
			g.giveBack(tk)
			tk = ticket{}
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

// waiter is an attempt in line behind the head.
type waiter struct {
	prev, next *waiter
	turn       chan struct{} // closed when it becomes the head
}

// enqueue puts an attempt in line, with g.qmu held on entry and released on
// return. If ctx's deadline comes before the attempt could leave, counting a
// token for each attempt ahead of it, it returns an error wrapping
// ErrDeadline instead.
func (g *Gate) enqueue(ctx context.Context) (*waiter, error) {
	defer g.qmu.Unlock()
	if deadline, ok := ctx.Deadline(); ok {
		now := g.now()
		if d := g.lineDelay(now, g.queued+1); !now.Add(d).Before(deadline) {
			return nil, fmt.Errorf("ratelimit: wait %v in line: %w", d, ErrDeadline)
		}
	}
	w := &waiter{turn: make(chan struct{}), prev: g.last}
	if g.last != nil {
		g.last.next = w
	} else {
		g.first = w
	}
	g.last = w
	g.queued++
	return w, nil
}

// lineDelay is how long from now the k-th attempt behind the head would wait
// at least, if the head and each attempt ahead of it took one token: the
// rest of the pause, or its token's time, whichever is later.
func (g *Gate) lineDelay(now time.Time, k int) time.Duration {
	d := max(g.PausedUntil().Sub(now), 0)
	if g.Shared != nil {
		g.smu.Lock()
		defer g.smu.Unlock()
		if !now.Before(g.downUntil) {
			if at, ok := g.lease.peek(k - 1); ok {
				d = max(d, at.Sub(now))
			}
			return d
		}
	}
	// The head's reservation, if made, is counted in the tokens already.
	if lack := float64(k) - g.limiter.TokensAt(now); lack > 0 {
		d = max(d, time.Duration(lack/float64(g.limiter.Limit())*float64(time.Second)))
	}
	return d
}

// awaitTurn waits until w is the head of the line. If the attempt leaves
// first (ctx done, Close, or a pause set meanwhile that outlasts ctx's
// deadline), it leaves the line having used no token.
func (g *Gate) awaitTurn(ctx context.Context, w *waiter) (time.Duration, error) {
	start := g.now()
	deadline, hasDeadline := ctx.Deadline()
	var err error
	for err == nil {
		var pauseSet <-chan struct{}
		if hasDeadline {
			pauseSet = g.pauseSet()
			if p := g.PausedUntil(); !p.Before(deadline) {
				err = fmt.Errorf("ratelimit: paused for %v: %w", p.Sub(g.now()), ErrDeadline)
				break
			}
		}
		select {
		case <-w.turn:
			return g.now().Sub(start), nil
		case <-pauseSet: // re-check the pause against the deadline
		case <-ctx.Done():
			err = fmt.Errorf("ratelimit: wait in line: %w", ctx.Err())
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("ratelimit: wait in line: %w: %w", ErrDeadline, ctx.Err())
			}
		case <-g.closed:
			err = ErrClosed
		}
	}
	g.qmu.Lock()
	select {
	case <-w.turn: // made the head meanwhile: the turn goes to the next
		g.qmu.Unlock()
		g.passTurn()
	default:
		g.unlink(w)
		g.qmu.Unlock()
	}
	return g.now().Sub(start), err
}

// passTurn makes the first attempt in line the head, as the head leaves.
func (g *Gate) passTurn() {
	g.qmu.Lock()
	defer g.qmu.Unlock()
	w := g.first
	if w == nil {
		g.busy = false
		if g.Shared != nil {
			g.giveRest()
		}
		return
	}
	g.unlink(w)
	close(w.turn)
}

// unlink takes w out of the line, with g.qmu held.
func (g *Gate) unlink(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		g.first = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		g.last = w.prev
	}
	w.prev, w.next = nil, nil
	g.queued--
}

// inLine is how many attempts wait in line behind the head.
func (g *Gate) inLine() int {
	g.qmu.Lock()
	defer g.qmu.Unlock()
	return g.queued
}

// pauseSet returns a channel closed when the pause is next extended.
func (g *Gate) pauseSet() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.extended == nil {
		g.extended = make(chan struct{})
	}
	return g.extended
}

// extendedLocked tells the attempts in line that the pause was extended,
// with g.mu held.
func (g *Gate) extendedLocked() {
	if g.extended != nil {
		close(g.extended)
		g.extended = nil
	}
}

// giveBack returns the token of a wait that failed, so that it does not slow
// the others: a local reservation goes back to the bucket (whole, as it is
// the only one outstanding), a leased token to the lease, for the next in
// line. The shared bucket itself keeps it booked.
func (g *Gate) giveBack(tk ticket) {
	if tk.res != nil {
		g.bmu.Lock()
		tk.res.CancelAt(g.bucketTime(g.now()))
		g.bmu.Unlock()
	}
	if !tk.expires.IsZero() {
		g.smu.Lock()
		g.lease.putBack(tk)
		g.smu.Unlock()
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
		g.closeOnce.Do(func() {
			close(g.closed)
			g.cmu.Lock()
			fs := g.onClose
			g.onClose, g.didClose = nil, true
			g.cmu.Unlock()
			for _, f := range fs {
				f()
			}
		})
	}
}

// AfterClose arranges for f to run once Close is called (at once, if it
// was): for what holds attempts past the Gate, such as a wait for a pooled
// connection, that must not leave after the shutdown either. A Gate not
// made by New never closes, and never runs f.
func (g *Gate) AfterClose(f func()) {
	if g.closed == nil {
		return
	}
	g.cmu.Lock()
	if !g.didClose {
		g.onClose = append(g.onClose, f)
		g.cmu.Unlock()
		return
	}
	g.cmu.Unlock()
	f()
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
// together when the pause ends. next is reserve's.
func (g *Gate) delay(ctx context.Context, tk *ticket, next bool) (d time.Duration, paused bool, err error) {
	now := g.now()
	if p := g.PausedUntil().Sub(now); p > 0 {
		return p, true, nil
	}
	if g.limiter == nil {
		return 0, false, nil
	}
	if tk.none(now) {
		if *tk, err = g.reserve(ctx, now, next); err != nil {
			return 0, false, err
		}
		now = g.now()
	}
	return tk.at.Sub(now), false, nil
}

// reserve takes one token: from the shared bucket when there is one and it
// answers, else from the local one.
//
// next says that the attempt became the head of the line as the one before
// it left, and no pause held it since: the line has been waiting all along,
// and the token is reserved as of up to one token's interval ago (never
// before the bucket's last call). The head takes its token only once the one
// before it has woken up and left; with a burst of 1, the bucket, full
// meanwhile, would not count the time of that wake-up, and a line of
// attempts would leave at the rate of wake-ups instead of the rate (on two
// busy cores, 1,230-1,630 a second at 2,000). Counted from a moment that
// late, a wake-up shorter than the interval is not lost: the line keeps to
// the bucket's schedule, and at most one attempt leaves early, right after a
// late one, which the bucket counted from then.
func (g *Gate) reserve(ctx context.Context, now time.Time, next bool) (ticket, error) {
	if g.Shared != nil {
		tk, ok, err := g.sharedTicket(ctx)
		if err != nil || ok {
			return tk, err
		}
		now = g.now()
	}
	// ReserveN, not Wait: the limiter reads our clock, so tests fix time.
	// burst >= 1 and n == 1, so the reservation is always OK.
	asOf := now
	if next {
		asOf = now.Add(-time.Duration(float64(time.Second) / float64(g.limiter.Limit())))
	}
	g.bmu.Lock()
	res := g.limiter.ReserveN(g.bucketTime(asOf), 1)
	g.bmu.Unlock()
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
		g.extendedLocked()
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
	g.extendedLocked()
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
