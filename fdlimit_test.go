package main

// The process out of file descriptors: a request refused before anything was
// sent (its claim could not be synced, or the upstream could not be dialled)
// leaves its key free, so the app's next try succeeds instead of getting 409
// idempotency_in_progress for the length of a lease.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// heldUpstream executes each key once, holding every first execution until
// release is closed; it counts requests per key.
type heldUpstream struct {
	release chan struct{}
	entered atomic.Int64
	mu      sync.Mutex
	seen    map[string]int
}

func (u *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.seen[key]++
	first := u.seen[key] == 1
	u.mu.Unlock()
	if first {
		u.entered.Add(1)
		<-u.release
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"key":%q,"status":"succeeded"}`, key)
}

func TestFileDescriptorLimit(t *testing.T) {
	up := &heldUpstream{release: make(chan struct{}), seen: map[string]int{}}
	srv := httptest.NewServer(up)
	defer srv.Close()
	defer func() {
		select {
		case <-up.release:
		default:
			close(up.release)
		}
	}()
	// sh sets the soft and the hard limit, so the Go runtime cannot raise it.
	p := launch(t, launchSpec{bin: "/bin/sh", args: []string{"-c", "ulimit -n 64 && exec " + binPath},
		env: baseEnv(srv.URL, t.TempDir(), "IDEMPROXY_RETRY_BASE_DELAY=50ms", "IDEMPROXY_RETRY_BUDGET=10s")})

	const n = 120
	// No keep-alive: an idle connection would hold one of the few descriptors
	// on idemproxy's side for its whole idle timeout.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Minute}
	statuses := make([]int, n)
	bodies := make([]string, n)
	var refused atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			statuses[i], bodies[i] = postJSON(client, p.proxy, fmt.Sprintf("fd-%d", i))
			if statuses[i] != http.StatusCreated {
				refused.Add(1)
			}
		})
	}
	// Hold the accepted orders at the upstream until the limit has refused some.
	for refused.Load() == 0 {
		select {
		case <-p.done:
			t.Fatalf("idemproxy exited out of file descriptors: %v\n%s", p.err, p.text())
		case <-time.After(10 * time.Millisecond):
		}
	}
	close(up.release)
	wg.Wait()

	var retried int
	kinds := map[string]int{}
	for i := range n {
		if statuses[i] == http.StatusCreated {
			continue
		}
		kinds[fmt.Sprintf("%d %s", statuses[i], fdCode(bodies[i]))]++
		if strings.Contains(bodies[i], "may be unknown") {
			t.Errorf("order %d refused as unknown, though nothing was sent: %d %s", i, statuses[i], bodies[i])
		}
		retried++
		st, body := postJSON(client, p.proxy, fmt.Sprintf("fd-%d", i))
		if st != http.StatusCreated {
			t.Errorf("order %d: next try after %d = %d %s; want 201 (the key must be free)", i, statuses[i], st, body)
		}
	}
	if t.Failed() {
		txt := p.text()
		t.Logf("idemproxy log tail:\n%s", txt[max(0, len(txt)-4000):])
	}
	t.Logf("%d of %d orders refused at the limit (%v), each succeeded on its next try", retried, n, kinds)
	if retried == 0 {
		t.Fatal("no order was refused: the limit was not reached")
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.seen) != n {
		t.Errorf("upstream saw %d keys, want %d", len(up.seen), n)
	}
}

// postJSON posts one order and returns the status and body; a transport error
// is status 0 with the error as body.
func postJSON(c *http.Client, addr, order string) (int, string) {
	resp, err := c.Post("http://"+addr+"/v1/payouts", "application/json",
		strings.NewReader(fmt.Sprintf(`{"order_id":%q,"amount":"1.00"}`, order)))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func fdCode(body string) string {
	_, rest, ok := strings.Cut(body, `"code":"`)
	if !ok {
		return ""
	}
	code, _, _ := strings.Cut(rest, `"`)
	return code
}

// TestFileDescriptorLimitIdleClients: many apps keep idle keep-alive
// connections open, as connection pools do, while new orders arrive. The
// connection bound derived from ulimit -n closes idle connections for new
// clients instead of leaving them waiting for an idle timeout, and orders
// past the in-flight bound are refused 503 overloaded, nothing sent; each
// succeeds on its next try.
func TestFileDescriptorLimitIdleClients(t *testing.T) {
	up := newGatedUpstream("new-")
	srv := httptest.NewServer(up)
	defer srv.Close()
	defer up.Release() // before srv.Close, which waits for held requests
	p := launch(t, launchSpec{bin: "/bin/sh", args: []string{"-c", "ulimit -n 256 && exec " + binPath},
		env: baseEnv(srv.URL, t.TempDir(), "IDEMPROXY_RETRY_BASE_DELAY=50ms", "IDEMPROXY_RETRY_BUDGET=10s")})
	limits := p.waitLine(t, `"msg":"limits"`)
	t.Logf("limits: %s", limits)

	// 150 clients, each with its own keep-alive connection left idle after
	// one answered order.
	const idleClients, n = 150, 100
	idle := make([]*http.Client, idleClients)
	for i := range idle {
		idle[i] = &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
		if st, body := postJSON(idle[i], p.proxy, fmt.Sprintf("idle-%d", i)); st != http.StatusCreated {
			t.Fatalf("idle client %d: %d %s", i, st, body)
		}
	}

	// New clients, with keep-alive too, while the idle ones hold their
	// connections; the upstream holds the orders it gets.
	statuses := make([]int, n)
	bodies := make([]string, n)
	var answered atomic.Int64
	var wg sync.WaitGroup
	clients := make([]*http.Client, n)
	for i := range n {
		clients[i] = &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
		wg.Go(func() {
			defer answered.Add(1)
			statuses[i], bodies[i] = postJSON(clients[i], p.proxy, fmt.Sprintf("new-%d", i))
		})
	}
	for answered.Load()+up.held.Load() < n {
		select {
		case <-p.done:
			t.Fatalf("idemproxy exited: %v\n%s", p.err, p.text())
		case <-time.After(10 * time.Millisecond):
		}
	}
	up.Release()
	wg.Wait()

	var refused int
	for i := range n {
		if statuses[i] == http.StatusCreated {
			continue
		}
		refused++
		if statuses[i] != http.StatusServiceUnavailable || fdCode(bodies[i]) != "overloaded" {
			t.Errorf("order %d: %d %s; want 201, or 503 overloaded", i, statuses[i], bodies[i])
		}
		if st, body := postJSON(clients[i], p.proxy, fmt.Sprintf("new-%d", i)); st != http.StatusCreated {
			t.Errorf("order %d: next try after %d = %d %s; want 201", i, statuses[i], st, body)
		}
	}
	m := scrape(t, "http://"+p.admin+"/metrics")
	t.Logf("%d of %d new orders refused overloaded next to %d idle clients, each succeeded on its next try; %v idle connections closed at the bound of %v",
		refused, n, idleClients, m["idemproxy_client_connections_closed_idle_total"], m["idemproxy_client_connections_limit"])
	if m["idemproxy_client_connections_closed_idle_total"] == 0 {
		t.Error("no idle connection was closed at the bound: the idle clients did not fill it")
	}
	if m[`idemproxy_overload_refusals_total{limit="requests"}`] != float64(refused) {
		t.Errorf("idemproxy_overload_refusals_total{limit=\"requests\"} = %v, want %d", m[`idemproxy_overload_refusals_total{limit="requests"}`], refused)
	}
	if refused == 0 {
		t.Error("no order was refused: the in-flight bound was not reached")
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for i := range n {
		if c := up.orders[fmt.Sprintf("new-%d", i)]; c != 1 {
			t.Errorf("order new-%d reached the provider %d times, want once (refusals send nothing)", i, c)
		}
	}
}

// gatedUpstream answers every order at once, except the first request of
// each order whose id has the prefix, which it holds until release is
// closed. It counts requests per order id.
type gatedUpstream struct {
	prefix  string
	release chan struct{}
	once    sync.Once
	held    atomic.Int64
	mu      sync.Mutex
	orders  map[string]int
}

func newGatedUpstream(prefix string) *gatedUpstream {
	return &gatedUpstream{prefix: prefix, release: make(chan struct{}), orders: map[string]int{}}
}

// Release lets every held request and every later one through; it may be
// called more than once.
func (u *gatedUpstream) Release() { u.once.Do(func() { close(u.release) }) }

func (u *gatedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var o struct {
		OrderID string `json:"order_id"`
	}
	json.NewDecoder(r.Body).Decode(&o)
	io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.orders[o.OrderID]++
	first := u.orders[o.OrderID] == 1
	u.mu.Unlock()
	if first && strings.HasPrefix(o.OrderID, u.prefix) {
		u.held.Add(1)
		<-u.release
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%q,"status":"succeeded"}`, o.OrderID)
}
