package proxy

import "net/http"

// statusWriter records the status a streamed answer is sent with, for the
// request's Summary, and flushes after every write, so that each piece of an
// unprotected answer is passed on as it comes (docs/contract.md). It keeps
// Flush working and lets http.ResponseController reach the writer below.
//
// ReverseProxy's FlushInterval -1 would flush each write too, but it also
// flushes the header alone from a timer goroutine before the first body
// byte: a goroutine and a second write to the socket for every answer,
// about a tenth of a pass-through GET's CPU (BENCHMARKS.md, Profiles of D,
// E and F). ReverseProxy still does that for the answers that need it, an
// event stream or a body of unknown length; those are flushed twice per
// write, and the second flush finds nothing buffered and writes nothing.
type statusWriter struct {
	http.ResponseWriter
	status int
	// clientGone: the attempt ended because the client left, and nothing
	// was written (upstreamError).
	clientGone bool
	// failed: the attempts ended with no answer to pass on, and idemproxy
	// answered with its own error, of this class (upstreamError).
	failed *apiError
	// stream is the request's body when it is streamed as it arrives
	// (Handler.stream), else nil.
	stream *streamBody
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // 1xx are not the answer
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	if err == nil {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
	return n, err
}

// Flush implements http.Flusher.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap is for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
