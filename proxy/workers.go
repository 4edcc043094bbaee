package proxy

import "sync/atomic"

// workers runs functions on goroutines of their own, as go statements
// would, but on a goroutine kept from an earlier function when one is
// waiting. A new goroutine's stack starts small, and a detached
// operation's call path (the attempt layer, net/http, the store) grows it,
// copying it, several times: 5-7% of a new key's CPU in BenchmarkPath's
// profiles (runtime.newstack), about 1% on kept goroutines, whose stacks
// have grown already. Up to max goroutines wait; past that, one ends with
// its function.
type workers struct {
	idle    chan func() // unbuffered: a send succeeds only when one waits
	waiting atomic.Int32
	max     int32
}

// detached runs the detached operations of every Handler (start).
var detached = newWorkers(64)

func newWorkers(max int32) *workers { return &workers{idle: make(chan func()), max: max} }

// run runs f on a waiting goroutine, else on a new one.
func (w *workers) run(f func()) {
	select {
	case w.idle <- f:
	default:
		go w.work(f)
	}
}

func (w *workers) work(f func()) {
	for {
		f()
		if w.waiting.Add(1) > w.max {
			w.waiting.Add(-1)
			return
		}
		f = <-w.idle
		w.waiting.Add(-1)
	}
}
