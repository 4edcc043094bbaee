package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/idemproxy/idemproxy/proxy"
)

// refusalListener makes the refusals that net/http's server writes itself,
// before any handler runs, reach the app in idemproxy's error format like
// every other refusal (README, Errors idemproxy answers itself): JSON
// {"error":{"code":"bad_request","message":"..."}} with Content-Type
// application/json, the status unchanged. They are requests idemproxy will
// not forward: a malformed request line or header, a control character in a
// header value (an Idempotency-Key included), two Host or Content-Length
// headers, headers over the server's MaxHeaderBytes (431), an unsupported
// Transfer-Encoding (501) or HTTP version (505). Nothing was read past the
// headers and nothing was sent upstream.
type refusalListener struct{ net.Listener }

func (l refusalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return refusalConn{c}, nil
}

// refusalConn rewrites net/http's own refusals on their way out.
type refusalConn struct{ net.Conn }

func (c refusalConn) Write(p []byte) (int, error) {
	out, ok := jsonRefusal(p)
	if !ok {
		return c.Conn.Write(p)
	}
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// netHTTPRefusalHeaders is what net/http's server writes between the status
// line and the body of a refusal it makes before any handler runs, in one
// Write on the connection (net/http server.go, conn.serve). An answer a
// handler writes never starts so: net/http writes the Date header, or the
// handler's own headers, before Content-Type.
const netHTTPRefusalHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// jsonRefusal returns the refusal p in idemproxy's error format, if p is one
// of net/http's: "HTTP/1.1 <status line>" + netHTTPRefusalHeaders + a body
// that repeats the status line (or names the unsupported transfer
// encoding), and nothing else.
func jsonRefusal(p []byte) ([]byte, bool) {
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
