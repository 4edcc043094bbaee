package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// binPath is the idemproxy binary built once for the end-to-end tests, run exactly as
// the container runs it: configuration from the environment only.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemproxy-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "idemproxy")
	build := exec.Command("go", "build", "-o", binPath, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build idemproxy:", err)
		os.Exit(1)
	}
	code := pgtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running idemproxy binary.
type proc struct {
	cmd   *exec.Cmd
	addr  string // proxy address
	admin string
	mu    sync.Mutex
	log   strings.Builder
	done  chan struct{} // closed when the process has exited
	err   error         // its exit status, once done is closed
}

// startBinary runs the binary with env (plus free loopback ports) and waits until
// it logs that it listens.
func startBinary(t *testing.T, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(binPath)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"),
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0"}, env...)
	if onPostgres {
		lastPostgres = pgtest.Database(t)
		cmd.Env = append(cmd.Env, "IDEMPROXY_STORE_URL="+lastPostgres)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	listening := make(chan struct{})
	go p.readLog(stderr, listening)
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-p.done })
	select {
	case <-listening:
	case <-p.done:
		t.Fatalf("idemproxy exited at start: %v\n%s", p.err, p.logText())
	case <-time.After(30 * time.Second):
		t.Fatalf("idemproxy did not start:\n%s", p.logText())
	}
	return p
}

func (p *proc) readLog(r io.Reader, listening chan struct{}) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		p.mu.Lock()
		p.log.WriteString(line + "\n")
		p.mu.Unlock()
		if strings.Contains(line, `"msg":"idemproxy listening"`) && p.addr == "" {
			p.addr = jsonField(line, "proxy")
			p.admin = jsonField(line, "admin")
			close(listening)
		}
	}
}

func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// jsonField pulls "name":"value" out of one JSON log line.
func jsonField(line, name string) string {
	_, rest, ok := strings.Cut(line, `"`+name+`":"`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// heldProvider executes each key once and replays it after; the first execution
// blocks until release is closed, so a test can act while it is in flight.
type heldProvider struct {
	mu      sync.Mutex
	execs   map[string]int
	seen    map[string]int
	stored  map[string]string
	entered chan string
	release chan struct{}
	once    sync.Once
}

// Release lets the held executions go; calling it again does nothing.
func (p *heldProvider) Release() { p.once.Do(func() { close(p.release) }) }

// newHeldProvider returns a heldProvider whose entered channel holds up to
// entered keys.
func newHeldProvider(entered int) *heldProvider {
	return &heldProvider{execs: map[string]int{}, seen: map[string]int{}, stored: map[string]string{},
		entered: make(chan string, entered), release: make(chan struct{})}
}

func (p *heldProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.seen[key]++
	prev, ok := p.stored[key]
	p.mu.Unlock()
	if ok {
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, prev)
		return
	}
	p.entered <- key
	<-p.release
	out := fmt.Sprintf(`{"id":"pay_%s","status":"succeeded"}`, key[:8])
	p.mu.Lock()
	p.execs[key]++
	p.stored[key] = out
	p.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, out)
}

func TestSIGKILLMidRequestResumesWithSameKey(t *testing.T) {
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	dataDir := t.TempDir()
	env := []string{"IDEMPROXY_UPSTREAM_URL=" + up.URL, "IDEMPROXY_DATA_DIR=" + dataDir, "IDEMPROXY_INFLIGHT_WAIT=1m"}
	p1 := startBinary(t, env...)
	body := `{"order_id":"crash-1","amount":"42.00"}`
	go func() {
		resp, err := http.Post("http://"+p1.addr+"/v1/payments", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
	}()
	key := <-prov.entered // the provider has the request: the in-flight record must be on disk
	if err := p1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p1.done
	close(prov.release) // the provider executes; the answer has nobody to go to

	p2 := startBinary(t, env...)
	if !strings.Contains(p2.logText(), `"count":1`) {
		t.Errorf("restart did not release exactly one in-flight record:\n%s", p2.logText())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+p2.addr+"/v1/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotency-Key") != key {
		t.Fatalf("retry after restart = %d %s key=%q, want 201 under %q", resp.StatusCode, b, resp.Header.Get("Idempotency-Key"), key)
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs[key] != 1 || len(prov.execs) != 1 {
		t.Errorf("executions %v, want exactly one for %q", prov.execs, key)
	}
	if prov.seen[key] != 2 {
		t.Errorf("provider saw key %q %d times, want 2 (lost answer, resumed retry)", key, prov.seen[key])
	}
}

func TestBinaryRejectsBadConfig(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want string
	}{
		{"no upstream", nil, "IDEMPROXY_UPSTREAM_URL"},
		{"relative upstream", []string{"IDEMPROXY_UPSTREAM_URL=/x"}, "IDEMPROXY_UPSTREAM_URL"},
		{"bad key sources", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_KEY_SOURCES=cookie:x"}, "IDEMPROXY_KEY_SOURCES"},
		{"bad duration", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_RETRY_BUDGET=soon"}, "IDEMPROXY_RETRY_BUDGET"},
		{"TTL shorter than the lease", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_RECORD_TTL=1m"}, "IDEMPROXY_RECORD_TTL"},
		{"bad policy", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_MISSING_KEY=maybe"}, "IDEMPROXY_MISSING_KEY"},
		{"missing secret file", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_SIGN_SECRET_FILE=/nonexistent/secret"}, "IDEMPROXY_SIGN_SECRET_FILE"},
		{"store URL not postgres", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_STORE_URL=mysql://u:pw@db/x"}, "IDEMPROXY_STORE_URL"},
		{"store URL and its file", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_STORE_URL=postgres://db/x", "IDEMPROXY_STORE_URL_FILE=/etc/hostname"}, "IDEMPROXY_STORE_URL"},
		{"store lease too short", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_STORE_LEASE=10ms"}, "IDEMPROXY_STORE_LEASE"},
		{"nonce in the template, no nonce header", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_SIGN_SECRET=abcdefgh", "IDEMPROXY_SIGN_CANONICAL={nonce}"}, "IDEMPROXY_SIGN_CANONICAL"},
		{"bad signature header name", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_SIGNATURE_HEADER=X Sig"}, "IDEMPROXY_SIGNATURE_HEADER"},
		{"nonce header is the timestamp header", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_NONCE_HEADER=X-Timestamp"}, "IDEMPROXY_NONCE_HEADER"},
		{"listen address without a port", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_LISTEN_ADDR=bogus"}, "IDEMPROXY_LISTEN_ADDR"},
		{"timestamp header is Content-Type", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_TIMESTAMP_HEADER=Content-Type"}, "IDEMPROXY_TIMESTAMP_HEADER"},
		{"upstream port out of range", []string{"IDEMPROXY_UPSTREAM_URL=https://127.0.0.1:99999"}, "IDEMPROXY_UPSTREAM_URL"},
		{"upstream port 0", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:0/base"}, "IDEMPROXY_UPSTREAM_URL"},
		{"admin port out of range", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:99999"}, "IDEMPROXY_ADMIN_ADDR"},
		{"static header is the signature header", []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_STATIC_HEADERS=X-Signature=abcdef"}, "IDEMPROXY_STATIC_HEADERS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := startStops(t, 2, append([]string{"IDEMPROXY_DATA_DIR=" + t.TempDir()}, c.env...)...)
			if !strings.Contains(out, c.want) {
				t.Errorf("output does not name %s:\n%s", c.want, out)
			}
		})
	}
}

// A listen address that is well formed but cannot be bound (the port is
// taken) is found only when the listener opens: the process stops then, with
// status 1 and a message naming the variable to change.
func TestBinaryNamesBusyListenAddr(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, name := range []string{"IDEMPROXY_LISTEN_ADDR", "IDEMPROXY_ADMIN_ADDR"} {
		t.Run(name, func(t *testing.T) {
			out := startStops(t, 1, "IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR="+t.TempDir(),
				"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0", name+"="+busy.Addr().String())
			if !strings.Contains(out, name+": listen tcp") {
				t.Errorf("output does not name %s:\n%s", name, out)
			}
		})
	}
}

func asExit(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*ee = e
	return ok
}

// startStops runs the binary with exactly env, expects it to stop at start
// with status, and returns what it printed. A binary that accepts env and
// serves is killed after a minute, which fails the test.
func startStops(t *testing.T, status int, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !asExit(err, &ee) || ee.ExitCode() != status {
		t.Fatalf("exit %v, want status %d; output:\n%s", err, status, out)
	}
	return string(out)
}

// countingProvider executes each key once, replays it after, and counts.
type countingProvider struct {
	mu    sync.Mutex
	execs map[string]int
	total int
}

func (p *countingProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total++
	p.execs[key]++
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"pay_%d","key":%q}`, len(p.execs), key)
}

func TestBinaryConcurrentIdenticalPosts(t *testing.T) {
	prov := &countingProvider{execs: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir())
	const n = 50
	type answer struct {
		status   int
		body     string
		key      string
		replayed bool
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post("http://"+p.addr+"/v1/payments", "application/json",
				strings.NewReader(`{"amount":"5.00","order_id":"same-order"}`))
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers[i] = answer{resp.StatusCode, string(b), resp.Header.Get("Idempotency-Key"), resp.Header.Get("Idempotent-Replayed") == "true"}
		}()
	}
	wg.Wait()
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.total != 1 {
		t.Fatalf("provider saw %d requests (%v), want 1", prov.total, prov.execs)
	}
	replayed := 0
	for i, a := range answers {
		if a.status != http.StatusCreated || a.body != answers[0].body || a.key != answers[0].key {
			t.Fatalf("answer %d = %+v, want the same as %+v", i, a, answers[0])
		}
		if a.replayed {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d replays, want %d", replayed, n-1)
	}
}

func TestBinaryRefusesCorruptDataDir(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"MANIFEST", "000001.vlog", "KEYREGISTRY"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("this is not badger data"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := startStops(t, 1, "IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR="+dir,
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0")
	if !strings.Contains(out, "open data directory IDEMPROXY_DATA_DIR="+dir) {
		t.Errorf("output does not explain the data directory problem, naming the variable:\n%s", out)
	}
	if strings.Contains(out, "panic") {
		t.Errorf("binary panicked:\n%s", out)
	}
}

// A data directory that cannot be made stops the start naming the variable.
func TestBinaryNamesUnusableDataDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out := startStops(t, 1, "IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR="+file,
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0")
	if !strings.Contains(out, "IDEMPROXY_DATA_DIR="+file) {
		t.Errorf("output does not name IDEMPROXY_DATA_DIR:\n%s", out)
	}
}

// An answer larger than a record can hold is refused at the attempt (nothing is
// stored, the key is released); one that fits is stored and replayed.
func TestBinaryResponseSizeLimit(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		size := 900 << 10
		if strings.Contains(r.URL.Path, "big") {
			size = 1100 << 10
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(strings.Repeat("x", size)))
	}))
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(), "IDEMPROXY_RETRY_MAX_ATTEMPTS=1")
	send := func(path string) (int, string, int) {
		resp, err := http.Post("http://"+p.addr+path, "application/json", strings.NewReader(`{"order_id":"size-1"}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), len(b)
	}
	if st, _, n := send("/fits"); st != http.StatusCreated || n != 900<<10 {
		t.Fatalf("900 KiB answer: %d, %d bytes", st, n)
	}
	if st, replayed, n := send("/fits"); st != http.StatusCreated || replayed != "true" || n != 900<<10 {
		t.Fatalf("900 KiB repeat: %d replayed=%q %d bytes, want a stored replay", st, replayed, n)
	}
	for i := range 2 {
		if st, replayed, _ := send("/big"); st != http.StatusBadGateway || replayed != "" {
			t.Fatalf("1.1 MiB answer, try %d: %d replayed=%q, want 502 and nothing stored", i, st, replayed)
		}
	}
}
