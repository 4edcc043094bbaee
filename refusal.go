package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// answerRefusalsInJSON makes the refusals that net/http's server writes
// itself, before any handler runs, reach the app in idemproxy's error format
// like every other refusal (README, Errors idemproxy answers itself): JSON
// {"error":{"code":"bad_request","message":"..."}} with Content-Type
// application/json, the status unchanged. They are requests idemproxy will
// not forward: a malformed request line or header, a control character in a
// header value (an Idempotency-Key included), two Host or Content-Length
// headers, headers over the server's MaxHeaderBytes (431), an unsupported
// Transfer-Encoding (501) or HTTP version (505), an Expect other than
// 100-continue (417, which net/http writes with no body at all). Nothing was read past the
// headers and nothing was sent upstream.
//
// It also marks, for the handler to refuse, a request whose length is
// ambiguous (Transfer-Encoding with Content-Length, Transfer-Encoding on
// HTTP/1.0, Content-Length twice), which net/http accepts and hides from
// handlers, and every request after one whose length framing cannot follow:
// see framing and proxy.MarkAmbiguousFraming.
//
// It wraps srv's Handler, ConnContext and ConnState, so call it once those
// are set; serve srv on the listener it returns, which wraps l. The hooks
// that were set see the connections of l, not the wrapper.
func answerRefusalsInJSON(srv *http.Server, l net.Listener) net.Listener {
	handler, connContext, connState := srv.Handler, srv.ConnContext, srv.ConnState
	if handler == nil {
		handler = http.DefaultServeMux
	}
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		rc, ok := c.(*refusalConn)
		if !ok {
			return ctx
		}
		if connContext != nil {
			ctx = connContext(ctx, rc.Conn)
		}
		return context.WithValue(ctx, refusalConnKey{}, rc)
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rc, ok := r.Context().Value(refusalConnKey{}).(*refusalConn); ok {
			rc.serving.Store(true)
			rc.late.Store(0)
			rc.requests++
			if rc.framing.refuses(rc.requests) {
				r = proxy.MarkAmbiguousFraming(r)
			}
		}
		handler.ServeHTTP(w, r)
	})
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if rc, ok := c.(*refusalConn); ok {
			// net/http reports StateIdle once the answer is written in
			// full: what it writes next, before the next handler runs,
			// is its own.
			if s == http.StateIdle {
				rc.serving.Store(false)
			}
			c = rc.Conn
		}
		if connState != nil {
			connState(c, s)
		}
	}
	return refusalListener{l}
}

type refusalConnKey struct{}

// refusalListener wraps each connection in a refusalConn.
type refusalListener struct{ net.Listener }

func (l refusalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &refusalConn{Conn: c}, nil
}

// refusalConn rewrites net/http's own refusals on their way out. It looks
// only at what is written while no handler is serving a request on the
// connection: a handler's answer is passed on byte for byte, even a streamed
// piece of a body that happens to look like a refusal.
type refusalConn struct {
	net.Conn
	// serving is set when a handler starts and cleared when the
	// connection is idle again (see answerRefusalsInJSON).
	serving atomic.Bool
	// framing follows the requests read; requests counts those the
	// handler was called for (one at a time, by the connection's
	// goroutine).
	framing  framing
	requests int64
	// late is when the extra wait of a read that timed out between
	// requests ends (readLate), in Unix nanoseconds; 0 until one did.
	// A handler starting clears it.
	late atomic.Int64
}

// lateHeaderWait is how much longer a read that timed out while no handler
// serves (the request line and header, or the wait for the next request)
// may wait for bytes, once: see readLate.
const lateHeaderWait = time.Second

// Read reads from the connection and lets framing follow what was read.
func (c *refusalConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n == 0 && err != nil && !c.serving.Load() {
		n, err = c.readLate(p, err)
	}
	c.framing.feed(p[:n])
	return n, err
}

// readLate reads again, once, a header read that failed at net/http's
// deadline (ReadHeaderTimeout, counted from when the connection's goroutine
// began reading it), with lateHeaderWait more. The deadline is checked
// before the bytes that came are looked at, so a process too busy to get
// to a connection for that long (hundreds of clients sending megabyte
// bodies at once on a loaded host) could take a client whose request was
// already waiting for one that sent nothing, and closed the connection
// without an answer: the client saw EOF or a reset instead of its 503
// overloaded (TestHeaderReadLateIsServed). What came in time is read now;
// a client that sent nothing is still cut, lateHeaderWait later.
func (c *refusalConn) readLate(p []byte, err error) (int, error) {
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		return 0, err
	}
	now := time.Now()
	c.late.CompareAndSwap(0, now.Add(lateHeaderWait).UnixNano())
	late := time.Unix(0, c.late.Load())
	if !now.Before(late) {
		return 0, err
	}
	c.Conn.SetReadDeadline(late)
	return c.Conn.Read(p)
}

func (c *refusalConn) Write(p []byte) (int, error) {
	if c.serving.Load() {
		return c.Conn.Write(p)
	}
	out, ok := jsonRefusal(p)
	if !ok {
		return c.Conn.Write(p)
	}
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseWrite half-closes the connection, if the connection wrapped can. net/http
// does so after a refusal that leaves the request unread (its closeWriteAndWait),
// so that the client reads the answer before the close resets the connection;
// without this method the wrapper would hide (*net.TCPConn).CloseWrite.
func (c *refusalConn) CloseWrite() error { return closeWrite(c.Conn) }

// closeWrite half-closes c, if it can.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// netHTTPRefusalHeaders is what net/http's server writes between the status
// line and the body of a refusal it makes before any handler runs, in one
// Write on the connection (net/http server.go, conn.serve). A handler's
// answer can contain the same bytes (an upstream's streamed body passes
// through in the pieces the upstream sent), which is why refusalConn looks
// only at what is written outside a handler.
const netHTTPRefusalHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// jsonRefusal returns the refusal p in idemproxy's error format, if p is one
// of net/http's: "HTTP/1.1 <status line>" + netHTTPRefusalHeaders + a body
// that repeats the status line (or names the unsupported transfer
// encoding), and nothing else.
func jsonRefusal(p []byte) ([]byte, bool) {
	if expectationFailed(p) {
		return jsonRefusalOf(http.StatusExpectationFailed, "the request's Expect is not supported (only 100-continue is); nothing was sent upstream")
	}
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !ok || len(rest) < 3 || rest[0] != '4' && rest[0] != '5' {
		return nil, false
	}
	line, text, ok := bytes.Cut(rest, []byte(netHTTPRefusalHeaders))
	if !ok || bytes.ContainsAny(line, "\r\n") || !bytes.Equal(text, line) && string(text) != "Unsupported transfer encoding" {
		return nil, false
	}
	status, err := strconv.Atoi(string(line[:3]))
	if err != nil || len(line) > 3 && line[3] != ' ' {
		return nil, false
	}
	msg := "the request is not valid HTTP/1.1 (a malformed request line or header, or a control character in a header value); nothing was sent upstream"
	switch {
	case status == http.StatusRequestHeaderFieldsTooLarge:
		msg = "the request headers are too large; nothing was sent upstream"
	case status == http.StatusNotImplemented:
		msg = "the request's Transfer-Encoding is not supported (send chunked or a Content-Length); nothing was sent upstream"
	default:
		// net/http's detail after the reason ("missing required Host
		// header", "too many Host headers") is fixed text, never the
		// client's bytes.
		if _, detail, ok := bytes.Cut(line, []byte(": ")); ok {
			msg = fmt.Sprintf("the request is not valid HTTP/1.1: %s; nothing was sent upstream", detail)
		}
	}
	return jsonRefusalOf(status, msg)
}

// expectationFailed reports whether p is the answer net/http's server
// writes, before any handler runs, to an Expect other than 100-continue:
// a 417 with no body.
func expectationFailed(p []byte) bool {
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: "))
	if !ok {
		return false
	}
	date, ok := bytes.CutSuffix(rest, []byte("\r\nContent-Length: 0\r\n\r\n"))
	return ok && len(date) < 64 && !bytes.ContainsAny(date, "\r\n")
}

// jsonRefusalOf is a whole answer with status and idemproxy's bad_request
// error saying msg, closing the connection.
func jsonRefusalOf(status int, msg string) ([]byte, bool) {
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Code, body.Error.Message = proxy.CodeBadRequest, msg
	b, err := json.Marshal(body)
	if err != nil {
		return nil, false
	}
	b = append(b, '\n')
	out := fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		status, http.StatusText(status), len(b))
	return append(out, b...), true
}
