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
	cut bool                       // the shutdown began: reads starting now end at once
	m   map[*http.Request]bodyRead // the reads under way
}

// bodyRead is one request's read: its ResponseWriter, for the read
// deadline, and whether the shutdown cut it.
type bodyRead struct {
	w   http.ResponseWriter
	cut bool
}

// start registers r's body read, answered on w; ended by end.
func (b *bodyReads) start(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[*http.Request]bodyRead{}
	}
	b.m[r] = bodyRead{w, b.cut}
	if b.cut {
		http.NewResponseController(w).SetReadDeadline(time.Now())
	}
}

// end unregisters r's read, and says whether the shutdown cut it. A read
// deadline is set only between start and end: after end, a deadline would
// end the server's watch for the client leaving with a timeout, taken for
// the client gone.
func (b *bodyReads) end(r *http.Request) (cut bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cut = b.m[r].cut
	delete(b.m, r)
	return cut
}

// CutBodyReads ends, with a read deadline in the past, every body still
// being read and any read that starts later: those requests get 503
// (ErrDraining), nothing sent. Called as the shutdown begins. The bodies
// streamed upstream as they arrive (unprotected requests whose body is not
// signed) are given longer: each is cut once it stops arriving for a
// moment, or at streamEnd, shortly before the grace ends (streamReads);
// those requests get 503 (ErrDrainingStreamed), their request upstream
// broken off.
func (h *Handler) CutBodyReads(streamEnd time.Time) {
	h.cutStreams(streamEnd)
	b := &h.reads
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cut = true
	for r, read := range b.m {
		if !read.cut {
			b.m[r] = bodyRead{read.w, true}
			http.NewResponseController(read.w).SetReadDeadline(time.Now())
		}
	}
}

// readBody is readHeld on r's body, registered with h.reads while it reads:
// a read the shutdown cut fails with ErrDraining, and the connection closes
// after the answer (what follows the cut on it cannot be read).
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request, t *ticket) ([]byte, error) {
	h.reads.start(w, r)
	body, err := readHeld(r.Body, r.ContentLength, t)
	if h.reads.end(r) {
		w.Header().Set("Connection", "close")
		return nil, ErrDraining
	}
	return body, err
}
