package cache

import "sync"

// groupSync shares one sync among every caller that asks while another sync
// is running (group commit). A caller's write must be complete before it
// calls wait; wait returns the result of a sync that STARTED after the call,
// so that sync covers the write. While a round runs, new callers queue for the
// next round; the caller that finds no round running leads rounds until the
// queue is empty. With N concurrent writers this costs about one fsync per
// fsync-latency, not one per write.
type groupSync struct {
	sync   func() error // syncs everything written so far
	joined func()       // if set, called after a caller joined a round (tests)

	mu      sync.Mutex
	next    *syncRound // round the next callers join; nil = none queued
	running bool       // a leader is running rounds
}

type syncRound struct {
	done chan struct{} // closed when err is set
	err  error
}

// wait blocks until a sync that started after the call has finished, and
// returns its error.
func (g *groupSync) wait() error {
	g.mu.Lock()
	if g.next == nil {
		g.next = &syncRound{done: make(chan struct{})}
	}
	r := g.next
	lead := !g.running
	g.running = true
	g.mu.Unlock()
	if g.joined != nil {
		g.joined()
	}
	if lead {
		g.lead()
	}
	<-r.done
	return r.err
}

// lead runs queued rounds one after another until none is left. Taking
// g.next under mu is what closes a round: later callers start a new one.
func (g *groupSync) lead() {
	for {
		g.mu.Lock()
		r := g.next
		g.next = nil
		if r == nil {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		r.err = g.sync()
		close(r.done)
	}
}
