package main

import (
	"net"
	"time"
)

// writeStall bounds how long one write to a client connection may wait for
// the client to read (proxyServer).
const writeStall = time.Minute

// stallListener wraps each connection in a stallConn.
type stallListener struct {
	net.Listener
	stall time.Duration
}

func (l stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, stall: l.stall}, nil
}

// stallConn gives every write to the client its own deadline, stall from
// when it starts: a client that stops reading an answer (its receive
// window stays shut) fails the write, and the handler writing it ends,
// giving back its request slot (IDEMPROXY_MAX_INFLIGHT) and its
// connection. Without it such a write waited for ever: a few hundred
// clients that asked for a streamed statement and never read it held every
// request slot, and every payment was refused 503 overloaded. A client
// that reads, however slowly, moves each write along. Waiting between
// writes (an event stream that is quiet, a protected request whose
// upstream is slow) is not a write and is not bounded here.
//
// net/http's Server.WriteTimeout cannot do this: it bounds the whole
// answer from the request's arrival, which would cut a protected request
// waiting out its retry budget and every long stream.
type stallConn struct {
	net.Conn
	stall time.Duration
}

func (c *stallConn) Write(p []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(c.stall))
	return c.Conn.Write(p)
}

// CloseWrite half-closes the connection, if the connection wrapped can (see
// refusalConn.CloseWrite).
func (c *stallConn) CloseWrite() error { return closeWrite(c.Conn) }
