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
type groupSync struct {
	sync   func() error // syncs everything written so far
	joined func()       // if set, called after a caller joined a round (tests)

	mu      sync.Mutex
	next    *syncRound // round the next callers join; nil = none open
	running bool       // a round is syncing
}

type syncRound struct {
	turn chan struct{} // receives one token when the round may start; its taker leads
	done chan struct{} // closed when err is set
	err  error
}

// wait blocks until a sync that started after the call has finished, and
// returns its error.
func (g *groupSync) wait() error {
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = &syncRound{turn: make(chan struct{}, 1), done: make(chan struct{})}
		g.next = r
		if !g.running {
			g.running = true
			r.turn <- struct{}{}
		}
	}
	g.mu.Unlock()
	if g.joined != nil {
		g.joined()
	}
	select {
	case <-r.done:
	case <-r.turn:
		g.lead(r)
	}
	return r.err
}

// lead runs round r, then hands the turn to the round that filled up
// meanwhile, if any. Taking r out of g.next under mu is what closes it:
// later callers open a new round.
func (g *groupSync) lead(r *syncRound) {
	g.mu.Lock()
	g.next = nil
	g.mu.Unlock()
	r.err = g.sync()
	g.mu.Lock()
	if g.next != nil {
		g.next.turn <- struct{}{} // first, so the next sync starts while r's callers wake
	} else {
		g.running = false
	}
	g.mu.Unlock()
	close(r.done)
}
