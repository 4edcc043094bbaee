package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// streamIdle is how long, once the shutdown began, a streamed body may go
// without a byte arriving while it is read before it is cut (streamReads).
const streamIdle = 2 * time.Second

// streamTick is how often the shutdown looks at the streamed bodies.
const streamTick = 50 * time.Millisecond

// errStreamCut is the cause of a streamed request's context when the
// shutdown cut its body.
var errStreamCut = errors.New("proxy: shutting down: request body cut before it arrived in full")

// streamReads holds the unprotected requests whose body is streamed upstream
// as it arrives (serveUnprotected), so that a shutdown can end them within
// its grace (CutBodyReads). Until the shutdown nothing is cut. From it, a
// body still arriving is cut once a read of it has waited streamIdle for the
// client, or at the end given to CutBodyReads, whichever comes first: its
// read gets a read deadline in the past and the request's context is
// cancelled, so the request upstream is aborted before its body ends (the
// provider sees it broken off, not complete) and the client gets 503
// (ErrDrainingStreamed) if nothing of the answer was passed on yet. A body
// read to its end is never cut: the request went upstream whole, and its
// answer is waited for like any other.
type streamReads struct {
	mu       sync.Mutex
	m        map[*streamBody]struct{} // the bodies still arriving
	shutdown bool                     // the shutdown began: the watch runs
	end      time.Time                // from the shutdown: when every body still arriving is cut
}

// streamBody is a streamed request's body, as the upstream request reads it.
type streamBody struct {
	io.ReadCloser
	w      http.ResponseWriter
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	since  time.Time // when the read under way began; zero if none is
	over   bool      // the body was read to its end (or failed): never cut
	cut    bool      // the shutdown cut it
}

// stream registers r's body, answered on w, as streamed; it returns the
// request to send upstream, whose context the cut cancels, and its body.
// r without a body is returned as it is.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request) (*http.Request, *streamBody) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return r, nil
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	r = r.WithContext(ctx)
	b := &streamBody{ReadCloser: r.Body, w: w, cancel: cancel}
	r.Body = b
	s := &h.streams
	s.mu.Lock()
	if s.m == nil {
		s.m = map[*streamBody]struct{}{}
	}
	s.m[b] = struct{}{}
	late := s.shutdown && !time.Now().Before(s.end)
	s.mu.Unlock()
	if late { // past the end: nothing more is let in
		b.cutNow()
	}
	return r, b
}

// Read reads the client's body. Once the body is cut, it fails, even if the
// read beneath ended the body in the meantime: the upstream request must not
// see a whole body after the cut.
func (b *streamBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.cut {
		b.mu.Unlock()
		return 0, errStreamCut
	}
	b.since = time.Now()
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.since = time.Time{}
	if b.cut {
		return 0, errStreamCut
	}
	if err != nil {
		b.over = true
	}
	return n, err
}

// cutNow cuts the body unless it was read to its end.
func (b *streamBody) cutNow() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.over || b.cut {
		return
	}
	b.cut = true
	// The cancel ends the upstream request even when it is not reading
	// the body (the provider not taking it in); the deadline ends a read
	// waiting for the client.
	b.cancel(errStreamCut)
	http.NewResponseController(b.w).SetReadDeadline(time.Now())
}

// stale says whether the body is to be cut at now: a read of it has waited
// streamIdle for the client, or the end has come.
func (b *streamBody) stale(now, end time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.over && !b.cut && (!now.Before(end) || !b.since.IsZero() && now.Sub(b.since) >= streamIdle)
}

// wasCut says whether the shutdown cut the body (false for nil).
func (b *streamBody) wasCut() bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cut
}

// streamDone unregisters b (nil: none) once its request is answered.
func (h *Handler) streamDone(b *streamBody) {
	if b == nil {
		return
	}
	s := &h.streams
	s.mu.Lock()
	delete(s.m, b)
	s.mu.Unlock()
	b.cancel(nil)
}

// watchStreams cuts the streamed bodies still arriving as they go stale,
// from the shutdown until end, when it cuts all those left.
func (h *Handler) watchStreams(end time.Time) {
	s := &h.streams
	tick := time.NewTicker(streamTick)
	defer tick.Stop()
	var stale []*streamBody
	for {
		now := time.Now()
		stale = stale[:0]
		s.mu.Lock()
		for b := range s.m {
			if b.stale(now, end) {
				stale = append(stale, b)
			}
		}
		s.mu.Unlock()
		for _, b := range stale {
			b.cutNow()
		}
		if !now.Before(end) {
			return
		}
		<-tick.C
	}
}

// cutStreams starts the shutdown's watch of the streamed bodies (once).
func (h *Handler) cutStreams(end time.Time) {
	s := &h.streams
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return
	}
	s.shutdown, s.end = true, end
	go h.watchStreams(end)
}
