package proxy

import (
	"net/http"
	"sync"
	"time"
)

// bodyReads holds the requests reading their body into memory (readHeld),
// so that a shutdown can end those reads at once (CutBodyReads): a client
// stalled in its body would otherwise hold the drain until the server's
// read timeout, past the shutdown grace. Nothing of such a request has been
// sent or claimed.
type bodyReads struct {
	mu  sync.Mutex
	cut bool // the shutdown began: reads starting now end at once
	m   map[*bodyRead]struct{}
}

// bodyRead is one request's read.
type bodyRead struct {
	rc  *http.ResponseController
	cut bool
}

// start registers w's body read; ended by end.
func (b *bodyReads) start(w http.ResponseWriter) *bodyRead {
	r := &bodyRead{rc: http.NewResponseController(w)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cut {
		r.cut = true
		r.rc.SetReadDeadline(time.Now())
		return r
	}
	if b.m == nil {
		b.m = map[*bodyRead]struct{}{}
	}
	b.m[r] = struct{}{}
	return r
}

// end unregisters r, and says whether the shutdown cut it. A read deadline
// is set only between start and end: after end, a deadline would end the
// server's watch for the client leaving with a timeout, taken for the client
// gone.
func (b *bodyReads) end(r *bodyRead) (cut bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, r)
	return r.cut
}

// CutBodyReads ends, with a read deadline in the past, every body still
// being read and any read that starts later: those requests get 503
// (ErrDraining), nothing sent. Called as the shutdown begins.
func (h *Handler) CutBodyReads() {
	b := &h.reads
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cut = true
	for r := range b.m {
		r.cut = true
		r.rc.SetReadDeadline(time.Now())
		delete(b.m, r)
	}
}

// readBody is readHeld on r's body, registered with h.reads while it reads:
// a read the shutdown cut fails with ErrDraining, and the connection closes
// after the answer (what follows the cut on it cannot be read).
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request, t *ticket) ([]byte, error) {
	read := h.reads.start(w)
	body, err := readHeld(r.Body, r.ContentLength, t)
	if h.reads.end(read) {
		w.Header().Set("Connection", "close")
		return nil, ErrDraining
	}
	return body, err
}
