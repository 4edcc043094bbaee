package main

// End-to-end tests of unprotected requests through the real binary: they
// stream both ways with no record cap, and a safe method is retried only
// before the first byte of its answer is passed on.

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
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
