package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/time/rate"
)

// Shared is the provider-wide throttle that replicas sharing one store hold
// together: a pause one replica sets holds for all, and one token bucket
// paces them all, so that IDEMPROXY_RATE_LIMIT is the provider's total. A
// Gate without it keeps both in its own process, which is right for one
// replica. The implementation also tells the Gate, through [Gate.PeerPause]
// and [Gate.SetReplicas], about pauses other replicas set and how many
// replicas are alive.
type Shared interface {
	// Pause makes every replica pause for d from now, by the store's
	// clock. It never shortens a longer pause.
	Pause(ctx context.Context, d time.Duration) error
	// Take takes n tokens from the provider's bucket, which refills at
	// perSecond up to burst, and returns the bucket's lead: how far ahead
	// of now its schedule stood before these tokens (0 when it had tokens
	// saved). Token i (from 0) may leave lead+(i+1-burst)/perSecond from
	// now, and not before now. When the lead is more than maxWait, Take
	// takes nothing and returns an error wrapping [ErrDeadline].
	Take(ctx context.Context, n int, perSecond float64, burst int, maxWait time.Duration) (time.Duration, error)
}

// Giver is a [Shared] that can take back tokens no attempt will spend: the
// last n tokens of the last Take, which the Gate leased and then found no
// attempt for (their attempts left while waiting). Give changes nothing if
// any replica took tokens since, as those were placed after these.
type Giver interface {
	Give(ctx context.Context, n int, perSecond float64) error
}

const (
	// sharedTimeout bounds one call to the Shared store made for an
	// attempt. A Take that does not answer within it is not a store that
	// failed: the Gate takes again (see lead) rather than fall back to its
	// local share, since the other replicas may still be taking the whole
	// rate from the store.
	sharedTimeout = time.Second
	// sharedRetry is how long the Gate uses its local share after a failed
	// call before it tries the Shared store again.
	sharedRetry = 5 * time.Second
	// leaseSlack is how long after its time a leased token may still be
	// spent. Tokens not spent by then are dropped, so that tokens saved
	// while idle cannot leave together later: in any window of w, the
	// replicas together send at most perSecond*(w+leaseSlack)+burst, plus
	// the tokens of the difference between their round trips to the store
	// (each places its tokens from the time the answer reached it).
	leaseSlack = 100 * time.Millisecond
	// noDeadline is the maxWait of a Take for an attempt without deadline.
	noDeadline = time.Hour
)

// ticket is what lets one attempt leave: a time, taken either from the local
// bucket (res, given back if the attempt does not leave) or from a lease of
// the shared one (valid until expires, dropped after; given back to the lease
// if the attempt does not leave).
type ticket struct {
	at      time.Time
	expires time.Time // zero for a local reservation
	res     *rate.Reservation
	lease   int // the leased token's Take (Gate.leases) and index in it
	index   int
}

// none says whether t holds nothing yet, or a leased token whose time to be
// spent is past: the attempt needs a new one.
func (t ticket) none(now time.Time) bool {
	if t.res == nil && t.expires.IsZero() {
		return true
	}
	return !t.expires.IsZero() && !now.Before(t.expires)
}

// lease is the tokens of one Take, handed to this replica's attempts in
// order. Token i leaves at start+(i+1-burst)*every, never before got.
type lease struct {
	start, got time.Time
	every      time.Duration
	burst      int
	n, next    int
	id         int // Gate.leases when it was taken
}

func (l *lease) at(i int) time.Time {
	at := l.start.Add(time.Duration(i+1-l.burst) * l.every)
	if at.Before(l.got) {
		at = l.got
	}
	return at
}

// take hands out the next token whose time has not passed by more than
// leaseSlack; the ones that have are dropped.
func (l *lease) take(now time.Time) (ticket, bool) {
	for ; l.next < l.n; l.next++ {
		at := l.at(l.next)
		if exp := at.Add(leaseSlack); now.Before(exp) {
			l.next++
			return ticket{at: at, expires: exp, lease: l.id, index: l.next - 1}, true
		}
	}
	return ticket{}, false
}

// putBack returns the token last handed out, unspent, for the next attempt.
// Only the head of the line holds a token, so it is the last handed out
// unless the lease was replaced since.
func (l *lease) putBack(tk ticket) {
	if tk.lease == l.id && tk.index == l.next-1 {
		l.next--
	}
}

// peek returns the time of the token k places after the next one to be
// handed out, if the lease holds it.
func (l *lease) peek(k int) (time.Time, bool) {
	if i := l.next + k; i < l.n {
		return l.at(i), true
	}
	return time.Time{}, false
}

// giveRest hands the tokens left in the lease back to the shared bucket, in
// the background, when the line has just emptied: no attempt waits for them,
// and attempts that left while waiting would otherwise keep them booked for
// every replica. Called with g.qmu held; the lease hands them out no more.
func (g *Gate) giveRest() {
	giver, ok := g.Shared.(Giver)
	if !ok {
		return
	}
	g.smu.Lock()
	defer g.smu.Unlock()
	n := g.lease.n - g.lease.next
	if n <= 0 || g.giving != nil {
		return
	}
	g.lease.n = g.lease.next
	done := make(chan struct{})
	g.giving = done // the next Take waits for it: Give is of the last Take
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
		defer cancel()
		if err := giver.Give(ctx, n, g.perSecond); err != nil {
			g.sharedFailed(fmt.Errorf("ratelimit: give back %d tokens to the shared bucket: %w", n, err))
		}
		g.smu.Lock()
		g.giving = nil
		close(done)
		g.smu.Unlock()
	}()
}

// sharedTicket takes a token of the shared bucket for the head of the line.
// When the lease has none left it runs one Take for the head and every
// attempt in line behind it, so that under load one round trip serves many
// attempts. ok is false while the shared store failed recently: the caller
// uses the local share then.
//
// A replica whose share is not known yet (no SetReplicas: the store failed
// before its first heartbeat, as when it starts while the database is down)
// does not pace alone: its share would be the whole rate, on top of the
// other replicas taking the whole rate from the store. The head waits for
// the store's next try instead, until its deadline or Close.
func (g *Gate) sharedTicket(ctx context.Context) (tk ticket, ok bool, err error) {
	g.smu.Lock()
	defer g.smu.Unlock()
	for {
		now := g.now()
		if now.Before(g.downUntil) {
			if g.shareSet.Load() {
				return ticket{}, false, nil
			}
			until := g.downUntil
			g.smu.Unlock()
			err := g.sleepWithin(ctx, now, until.Sub(now))
			g.smu.Lock()
			if err != nil {
				return ticket{}, true, err
			}
			continue
		}
		if tk, ok := g.lease.take(now); ok {
			return tk, true, nil
		}
		if err := g.lead(ctx); err != nil {
			return ticket{}, true, err
		}
	}
}

// lead runs one Take, for the head and the attempts in line behind it, with
// g.smu held on entry and exit (released during the call: g.qmu is taken
// before it, never after) and installs the lease, or marks the store down.
//
// A Take that timed out (sharedTimeout) leaves the store up: the caller
// takes again. The store answered slowly (a busy database, or this replica
// starved of CPU), and the other replicas may be taking from it at the whole
// rate all along: a local share on top of theirs would exceed the
// provider's rate limit (two replicas on two loaded cores: a replica that
// timed out paced alone for 5 s at the rate its last heartbeat allowed,
// while the other took the whole bucket). The attempt waits for the store
// instead, until its own deadline or Close. But a store whose Takes have
// all timed out for sharedRetry is not slow: it is hung or cut off (its
// processes stopped, its packets dropped), and waiting for it would send
// nothing for as long as it lasts, every attempt ending at its deadline. It
// is down then, and the local share paces until a Take answers again.
func (g *Gate) lead(ctx context.Context) error {
	for g.giving != nil {
		done := g.giving
		g.smu.Unlock()
		<-done
		g.smu.Lock()
	}
	g.smu.Unlock()
	l, err := g.takeLease(ctx, 1+g.inLine())
	g.smu.Lock()
	switch {
	case err == nil:
		g.slowSince = time.Time{}
		g.leases++
		l.id = g.leases
		g.lease = l
	case errors.Is(err, ErrDeadline), ctx.Err() != nil:
		return err
	case g.isClosed():
		return ErrClosed
	case errors.Is(err, context.DeadlineExceeded):
		now := g.now()
		if g.slowSince.IsZero() {
			g.slowSince = now
		}
		if hung := now.Sub(g.slowSince); hung >= sharedRetry {
			// Left set: the next Take that times out falls back at once.
			g.downUntil = now.Add(sharedRetry)
			g.sharedFailed(fmt.Errorf("no answer for %v: %w", hung.Round(time.Second)+sharedTimeout, err))
			break
		}
		if !now.Before(g.slowUntil) {
			g.slowUntil = now.Add(sharedRetry)
			if g.OnSharedSlow != nil {
				g.OnSharedSlow(err)
			}
		}
	default:
		g.slowSince = time.Time{}
		g.downUntil = g.now().Add(sharedRetry)
		g.sharedFailed(err)
	}
	return nil
}

func (g *Gate) takeLease(ctx context.Context, n int) (lease, error) {
	maxWait := noDeadline
	if d, ok := ctx.Deadline(); ok {
		maxWait = d.Sub(g.now())
	}
	ctx, cancel := context.WithTimeout(ctx, sharedTimeout)
	defer cancel()
	ctx, stop := g.UntilClosed(ctx) // a Take still waiting at Close is given up
	defer stop()
	lead, err := g.Shared.Take(ctx, n, g.perSecond, g.burst, maxWait)
	if err != nil {
		return lease{}, fmt.Errorf("ratelimit: shared bucket: %w", err)
	}
	now := g.now()
	return lease{start: now.Add(lead), got: now, every: time.Duration(float64(time.Second) / g.perSecond),
		burst: g.burst, n: n}, nil
}

// publish shares a pause of d from now with the other replicas, in the
// background: the local pause already holds.
func (g *Gate) publish(d time.Duration) {
	if d <= 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
		defer cancel()
		if err := g.Shared.Pause(ctx, d); err != nil {
			g.sharedFailed(fmt.Errorf("ratelimit: share a pause of %v: %w", d, err))
		}
	}()
}

func (g *Gate) sharedFailed(err error) {
	if g.OnSharedError != nil {
		g.OnSharedError(err)
	}
}
