package main

import (
	"net"
	"net/http"
	"sync"
)

// connLimiter bounds the client connections open at once, so that the
// process keeps file descriptors for the store and the provider however many
// apps connect (README, Sizing limits). At the bound it first closes client
// connections idle between requests (keep-alive), so that a new client is
// served instead of waiting behind connections that send nothing; only when
// every connection is busy does Accept wait for one to close.
//
// Its ConnState method must be the http.Server's ConnState: it is how the
// limiter learns which connections are idle and when one is closed.
type connLimiter struct {
	net.Listener
	max int

	mu     sync.Mutex
	open   int
	idle   map[net.Conn]struct{}
	freed  *sync.Cond // signalled when a connection closes
	closed bool
	// evicted counts idle connections closed at the bound (tests, logs).
	evicted int
}

func newConnLimiter(l net.Listener, max int) *connLimiter {
	c := &connLimiter{Listener: l, max: max, idle: map[net.Conn]struct{}{}}
	c.freed = sync.NewCond(&c.mu)
	return c
}

// Accept accepts a connection, then waits until it fits in the bound.
// Waiting with the connection accepted costs one descriptor over the bound
// at most (Accept is called from one loop), and lets idle connections be
// closed only when a new client is actually waiting.
func (c *connLimiter) Accept() (net.Conn, error) {
	conn, err := c.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := c.admit(); err != nil {
		conn.Close()
		return nil, err
	}
	return &limitedConn{Conn: conn, l: c}, nil
}

// admit takes a slot, closing an idle connection when none is free.
func (c *connLimiter) admit() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.open >= c.max && !c.closed {
		for conn := range c.idle {
			// Closing an idle keep-alive connection is what its idle
			// timeout would do later; the app's client opens a new one.
			delete(c.idle, conn)
			c.evicted++
			go conn.Close() // gives the slot back (limitedConn.Close), which takes mu
			break
		}
		c.freed.Wait()
	}
	if c.closed {
		return net.ErrClosed
	}
	c.open++
	return nil
}

func (c *connLimiter) release() {
	c.mu.Lock()
	c.open--
	c.mu.Unlock()
	c.freed.Signal()
}

// Close closes the listener and wakes a waiting Accept.
func (c *connLimiter) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.freed.Broadcast()
	return c.Listener.Close()
}

// ConnState tracks idle connections; set it as http.Server.ConnState.
func (c *connLimiter) ConnState(conn net.Conn, s http.ConnState) {
	lc, ok := conn.(*limitedConn)
	if !ok {
		return
	}
	c.mu.Lock()
	switch s {
	case http.StateIdle:
		c.idle[lc] = struct{}{}
	default:
		delete(c.idle, lc)
	}
	// An idle connection appearing while Accept waits at the bound can be
	// closed now.
	wake := s == http.StateIdle && c.open >= c.max
	c.mu.Unlock()
	if wake {
		c.freed.Signal()
	}
}

// Open returns the connections open now.
func (c *connLimiter) Open() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(c.open)
}

// ClosedIdle returns how many idle connections were closed at the bound.
func (c *connLimiter) ClosedIdle() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(c.evicted)
}

// limitedConn gives its slot back once, when closed.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	once sync.Once
}

func (lc *limitedConn) Close() error {
	err := lc.Conn.Close()
	lc.once.Do(func() {
		lc.l.mu.Lock()
		delete(lc.l.idle, lc)
		lc.l.mu.Unlock()
		lc.l.release()
	})
	return err
}

// CloseWrite half-closes the connection, if the connection wrapped can, as
// net/http does after a refusal that leaves the request unread (see
// refusalConn.CloseWrite).
func (lc *limitedConn) CloseWrite() error { return closeWrite(lc.Conn) }
