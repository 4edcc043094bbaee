package proxy_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/internal/fakeclock"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/routes"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream"
)

func mustRoutes(t *testing.T, s string) routes.Table {
	t.Helper()
	tab, err := routes.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// newRouteEnv is newEnv with a route table and, when clk is set, one clock for
// the proxy and the store (fingerprint windows compare the two). A store on
// dir survives the handler, as across a restart.
func newRouteEnv(t *testing.T, table string, clk *fakeclock.Clock, dir string, opts ...envOpt) *env {
	t.Helper()
	e := &env{prov: newProvider()}
	e.up = httptest.NewServer(e.prov)
	t.Cleanup(e.up.Close)
	co := cache.Options{Dir: dir, SyncWrites: true, TTL: time.Hour, GCInterval: -1}
	if clk != nil {
		co.Now = clk.Now
	}
	st, err := cache.Open(co)
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	u, _ := url.Parse(e.up.URL)
	sources, err := idemkey.ParseSources("json:order_id")
	if err != nil {
		t.Fatal(err)
	}
	pol := retry.Policy{MaxAttempts: 1}
	o := proxy.Options{Upstream: u, Store: st, KeySources: sources, InflightWait: 5 * time.Second, Routes: mustRoutes(t, table)}
	if clk != nil {
		o.Now = clk.Now
	}
	for _, f := range opts {
		f(&o, &pol)
	}
	if o.Transport, err = upstream.New(upstream.Config{Policy: pol, MaxResponseBytes: st.MaxBodyBytes(), Wire: e.up.Client().Transport}); err != nil {
		t.Fatal(err)
	}
	if e.h, err = proxy.New(o); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.h)
	t.Cleanup(func() {
		e.srv.Close()
		e.h.Drain(context.Background())
		st.Close()
	})
	return e
}

func TestRouteUnprotectedIsNeverStored(t *testing.T) {
	e := newRouteEnv(t, "POST /v1/payout/info=unprotected", nil, t.TempDir())
	for i := range 3 {
		a := e.do(t, "POST", "/v1/payout/info", `{"order_id":"o-1"}`)
		if a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" || a.header.Get("Idempotency-Key") != "" {
			t.Fatalf("lookup %d: %d replayed=%q key=%q, want a fresh answer with no key", i, a.status,
				a.header.Get("Idempotent-Replayed"), a.header.Get("Idempotency-Key"))
		}
	}
	total, execs := e.prov.counts()
	if total != 3 || execs[""] != 3 {
		t.Errorf("provider saw %d requests, %v; want 3 without a key", total, execs)
	}
	// The same body on an unmatched path is still protected by order_id.
	e.do(t, "POST", "/v1/payout", `{"order_id":"o-1"}`)
	if r := e.do(t, "POST", "/v1/payout", `{"order_id":"o-1"}`); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("unmatched POST not replayed: %d %s", r.status, r.body)
	}
}

// An unprotected rule applies to the spellings of its path a lenient provider
// routes to it (nginx merges slashes and decodes, servlet containers drop
// ';...', many routers ignore a trailing slash or letter case): such a status
// lookup was taken for a protected POST, its answer stored as final and
// replayed stale for every later lookup. Each spelling goes upstream as it
// came; a protected path spelled so is still protected, under the key the
// path as written derives.
func TestRouteUnprotectedSpellings(t *testing.T) {
	e := newRouteEnv(t, "POST /v1/payout/info=unprotected; POST /cards/*/topup=fingerprint:10m", nil, t.TempDir())
	for _, path := range []string{
		"//v1/payout/info", "/v1/payout/info/", "/v1//payout/info", "/v1/payout%2Finfo", "/v1%5Cpayout%5Cinfo",
		"/v1/payout/info;v=2", "/V1/Payout/Info", "/v1/payout/%69nfo",
	} {
		for i := range 2 {
			a := e.do(t, "POST", path, `{"order_id":"o-1"}`)
			if a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" || a.header.Get("Idempotency-Key") != "" {
				t.Errorf("POST %s (%d): %d replayed=%q key=%q, want a fresh answer with no key", path, i, a.status,
					a.header.Get("Idempotent-Replayed"), a.header.Get("Idempotency-Key"))
			}
		}
		if got, want := e.prov.takeTargets(), []string{"POST " + path, "POST " + path}; !slices.Equal(got, want) {
			t.Errorf("POST %s: provider saw %q, want %q: each lookup sent, as it came", path, got, want)
		}
	}
	if _, execs := e.prov.counts(); len(execs) != 1 || execs[""] != 16 {
		t.Errorf("provider executed %v, want 16 requests without a key", execs)
	}
	// A path that is not the lookup's, however close, stays protected: sent
	// once with the key derived from order_id and the path in its normal
	// form (repeated and trailing slashes dropped), then replayed. A second
	// spelling of one normal form (//cards/c1/topup after /cards/c1/topup/)
	// is the same order at the same endpoint: 409 idempotency_conflict under
	// the first's key, nothing sent. (This test wanted each spelling's own
	// key and a second execution of order o-2 at the provider, which routes
	// both spellings to one endpoint.)
	sent := map[string]bool{}
	for _, path := range []string{"/v1/payout", "/v1/payout/infos", "/v1/payout/info/x", "/cards/c1/topup/", "//cards/c1/topup"} {
		normal := strings.TrimSuffix(strings.ReplaceAll(path, "//", "/"), "/")
		want := idemkey.KeyFor(idemkey.Source{Kind: idemkey.JSON, Name: "order_id"}, "o-2",
			idemkey.Request{Method: "POST", Path: normal})
		again := sent[normal]
		sent[normal] = true
		for i := range 2 {
			a := e.do(t, "POST", path, `{"order_id":"o-2"}`)
			if again {
				if a.status != http.StatusConflict || a.header.Get("Idempotency-Key") != want {
					t.Errorf("POST %s (%d): %d key %q, want 409 with key %s", path, i, a.status, a.header.Get("Idempotency-Key"), want)
				}
				continue
			}
			if a.status != http.StatusCreated || a.header.Get("Idempotency-Key") != want {
				t.Errorf("POST %s (%d): %d key %q, want 201 with key %s", path, i, a.status, a.header.Get("Idempotency-Key"), want)
			}
			if replayed := a.header.Get("Idempotent-Replayed") == "true"; replayed != (i == 1) {
				t.Errorf("POST %s (%d): replayed %v", path, i, replayed)
			}
		}
		targets := []string{"POST " + path}
		if again {
			targets = nil
		}
		if got := e.prov.takeTargets(); !slices.Equal(got, targets) {
			t.Errorf("POST %s: provider saw %q, want %q", path, got, targets)
		}
	}
}

func TestRouteReject(t *testing.T) {
	e := newRouteEnv(t, "* /v1/admin/*=reject", nil, t.TempDir())
	for _, m := range []string{"POST", "GET", "DELETE"} {
		a := e.do(t, m, "/v1/admin/users", `{"order_id":"o-1"}`)
		if a.status != http.StatusMethodNotAllowed || errorCode(t, a) != "method_not_allowed" {
			t.Errorf("%s: %d %s, want 405 method_not_allowed", m, a.status, a.body)
		}
		if allow, ok := a.header["Allow"]; !ok || len(allow) != 1 || allow[0] != "" {
			t.Errorf("%s: Allow %q, want one empty Allow: no method is allowed there", m, allow)
		}
	}
	// A rule for one method leaves the others allowed, and says so.
	e = newRouteEnv(t, "DELETE /v1/cards/*=reject", nil, t.TempDir())
	a := e.do(t, "DELETE", "/v1/cards/c1", "")
	if a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") != "GET, HEAD, POST, PUT, PATCH, OPTIONS" {
		t.Errorf("DELETE rejected: %d Allow %q, want 405 with every other method allowed", a.status, a.header.Get("Allow"))
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("provider saw %d requests, want none", total)
	}
}

func TestRouteKeySources(t *testing.T) {
	e := newRouteEnv(t, "POST /cardholders=key:json:external_id; PUT /cards/*=key:header:X-Request-Id", nil, t.TempDir())
	body := `{"external_id":"cust-1","name":"A"}`
	a := e.do(t, "POST", "/cardholders", body)
	b := e.do(t, "POST", "/cardholders", body)
	if a.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(a.body, b.body) {
		t.Fatalf("key from external_id: %d then %d replayed=%q", a.status, b.status, b.header.Get("Idempotent-Replayed"))
	}
	// A route's sources replace the default ones: order_id does not count here.
	if c := e.do(t, "POST", "/cardholders", `{"order_id":"o-1"}`); c.status != http.StatusUnprocessableEntity {
		t.Errorf("no external_id: %d %s, want 422", c.status, c.body)
	}
	// A key rule protects a method IDEMPROXY_PROTECTED_METHODS does not list.
	d := e.do(t, "PUT", "/cards/c1", `{}`, "X-Request-Id", "r-1")
	f := e.do(t, "PUT", "/cards/c1", `{}`, "X-Request-Id", "r-1")
	if d.header.Get("Idempotency-Key") == "" || f.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("PUT with a key rule: key=%q replayed=%q", d.header.Get("Idempotency-Key"), f.header.Get("Idempotent-Replayed"))
	}
	if _, execs := e.prov.counts(); len(execs) != 2 {
		t.Errorf("executions %v, want two operations", execs)
	}
}

// periodStart is the start of the window period after now: a boundary.
func periodStart(window time.Duration) time.Time {
	return time.Now().Truncate(window).Add(window)
}

func TestFingerprintWindow(t *testing.T) {
	const window = 10 * time.Minute
	clk := fakeclock.New(time.Time{})
	boundary := periodStart(window)
	clk.Set(boundary.Add(-time.Second))
	e := newRouteEnv(t, "POST /cards/*/topup=fingerprint:10m", clk, t.TempDir())
	topup := `{"amount":"50"}`
	first := e.do(t, "POST", "/cards/c1/topup", topup)
	key := first.header.Get("Idempotency-Key")
	if first.status != http.StatusCreated || key == "" {
		t.Fatalf("first top-up: %d key=%q", first.status, key)
	}
	// Two seconds later, across a period boundary: the same operation.
	clk.Set(boundary.Add(time.Second))
	again := e.do(t, "POST", "/cards/c1/topup", `{ "amount" : "50" }`)
	if again.header.Get("Idempotency-Key") != key || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("repeat across the boundary: key %q (want %q) replayed=%q", again.header.Get("Idempotency-Key"), key, again.header.Get("Idempotent-Replayed"))
	}
	// Another body, or another card, is another operation.
	other := e.do(t, "POST", "/cards/c1/topup", `{"amount":"51"}`)
	card2 := e.do(t, "POST", "/cards/c2/topup", topup)
	if k := other.header.Get("Idempotency-Key"); k == key || other.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("other amount: key %q replayed=%q, want a new operation", k, other.header.Get("Idempotent-Replayed"))
	}
	if k := card2.header.Get("Idempotency-Key"); k == key || card2.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("other card: key %q, want a new operation", k)
	}
	// Just inside the window of the first request: still the same operation.
	clk.Set(boundary.Add(-time.Second + window - time.Millisecond))
	if r := e.do(t, "POST", "/cards/c1/topup", topup); r.header.Get("Idempotency-Key") != key {
		t.Errorf("at the end of the window: key %q, want %q", r.header.Get("Idempotency-Key"), key)
	}
	// At the window's end: a new operation with a new key, executed.
	clk.Set(boundary.Add(-time.Second + window))
	later := e.do(t, "POST", "/cards/c1/topup", topup)
	key2 := later.header.Get("Idempotency-Key")
	if key2 == key || key2 == "" || later.status != http.StatusCreated || later.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after the window: %d key %q replayed=%q, want a new operation", later.status, key2, later.header.Get("Idempotent-Replayed"))
	}
	// The new operation's window starts at its own first request, not at a
	// period boundary: 9 minutes later, in the next period, it still replays.
	clk.Advance(9 * time.Minute)
	if r := e.do(t, "POST", "/cards/c1/topup", topup); r.header.Get("Idempotency-Key") != key2 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("9m into the second operation: key %q replayed=%q, want %q replayed", r.header.Get("Idempotency-Key"), r.header.Get("Idempotent-Replayed"), key2)
	}
	_, execs := e.prov.counts()
	if len(execs) != 4 || execs[key] != 1 || execs[key2] != 1 {
		t.Errorf("executions %v, want 4 operations, each executed once", execs)
	}
	// The client's own key still wins over the window.
	if r := e.do(t, "POST", "/cards/c1/topup", topup, "Idempotency-Key", "app-key-1"); r.header.Get("Idempotency-Key") != "app-key-1" {
		t.Errorf("client key: got %q", r.header.Get("Idempotency-Key"))
	}
}

// An operation anchored before a restart keeps its key after it, even when the
// attempt was abandoned (nothing stored) and the retry falls in the next period.
func TestFingerprintWindowSurvivesRestart(t *testing.T) {
	const window = time.Minute
	clk := fakeclock.New(time.Time{})
	boundary := periodStart(window)
	clk.Set(boundary.Add(-time.Second))
	dir := t.TempDir()
	e := newRouteEnv(t, "POST /cards=fingerprint:1m", clk, dir)
	e.prov.status = http.StatusBadGateway // not final: the key is released
	a := e.do(t, "POST", "/cards", `{"amount":"5"}`)
	key := a.header.Get("Idempotency-Key")
	if a.status != http.StatusBadGateway || key == "" {
		t.Fatalf("first: %d key=%q", a.status, key)
	}
	e.srv.Close()
	e.h.Drain(context.Background())
	e.store.Close()

	clk.Set(boundary.Add(30 * time.Second))
	e2 := newRouteEnv(t, "POST /cards=fingerprint:1m", clk, dir)
	b := e2.do(t, "POST", "/cards", `{"amount":"5"}`)
	if b.header.Get("Idempotency-Key") != key || b.status != http.StatusCreated {
		t.Fatalf("retry after restart, next period: %d key %q, want %q", b.status, b.header.Get("Idempotency-Key"), key)
	}
}

// An operation whose answer says needs_review (the cards provider: carried
// out or not, a person is reviewing it; never to be repeated) is never
// replaced by a new one while it awaits review: the same request after the
// window (within the look-back of two windows, as for an unknown outcome)
// replays it under its key. It was a new operation with a new key, and the
// provider ran the top-up a second time. Once an operator marks it
// reviewed, the request after its window is a new operation again.
func TestFingerprintWindowHoldsNeedsReview(t *testing.T) {
	const window = time.Minute
	clk := fakeclock.New(time.Time{})
	start := periodStart(window).Add(time.Second)
	clk.Set(start)
	e := newRouteEnv(t, "POST /cards/*/topup=fingerprint:1m", clk, t.TempDir())
	topup := `{"amount":"66.66"}`
	first := e.do(t, "POST", "/cards/c1/topup", topup)
	key := first.header.Get("Idempotency-Key")
	if first.status != http.StatusOK || key == "" || !strings.Contains(string(first.body), "needs_review") {
		t.Fatalf("first top-up: %d key=%q %s, want 200 needs_review with a key", first.status, key, first.body)
	}
	for _, after := range []time.Duration{window + 2*time.Second, 2*window + 30*time.Second, 4 * window} {
		clk.Set(start.Add(after))
		r := e.do(t, "POST", "/cards/c1/topup", topup)
		if k := r.header.Get("Idempotency-Key"); k != key || r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, first.body) {
			t.Fatalf("%v after a needs_review top-up: %d key %q replayed=%q, want %q replayed", after, r.status, k, r.header.Get("Idempotent-Replayed"), key)
		}
	}
	if total, execs := e.prov.counts(); total != 1 || execs[key] != 1 {
		t.Fatalf("provider saw %d requests %v, want the top-up sent once", total, execs)
	}
	if _, marked, err := e.store.Reviewed(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: key}); err != nil || !marked {
		t.Fatalf("Reviewed = %v, %v", marked, err)
	}
	clk.Set(start.Add(6 * window))
	n := e.do(t, "POST", "/cards/c1/topup", topup)
	if k := n.header.Get("Idempotency-Key"); k == key || k == "" || n.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after review and a window: %d key %q replayed=%q, want a new operation", n.status, k, n.header.Get("Idempotent-Replayed"))
	}
	// An operator cannot name such an operation by an order value (orders
	// renew): told so and what does happen, not only that no key derives.
	if _, err := e.h.OrderKeys(http.MethodPost, "/cards/c1/topup", "x", proxy.DefaultTenant, 1); err == nil ||
		!strings.Contains(err.Error(), "fingerprint window (1m0s)") || !strings.Contains(err.Error(), "after the window is sent under a new key") {
		t.Errorf("OrderKeys on a fingerprint route = %v, want it to name the window and what happens after it", err)
	}
}

// An operation whose outcome is unknown is never replaced by a new one: a
// retry that comes after the window resumes it with its key, whether the
// period before the retry's was anchored by it or not; once the resumed
// operation is final, a repeat in the same window replays it, and only a
// request after that window is a new operation.
func TestFingerprintWindowResumesUnknownOutcome(t *testing.T) {
	const window = time.Minute
	clk := fakeclock.New(time.Time{})
	boundary := periodStart(window)
	e := newRouteEnv(t, "POST /cards/*/topup=fingerprint:1m", clk, t.TempDir())
	for _, c := range []struct {
		name        string
		first, late time.Time // the late retry comes more than a window after the first
	}{
		// The retry's previous period holds the operation's anchor, too old.
		{"anchor in the period before", boundary.Add(time.Second), boundary.Add(window + 2*time.Second)},
		// The retry's previous period has no anchor; the one before it has.
		{"anchor two periods before", boundary.Add(3 * window).Add(-time.Second), boundary.Add(4*window + 30*time.Second)},
	} {
		t.Run(c.name, func(t *testing.T) {
			topup := `{"amount":"` + c.name + `"}`
			clk.Set(c.first)
			e.prov.mu.Lock()
			e.prov.status = http.StatusGatewayTimeout // the provider may have acted
			e.prov.mu.Unlock()
			a := e.do(t, "POST", "/cards/c1/topup", topup)
			key := a.header.Get("Idempotency-Key")
			if a.status != http.StatusGatewayTimeout || key == "" {
				t.Fatalf("first: %d key=%q, want 504 with a key", a.status, key)
			}
			e.prov.mu.Lock()
			e.prov.status = 0
			e.prov.mu.Unlock()
			clk.Set(c.late)
			b := e.do(t, "POST", "/cards/c1/topup", topup)
			if k := b.header.Get("Idempotency-Key"); k != key || b.status != http.StatusCreated {
				t.Fatalf("retry after the window, outcome unknown: %d key %q, want the unknown operation's %q resumed", b.status, k, key)
			}
			clk.Advance(20 * time.Second)
			r := e.do(t, "POST", "/cards/c1/topup", topup)
			if r.header.Get("Idempotency-Key") != key || r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, b.body) {
				t.Fatalf("repeat after the resumed operation ended: key %q replayed=%q, want %q replayed", r.header.Get("Idempotency-Key"), r.header.Get("Idempotent-Replayed"), key)
			}
			clk.Set(c.late.Add(window))
			n := e.do(t, "POST", "/cards/c1/topup", topup)
			if k := n.header.Get("Idempotency-Key"); k == key || k == "" || n.status != http.StatusCreated || n.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("after the resumed operation's window: %d key %q replayed=%q, want a new operation", n.status, k, n.header.Get("Idempotent-Replayed"))
			}
			e.prov.mu.Lock()
			sent, execs := e.prov.requests[key], e.prov.execs[key]
			e.prov.mu.Unlock()
			if sent != 2 || execs != 1 {
				t.Errorf("the unknown operation's key: %d requests, %d executions; want 2 and 1", sent, execs)
			}
		})
	}
}

// An operation still running when its window ends is not run a second time
// by a request after the window: that request waits for it, as a repeat in
// the window does, and gets its answer replayed.
func TestFingerprintWindowWaitsForRunningOperation(t *testing.T) {
	const window = time.Minute
	clk := fakeclock.New(time.Time{})
	clk.Set(periodStart(window).Add(10 * time.Second))
	e := newRouteEnv(t, "POST /cards/*/topup=fingerprint:1m", clk, t.TempDir())
	e.prov.hold = make(chan struct{})
	e.prov.entered = make(chan string, 1)
	first := e.goSend("POST", "/cards/c1/topup", `{"amount":"7"}`)
	key := <-e.prov.entered
	clk.Advance(window + time.Second)
	late := e.goSend("POST", "/cards/c1/topup", `{"amount":"7"}`)
	time.Sleep(100 * time.Millisecond) // let it reach the wait for the running operation
	close(e.prov.hold)
	a, b := <-first, <-late
	if a.err != nil || b.err != nil {
		t.Fatal(a.err, b.err)
	}
	if k := b.header.Get("Idempotency-Key"); k != key || b.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(a.body, b.body) {
		t.Fatalf("request after the window of a running operation: %d key %q replayed=%q, want %q replayed", b.status, k, b.header.Get("Idempotent-Replayed"), key)
	}
	if total, _ := e.prov.counts(); total != 1 {
		t.Errorf("provider saw %d requests, want 1", total)
	}
}

func TestInProgressDialect(t *testing.T) {
	e := newRouteEnv(t, "", nil, t.TempDir(), func(o *proxy.Options, _ *retry.Policy) {
		o.InflightWait = 50 * time.Millisecond
		o.InProgressStatus, o.InProgressCode = http.StatusServiceUnavailable, "idempotency.in_progress"
	})
	e.prov.hold = make(chan struct{})
	e.prov.entered = make(chan string, 1)
	first := e.goSend("POST", "/v1/payout", order)
	<-e.prov.entered
	a := e.do(t, "POST", "/v1/payout", order)
	if a.status != http.StatusServiceUnavailable || errorCode(t, a) != "idempotency.in_progress" || a.header.Get("Retry-After") != "1" {
		t.Errorf("got %d %s Retry-After=%q, want 503 idempotency.in_progress with Retry-After: 1", a.status, a.body, a.header.Get("Retry-After"))
	}
	close(e.prov.hold)
	if f := <-first; f.err != nil {
		t.Error(f.err)
	}
}
