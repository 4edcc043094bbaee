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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// SIGTERM with requests queued behind a provider's pause and the data
// directory removed: the queued requests, never sent, get a 503 with their
// key at once, and the process exits within the grace (plus exitMargin) although
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
	bound := time.After(grace + exitMargin)
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

// TestShutdownCutsStalledStreamedBody: an unprotected request streamed
// upstream as its body arrives (no signing over the body) whose client
// stalls mid-body, and another whose client trickles its body without end,
// do not hold the drain to the end of the grace. At SIGTERM the stalled one
// is cut once its body has not moved for a short while, the trickling one
// shortly before the grace ends; each client gets 503 upstream_unavailable
// with Retry-After and Connection: close, the request upstream is broken off
// (the provider sees its body end before it is whole: it cannot act on it),
// and the process exits 0 within the grace. So is, at the same time as the
// trickling one, a request whose client sends as fast as it can to a
// provider that does not take the body in (idemproxy is then not reading
// it). A streamed request whose body arrived whole is not cut: the
// provider's answer, given after the others were cut, is passed on.
func TestShutdownCutsStalledStreamedBody(t *testing.T) {
	const grace = 10 * time.Second
	type seen struct {
		path string
		n    int
		err  error
	}
	entered := make(chan string, 4)
	got := make(chan seen, 4)
	answerComplete := make(chan struct{})
	exited := make(chan struct{}) // closed once the process has exited
	var exitedOnce sync.Once
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- r.URL.Path
		if r.URL.Path == "/uploads/unread" { // takes the body in only once idemproxy is gone
			<-exited
		}
		b, err := io.ReadAll(r.Body)
		got <- seen{r.URL.Path, len(b), err}
		if err != nil {
			return
		}
		if r.URL.Path == "/uploads/complete" { // answered after the others' cut
			<-answerComplete
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	defer exitedOnce.Do(func() { close(exited) }) // before up.Close
	// The unread body is more than the sockets between it and the provider hold.
	const unreadSize = 64 << 20
	p := launch(t, launchSpec{env: baseEnv(up.URL, filepath.Join(t.TempDir(), "data"), "IDEMPROXY_SHUTDOWN_GRACE="+grace.String(),
		"IDEMPROXY_MAX_BODY_BYTES="+strconv.Itoa(unreadSize))})
	dial := func() net.Conn {
		conn, err := net.Dial("tcp", p.proxy)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}

	// Stalled: declares 1000 bytes, sends 100, then nothing.
	stalled := dial()
	fmt.Fprintf(stalled, "PUT /uploads/stalled HTTP/1.1\r\nHost: idemproxy\r\nContent-Type: text/csv\r\nContent-Length: 1000\r\n\r\n%s", strings.Repeat("s", 100))
	// Trickling: chunked, one byte every 100 ms until its connection ends.
	trickling := dial()
	fmt.Fprintf(trickling, "PUT /uploads/trickling HTTP/1.1\r\nHost: idemproxy\r\nContent-Type: text/csv\r\nTransfer-Encoding: chunked\r\n\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			if _, err := io.WriteString(trickling, "1\r\nt\r\n"); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	// Complete: its whole body sent; the provider answers late.
	complete := dial()
	fmt.Fprintf(complete, "PUT /uploads/complete HTTP/1.1\r\nHost: idemproxy\r\nContent-Type: text/csv\r\nContent-Length: 1000\r\n\r\n%s", strings.Repeat("c", 1000))
	// Unread: sends as fast as the provider, which does not read, lets it.
	unread := dial()
	fmt.Fprintf(unread, "PUT /uploads/unread HTTP/1.1\r\nHost: idemproxy\r\nContent-Type: text/csv\r\nContent-Length: %d\r\n\r\n", unreadSize)
	go func() {
		piece := strings.Repeat("u", 64<<10)
		for range unreadSize / len(piece) {
			if _, err := io.WriteString(unread, piece); err != nil {
				return
			}
		}
	}()
	for range 4 { // all four are streaming to the provider
		select {
		case <-entered:
		case <-time.After(time.Minute):
			t.Fatalf("the streamed requests never reached the provider:\n%s", p.text())
		}
	}
	time.Sleep(time.Second) // the provider has the first bytes; the unread body's sockets are full

	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The trickling body is cut 3/4 into the grace (min(grace/4, 5 s)
	// before its end); the complete request is answered after that.
	time.AfterFunc(grace*3/4+300*time.Millisecond, func() { close(answerComplete) })
	type answer struct {
		name  string
		after time.Duration
		resp  *http.Response
		body  string
		err   error
	}
	answers := make(chan answer, 4)
	for name, conn := range map[string]net.Conn{"stalled": stalled, "trickling": trickling, "complete": complete, "unread": unread} {
		go func() {
			conn.SetReadDeadline(time.Now().Add(grace + 5*time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			a := answer{name: name, after: time.Since(start), resp: resp, err: err}
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				a.body = string(b)
			}
			answers <- a
		}()
	}
	for range 4 {
		a := <-answers
		if a.err != nil {
			t.Errorf("%s streamed request: no answer %s after SIGTERM (grace %s): %v\n%s", a.name, a.after.Round(time.Millisecond), grace, a.err, p.text())
			continue
		}
		t.Logf("%s streamed request answered %s after SIGTERM: %d %s", a.name, a.after.Round(time.Millisecond), a.resp.StatusCode, strings.TrimSpace(a.body))
		if a.name == "complete" {
			if a.resp.StatusCode != http.StatusCreated {
				t.Errorf("streamed request whose body arrived whole = %d %s at shutdown; want the provider's 201 passed on", a.resp.StatusCode, a.body)
			}
			continue
		}
		if a.resp.StatusCode != http.StatusServiceUnavailable || a.resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(a.body, `"upstream_unavailable"`) || !strings.Contains(a.body, "shutting down") {
			t.Errorf("%s streamed request at SIGTERM = %d Retry-After=%q %s; want 503 upstream_unavailable with Retry-After, saying it is shutting down",
				a.name, a.resp.StatusCode, a.resp.Header.Get("Retry-After"), a.body)
		}
		if !a.resp.Close {
			t.Errorf("%s streamed request's connection is kept after its cut body; want Connection: close", a.name)
		}
		if a.name == "stalled" && a.after > grace/2 {
			t.Errorf("stalled streamed request answered %s after SIGTERM; want it cut once its body stopped, well before the grace (%s) ends", a.after.Round(time.Millisecond), grace)
		}
	}
	select {
	case <-p.done:
	case <-time.After(grace - time.Since(start)):
		t.Fatalf("still running at the end of the grace (%s) after SIGTERM:\n%s", grace, p.text())
	}
	t.Logf("exited %s after SIGTERM (grace %s): %v", time.Since(start).Round(time.Millisecond), grace, p.err)
	if p.err != nil {
		t.Errorf("exit after SIGTERM = %v, want 0 (drain finished):\n%s", p.err, p.text())
	}
	exitedOnce.Do(func() { close(exited) })
	for range 4 {
		var s seen
		select {
		case s = <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("the provider's handlers did not end after the process exited")
		}
		t.Logf("provider read %d bytes of %s: %v", s.n, s.path, s.err)
		switch {
		case s.path == "/uploads/complete":
			if s.err != nil || s.n != 1000 {
				t.Errorf("the provider read %d bytes of the complete body: %v; want 1000", s.n, s.err)
			}
		case s.err == nil:
			t.Errorf("the provider read %s whole (%d bytes): the cut request reached it as complete; want its body broken off", s.path, s.n)
		case s.n == 0:
			t.Errorf("the provider read nothing of %s: the test did not stream", s.path)
		}
	}
}
