package main

// End-to-end tests of the operator's side with the real binary: graceful drain
// on SIGTERM, readiness, metrics after a scripted sequence, the request log, and
// that no configured secret reaches the log.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// opsProc is a running idemproxy binary whose log lines a test can wait for.
type opsProc struct {
	cmd   *exec.Cmd
	proxy string // proxy listener address
	admin string // admin listener address
	mu    sync.Mutex
	lines []string
	more  chan struct{} // closed and replaced when a line arrives or the log ends
	ended bool          // the log reached EOF
	done  chan struct{} // closed when the process has exited
	err   error         // its exit status, once done is closed
}

// launchSpec says how to run the binary.
type launchSpec struct {
	bin  string              // "" means binPath
	args []string            // subcommand, none to serve
	env  []string            // the whole environment: nothing is added
	cred *syscall.Credential // run as this user; nil means as the test
}

// launch runs the binary and waits until it logs that it listens.
func launch(t testing.TB, spec launchSpec) *opsProc {
	t.Helper()
	p := startProc(t, spec)
	p.listening(t)
	return p
}

// listening waits until the process logs that it listens, and notes where.
func (p *opsProc) listening(t testing.TB) {
	t.Helper()
	line := p.waitLine(t, `"msg":"idemproxy listening"`)
	p.proxy, p.admin = jsonField(line, "proxy"), jsonField(line, "admin")
}

// startProc runs the binary; it does not wait for anything.
func startProc(t testing.TB, spec launchSpec) *opsProc {
	t.Helper()
	bin := spec.bin
	if bin == "" {
		bin = binPath
	}
	cmd := exec.Command(bin, spec.args...)
	cmd.Env = spec.env
	if spec.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: spec.cred}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &opsProc{cmd: cmd, more: make(chan struct{}), done: make(chan struct{})}
	// Wait closes the pipe: read it to the end first, or the last lines
	// (written just before exit) can be lost.
	logged := make(chan struct{})
	go func() { p.read(stderr); close(logged) }()
	go func() { <-logged; p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-p.done })
	return p
}

func (p *opsProc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		close(p.more)
		p.more = make(chan struct{})
		p.mu.Unlock()
	}
	p.mu.Lock()
	p.ended = true
	close(p.more)
	p.mu.Unlock()
}

// waitLine returns the first log line containing substr, waiting for it to be
// written. It fails the test if the log ends without one; the one-minute bound
// only keeps a broken binary from hanging the run.
func (p *opsProc) waitLine(t testing.TB, substr string) string {
	t.Helper()
	bound := time.After(time.Minute)
	for i := 0; ; {
		p.mu.Lock()
		for ; i < len(p.lines); i++ {
			if strings.Contains(p.lines[i], substr) {
				line := p.lines[i]
				p.mu.Unlock()
				return line
			}
		}
		more, ended := p.more, p.ended
		p.mu.Unlock()
		if ended {
			t.Fatalf("log ended without %q:\n%s", substr, p.text())
		}
		select {
		case <-more:
		case <-bound:
			t.Fatalf("no log line with %q within a minute:\n%s", substr, p.text())
		}
	}
}

// servesOrExits waits until the process logs that it listens (true, its
// addresses noted) or exits without doing so (false, p.done closed). The
// one-minute bound only keeps a broken binary from hanging the run.
func (p *opsProc) servesOrExits(t testing.TB) bool {
	t.Helper()
	bound := time.After(time.Minute)
	for i := 0; ; {
		p.mu.Lock()
		for ; i < len(p.lines); i++ {
			if line := p.lines[i]; strings.Contains(line, `"msg":"idemproxy listening"`) {
				p.mu.Unlock()
				p.proxy, p.admin = jsonField(line, "proxy"), jsonField(line, "admin")
				return true
			}
		}
		more, ended := p.more, p.ended
		p.mu.Unlock()
		if ended {
			<-p.done
			return false
		}
		select {
		case <-more:
		case <-bound:
			t.Fatalf("neither listening nor exited within a minute:\n%s", p.text())
		}
	}
}

// text is the whole log so far.
func (p *opsProc) text() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// requestLines returns the parsed "request" log lines.
func (p *opsProc) requestLines(t *testing.T) []map[string]any {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []map[string]any
	for _, l := range p.lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("log line is not JSON: %v: %s", err, l)
			continue
		}
		if m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

// terminate sends SIGTERM and waits for the exit; it returns the exit error.
func (p *opsProc) terminate(t testing.TB) error {
	t.Helper()
	_, err := p.terminateWithin(t, 0)
	return err
}

// terminateWithin sends SIGTERM and waits for the exit, failing the test if
// the process still runs limit later (0: no limit); it returns how long the
// exit took and the exit error.
// exitMargin is what a test allows past the shutdown grace for a process to
// end after SIGTERM: the scheduling of the signal, of the store's close and
// of the exit (README, Operations: the process exits within the grace, the
// store's close included, plus at most a quarter of a second).
const exitMargin = 250 * time.Millisecond

func (p *opsProc) terminateWithin(t testing.TB, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var timeout <-chan time.Time
	if limit > 0 {
		timeout = time.After(limit)
	}
	select {
	case <-p.done:
	case <-timeout:
		t.Fatalf("still running %v after SIGTERM, want an exit within %v:\n%s",
			time.Since(start).Round(time.Millisecond), limit, p.text())
	}
	return time.Since(start), p.err
}

// baseEnv is the environment of a test run: loopback listeners on free ports.
func baseEnv(upstream, dataDir string, extra ...string) []string {
	return append([]string{
		"PATH=" + os.Getenv("PATH"),
		"IDEMPROXY_UPSTREAM_URL=" + upstream,
		"IDEMPROXY_DATA_DIR=" + dataDir,
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0",
		"IDEMPROXY_ADMIN_ADDR=127.0.0.1:0",
	}, extra...)
}

// reply is what a client got.
type reply struct {
	status int
	header http.Header
	body   string
}

func send(t testing.TB, method, url, body string, header ...string) reply {
	t.Helper()
	r, err := trySend(method, url, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// trySend is send for goroutines other than the test's, which must not call
// t.Fatal.
func trySend(method, url, body string, header ...string) (reply, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}, nil
}

// sentReply is the reply to a request sent from another goroutine, or its
// error.
type sentReply struct {
	reply
	err error
}

// goSend sends a request from a new goroutine; the reply or error arrives on
// the channel for the test goroutine to check.
func goSend(method, url, body string, header ...string) <-chan sentReply {
	c := make(chan sentReply, 1)
	go func() {
		r, err := trySend(method, url, body, header...)
		c <- sentReply{r, err}
	}()
	return c
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	return send(t, http.MethodGet, url, "").status
}

func TestSIGTERMDrainsInFlightOperation(t *testing.T) {
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	env := baseEnv(up.URL, t.TempDir(), "IDEMPROXY_SHUTDOWN_GRACE=2m")
	p := launch(t, launchSpec{env: env})
	if got := getStatus(t, "http://"+p.admin+"/readyz"); got != http.StatusOK {
		t.Fatalf("readyz before shutdown = %d, want 200", got)
	}

	body := `{"order_id":"drain-1","amount":"10.00"}`
	answer := make(chan reply, 1)
	go func() {
		resp, err := http.Post("http://"+p.proxy+"/v1/payments", "application/json", strings.NewReader(body))
		if err != nil {
			answer <- reply{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answer <- reply{resp.StatusCode, resp.Header, string(b)}
	}()
	key := <-prov.entered // the operation is at the provider, held there

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitLine(t, "proxy listener closed")
	if got := getStatus(t, "http://"+p.admin+"/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("readyz while draining = %d, want 503", got)
	}
	if got := getStatus(t, "http://"+p.admin+"/healthz"); got != http.StatusOK {
		t.Errorf("healthz while draining = %d, want 200 (alive)", got)
	}
	if c, err := net.Dial("tcp", p.proxy); err == nil {
		c.Close()
		t.Error("proxy port still accepts connections while draining")
	}
	select {
	case <-p.done:
		t.Fatalf("process exited with the operation still in flight: %v", p.err)
	default:
	}

	close(prov.release)
	a := <-answer
	if a.status != http.StatusCreated || !strings.Contains(a.body, `"status":"succeeded"`) {
		t.Fatalf("held client got %d %q, want the provider's 201", a.status, a.body)
	}
	<-p.done
	if p.err != nil {
		t.Fatalf("exit after drain: %v, want status 0\n%s", p.err, p.text())
	}
	log := p.text()
	order := []string{"shutting down: not ready", "proxy listener closed", `"msg":"request"`, "shutdown complete", "store closed"}
	last := -1
	for _, s := range order {
		i := strings.Index(log, s)
		if i < 0 || i < last {
			t.Fatalf("log lacks %q or has it out of order %q:\n%s", s, order, log)
		}
		last = i
	}

	// The record was stored before exit: on the same directory, the repeat is a
	// replay and the provider is not called again.
	p2 := launch(t, launchSpec{env: env})
	r := send(t, http.MethodPost, "http://"+p2.proxy+"/v1/payments", body)
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.body != a.body {
		t.Errorf("repeat after restart = %d replayed=%q %q, want the stored 201 replayed", r.status, r.header.Get("Idempotent-Replayed"), r.body)
	}
	if !strings.Contains(p2.text(), `"count":0`) {
		t.Errorf("restart released in-flight records; the drained one should have been final:\n%s", p2.text())
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.seen[key] != 1 || prov.execs[key] != 1 {
		t.Errorf("provider saw key %d times, executed %d, want 1 and 1", prov.seen[key], prov.execs[key])
	}
}

// SIGHUP (docker kill -s HUP, sent to reload; a closed terminal) drains as
// SIGTERM does: the operation in flight is answered and stored, exit 0. Left
// to Go's default it ended the process at once (as PID 1 with exit status 2,
// which says "bad configuration", and no log line), cutting the answer.
func TestSIGHUPDrains(t *testing.T) {
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer prov.Release()
	p := launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir(), "IDEMPROXY_SHUTDOWN_GRACE=2m")})
	answered := make(chan int, 1) // the status, 0 when the answer was cut
	go func() {
		resp, err := http.Post("http://"+p.proxy+"/v1/payments", "application/json", strings.NewReader(`{"order_id":"hup-1","amount":"10.00"}`))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	<-prov.entered // held at the provider: the drain waits for it
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitLine(t, "proxy listener closed")
	prov.Release()
	if status := <-answered; status != http.StatusCreated {
		t.Errorf("the order in flight at SIGHUP = %d, want 201 (0: cut)", status)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("still running a minute after SIGHUP:\n%s", p.text())
	}
	if p.err != nil {
		t.Errorf("exit after SIGHUP: %v, want 0\n%s", p.err, p.text())
	}
	p.waitLine(t, "shutdown complete")
}

// A second SIGTERM during the drain ends the process at once, as README
// says, with exit status 1 and a log line saying so. It was left to the
// signal's default action: outside a container the process died of the
// signal with nothing logged, and as PID 1 in a container (where the kernel
// ignores a default-action signal) Go's runtime exited with status 2, which
// says "bad configuration" (seen with docker kill -s TERM twice). What was in
// flight is released at the next start and the retry runs it once.
func TestSecondSIGTERMStopsAtOnce(t *testing.T) {
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer prov.Release()
	env := baseEnv(up.URL, t.TempDir(), "IDEMPROXY_SHUTDOWN_GRACE=2m")
	p := launch(t, launchSpec{env: env})
	body := `{"order_id":"twice-1","amount":"10.00"}`
	go func() {
		resp, err := http.Post("http://"+p.proxy+"/v1/payments", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
	}()
	key := <-prov.entered // held at the provider: the drain waits for it

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitLine(t, "proxy listener closed")
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("still draining a minute after the second SIGTERM:\n%s", p.text())
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("exit after a second SIGTERM: %v, want exit status 1\n%s", p.err, p.text())
	}
	if line := p.waitLine(t, "second signal during the drain"); !strings.Contains(line, `"signal":"terminated"`) {
		t.Errorf("the log line does not name the signal: %s", line)
	}
	prov.Release() // the provider executes; the answer has nobody to go to
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		prov.mu.Lock()
		n := prov.execs[key]
		prov.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the held execution never ended")
		}
	}

	p2 := launch(t, launchSpec{env: env})
	if !strings.Contains(p2.text(), `"count":1`) {
		t.Errorf("restart did not release exactly one in-flight record:\n%s", p2.text())
	}
	r := send(t, http.MethodPost, "http://"+p2.proxy+"/v1/payments", body)
	if r.status != http.StatusCreated || r.header.Get("Idempotency-Key") != key {
		t.Errorf("retry after restart = %d key=%q %s, want 201 under %q", r.status, r.header.Get("Idempotency-Key"), r.body, key)
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs[key] != 1 || len(prov.execs) != 1 {
		t.Errorf("executions %v, want exactly one for %q", prov.execs, key)
	}
}

// scriptedProvider answers by order_id: "retry-503" and "retry-429" fail their
// first attempt (the 429 with Retry-After), "down" always fails with 500, any
// other order succeeds; GETs succeed. It records the signature headers it saw.
type scriptedProvider struct {
	mu    sync.Mutex
	calls map[string]int
	seen  []string // X-Signature and X-Nonce values received
}

func newScriptedProvider() *scriptedProvider { return &scriptedProvider{calls: map[string]int{}} }

func (p *scriptedProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req struct {
		OrderID string `json:"order_id"`
	}
	json.Unmarshal(b, &req)
	p.mu.Lock()
	p.calls[req.OrderID]++
	n := p.calls[req.OrderID]
	for _, h := range []string{"X-Signature", "X-Nonce"} {
		if v := r.Header.Get(h); v != "" {
			p.seen = append(p.seen, v)
		}
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet:
		io.WriteString(w, `{"id":"pay_1","status":"succeeded"}`)
	case req.OrderID == "retry-503" && n == 1:
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"code":"maintenance"}}`)
	case req.OrderID == "retry-429" && n == 1:
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"state":1,"message":"rate limit exceeded"}`)
	case req.OrderID == "down":
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":{"code":"internal"}}`)
	default:
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%s","status":"succeeded"}`, req.OrderID)
	}
}

// step is one request of a scripted sequence and the status it must get.
type step struct {
	method, path, body string
	header             []string
	want               int
}

// script is the sequence of TestMetricsAfterScriptedSequence: forward, replay,
// conflict, a retried 503, a retried 429 with Retry-After, a streamed GET, and a
// request refused for want of a key.
var script = []step{
	{"POST", "/v1/payments", `{"order_id":"A","amount":"10.00"}`, nil, 201},
	{"POST", "/v1/payments", `{"order_id":"A","amount":"10.00"}`, nil, 201},
	{"POST", "/v1/payments", `{"order_id":"A","amount":"99.00"}`, nil, 409},
	{"POST", "/v1/payments", `{"order_id":"retry-503","amount":"1.00"}`, nil, 201},
	{"POST", "/v1/payments", `{"order_id":"retry-429","amount":"1.00"}`, nil, 201},
	{"GET", "/v1/payments/pay_1", "", nil, 200},
	{"POST", "/v1/payments", `{"amount":"1.00"}`, nil, 422},
}

func runScript(t *testing.T, p *opsProc, steps []step) {
	t.Helper()
	for i, s := range steps {
		if r := send(t, s.method, "http://"+p.proxy+s.path, s.body, s.header...); r.status != s.want {
			t.Fatalf("step %d %s %s %s: %d %s, want %d", i, s.method, s.path, s.body, r.status, r.body, s.want)
		}
	}
}

// fastRetries keeps the scripted retries short: Retry-After is capped by the
// maximum delay.
var fastRetries = []string{"IDEMPROXY_RETRY_BASE_DELAY=1ms", "IDEMPROXY_RETRY_MAX_DELAY=20ms", "IDEMPROXY_RETRY_MAX_ATTEMPTS=3"}

func TestMetricsAfterScriptedSequence(t *testing.T) {
	up := httptest.NewServer(newScriptedProvider())
	defer up.Close()
	p := launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir(), fastRetries...)})
	runScript(t, p, script)
	series := scrape(t, "http://"+p.admin+"/metrics")
	cases := []struct {
		series string
		want   float64
	}{
		{`idemproxy_requests_total{method="POST",outcome="forwarded"}`, 3},
		{`idemproxy_requests_total{method="POST",outcome="replayed"}`, 1},
		{`idemproxy_requests_total{method="POST",outcome="conflict"}`, 1},
		{`idemproxy_requests_total{method="POST",outcome="rejected"}`, 1},
		{`idemproxy_requests_total{method="GET",outcome="forwarded"}`, 1},
		{`idemproxy_request_duration_seconds_count{outcome="forwarded"}`, 4},
		{`idemproxy_upstream_attempts_total{mode="protected",result="2xx"}`, 3},
		{`idemproxy_upstream_attempts_total{mode="protected",result="5xx"}`, 1},
		{`idemproxy_upstream_attempts_total{mode="protected",result="4xx"}`, 1},
		{`idemproxy_upstream_attempts_total{mode="safe",result="2xx"}`, 1},
		{`idemproxy_upstream_retries_total{reason="status"}`, 2},
		{`idemproxy_upstream_attempts_per_request_count{mode="protected"}`, 3},
		{`idemproxy_upstream_attempts_per_request_sum{mode="protected"}`, 5},
		{`idemproxy_upstream_attempt_duration_seconds_count{mode="protected"}`, 5},
		{`idemproxy_ratelimit_wait_seconds_count`, 6},
		{`idemproxy_retry_after_pauses_total{status="429"}`, 1},
		{`idemproxy_retry_after_pause_seconds_total`, 0.02},
		{`idemproxy_store_operation_duration_seconds_count{op="begin"}`, 5},
		{`idemproxy_store_operation_duration_seconds_count{op="complete"}`, 3},
		{`idemproxy_records_stored_total`, 3},
		{`idemproxy_operations_in_flight`, 0},
		{`idemproxy_requests_in_flight`, 0},
		{`idemproxy_inflight_released_total`, 0},
	}
	for _, c := range cases {
		t.Run(c.series, func(t *testing.T) {
			got, ok := series[c.series]
			if !ok {
				t.Fatalf("not exported")
			}
			if got != c.want {
				t.Errorf("= %v, want %v", got, c.want)
			}
		})
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "process_open_fds"} {
		if _, ok := series[name]; !ok {
			t.Errorf("runtime/process series %s not exported", name)
		}
	}
	// Exported at 0 from the start (metrics.initCounters), and still 0.
	if v, ok := series[`idemproxy_store_errors_total{kind="other",op="begin"}`]; !ok || v != 0 {
		t.Errorf("store errors during a healthy run: exported %v, value %v; want exported at 0", ok, v)
	}
	checkRequestLog(t, p)
}

// checkRequestLog checks the request lines of the scripted sequence.
func checkRequestLog(t *testing.T, p *opsProc) {
	lines := p.requestLines(t)
	if len(lines) != len(script) {
		t.Fatalf("%d request log lines, want one per request (%d):\n%s", len(lines), len(script), p.text())
	}
	want := []struct {
		outcome  string
		status   float64
		attempts float64
		replayed bool
	}{
		{"forwarded", 201, 1, false},
		{"replayed", 201, 0, true}, // no attempt: the stored answer, whatever the original took
		{"conflict", 409, 0, false},
		{"forwarded", 201, 2, false},
		{"forwarded", 201, 2, false},
		{"forwarded", 200, 1, false}, // streamed: status and attempts recorded by the proxy
		{"rejected", 422, 0, false},
	}
	for i, w := range want {
		l := lines[i]
		if l["outcome"] != w.outcome || l["status"] != w.status || l["attempts"] != w.attempts || l["replayed"] != w.replayed {
			t.Errorf("request line %d = %v, want outcome %s status %v attempts %v replayed %v", i, l, w.outcome, w.status, w.attempts, w.replayed)
		}
		for _, k := range []string{"method", "path", "key", "duration_ms", "time", "level"} {
			if _, ok := l[k]; !ok {
				t.Errorf("request line %d lacks %q: %v", i, k, l)
			}
		}
	}
	if k, _ := lines[0]["key"].(string); len(k) != 36 {
		t.Errorf("first request logged key %q, want the derived UUID-shaped key", k)
	}
}

// scrape reads a Prometheus text page into series (name with its labels, as
// printed) → value.
func scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	r := send(t, http.MethodGet, url, "")
	if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET %s = %d %s", url, r.status, r.header.Get("Content-Type"))
	}
	out := map[string]float64{}
	for _, line := range strings.Split(r.body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func TestNoSecretInLogs(t *testing.T) {
	prov := newScriptedProvider()
	up := httptest.NewServer(prov)
	secret := "sk_" + randomHex(t, 16)
	publicID := "pub_" + randomHex(t, 8)
	shortCred := "Qz~7" // below the logger's safety-net length: only not logging it keeps it out
	forged := "forged_" + randomHex(t, 8)
	env := baseEnv(up.URL, t.TempDir(), append(fastRetries,
		"IDEMPROXY_LOG_LEVEL=debug",
		"IDEMPROXY_SIGN_SECRET="+secret,
		"IDEMPROXY_NONCE_HEADER=X-Nonce",
		"IDEMPROXY_SIGN_CANONICAL={method}\\n{path}\\n{timestamp}\\n{nonce}\\n{idempotency_key}\\n{body_sha256}",
		"IDEMPROXY_STATIC_HEADERS=X-Public-Id="+publicID+",X-Api-Key="+shortCred)...)
	p := launch(t, launchSpec{env: env})
	steps := append(append([]step{}, script...),
		step{"POST", "/v1/payments", `{"order_id":"down","amount":"1.00"}`, nil, 502},
		step{"POST", "/v1/payments", `{"order_id":"forged","amount":"1.00"}`, []string{"X-Signature", forged, "X-Public-Id", forged}, 201},
	)
	runScript(t, p, steps)
	up.Close() // the provider goes away: network errors are logged too
	runScript(t, p, []step{
		{"POST", "/v1/payments", `{"order_id":"gone","amount":"1.00"}`, nil, 502},
		{"GET", "/v1/payments/pay_1", "", nil, 502},
	})
	if err := p.terminate(t); err != nil {
		t.Fatalf("exit: %v", err)
	}
	log := p.text()
	if !strings.Contains(log, `"level":"DEBUG"`) || !strings.Contains(log, "provider asked to pause") {
		t.Fatalf("the run did not log at debug level or missed the pause:\n%s", log)
	}
	prov.mu.Lock()
	derived := append([]string{}, prov.seen...)
	prov.mu.Unlock()
	if len(derived) < 2*len(steps) {
		t.Fatalf("provider saw %d signature/nonce headers; signing is off?", len(derived))
	}
	secrets := map[string]string{"sign secret": secret, "static header value": publicID, "short static header value": shortCred, "client's signature header": forged}
	for i, v := range derived {
		if len(v) >= 32 { // signatures (nonces are UUIDs, not secrets, but harmless to check)
			secrets[fmt.Sprintf("signature %d", i)] = v
		}
	}
	for name, v := range secrets {
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, v) {
				t.Errorf("%s %q appears in the log: %s", name, v, line)
			}
		}
	}
	if strings.Contains(log, "[redacted]") {
		t.Errorf("the logger's safety net had to redact something; a secret was logged:\n%s", log)
	}
}

// TestClientGoneOperationFinishes: a client that leaves while its operation is
// at the provider is logged and counted as client_gone; the operation finishes
// and is stored, and the client's retry is a replay.
func TestClientGoneOperationFinishes(t *testing.T) {
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	p := launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir(), "IDEMPROXY_INFLIGHT_WAIT=1m")})
	body := `{"order_id":"gone-1","amount":"3.00"}`
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+p.proxy+"/v1/payments", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	key := <-prov.entered
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the canceled client got an answer")
	}
	line := p.waitLine(t, `"outcome":"client_gone"`)
	if !strings.Contains(line, `"key":"`+key+`"`) {
		t.Errorf("client_gone line lacks the key %s: %s", key, line)
	}
	close(prov.release)
	r := send(t, "POST", "http://"+p.proxy+"/v1/payments", body) // waits for the operation, then replays it
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d replayed=%q %s, want the stored 201", r.status, r.header.Get("Idempotent-Replayed"), r.body)
	}
	series := scrape(t, "http://"+p.admin+"/metrics")
	for s, want := range map[string]float64{
		`idemproxy_requests_total{method="POST",outcome="client_gone"}`: 1,
		`idemproxy_requests_total{method="POST",outcome="replayed"}`:    1,
		`idemproxy_records_stored_total`:                                1,
		`idemproxy_operations_in_flight`:                                0,
	} {
		if series[s] != want {
			t.Errorf("%s = %v, want %v", s, series[s], want)
		}
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.seen[key] != 1 {
		t.Errorf("provider saw the key %d times, want 1", prov.seen[key])
	}
}
