package cache

import "sync"

// groupSync shares one sync among every caller that asks while another sync
// is running (group commit, leader/follower). A caller's write must be
// complete before it calls wait; wait returns the result of a sync that
// STARTED after the call, so that sync covers the write. Each caller passes
// a timestamp whose commits, and all below it, were written before its call;
// a round hands sync the largest of its callers'.
//
// The first caller with no sync running leads at once: a lone write never
// waits for a timer or for anyone else. Callers arriving while a sync runs
// join the next round; when the running round ends, one of them leads that
// round and the others follow it. A leader runs exactly one round, so no
// caller's answer is held up by rounds it does not need (docs/design/durability.md).
//
// Rounds are reused once their last caller has left (their condition
// variable shares mu), so a caller allocates nothing.
type groupSync struct {
	sync   func(ts uint64) error // syncs everything written so far; ts as wait says
	joined func()                // if set, called after a caller joined a round (tests)

	mu      sync.Mutex
	next    *syncRound // round the next callers join; nil = none open
	running bool       // a round is syncing
	free    *syncRound // a finished round nobody waits on, for reuse
}

type syncRound struct {
	cond    sync.Cond // on groupSync.mu; signalled when the turn comes, broadcast when done
	turn    bool      // the round may start; the first caller to see it leads
	led     bool      // a caller took the turn
	done    bool      // err is set
	err     error
	callers int    // callers that joined and have not yet left
	ts      uint64 // the largest timestamp its callers passed
}

// wait blocks until a sync that started after the call has finished, and
// returns its error. Every commit at or below ts was written before the call.
func (g *groupSync) wait(ts uint64) error {
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = g.free
		if r != nil {
			g.free = nil
		} else {
			r = &syncRound{}
			r.cond.L = &g.mu
		}
		g.next = r
		if !g.running {
			g.running = true
			r.turn = true
		}
	}
	r.callers++
	r.ts = max(r.ts, ts)
	if g.joined != nil {
		g.mu.Unlock()
		g.joined()
		g.mu.Lock()
	}
	for !r.done && (!r.turn || r.led) {
		r.cond.Wait()
	}
	if !r.done {
		r.led = true
		g.lead(r) // releases mu while syncing
	}
	err := r.err
	if r.callers--; r.callers == 0 {
		// Done and out of g.next (lead took it out before syncing): nobody
		// can reach it any more.
		*r = syncRound{cond: sync.Cond{L: &g.mu}}
		g.free = r
	}
	g.mu.Unlock()
	return err
}

// lead runs round r, then hands the turn to the round that filled up
// meanwhile, if any. Taking r out of g.next under mu is what closes it:
// later callers open a new round. Called with mu held, which it releases
// while syncing; returns with mu held.
func (g *groupSync) lead(r *syncRound) {
	g.next = nil
	ts := r.ts // final: nobody joins r once it is out of g.next
	g.mu.Unlock()
	err := g.sync(ts)
	g.mu.Lock()
	if n := g.next; n != nil {
		n.turn = true
		n.cond.Signal() // first, so the next sync starts while r's callers wake
	} else {
		g.running = false
	}
	r.err, r.done = err, true
	r.cond.Broadcast()
}
