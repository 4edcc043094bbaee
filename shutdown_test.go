package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// SIGTERM with requests queued behind a provider's pause and the data
// directory removed: the queued requests, never sent, get a 503 with their
// key at once, and the process exits within the grace plus 5 s although
// Badger can no longer flush (its Close would retry forever). The request
// that met the 429, waiting out the pause for its next attempt, is answered
// too, not cut off when the process exits: it was sent, so it gets what a
// spent retry budget gets (502 with its key), saying idemproxy is shutting
// down and, its key released after a 429, not that the outcome may be unknown.
func TestShutdownWithQueuedRequestsAndDataDirGone(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		first := len(seen) == 0
		seen[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		if first { // the provider pauses everyone for a minute
			w.Header().Set("Retry-After", "60")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	dir := filepath.Join(t.TempDir(), "data")
	const grace = 3 * time.Second
	p := launch(t, launchSpec{env: baseEnv(up.URL, dir, "IDEMPROXY_SHUTDOWN_GRACE="+grace.String())})

	type got struct {
		status int
		key    string
		retry  string
		body   string
	}
	post := func(order string, out chan<- got) {
		resp, err := http.Post("http://"+p.proxy+"/v1/payouts", "application/json",
			strings.NewReader(fmt.Sprintf(`{"order_id":%q}`, order)))
		if err != nil {
			out <- got{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct {
				Key string `json:"idempotency_key"`
			} `json:"error"`
		}
		json.Unmarshal(b, &e)
		out <- got{resp.StatusCode, e.Error.Key, resp.Header.Get("Retry-After"), string(b)}
	}
	paused := make(chan got, 1)
	go post("pauses-everyone", paused)
	p.waitLine(t, "provider asked to pause")
	const queued = 5
	answers := make(chan got, queued)
	for i := range queued {
		go post(fmt.Sprintf("queued-%d", i), answers)
	}
	// All five are claimed (in flight) and held at the gate, never sent.
	// Listed in flight is not yet claimed: a claim is visible before the
	// sync round that makes it durable returns it, and a claim whose sync
	// round finds the directory gone fails (503 without a key, correctly).
	waitInFlight(t, p.admin, 1+queued)
	waitBegins(t, p.admin, 1+queued)

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	bound := time.After(grace + 5*time.Second)
	for range queued {
		var a got
		select {
		case a = <-answers:
		case <-bound:
			t.Fatalf("queued requests not answered %s after SIGTERM:\n%s", time.Since(start).Round(time.Millisecond), p.text())
		}
		if a.status != http.StatusServiceUnavailable || a.key == "" || a.retry == "" || !strings.Contains(a.body, "nothing was sent") {
			t.Errorf("queued request at shutdown = %d key=%q Retry-After=%q %s; want 503 with its key and Retry-After", a.status, a.key, a.retry, a.body)
		}
	}
	select {
	case <-p.done:
	case <-bound:
		t.Fatalf("still running %s after SIGTERM (grace %s):\n%s", time.Since(start).Round(time.Millisecond), grace, p.text())
	}
	// The process has exited: its answer, if any, has come.
	if a := <-paused; a.status != http.StatusBadGateway || a.key == "" ||
		!strings.Contains(a.body, "shutting down") || strings.Contains(a.body, "unknown") {
		t.Errorf("request waiting out the pause at shutdown = %d key=%q %s; want 502 with its key, saying it is shutting down and not that the outcome may be unknown", a.status, a.key, a.body)
	}
	t.Logf("exited %s after SIGTERM (grace %s): %v", time.Since(start).Round(time.Millisecond), grace, p.err)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Errorf("the provider saw %d keys, want only the first: the queued ones must not be sent", len(seen))
	}
}

// waitBegins polls the metrics until n claims (store Begins) have returned.
func waitBegins(t *testing.T, admin string, n int) {
	t.Helper()
	const series = `idemproxy_store_operation_duration_seconds_count{op="begin"}`
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if scrape(t, "http://"+admin+"/metrics")[series] >= float64(n) {
			return
		}
	}
	t.Fatalf("fewer than %d claims returned within a minute", n)
}

// waitInFlight polls the admin API until n records are in flight.
func waitInFlight(t *testing.T, admin string, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + admin + "/admin/v1/records?state=in_flight&limit=100")
		if err != nil {
			continue
		}
		var page struct {
			Records []json.RawMessage `json:"records"`
		}
		json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if len(page.Records) >= n {
			return
		}
	}
	t.Fatalf("fewer than %d records in flight after a minute", n)
}

// TestShutdownCutsBodyStillArriving: a client stalled in its body (declared
// 100 bytes, sent fewer) does not hold the drain until the server's read
// timeout, past the grace: at SIGTERM it gets 503 with Retry-After, nothing
// is sent, and the process exits 0 (its drain finished), well within the
// grace.
func TestShutdownCutsBodyStillArriving(t *testing.T) {
	var sent atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	p := launch(t, launchSpec{env: baseEnv(up.URL, filepath.Join(t.TempDir(), "data"), "IDEMPROXY_SHUTDOWN_GRACE=20s")})
	conn, err := net.Dial("tcp", p.proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/payouts HTTP/1.1\r\nHost: idemproxy\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n%s", `{"order_id":"stalled"`)
	for deadline := time.Now().Add(time.Minute); scrape(t, "http://"+p.admin+"/metrics")["idemproxy_requests_in_flight"] < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stalled request never reached the handler")
		}
	}
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the stalled request at SIGTERM: %v\n%s", err, p.text())
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(b), "shutting down") || !strings.Contains(string(b), "nothing was sent") {
		t.Errorf("stalled request at SIGTERM = %d Retry-After=%q %s; want 503 with Retry-After, shutting down, nothing sent",
			resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	if !resp.Close {
		t.Error("the stalled request's connection is kept after its cut body; want Connection: close")
	}
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15 s after SIGTERM (grace 20 s):\n%s", p.text())
	}
	if p.err != nil {
		t.Errorf("exit after SIGTERM = %v, want 0 (drain finished):\n%s", p.err, p.text())
	}
	if n := sent.Load(); n != 0 {
		t.Errorf("the provider saw %d requests, want none", n)
	}
}
