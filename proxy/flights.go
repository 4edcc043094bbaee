package proxy

import (
	"sync"

	"github.com/idemproxy/idemproxy/store"
)

// flights lets requests waiting for a key in flight in this process wake the moment
// it ends, instead of polling the store.
type flights struct {
	mu sync.Mutex
	m  map[store.ID]*flight // keyed by the ID itself: no key string built per lookup
}

// flight is one operation this process runs for a key: its result, set
// before done is closed, and the renewal of its lease. One allocation holds
// what the operation needs besides its goroutine and done.
type flight struct {
	done  chan struct{}
	res   result // read by the request that started the operation, once done is closed
	lease leaseRenewal
}

// open registers an operation for id.
func (f *flights) open(id store.ID) *flight {
	fl := &flight{done: make(chan struct{})}
	f.mu.Lock()
	f.m[id] = fl
	f.mu.Unlock()
	return fl
}

// close ends the operation fl.
func (f *flights) close(id store.ID, fl *flight) {
	f.mu.Lock()
	if f.m[id] == fl {
		delete(f.m, id)
	}
	f.mu.Unlock()
	close(fl.done)
}

// wait returns a channel closed when id's local operation ends; nil (never ready)
// when none runs here.
func (f *flights) wait(id store.ID) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[id]; fl != nil {
		return fl.done
	}
	return nil
}
