package proxy

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/idemproxy/idemproxy/internal/heldbody"
)

// ErrOverloaded answers a request past Options.MaxInflight or
// Options.MaxInflightBytes: nothing was sent upstream and no record was
// written, so the same request with the same key may be sent again after
// Retry-After.
var (
	ErrOverloaded      = &Error{http.StatusServiceUnavailable, CodeOverloaded, "too many requests in flight; nothing was sent upstream: send the request again after Retry-After (with the same Idempotency-Key, if it has one)"}
	ErrOverloadedBytes = &Error{http.StatusServiceUnavailable, CodeOverloaded, "too many request body bytes in flight; nothing was sent upstream: send the request again after Retry-After (with the same Idempotency-Key, if it has one)"}
)

// Limits named in Summary.Limit for an overloaded request.
const (
	LimitRequests = "requests"
	LimitBytes    = "bytes"
)

// admission bounds the work in flight, so that overload gets a clear 503
// before memory or file descriptors run out: requests counted from the
// moment they are ready to be served (once the body has been read; an
// unprotected request whose body is streamed upstream as it comes, at
// arrival) to their answer (a detached operation until it ends), and request
// body bytes held, counted as they arrive. A nil semaphore is no bound.
//
// What a client sends slowly into memory is not counted as a request in
// flight: a client that dribbles such a body, or stalls in it, holds a
// connection (their
// number is bounded on its own, connlimit.go) and a buffer for the bytes it
// sent (readHeld), not one of MaxInflight nor the length it declared, so a
// few such clients cannot make everyone else's requests overloaded.
type admission struct {
	requests, bytes *semaphore.Weighted
}

func newAdmission(requests, bytes int64) *admission {
	a := &admission{}
	if requests > 0 {
		a.requests = semaphore.NewWeighted(requests)
	}
	if bytes > 0 {
		a.bytes = semaphore.NewWeighted(bytes)
	}
	return a
}

// ticket is one request's share of the bounds. The handler holds it, and so
// does a detached operation the request starts, which may outlive the
// handler; the last to let go releases it.
type ticket struct {
	a     *admission
	slot  bool  // holds one of MaxInflight
	bytes int64 // of MaxInflightBytes held
	// reading: the body's first bytes were reserved, so it may have been
	// read from (and 100 Continue sent, see drainRefused).
	reading bool
	refs    atomic.Int32
}

// admit returns the ticket of a new request, holding nothing yet.
func (a *admission) admit() *ticket {
	t := &ticket{a: a}
	t.refs.Store(1)
	return t
}

// takeSlot takes a request slot if one is free and reports whether the
// ticket holds one. It is called once, before the ticket is shared (hold).
func (t *ticket) takeSlot() bool {
	t.slot = t.a.requests == nil || t.a.requests.TryAcquire(1)
	return t.slot
}

// reserve takes n more body bytes, false past the bound.
func (t *ticket) reserve(n int64) bool {
	if n <= 0 || t.a.bytes == nil {
		return true
	}
	if !t.a.bytes.TryAcquire(n) {
		return false
	}
	t.bytes += n
	return true
}

// reserveBody is reserve for the body's buffers, which heldbody asks for
// before it reads into them.
func (t *ticket) reserveBody(n int64) bool {
	if !t.reserve(n) {
		return false
	}
	t.reading = true
	return true
}

// hold adds a holder; each holder calls release once.
func (t *ticket) hold() { t.refs.Add(1) }

func (t *ticket) release() {
	if t.refs.Add(-1) != 0 {
		return
	}
	if t.slot && t.a.requests != nil {
		t.a.requests.Release(1)
	}
	if t.bytes > 0 {
		t.a.bytes.Release(t.bytes)
	}
}

// errBodyBytes is readHeld's error when the body bytes bound refused more.
var errBodyBytes = errors.New("request body bytes in flight at the bound")

// readHeld reads a request body into the one slice every layer and attempt
// then shares (heldbody), reserving its bytes on t before they are read
// into. A declared length (already within MaxBodyBytes) up to
// heldbody.MaxPrealloc is reserved at once and read into one allocation; a
// longer one, and a chunked body, as the buffer grows with the bytes that
// came: a client that declares a megabyte and stalls holds what it sent.
func readHeld(r io.Reader, declared int64, t *ticket) ([]byte, error) {
	var b []byte
	var err error
	if declared > 0 {
		b, err = heldbody.ReadDeclared(r, declared, t.reserveBody) // the server ends the body at the declared length
	} else {
		b, err = heldbody.ReadAll(r, -1, 0, t.reserveBody) // reserves its first buffer too
	}
	if errors.Is(err, heldbody.ErrRefused) {
		return nil, errBodyBytes
	}
	return b, err
}
