package retry

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/fakeclock"
	"github.com/idemproxy/idemproxy/ratelimit"
)

const testKey = "6f1c1a52-0d55-4c1e-9f7a-1f4b2a9d3c10"

var testBody = []byte(`{"order_id":"payout-1","amount":"25","currency":"USDT","network":"tron"}`)

// newFakeClock starts at the real time, truncated to a second (so HTTP dates
// round-trip exactly), so that real context deadlines derived from it lie in
// the future while a test runs.
func newFakeClock() *fakeclock.Clock { return fakeclock.New(time.Now().Truncate(time.Second)) }

// arrival is one request as the provider received it.
type arrival struct {
	key   string
	nonce string
	body  []byte
	at    time.Time
	// request line, for the status probe's tests
	method, path string
}

// step is what the provider does with one arrival.
type step func(p *provider, w http.ResponseWriter, r *http.Request)

// provider is an httptest upstream that behaves like the providers idemproxy fronts:
// a key's first successful request executes the operation, a repeat with the
// same key replays it with Idempotent-Replayed: true. Arrival n (0-based)
// runs steps[n]; arrivals past the script are processed normally.
type provider struct {
	srv     *httptest.Server
	steps   []step
	release chan struct{} // closed at test end: unblocks hung handlers

	mu       sync.Mutex
	arrivals []arrival
	executed int
	done     map[string][]byte
}

func newProvider(t *testing.T, steps ...step) *provider {
	p := &provider{steps: steps, release: make(chan struct{}), done: make(map[string][]byte)}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	t.Cleanup(func() { close(p.release) }) // runs first: Close waits for handlers
	return p
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	n := len(p.arrivals)
	p.arrivals = append(p.arrivals, arrival{r.Header.Get("Idempotency-Key"), r.Header.Get("X-Nonce"), body, time.Now(), r.Method, r.URL.Path})
	s := process
	if n < len(p.steps) {
		s = p.steps[n]
	}
	p.mu.Unlock()
	s(p, w, r)
}

func (p *provider) Arrivals() []arrival {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.arrivals)
}

func (p *provider) Executed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.executed
}

// execute runs the operation for key once; later calls return the stored
// result and replayed == true.
func (p *provider) execute(key string) (body []byte, replayed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b, ok := p.done[key]; ok {
		return b, true
	}
	p.executed++
	b := fmt.Appendf(nil, `{"id":"op-%d","status":"processing"}`, p.executed)
	p.done[key] = b
	return b, false
}

// process executes (or replays) and answers 200.
func process(p *provider, w http.ResponseWriter, r *http.Request) {
	body, replayed := p.execute(r.Header.Get("Idempotency-Key"))
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Write(body)
}

// respond answers status with the body and header pairs, executing nothing.
func respond(status int, body string, header ...string) step {
	return func(_ *provider, w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// resetBeforeProcessing drops the connection with a TCP reset before the
// operation runs.
func resetBeforeProcessing(_ *provider, w http.ResponseWriter, _ *http.Request) {
	reset(w)
}

// resetAfterProcessing executes the operation, then drops the connection:
// the answer is lost, the payout exists.
func resetAfterProcessing(p *provider, w http.ResponseWriter, r *http.Request) {
	p.execute(r.Header.Get("Idempotency-Key"))
	reset(w)
}

func reset(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0) // RST instead of FIN
	}
	conn.Close()
}

// hang never answers (until the test ends).
func hang(p *provider, _ http.ResponseWriter, _ *http.Request) {
	<-p.release
}

// slowBody executes, sends the headers and half the body, then stalls.
func slowBody(p *provider, w http.ResponseWriter, r *http.Request) {
	body, _ := p.execute(r.Header.Get("Idempotency-Key"))
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	w.Write(body[:len(body)/2])
	w.(http.Flusher).Flush()
	<-p.release
}

// signer stands in for package resign: a separate RoundTripper below the
// loop that stamps every request passing through it with a new nonce, so
// the tests can see that each attempt was its own RoundTrip.
type signer struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (s *signer) RoundTrip(r *http.Request) (*http.Response, error) {
	out := r.Clone(r.Context())
	out.Header.Set("X-Nonce", strconv.FormatInt(s.n.Add(1), 10))
	return s.next.RoundTrip(out)
}

// harness is a Transport wired as in production (retry → signer → OneShot →
// http.Transport) with a fake clock shared by the Transport and its Gate.
type harness struct {
	tr    *Transport
	gate  *ratelimit.Gate
	clock *fakeclock.Clock

	mu    sync.Mutex
	infos []AttemptInfo
}

func testPolicy() Policy {
	p := defaultPolicy()
	p.MaxAttempts = 4
	p.BaseDelay = 100 * time.Millisecond
	p.MaxDelay = 10 * time.Second
	p.Budget = time.Hour
	p.AttemptTimeout = 10 * time.Second // only the timeout tests rely on it, with their own
	return p
}

func newHarness(t *testing.T, pol Policy) *harness {
	wire := &http.Transport{}
	t.Cleanup(wire.CloseIdleConnections)
	h := &harness{clock: newFakeClock(), gate: ratelimit.New(0, 1)}
	h.gate.Now, h.gate.Sleep = h.clock.Now, h.clock.Sleep
	h.tr = &Transport{
		Next:      &signer{next: OneShot{Next: wire}},
		Policy:    pol,
		Gate:      h.gate,
		Now:       h.clock.Now,
		Sleep:     h.clock.Sleep,
		Rand:      func() float64 { return 0.5 },
		OnAttempt: h.record,
	}
	return h
}

func (h *harness) record(i AttemptInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.infos = append(h.infos, i)
}

func (h *harness) Infos() []AttemptInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.infos)
}

func (h *harness) reasons() []Reason {
	var out []Reason
	for _, i := range h.Infos() {
		out = append(out, i.Reason)
	}
	return out
}

// post is the protected payout request every test sends; the query carries a
// "secret" that must never show in errors.
func post(t *testing.T, base string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/payout?token=s3cr3t", bytes.NewReader(testBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	return req
}

// assertSameRequest checks that the provider saw want attempts, all with the
// same Idempotency-Key and the same body bytes, each freshly signed.
func assertSameRequest(t *testing.T, p *provider, want int, body []byte) {
	t.Helper()
	arrivals := p.Arrivals()
	if len(arrivals) != want {
		t.Errorf("provider saw %d attempts, want %d", len(arrivals), want)
	}
	nonces := make(map[string]bool)
	for i, a := range arrivals {
		if a.key != testKey {
			t.Errorf("attempt %d: Idempotency-Key %q, want %q", i+1, a.key, testKey)
		}
		if !bytes.Equal(a.body, body) {
			t.Errorf("attempt %d: body %q, want %q", i+1, a.body, body)
		}
		if a.nonce == "" || nonces[a.nonce] {
			t.Errorf("attempt %d: nonce %q missing or reused: the attempt did not pass the signer afresh", i+1, a.nonce)
		}
		nonces[a.nonce] = true
	}
}

// readFinal checks a final response and returns its body.
func readFinal(t *testing.T, resp *http.Response, err error, wantStatus, wantAttempts int) []byte {
	t.Helper()
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != wantStatus {
		t.Errorf("status %d, want %d (body %s)", resp.StatusCode, wantStatus, b)
	}
	if got := resp.Header.Get(AttemptsHeader); got != strconv.Itoa(wantAttempts) {
		t.Errorf("%s = %q, want %d", AttemptsHeader, got, wantAttempts)
	}
	return b
}

// send runs req through tr in mode and checks that the Report agrees with
// the answer: the attempts the response header shows, Retry on an error.
func send(t *testing.T, tr *Transport, req *http.Request, mode Mode) (*http.Response, error) {
	t.Helper()
	resp, rep, err := tr.Do(req, Call{Mode: mode})
	if err == nil && resp.Header.Get(AttemptsHeader) != strconv.Itoa(rep.Attempts) {
		t.Errorf("report: %d attempts, response header %q", rep.Attempts, resp.Header.Get(AttemptsHeader))
	}
	if ex := (*ExhaustedError)(nil); errors.As(err, &ex) {
		want := Retry
		switch {
		case ex.Unknown:
			want = Unknown
		case ex.NotSent:
			want = NotSent
		}
		if ex.Attempts != rep.Attempts || rep.Disposition != want || !rep.FirstSentAt.Equal(ex.FirstSentAt) {
			t.Errorf("report %+v disagrees with %#v", rep, ex)
		}
	}
	return resp, err
}
