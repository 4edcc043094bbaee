package proxy

import (
	"sync"

	"github.com/idemproxy/idemproxy/store"
)

// flights lets requests waiting for a key in flight in this process wake the moment
// it ends, instead of polling the store.
type flights struct {
	mu sync.Mutex
	m  map[store.ID]chan struct{} // keyed by the ID itself: no key string built per lookup
}

// open registers an operation for id and returns the channel closed when it ends.
func (f *flights) open(id store.ID) chan struct{} {
	ch := make(chan struct{})
	f.mu.Lock()
	f.m[id] = ch
	f.mu.Unlock()
	return ch
}

// close ends the operation registered as ch.
func (f *flights) close(id store.ID, ch chan struct{}) {
	f.mu.Lock()
	if f.m[id] == ch {
		delete(f.m, id)
	}
	f.mu.Unlock()
	close(ch)
}

// wait returns a channel closed when id's local operation ends; nil (never ready)
// when none runs here.
func (f *flights) wait(id store.ID) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[id]
}
