package proxy

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
// body bytes held, counted as they arrive (byteBudget). A nil bound is no
// bound.
//
// What a client sends slowly into memory is not counted as a request in
// flight: a client that dribbles such a body, or stalls in it, holds a
// connection (their
// number is bounded on its own, connlimit.go) and a buffer for the bytes it
// sent (readHeld), not one of MaxInflight nor the length it declared, so a
// few such clients cannot make everyone else's requests overloaded.
type admission struct {
	requests *semaphore.Weighted
	bytes    *byteBudget
	arrivals atomic.Uint64 // numbers the tickets in order of arrival
}

func newAdmission(requests, bytes int64) *admission {
	a := &admission{}
	if requests > 0 {
		a.requests = semaphore.NewWeighted(requests)
	}
	if bytes > 0 {
		a.bytes = &byteBudget{max: bytes, readers: map[*ticket]struct{}{}, freed: make(chan struct{})}
	}
	return a
}

// ticket is one request's share of the bounds. The handler holds it, and so
// does a detached operation the request starts, which may outlive the
// handler; the last to let go releases it.
type ticket struct {
	a     *admission
	slot  bool  // holds one of MaxInflight
	bytes int64 // of MaxInflightBytes held; under a.bytes.mu
	// reading: the body's first bytes were reserved, so it may have been
	// read from (and 100 Continue sent, see drainRefused).
	reading bool
	arrival uint64 // its place in arrival order: the older first
	// yield: a body read of more priority needs this one's bytes; its read
	// is refused at its next growth, or as it ends. Under a.bytes.mu.
	yield bool
	refs  atomic.Int32
}

// admit returns the ticket of a new request, holding nothing yet.
func (a *admission) admit() *ticket {
	t := &ticket{a: a, arrival: a.arrivals.Add(1)}
	t.refs.Store(1)
	return t
}

// takeSlot takes a request slot if one is free and reports whether the
// ticket holds one. It is called before the ticket is shared (hold): once,
// and again by a request that gave its slot back while it waited (giveSlot).
func (t *ticket) takeSlot() bool {
	t.slot = t.a.requests == nil || t.a.requests.TryAcquire(1)
	return t.slot
}

// giveSlot gives the request slot back while the request waits for its key
// in flight for another request: waiting sends nothing, and a slot held by
// each repeat of one slow order let an app repeating it use up MaxInflight,
// every other order refused overloaded. The body bytes stay reserved: they
// are held. Called before the ticket is shared (hold), as takeSlot is; the
// request takes a slot again before it claims the key (obtain).
func (t *ticket) giveSlot() {
	if t.slot && t.a.requests != nil {
		t.a.requests.Release(1)
	}
	t.slot = false
}

// reserve takes n more body bytes, false past the bound: bytes held after
// the body was read (its decoded copy), never waited for.
func (t *ticket) reserve(n int64) bool {
	b := t.a.bytes
	if n <= 0 || b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.take(t, n)
}

// reserveBody is reserve for the body's buffers, which heldbody asks for
// before it reads into them, between startRead and endRead: past the bound
// the read of most priority waits for the reads below it to give their
// bytes back (byteBudget.grow).
func (t *ticket) reserveBody(n int64) bool {
	b := t.a.bytes
	if n > 0 && b != nil && !b.grow(t, n) {
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
	if b := t.a.bytes; b != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		if t.bytes > 0 {
			b.used -= t.bytes
			t.bytes = 0
			b.wake()
		}
	}
}

// yieldWait bounds how long a body read waits for the reads that yield to
// it to give their bytes back: each does at its next growth or as its body
// ends, which a client that stalls may not reach before the read timeout.
const yieldWait = 5 * time.Second

// byteBudget is MaxInflightBytes, with the bodies being read into memory.
//
// Bodies are reserved as their buffers grow (readHeld), so that a client
// declaring a length it never sends holds only what it sent. A burst of
// large bodies then shared the bound until none could grow (three bodies of
// 59 MiB under 60 MiB each held 16 MiB and none could double): whichever
// asked first was refused, the one furthest along too, and when they asked
// at the same moment all were. So the reads are ordered: the one holding
// the most, the oldest among equals, goes first. A read that cannot grow
// takes the bytes of reads below it, which yield (refused 503 overloaded at
// their next growth or as their body ends, when they give their bytes
// back), and waits for them, up to yieldWait; if the free bytes and those
// of the reads below it are not enough (the bound is held by requests past
// their read, or by reads above it), it is refused at once, as before. The
// first read never yields, so a burst ends with one body through, not none.
type byteBudget struct {
	max int64

	mu      sync.Mutex
	used    int64
	readers map[*ticket]struct{} // between startRead and endRead
	freed   chan struct{}        // closed, and replaced, when bytes are given back or a read yields
	waiting int                  // reads waiting in grow for freed
}

// startRead and endRead bracket t's body read; endRead reports whether the
// read had to yield: it is then refused, whatever it read.
func (b *byteBudget) startRead(t *ticket) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.readers[t] = struct{}{}
}

func (b *byteBudget) endRead(t *ticket) (yielded bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.readers, t)
	return t.yield
}

// take takes n bytes for t if they are free; under mu.
func (b *byteBudget) take(t *ticket, n int64) bool {
	if b.used+n > b.max {
		return false
	}
	b.used += n
	t.bytes += n
	return true
}

// wake wakes the reads waiting in grow; under mu. With none waiting, as
// for nearly every request, it costs nothing.
func (b *byteBudget) wake() {
	if b.waiting == 0 {
		return
	}
	close(b.freed)
	b.freed = make(chan struct{})
}

// before reports whether read t goes before read u.
func before(t, u *ticket) bool {
	return t.bytes > u.bytes || t.bytes == u.bytes && t.arrival < u.arrival
}

// grow takes n more bytes for t's read, making the reads below it yield and
// waiting for them if it must; false when t is refused.
func (b *byteBudget) grow(t *ticket, n int64) bool {
	var deadline time.Time // set when it first has to wait
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if t.yield {
			return false
		}
		if b.take(t, n) {
			return true
		}
		if !b.yieldBelow(t, n) {
			return false
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(yieldWait)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		freed := b.freed
		b.waiting++
		b.mu.Unlock()
		timer := time.NewTimer(left)
		select {
		case <-freed:
		case <-timer.C:
		}
		timer.Stop()
		b.mu.Lock()
		b.waiting--
	}
}

// yieldBelow makes reads below t yield, the last first, until the free
// bytes and those of the reads yielding make n; false if they cannot. Under
// mu.
func (b *byteBudget) yieldBelow(t *ticket, n int64) bool {
	var below []*ticket
	coming := b.max - b.used // free now, or once the reads yielding end
	for u := range b.readers {
		switch {
		case u == t || !before(t, u):
		case u.yield:
			coming += u.bytes
		default:
			below = append(below, u)
		}
	}
	slices.SortFunc(below, func(u, v *ticket) int {
		if before(v, u) {
			return -1
		}
		return 1
	})
	woke := false
	for _, u := range below {
		if coming >= n {
			break
		}
		u.yield, woke = true, true
		coming += u.bytes
	}
	if woke {
		b.wake() // a read yielding may be waiting in grow itself
	}
	return coming >= n
}

// errBodyBytes is readHeld's error when the body bytes bound refused more.
var errBodyBytes = errors.New("request body bytes in flight at the bound")

// readHeld reads a request body into the one slice every layer and attempt
// then shares (heldbody), reserving its bytes on t before they are read
// into. A declared length (already within MaxBodyBytes) up to
// heldbody.MaxPrealloc is reserved at once and read into one allocation; a
// longer one, and a chunked body, as the buffer grows with the bytes that
// came: a client that declares a megabyte and stalls holds what it sent.
// A read that had to yield to another is refused (byteBudget).
func readHeld(r io.Reader, declared int64, t *ticket) (b []byte, err error) {
	if bb := t.a.bytes; bb != nil {
		bb.startRead(t)
		defer func() {
			if bb.endRead(t) {
				b, err = nil, errBodyBytes
			}
		}()
	}
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
