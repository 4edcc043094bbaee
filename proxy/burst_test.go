package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// smallBuffers is a listener whose connections have a small receive
// buffer, so that what a client has written is, within a few kilobytes,
// what the server has read.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		c.(*net.TCPConn).SetReadBuffer(32 << 10)
	}
	return c, err
}

// A burst of large bodies that together pass MaxInflightBytes: each body
// grows its buffer as it arrives, so all of them held a part of the bound
// and the one that needed to grow first was refused, whichever it was;
// when they grew at the same pace none got through. The body furthest
// along (the most bytes held) must get through, the others refused 503
// overloaded with Retry-After, nothing sent.
//
// The bodies go to a real server on loopback with small socket buffers, so
// that a write that returned has been read by the proxy but for a few
// kilobytes: first 3 MiB of A (its buffer grows to 4 MiB), then 1.5 MiB of
// B and of C (2 MiB each: the bound is full), then A's 4th MiB (where it
// must grow), then the rest of the three at once. Before: A was refused,
// and C or B took its place.
func TestBurstOfLargeBodiesLetsOneThrough(t *testing.T) {
	const bound, size = 8 << 20, 5 << 20
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.MaxBodyBytes, o.MaxInflightBytes = size+(64<<10), bound
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: smallBuffers{ln}, Config: &http.Server{Handler: e.h}}
	srv.Start()
	t.Cleanup(srv.Close)
	dialer := &net.Dialer{}
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err == nil {
				c.(*net.TCPConn).SetWriteBuffer(32 << 10)
			}
			return c, err
		},
	}, Timeout: time.Minute}

	type burst struct {
		id   string
		body string
		pw   *io.PipeWriter
		sent int
		got  chan sent
	}
	start := func(id string) *burst {
		b := &burst{id: id, body: orderOf(id, size-len(orderOf(id, 0))), got: make(chan sent, 1)}
		pr, pw := io.Pipe()
		b.pw = pw
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", pr)
		req.ContentLength = int64(len(b.body))
		req.Header.Set("Content-Type", "application/json")
		go func() {
			resp, err := client.Do(req)
			if err != nil {
				pr.CloseWithError(err)
				b.got <- sent{err: err}
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			pr.CloseWithError(io.ErrClosedPipe) // a body the server stopped reading is not sent on
			b.got <- sent{answer{resp.StatusCode, resp.Header, body}, err}
		}()
		return b
	}
	sendTo := func(b *burst, to int) {
		if _, err := io.WriteString(b.pw, b.body[b.sent:to]); err != nil {
			t.Fatalf("%s: its first %d bytes: %v", b.id, to, err)
		}
		b.sent = to
	}
	a := start("burst-a")
	sendTo(a, 3<<20)
	bs, c := start("burst-b"), start("burst-c")
	sendTo(bs, 3<<19)
	sendTo(c, 3<<19)
	sendTo(a, 4<<20)
	for _, b := range []*burst{a, bs, c} {
		go func() {
			_, err := io.WriteString(b.pw, b.body[b.sent:])
			b.pw.CloseWithError(err)
		}()
	}
	for _, b := range []*burst{a, bs, c} {
		got := <-b.got
		if got.err != nil {
			t.Fatalf("%s: %v", b.id, got.err)
		}
		if b == a {
			checkExecutedOnce(t, e, got.answer, b.id)
			continue
		}
		checkOverloaded(t, e, got.answer, orderKey(t, e, b.id))
		if !strings.Contains(string(got.body), "body bytes") {
			t.Errorf("%s: %s; want the body bytes bound named", b.id, got.body)
		}
	}
}
