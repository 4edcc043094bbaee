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
// before memory or file descriptors run out: requests counted from arrival
// to answer (a detached operation until it ends), and request body bytes
// held. A nil semaphore is no bound.
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
	refs  atomic.Int32
}

// admit returns the ticket of a new request, with a request slot if one is
// free (slot reports it).
func (a *admission) admit() *ticket {
	t := &ticket{a: a}
	t.refs.Store(1)
	t.slot = a.requests == nil || a.requests.TryAcquire(1)
	return t
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
// then shares (heldbody), reserving its bytes on t first: a declared length
// (already within MaxBodyBytes) at once and into one allocation, a chunked
// body as its buffer grows.
func readHeld(r io.Reader, declared int64, t *ticket) ([]byte, error) {
	if declared > 0 {
		if !t.reserve(declared) {
			return nil, errBodyBytes
		}
		b := make([]byte, declared)
		if _, err := io.ReadFull(r, b); err != nil { // the server ends the body at the declared length
			return nil, err
		}
		return b, nil
	}
	b, err := heldbody.ReadAll(r, -1, 0, t.reserve) // reserves its first buffer too
	if errors.Is(err, heldbody.ErrRefused) {
		return nil, errBodyBytes
	}
	return b, err
}
