package cache

import "sync"

// groupSync shares one sync among every caller that asks while another sync
// is running (group commit, leader/follower). A caller's write must be
// complete before it calls wait; wait returns the result of a sync that
// STARTED after the call, so that sync covers the write.
//
// The first caller with no sync running leads at once: a lone write never
// waits for a timer or for anyone else. Callers arriving while a sync runs
// join the next round; when the running round ends, one of them leads that
// round and the others follow it. A leader runs exactly one round, so no
// caller's answer is held up by rounds it does not need (docs/design/durability.md).
//
// A round is one small allocation (its condition variable shares mu); a
// caller allocates nothing of its own.
type groupSync struct {
	sync   func() error // syncs everything written so far
	joined func()       // if set, called after a caller joined a round (tests)

	mu      sync.Mutex
	next    *syncRound // round the next callers join; nil = none open
	running bool       // a round is syncing
}

type syncRound struct {
	cond sync.Cond // on groupSync.mu; signalled when the turn comes, broadcast when done
	turn bool      // the round may start; the first caller to see it leads
	led  bool      // a caller took the turn
	done bool      // err is set
	err  error
}

// wait blocks until a sync that started after the call has finished, and
// returns its error.
func (g *groupSync) wait() error {
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = &syncRound{}
		r.cond.L = &g.mu
		g.next = r
		if !g.running {
			g.running = true
			r.turn = true
		}
	}
	if g.joined != nil {
		g.mu.Unlock()
		g.joined()
		g.mu.Lock()
	}
	for !r.done && (!r.turn || r.led) {
		r.cond.Wait()
	}
	if r.done {
		g.mu.Unlock()
		return r.err
	}
	r.led = true
	g.lead(r) // unlocks mu
	return r.err
}

// lead runs round r, then hands the turn to the round that filled up
// meanwhile, if any. Taking r out of g.next under mu is what closes it:
// later callers open a new round. Called with mu held; returns without.
func (g *groupSync) lead(r *syncRound) {
	g.next = nil
	g.mu.Unlock()
	err := g.sync()
	g.mu.Lock()
	if n := g.next; n != nil {
		n.turn = true
		n.cond.Signal() // first, so the next sync starts while r's callers wake
	} else {
		g.running = false
	}
	r.err, r.done = err, true
	r.cond.Broadcast()
	g.mu.Unlock()
}
