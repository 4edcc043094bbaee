package main

// End-to-end tests of unprotected requests through the real binary: they
// stream both ways with no record cap, and a safe method is retried only
// before the first byte of its answer is passed on.

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestBinaryUnprotectedStreams(t *testing.T) {
	release := make(chan struct{})
	var flaky, broken atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/statement": // larger than any record
			w.Header().Set("Content-Type", "text/csv")
			io.WriteString(w, strings.Repeat("x", 1_000_000))
		case "/events": // the second event only after the client has the first
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-release
			io.WriteString(w, "data: two\n\n")
		case "/flaky": // a 503 first, retried because nothing was passed on yet
			if flaky.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ok")
		case "/broken": // breaks after the first bytes were passed on: not retried
			broken.Add(1)
			w.Header().Set("Content-Length", "100")
			io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		case "/upload": // the request body arrives as sent, however large
			n, _ := io.Copy(io.Discard, r.Body)
			io.WriteString(w, strings.Repeat("y", int(n%7)))
			w.Header().Set("X-Got", "ignored")
		}
	}))
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_RETRY_BASE_DELAY=1ms", "IDEMPROXY_RETRY_MAX_DELAY=2ms")
	base := "http://" + p.addr

	big := send(t, http.MethodGet, base+"/statement", "")
	if big.status != http.StatusOK || len(big.body) != 1_000_000 {
		t.Errorf("1,000,000-byte GET: %d, %d bytes", big.status, len(big.body))
	}

	resp, err := http.Get(base + "/events")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: one\n" {
		t.Fatalf("first event %q, %v: not passed on while the stream was open", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if string(rest) != "\ndata: two\n\n" {
		t.Errorf("rest of the stream %q", rest)
	}

	if got := send(t, http.MethodGet, base+"/flaky", ""); got.status != http.StatusOK || got.body != "ok" || flaky.Load() != 2 {
		t.Errorf("GET after a 503: %d %q after %d attempts, want 200 ok after 2", got.status, got.body, flaky.Load())
	}

	resp, err = http.Get(base + "/broken")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || string(b) != "partial" || broken.Load() != 1 {
		t.Errorf("answer broken after its first bytes: %q, %v, %d attempts; want the bytes passed on, the break, one attempt", b, err, broken.Load())
	}

	// A PUT (unprotected) streams its body upstream: larger than a record.
	req, _ := http.NewRequest(http.MethodPut, base+"/upload", io.NopCloser(strings.NewReader(strings.Repeat("u", 900_000))))
	req.ContentLength = -1 // chunked, as a streaming client sends it
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("streamed PUT: %d", resp.StatusCode)
	}
}

// An unprotected answer passes byte for byte even when the provider streams
// a piece of it, on its own, that is exactly what net/http writes for a
// refusal: the binary once rewrote that piece to its JSON error mid-body,
// past the Content-Length, and the next answer on the kept-alive connection
// was read from the wrong place.
func TestBinaryUnprotectedStreamLikeARefusal(t *testing.T) {
	if _, ok := jsonRefusal([]byte(netHTTPRefusal)); !ok {
		t.Fatalf("%q is not taken for net/http's refusal; the test would prove nothing", netHTTPRefusal)
	}
	pieces := []string{"before\n", netHTTPRefusal, "after\n"}
	want := strings.Join(pieces, "")
	next, stop := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", strconv.Itoa(len(want)))
		for i, p := range pieces {
			if i > 0 {
				select { // the client has the piece before: this one is read alone
				case <-next:
				case <-stop: // the test failed
					return
				}
			}
			io.WriteString(w, p)
			w.(http.Flusher).Flush()
		}
	}))
	defer up.Close()
	defer close(stop)
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir())
	k := dialKeptAlive(t, p.addr)
	resp := k.ask(t, "GET /statement HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(want)) {
		t.Fatalf("answer %d with Content-Length %d, want 200 with %d", resp.StatusCode, resp.ContentLength, len(want))
	}
	var got []byte
	for i, piece := range pieces {
		if i > 0 {
			next <- struct{}{}
		}
		b := make([]byte, len(piece))
		n, err := io.ReadFull(resp.Body, b)
		got = append(got, b[:n]...)
		if err != nil {
			t.Fatalf("body so far %q: %v", got, err)
		}
	}
	if string(got) != want {
		t.Fatalf("body %q, want %q", got, want)
	}
	// The connection is in step: a malformed request on it is refused in
	// JSON, as on a new connection.
	resp = k.ask(t, "GET /p HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/json" || errorCode(t, resp) != "bad_request" {
		t.Errorf("malformed request after the answer: %d %q, want 400 application/json bad_request", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// A 3 MiB unprotected answer passes as it comes: the app reads its first
// MiB while the provider still holds the rest back, so nothing buffers the
// answer whole. The provider's hop-by-hop headers (those its Connection
// header names included) stay on its side. A GET whose first attempt loses
// its connection before any answer is sent again.
func TestBinaryUnprotectedLargeAnswerAsItComes(t *testing.T) {
	const size, half = 3 << 20, 3 << 19
	rest, stop := make(chan struct{}), make(chan struct{})
	var dropped atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/dropped" {
			if dropped.Add(1) == 1 {
				conn, _, _ := w.(http.Hijacker).Hijack()
				conn.Close()
				return
			}
			io.WriteString(w, "second try")
			return
		}
		w.Header().Set("Content-Type", "text/csv")
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Header().Set("Connection", "X-Provider-Hop")
		w.Header().Set("X-Provider-Hop", "provider side only")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Proxy-Authenticate", "Basic realm=provider")
		io.WriteString(w, strings.Repeat("a", half))
		w.(http.Flusher).Flush()
		select { // the app has the first MiB before the rest leaves
		case <-rest:
		case <-stop:
			return
		}
		io.WriteString(w, strings.Repeat("b", size-half))
	}))
	defer up.Close()
	defer close(stop)
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_RETRY_BASE_DELAY=1ms", "IDEMPROXY_RETRY_MAX_DELAY=2ms")

	resp, err := http.Get("http://" + p.addr + "/statements/2026-11.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ContentLength != size {
		t.Fatalf("answer %d with length %d, want 200 with %d", resp.StatusCode, resp.ContentLength, size)
	}
	for _, h := range []string{"X-Provider-Hop", "Keep-Alive", "Proxy-Authenticate", "Connection"} {
		if v := resp.Header.Values(h); len(v) > 0 {
			t.Errorf("hop-by-hop header %s: %q reached the app", h, v)
		}
	}
	first := make([]byte, 1<<20)
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(resp.Body, first); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("first MiB: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the first MiB did not arrive while the provider held the rest: the answer is buffered")
	}
	close(rest)
	tail, err := io.ReadAll(resp.Body)
	if err != nil || len(first)+len(tail) != size || strings.Count(string(tail), "b") != size-half {
		t.Errorf("rest of the answer: %d bytes, %v; want %d", len(tail), err, size-len(first))
	}

	if got := send(t, http.MethodGet, "http://"+p.addr+"/dropped", ""); got.status != http.StatusOK || got.body != "second try" || dropped.Load() != 2 {
		t.Errorf("GET after a dropped connection: %d %q after %d attempts, want 200 \"second try\" after 2", got.status, got.body, dropped.Load())
	}
}

// An unprotected request's body streams upstream as the app sends it when
// the signature does not cover the body: the provider reads the first bytes
// while the app still holds the rest back (README, Unprotected methods).
func TestBinaryUnprotectedRequestBodyAsItComes(t *testing.T) {
	first := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, len("part one;"))
		io.ReadFull(r.Body, b)
		first <- string(b)
		rest, _ := io.ReadAll(r.Body)
		io.WriteString(w, string(b)+string(rest))
	}))
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_SIGN_SECRET=stream-test-signing-secret", `IDEMPROXY_SIGN_CANONICAL={timestamp}\n{method}\n{path}`)
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest(http.MethodPut, "http://"+p.addr+"/documents/d-1", pr)
	answer := make(chan reply, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answer <- reply{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answer <- reply{status: resp.StatusCode, body: string(b)}
	}()
	io.WriteString(pw, "part one;")
	select {
	case got := <-first:
		if got != "part one;" {
			t.Errorf("provider read %q first", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the provider did not get the body's first part while the app held the rest: the request body is buffered")
	}
	io.WriteString(pw, "part two")
	pw.Close()
	if got := <-answer; got.status != http.StatusOK || got.body != "part one;part two" {
		t.Errorf("answer %d %q, want 200 with the whole body echoed", got.status, got.body)
	}
}

// An unprotected request whose provider sends no answer within
// IDEMPROXY_ATTEMPT_TIMEOUT gets 504 upstream_unavailable, as a protected one
// does: a GET after its retries, a PUT (sent once) after its one attempt. It
// was answered 499 client_closed_request, "client closed the request", to an
// app that was still waiting, and logged as a network error.
func TestBinaryUnprotectedAttemptTimeout(t *testing.T) {
	held := make(chan struct{})
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select { // no answer until the test ends
		case <-held:
		case <-r.Context().Done():
		}
	}))
	defer up.Close()
	defer close(held)
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_ATTEMPT_TIMEOUT=300ms", "IDEMPROXY_RETRY_MAX_ATTEMPTS=2",
		"IDEMPROXY_RETRY_BASE_DELAY=1ms", "IDEMPROXY_RETRY_MAX_DELAY=2ms")
	base := "http://" + p.addr
	for _, tc := range []struct {
		method   string
		attempts int
	}{{http.MethodGet, 2}, {http.MethodPut, 1}} {
		calls.Store(0)
		got := send(t, tc.method, base+"/v1/statement", "")
		if got.status != http.StatusGatewayTimeout || jsonField(got.body, "code") != "upstream_unavailable" {
			t.Errorf("%s with no answer within the attempt timeout: %d %s, want 504 upstream_unavailable", tc.method, got.status, got.body)
		}
		if n := calls.Load(); n != int32(tc.attempts) {
			t.Errorf("%s: %d attempts, want %d", tc.method, n, tc.attempts)
		}
	}
	if log := p.logText(); strings.Contains(log, `"status":499`) {
		t.Errorf("a request logged as answered 499 (client gone):\n%s", log)
	}
}

// An unprotected request that idemproxy answers with its own
// upstream_unavailable (the provider unreachable, so nothing came to pass on)
// is logged and counted as upstream_unavailable, as a protected one is, not
// as forwarded: the "provider unavailable" alert and the WARN request line
// once missed every lookup that failed so.
func TestBinaryUnprotectedFailureOutcome(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close() // a guaranteed connection refused
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+refused, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_RETRY_MAX_ATTEMPTS=2", "IDEMPROXY_RETRY_BASE_DELAY=1ms", "IDEMPROXY_RETRY_MAX_DELAY=2ms")
	got := send(t, http.MethodGet, "http://"+p.addr+"/v1/payouts/p-1", "")
	if got.status != http.StatusBadGateway || jsonField(got.body, "code") != "upstream_unavailable" {
		t.Fatalf("GET with the provider unreachable: %d %s, want 502 upstream_unavailable", got.status, got.body)
	}
	var line string
	deadline := time.Now().Add(5 * time.Second)
	for line == "" && time.Now().Before(deadline) {
		for l := range strings.SplitSeq(p.logText(), "\n") {
			if strings.Contains(l, `"msg":"request"`) && strings.Contains(l, `"path":"/v1/payouts/p-1"`) {
				line = l
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if jsonField(line, "outcome") != "upstream_unavailable" || jsonField(line, "level") != "WARN" || !strings.Contains(line, `"attempts":2`) {
		t.Errorf("request line %q: want level WARN, outcome upstream_unavailable, attempts 2", line)
	}
}
