// Package upstream builds the chain every upstream attempt goes through, in
// the one order that is safe:
//
//	retry.Transport → resign.Transport → retry.OneShot → *http.Transport
//
// The retry loop is on top, so every attempt, the first included, passes the
// signer and leaves with a fresh timestamp, nonce and signature; OneShot sits
// right above the wire, so net/http never resends a signed attempt on its own
// (docs/design/oneshot.md). main and the tests build the chain here, so a test
// runs what production runs, gate and response cap included.
package upstream

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/ratelimit"
	"github.com/idemproxy/idemproxy/resign"
	"github.com/idemproxy/idemproxy/retry"
)

// Config is what the chain needs. Zero values have the defaults stated.
type Config struct {
	// Sign configures the signer. The zero Config signs nothing, but the
	// app's own signature, timestamp and nonce headers are still removed.
	Sign resign.Config
	// Policy says what is retried and how long to wait.
	Policy retry.Policy
	// Gate paces attempts and holds the provider-wide Retry-After pause. Nil
	// means a Gate without a rate limit, so the pause still holds.
	Gate *ratelimit.Gate
	// MaxResponseBytes caps a response body. Set it to the record store's
	// limit, so that an answer the store could not hold is refused at the
	// attempt instead of after it. Zero means retry.DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// OnAttempt, if set, is called after every attempt (metrics, logs).
	OnAttempt func(retry.AttemptInfo)
	// Prober, KeyRetention and OnProbe are retry.Transport's: the status
	// lookup before re-sending an operation whose outcome is unknown, how long
	// the provider keeps keys, and the probe's hook. Zero: no probe, keys kept
	// forever, no hook.
	Prober       retry.Prober
	KeyRetention time.Duration
	OnProbe      func(retry.ProbeInfo)
	// Wire writes attempts to the network. Nil means NewWire() with
	// MaxConns.
	Wire http.RoundTripper
	// MaxConns bounds the connections to the provider open at once (each a
	// file descriptor); an attempt past it waits for one within its
	// timeout. Zero: no bound. Unused with Wire.
	MaxConns int
}

// New builds the chain. Its error, from a signing configuration that cannot
// work, wraps resign.ErrConfig.
func New(c Config) (*retry.Transport, error) {
	gate := c.Gate
	if gate == nil {
		gate = ratelimit.New(0, 1)
	}
	wire := c.Wire
	if wire == nil {
		w := NewWire()
		w.MaxConnsPerHost = c.MaxConns
		waits := &connWaits{waiting: map[*gotConn]struct{}{}}
		gate.AfterClose(waits.close)
		wire = connWatch{next: w, waits: waits}
	}
	signer, err := resign.New(c.Sign, retry.OneShot{Next: wire})
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	return &retry.Transport{
		Next:             signer,
		Policy:           c.Policy,
		Gate:             gate,
		OnAttempt:        c.OnAttempt,
		MaxResponseBytes: c.MaxResponseBytes,
		Prober:           c.Prober,
		KeyRetention:     c.KeyRetention,
		OnProbe:          c.OnProbe,
	}, nil
}

// NewWire returns the pooled transport idemproxy writes to the provider with.
func NewWire() *http.Transport {
	return &http.Transport{
		DialContext:       (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2: true,
		// The default keeps 2 idle connections per host, which collapses
		// throughput to a single upstream under concurrency.
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// connWatch is the wire New builds: it tells an attempt that ended before it
// had a connection to the provider from one that may have been sent.
// *http.Transport returns the attempt's context error in both cases when its
// deadline passes: while it dials (a provider that does not answer the SYN)
// or waits for a connection of the pool (MaxConns all busy), nothing was
// written, yet the error reads as a timeout after sending, and the operation
// was kept as unknown, answered 504 "outcome may be unknown". GotConn, which
// the transport calls before it writes anything (HTTP/2 too), tells them
// apart; such an error wraps retry.ErrNoConnection.
//
// At shutdown (the Gate's Close) it also cuts the attempts that have no
// connection yet, and refuses those that come after: they passed the Gate
// before it closed, but were not sent, and nothing may leave once the
// shutdown began. Left waiting for a pooled connection (MaxConns all busy
// with operations the drain waits for), such an attempt took the first one
// freed and was sent during the drain. Cut, it ends with ratelimit.ErrClosed
// as well as retry.ErrNoConnection: the app gets the shutdown's 503, nothing
// sent, its key released.
type connWatch struct {
	next  *http.Transport
	waits *connWaits
}

// connWaits are the watched attempts that have no connection yet.
type connWaits struct {
	mu      sync.Mutex
	closed  bool
	waiting map[*gotConn]struct{}
}

// add registers g's attempt, false once closed: it must not be sent.
func (w *connWaits) add(g *gotConn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.waiting[g] = struct{}{}
	return true
}

// remove ends g's registration (it got its connection, or its RoundTrip
// returned): close no longer cuts it.
func (w *connWaits) remove(g *gotConn) {
	w.mu.Lock()
	delete(w.waiting, g)
	w.mu.Unlock()
}

// close cuts every attempt still waiting for a connection, and refuses the
// ones to come.
func (w *connWaits) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for g := range w.waiting {
		g.cancel(ratelimit.ErrClosed)
		delete(w.waiting, g)
	}
}

// gotConn is set by its trace's GotConn. It is pooled with its trace: the
// transport calls GotConn only within RoundTrip, and nothing writes the trace
// after New, so a watched attempt costs only its contexts and request copy.
// waits and cancel are its attempt's, while it runs.
type gotConn struct {
	trace  httptrace.ClientTrace
	got    atomic.Bool
	waits  *connWaits
	cancel context.CancelCauseFunc
}

var gotConns = sync.Pool{New: func() any {
	g := &gotConn{}
	g.trace.GotConn = func(httptrace.GotConnInfo) {
		// Once removed, close can no longer cut the attempt. If close cut it
		// before that, got is already true: its error counts as maybe sent,
		// which errs towards unknown.
		g.got.Store(true)
		g.waits.remove(g)
	}
	return g
}}

// RoundTrip watches a request that carries no trace of its own, as every
// protected attempt is. One that does is an unprotected request passed on
// by httputil.ReverseProxy (its trace reports 1xx answers), retried on any
// network error (safe methods) or never: it goes unwatched, since
// WithClientTrace would compose its trace into the pooled one.
//
// The attempt's context gets a child that only close cancels. It is not
// cancelled when RoundTrip returns (that would cut the answer's body): it
// ends with the attempt's own context, which the caller cancels.
func (c connWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	if httptrace.ContextClientTrace(req.Context()) != nil {
		return c.next.RoundTrip(req)
	}
	g := gotConns.Get().(*gotConn)
	g.got.Store(false)
	ctx, cancel := context.WithCancelCause(req.Context())
	g.waits, g.cancel = c.waits, cancel
	var (
		resp *http.Response
		err  error
	)
	if c.waits.add(g) {
		resp, err = c.next.RoundTrip(req.WithContext(httptrace.WithClientTrace(ctx, &g.trace)))
		if !g.got.Load() { // GotConn removed it otherwise
			c.waits.remove(g)
		}
	} else {
		cancel(ratelimit.ErrClosed)
		err = ratelimit.ErrClosed
	}
	connected := g.got.Load()
	g.waits, g.cancel = nil, nil
	gotConns.Put(g)
	if err != nil {
		if !connected {
			err = fmt.Errorf("%w (%w)", err, retry.ErrNoConnection)
		}
		return nil, err
	}
	resp.Request = req
	return resp, nil
}
