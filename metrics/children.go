package metrics

import (
	"sync"
	"sync/atomic"
)

// children keeps the children of a metric vector by their label values
// (one or two), so that a request does not ask the vector for them each
// time: WithLabelValues checks, hashes and looks up its values under a lock,
// about half of the CPU of a request's metrics (its hooks look up six or
// seven children). A child is made by the vector's WithLabelValues on first
// use, as before, so /metrics shows the same series. The vectors are never
// reset, so a kept child stays the vector's.
type children[T any] struct {
	with func(values ...string) T // the vector's WithLabelValues
	two  bool                     // the vector has two labels, else one

	mu sync.Mutex                      // held while adding one
	m  atomic.Pointer[map[[2]string]T] // copied on every addition: read without a lock
}

func newChildren[T any](with func(values ...string) T, labels int) *children[T] {
	return &children[T]{with: with, two: labels == 2}
}

// get returns the child for label value a (and b, with two labels).
func (c *children[T]) get(a, b string) T {
	key := [2]string{a, b}
	if m := c.m.Load(); m != nil {
		if child, ok := (*m)[key]; ok {
			return child
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if child, ok := (*old)[key]; ok {
			return child
		}
	}
	var child T
	if c.two {
		child = c.with(a, b)
	} else {
		child = c.with(a)
	}
	m := make(map[[2]string]T, 1)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	m[key] = child
	c.m.Store(&m)
	return child
}
