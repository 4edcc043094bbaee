package retry

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/internal/heldbody"
)

type connCounterKey struct{}

// dropSecondServer serves keep-alive connections; on the SECOND request of
// a connection it reads the request fully (the provider has it, and might
// have acted on it), then hijacks and closes the connection without
// answering. That is the case where *http.Transport replays on its own.
// It counts arrivals by the X-Marker header.
type dropSecondServer struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen map[string]int
}

func newDropSecondServer(t *testing.T) *dropSecondServer {
	d := &dropSecondServer{seen: make(map[string]int)}
	d.srv = httptest.NewUnstartedServer(http.HandlerFunc(d.serve))
	d.srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connCounterKey{}, new(atomic.Int32))
	}
	d.srv.Start()
	t.Cleanup(d.srv.Close)
	return d
}

func (d *dropSecondServer) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	d.mu.Lock()
	d.seen[r.Header.Get("X-Marker")]++
	d.mu.Unlock()
	if r.Context().Value(connCounterKey{}).(*atomic.Int32).Add(1) == 2 {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		conn.Close()
		return
	}
	io.WriteString(w, "ok")
}

func (d *dropSecondServer) count(marker string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seen[marker]
}

// TestOneShotPreventsSilentResend proves the hazard and the fix. Through a
// plain *http.Transport, the second request on a kept-alive connection that
// the server drops after reading it is resent by net/http itself
// (transport.go:818 shouldRetryRequest, request.go:1534 isReplayable): the
// server sees the same marker — in real life the same signed nonce — twice,
// and the caller sees a success and one attempt. Through OneShot it is sent
// exactly once and the error reaches the caller, whose retry loop counts it,
// waits, and re-signs.
func TestOneShotPreventsSilentResend(t *testing.T) {
	tests := []struct {
		name    string
		request func(url string) *http.Request
	}{
		{"POST with Idempotency-Key and GetBody", func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte(`{"order_id":"o-1"}`)))
			r.Header.Set("Idempotency-Key", "k-1")
			return r
		}},
		{"POST with a held body, Idempotency-Key and GetBody", func(url string) *http.Request {
			b := []byte(`{"order_id":"o-1"}`)
			r, _ := http.NewRequest(http.MethodPost, url, nil)
			r.Body, r.ContentLength = heldbody.New(b), int64(len(b))
			r.GetBody = func() (io.ReadCloser, error) { return heldbody.New(b), nil }
			r.Header.Set("Idempotency-Key", "k-1")
			return r
		}},
		{"POST with Idempotency-Key and no body", func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, url, nil)
			r.Header.Set("Idempotency-Key", "k-1")
			return r
		}},
		{"POST with X-Idempotency-Key and no body", func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, url, nil)
			r.Header.Set("X-Idempotency-Key", "k-1")
			return r
		}},
		{"PUT with Idempotency-Key and NoBody", func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPut, url, http.NoBody)
			r.Header.Set("Idempotency-Key", "k-1")
			return r
		}},
		{"GET", func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodGet, url, nil)
			return r
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Run("plain http.Transport resends", func(t *testing.T) {
				d := newDropSecondServer(t)
				wire := &http.Transport{}
				defer wire.CloseIdleConnections()
				warmUp(t, wire, d.srv.URL)
				req := tt.request(d.srv.URL)
				req.Header.Set("X-Marker", "m")
				resp, err := wire.RoundTrip(req)
				if err != nil {
					t.Fatalf("plain transport: %v (expected its silent resend to succeed)", err)
				}
				resp.Body.Close()
				if n := d.count("m"); n != 2 {
					t.Errorf("server saw the request %d times, want 2 (the silent resend)", n)
				}
			})
			t.Run("OneShot sends once", func(t *testing.T) {
				d := newDropSecondServer(t)
				wire := &http.Transport{}
				defer wire.CloseIdleConnections()
				warmUp(t, wire, d.srv.URL)
				req := tt.request(d.srv.URL)
				req.Header.Set("X-Marker", "m")
				getBody := req.GetBody
				resp, err := OneShot{Next: wire}.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
					t.Fatal("OneShot: got a response, want the dropped connection's error")
				}
				if n := d.count("m"); n != 1 {
					t.Errorf("server saw the request %d times, want exactly 1", n)
				}
				if (getBody == nil) != (req.GetBody == nil) {
					t.Error("OneShot modified the caller's request")
				}
			})
		})
	}
}

// warmUp makes one request and returns its connection to the idle pool, so
// that the next request reuses it (the resend only happens on reused
// connections: transport.go shouldRetryRequest, "!pc.isReused()").
func warmUp(t *testing.T, rt http.RoundTripper, url string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("X-Marker", "warm-up")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// An empty body sent through OneShot is still empty on the wire, framed as
// its method expects: no body and no framing for GET/DELETE, and
// "Content-Length: 0" (never a zero-length chunked body, which some providers
// and WAFs answer with 411) for POST, PUT and PATCH. The key arrives.
func TestOneShotEmptyBodyFraming(t *testing.T) {
	type seen struct {
		length   string // the Content-Length header as sent; "" when none
		chunked  bool
		bodySize int
		key      string
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Header.Get("Content-Length"), len(r.TransferEncoding) > 0, len(b), r.Header.Get("Idempotency-Key")}
	}))
	defer srv.Close()
	tests := []struct {
		name       string
		method     string
		body       io.Reader
		wantLength string
	}{
		{"GET nil body", http.MethodGet, nil, ""},
		{"DELETE nil body", http.MethodDelete, nil, ""},
		{"POST nil body", http.MethodPost, nil, "0"},
		{"POST NoBody", http.MethodPost, http.NoBody, "0"},
		{"PUT nil body", http.MethodPut, nil, "0"},
		{"PATCH NoBody", http.MethodPatch, http.NoBody, "0"},
		{"POST with body", http.MethodPost, bytes.NewReader([]byte("{}")), "2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL, tt.body)
			req.Header.Set("Idempotency-Key", "k-1")
			resp, err := OneShot{Next: srv.Client().Transport}.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.Request != req {
				t.Error("response.Request is not the caller's request")
			}
			if _, ok := req.Header["Idempotency-Key"]; !ok {
				t.Error("OneShot modified the caller's header map")
			}
			s := <-got
			wantSize := 0
			if req.ContentLength > 0 {
				wantSize = int(req.ContentLength)
			}
			if s.bodySize != wantSize || s.chunked || s.key != "k-1" || s.length != tt.wantLength {
				t.Errorf("server saw body %d bytes, chunked %v, Content-Length %q, key %q; want %d, not chunked, %q, k-1",
					s.bodySize, s.chunked, s.length, s.key, wantSize, tt.wantLength)
			}
		})
	}
}

// TestOneShotHeldAttemptSentOnce: the retry loop's attempt, a held body and
// no GetBody, which OneShot hands to net/http as an in-memory reader, is
// still sent once when the kept-alive connection drops after the server read
// it: the error reaches the caller, net/http does not resend it.
func TestOneShotHeldAttemptSentOnce(t *testing.T) {
	d := newDropSecondServer(t)
	wire := &http.Transport{}
	defer wire.CloseIdleConnections()
	warmUp(t, wire, d.srv.URL)
	b := []byte(`{"order_id":"o-1"}`)
	req, _ := http.NewRequest(http.MethodPost, d.srv.URL, nil)
	req.Body, req.ContentLength = heldbody.New(b), int64(len(b))
	req.Header.Set("Idempotency-Key", "k-1")
	req.Header.Set("X-Marker", "held")
	resp, err := OneShot{Next: wire}.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("OneShot: got a response, want the dropped connection's error")
	}
	if n := d.count("held"); n != 1 {
		t.Errorf("server saw the attempt %d times, want exactly 1", n)
	}
}

// writeCounter counts the writes on the connections a transport dials.
type writeCounter struct {
	net.Conn
	n *atomic.Int32
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// opaqueBody is a request body of a type net/http does not know.
type opaqueBody struct{ r *bytes.Reader }

func (b opaqueBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (opaqueBody) Close() error                 { return nil }

// TestOneShotHeldBodyOneWrite: an attempt whose body the retry loop holds
// leaves in one write on the connection, header and body together, as
// net/http sends an in-memory body; a body of a type net/http does not know
// takes two (the header is flushed first, in case the body blocks). The
// attempt is still sent once: the server sees it once and answers it.
func TestOneShotHeldBodyOneWrite(t *testing.T) {
	var seen atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); string(b) != `{"order_id":"w-1","amount":1000}` {
			t.Errorf("server got body %q", b)
		}
		seen.Add(1)
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	var writes atomic.Int32
	wire := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{c, &writes}, nil
	}}
	defer wire.CloseIdleConnections()
	body := []byte(`{"order_id":"w-1","amount":1000}`)
	send := func(b io.ReadCloser) int32 {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", nil)
		req.Body, req.ContentLength = b, int64(len(body))
		req.Header.Set("Idempotency-Key", "k-1")
		before := writes.Load()
		resp, err := OneShot{Next: wire}.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Request != req {
			t.Error("the response's Request is not the caller's")
		}
		return writes.Load() - before
	}
	for i := range 2 { // a new connection, then a reused one
		if n := send(heldbody.New(body)); n != 1 {
			t.Errorf("held body, request %d: %d writes on the connection, want 1", i+1, n)
		}
	}
	if n := send(opaqueBody{bytes.NewReader(body)}); n != 2 {
		t.Errorf("body of an unknown type: %d writes, want 2 (the header flushed apart); the count does not see a split", n)
	}
	if n := seen.Load(); n != 3 {
		t.Errorf("server saw %d requests, want 3", n)
	}
}
