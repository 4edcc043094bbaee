package main

// End-to-end tests of operations whose outcome is unknown, with the real
// binary in front of the payments sandbox: the record is kept and resumed
// with the same key, the status probe resolves a 504, and the provider's key
// retention stops a blind resend.

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// gatewayProvider is a sandbox (payments unless cfg names another) behind
// a gateway that, while lose is above zero, answers a POST with 504 after
// the sandbox has handled it (executed = true) or without passing it on
// (executed = false). The 504
// names the payment, as the sandbox's own fault does, or paymentID when the
// sandbox made none. It counts the POSTs reaching the provider, per key.
type gatewayProvider struct {
	sb *sandbox.Server

	mu        sync.Mutex
	lose      int
	executed  bool
	paymentID string
	posts     map[string]int // Idempotency-Key → POSTs that reached the gateway
	gets      int
}

func newGatewayProvider(t *testing.T, cfg sandbox.Config) *gatewayProvider {
	t.Helper()
	if cfg.Provider == "" {
		cfg.Provider = sandbox.ProviderPayments
	}
	sb, err := sandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &gatewayProvider{sb: sb, posts: map[string]int{}, executed: true}
}

func (g *gatewayProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	if r.Method == http.MethodGet {
		g.gets++
	}
	if r.Method != http.MethodPost || g.lose == 0 {
		if r.Method == http.MethodPost {
			g.posts[r.Header.Get("Idempotency-Key")]++
		}
		g.mu.Unlock()
		g.sb.ServeHTTP(w, r)
		return
	}
	g.lose--
	g.posts[r.Header.Get("Idempotency-Key")]++
	executed, id := g.executed, g.paymentID
	g.mu.Unlock()
	if executed {
		rec := httptest.NewRecorder()
		g.sb.ServeHTTP(rec, r)
		var p struct{ ID string }
		json.Unmarshal(rec.Body.Bytes(), &p)
		id = p.ID
	} else {
		io.Copy(io.Discard, r.Body)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusGatewayTimeout)
	io.WriteString(w, `{"error":{"code":"gateway_timeout","message":"upstream timed out"},"payment_id":"`+id+`"}`)
}

func (g *gatewayProvider) set(lose int, executed bool, paymentID string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lose, g.executed, g.paymentID = lose, executed, paymentID
}

// postCounts returns the POSTs per key and the GETs seen so far.
func (g *gatewayProvider) postCounts() (map[string]int, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]int{}
	for k, n := range g.posts {
		out[k] = n
	}
	return out, g.gets
}

// unknownEnv is a fast retry setup: one attempt per request unless more are
// asked for, short timeouts.
func unknownEnv(upstream, dir string, extra ...string) []string {
	return baseEnv(upstream, dir, append(fastRetry(), extra...)...)
}

// fastRetry is unknownEnv's retry settings, for any store.
func fastRetry() []string {
	return []string{
		"IDEMPROXY_RETRY_MAX_ATTEMPTS=1",
		"IDEMPROXY_RETRY_BASE_DELAY=10ms",
		"IDEMPROXY_RETRY_MAX_DELAY=50ms",
		"IDEMPROXY_RETRY_BUDGET=5s",
		"IDEMPROXY_ATTEMPT_TIMEOUT=2s",
	}
}

const paymentBody = `{"order_id":"order-77","amount":"10.00","currency":"EUR"}`

// onlyKey returns the one key in posts and its count, failing otherwise.
func onlyKey(t *testing.T, posts map[string]int) (string, int) {
	t.Helper()
	if len(posts) != 1 {
		t.Fatalf("POSTs reached the provider with %d keys (%v), want exactly one key", len(posts), posts)
	}
	for k, n := range posts {
		return k, n
	}
	return "", 0
}

func TestUnknownKeptAndResumedWithSameKey(t *testing.T) {
	gw := newGatewayProvider(t, sandbox.Config{})
	up := httptest.NewServer(gw)
	defer up.Close()
	gw.set(1<<30, true, "")
	p := launch(t, launchSpec{env: unknownEnv(up.URL, t.TempDir(), "IDEMPROXY_RETRY_MAX_ATTEMPTS=2")})

	first := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if first.status != http.StatusBadGateway || !strings.Contains(first.body, "upstream_unavailable") {
		t.Fatalf("first POST = %d %s, want 502 upstream_unavailable", first.status, first.body)
	}
	line := p.waitLine(t, `"msg":"operation outcome unknown`)
	if jsonField(line, "key") != first.header.Get("Idempotency-Key") || !strings.Contains(line, `"attempts":2`) {
		t.Fatalf("unknown log line %s does not name the key %s and 2 attempts", line, first.header.Get("Idempotency-Key"))
	}
	if m := scrape(t, "http://"+p.admin+"/metrics"); m["idemproxy_operations_unknown"] != 1 {
		t.Fatalf("idemproxy_operations_unknown = %v, want 1", m["idemproxy_operations_unknown"])
	}

	gw.set(0, true, "")
	second := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("resumed POST = %d %s (replayed %q), want the provider's stored 201",
			second.status, second.body, second.header.Get("Idempotent-Replayed"))
	}
	key, n := onlyKey(t, mustPosts(gw))
	if key != first.header.Get("Idempotency-Key") || n != 3 {
		t.Fatalf("provider saw key %s %d times, want %s 3 times", key, n, first.header.Get("Idempotency-Key"))
	}
	if l := gw.sb.Ledger(); l.Executions != 1 {
		t.Fatalf("provider executed %d payments, want 1", l.Executions)
	}
	if m := scrape(t, "http://"+p.admin+"/metrics"); m["idemproxy_operations_unknown"] != 0 {
		t.Fatalf("idemproxy_operations_unknown = %v after the resume, want 0", m["idemproxy_operations_unknown"])
	}
}

func mustPosts(g *gatewayProvider) map[string]int {
	posts, _ := g.postCounts()
	return posts
}

func TestProbeTurns504IntoStoredResult(t *testing.T) {
	gw := newGatewayProvider(t, sandbox.Config{})
	up := httptest.NewServer(gw)
	defer up.Close()
	gw.set(1, true, "")
	p := launch(t, launchSpec{env: unknownEnv(up.URL, t.TempDir(),
		"IDEMPROXY_RETRY_MAX_ATTEMPTS=3", "IDEMPROXY_STATUS_PROBE=GET /payments/{resp.payment_id}")})

	r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if r.status != http.StatusOK || r.header.Get("Idemproxy-Reconciled") != "true" || !strings.Contains(r.body, `"order_id":"order-77"`) {
		t.Fatalf("POST = %d %s (reconciled %q), want the payment found by the probe, marked reconciled",
			r.status, r.body, r.header.Get("Idemproxy-Reconciled"))
	}
	again := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if again.status != http.StatusOK || again.body != r.body || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Idemproxy-Reconciled") != "true" {
		t.Fatalf("repeat = %d %s, want the reconciled answer replayed", again.status, again.body)
	}
	posts, gets := gw.postCounts()
	key, n := onlyKey(t, posts)
	if n != 1 || gets != 1 {
		t.Fatalf("provider saw %d POSTs and %d GETs, want 1 POST (no resend) and 1 probe", n, gets)
	}
	if l := gw.sb.Ledger(); l.Executions != 1 {
		t.Fatalf("provider executed %d payments, want 1", l.Executions)
	}
	// The log names the operation, its key and the lookup that was sent.
	var id struct{ ID string }
	json.Unmarshal([]byte(r.body), &id)
	line := p.waitLine(t, `"msg":"status probe"`)
	for _, want := range []string{`"method":"POST"`, `"path":"/payments"`, `"key":"` + key + `"`,
		`"probe_method":"GET"`, `"probe_path":"/payments/` + id.ID + `"`, `"result":"found"`, `"status":200`} {
		if id.ID == "" || !strings.Contains(line, want) {
			t.Errorf("status probe log line %s lacks %s (payment id %q)", line, want, id.ID)
		}
	}
	if m := scrape(t, "http://"+p.admin+"/metrics"); m[`idemproxy_status_probes_total{result="found"}`] != 1 {
		t.Fatalf("probes found = %v, want 1", m[`idemproxy_status_probes_total{result="found"}`])
	}
}

func TestProbeNotFoundResendsWithSameKey(t *testing.T) {
	gw := newGatewayProvider(t, sandbox.Config{})
	up := httptest.NewServer(gw)
	defer up.Close()
	gw.set(1, false, "pay_never_made") // 504 from the gateway; the provider never saw it
	p := launch(t, launchSpec{env: unknownEnv(up.URL, t.TempDir(),
		"IDEMPROXY_RETRY_MAX_ATTEMPTS=3", "IDEMPROXY_STATUS_PROBE=GET /payments/{resp.payment_id}",
		"IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES=payment_not_found")})

	r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if r.status != http.StatusCreated || r.header.Get("Idemproxy-Reconciled") != "" {
		t.Fatalf("POST = %d %s, want the resent payment's own 201", r.status, r.body)
	}
	posts, gets := gw.postCounts()
	key, n := onlyKey(t, posts)
	if key != r.header.Get("Idempotency-Key") || n != 2 || gets != 1 {
		t.Fatalf("provider saw %v and %d GETs, want 2 POSTs with key %s around 1 probe", posts, gets, r.header.Get("Idempotency-Key"))
	}
	if l := gw.sb.Ledger(); l.Executions != 1 {
		t.Fatalf("provider executed %d payments, want 1", l.Executions)
	}
	if m := scrape(t, "http://"+p.admin+"/metrics"); m[`idemproxy_status_probes_total{result="not_found"}`] != 1 {
		t.Fatalf("probes not_found = %v, want 1", m[`idemproxy_status_probes_total{result="not_found"}`])
	}
}

// TestProbeFillsRespFromEarlierRequest: the payment is executed and its
// 504 names it, the only attempt the budget allows; the operation is kept
// unknown. The app's retry comes later, on the same replica or on another
// one sharing the store: the probe reads the payment id from the 504 the
// record kept, finds the payment, and that answer is stored as the result
// without a second POST.
func TestProbeFillsRespFromEarlierRequest(t *testing.T) {
	retry := []string{"IDEMPROXY_RETRY_MAX_ATTEMPTS=1", "IDEMPROXY_RETRY_BASE_DELAY=10ms", "IDEMPROXY_RETRY_MAX_DELAY=50ms",
		"IDEMPROXY_RETRY_BUDGET=5s", "IDEMPROXY_ATTEMPT_TIMEOUT=2s", "IDEMPROXY_STATUS_PROBE=GET /payments/{resp.payment_id}"}
	cases := []struct {
		name   string
		launch func(t *testing.T, upstream string) (first, retry *opsProc)
	}{
		{"one replica, Badger", func(t *testing.T, upstream string) (*opsProc, *opsProc) {
			p := launch(t, launchSpec{env: baseEnv(upstream, t.TempDir(), retry...)})
			return p, p
		}},
		{"another replica, PostgreSQL", func(t *testing.T, upstream string) (*opsProc, *opsProc) {
			env := sharedEnv(upstream, pgtest.Database(t), retry...)
			return launch(t, launchSpec{env: env}), launch(t, launchSpec{env: env})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gw := newGatewayProvider(t, sandbox.Config{})
			up := httptest.NewServer(gw)
			defer up.Close()
			gw.set(1, true, "") // the first POST executes; its 504 names the payment
			a, b := c.launch(t, up.URL)

			first := send(t, "POST", "http://"+a.proxy+"/payments", paymentBody)
			if first.status != http.StatusBadGateway {
				t.Fatalf("first POST = %d %s, want 502 (budget spent, outcome unknown)", first.status, first.body)
			}
			a.waitLine(t, `"msg":"operation outcome unknown`)
			if _, gets := gw.postCounts(); gets != 0 {
				t.Fatalf("%d probes during the first request; its one attempt leaves none to resolve", gets)
			}

			r := send(t, "POST", "http://"+b.proxy+"/payments", paymentBody)
			if r.status != http.StatusOK || r.header.Get("Idemproxy-Reconciled") != "true" || !strings.Contains(r.body, `"order_id":"order-77"`) {
				t.Fatalf("the app's retry = %d %s (reconciled %q), want the payment the probe found",
					r.status, r.body, r.header.Get("Idemproxy-Reconciled"))
			}
			again := send(t, "POST", "http://"+a.proxy+"/payments", paymentBody)
			if again.status != http.StatusOK || again.body != r.body || again.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("repeat = %d %s, want the reconciled answer replayed", again.status, again.body)
			}
			posts, gets := gw.postCounts()
			if key, n := onlyKey(t, posts); n != 1 || gets != 1 || key != first.header.Get("Idempotency-Key") {
				t.Fatalf("provider saw %v and %d GETs, want 1 POST with key %s and 1 probe", posts, gets, first.header.Get("Idempotency-Key"))
			}
			if l := gw.sb.Ledger(); l.Executions != 1 {
				t.Fatalf("provider executed %d payments, want 1", l.Executions)
			}
			if m := scrape(t, "http://"+b.admin+"/metrics"); m[`idemproxy_status_probes_total{result="found"}`] != 1 {
				t.Fatalf("probes found on the retrying replica = %v, want 1", m[`idemproxy_status_probes_total{result="found"}`])
			}
		})
	}
}

// TestRetentionGuardRefusesBlindResend: the provider forgets keys after a
// second. The first attempt executes and its answer is lost; the app retries
// after the retention. Without the guard the retry executes the payment a
// second time; with it nothing is sent and the app gets 409
// idempotency_key_expired.
func TestRetentionGuardRefusesBlindResend(t *testing.T) {
	const retention = time.Second
	for _, guard := range []bool{false, true} {
		name := map[bool]string{false: "without guard", true: "with guard"}[guard]
		t.Run(name, func(t *testing.T) {
			gw := newGatewayProvider(t, sandbox.Config{KeyRetention: retention})
			up := httptest.NewServer(gw)
			defer up.Close()
			gw.set(1, true, "")
			env := unknownEnv(up.URL, t.TempDir())
			if guard {
				env = append(env, "IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())
			}
			p := launch(t, launchSpec{env: env})
			first := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
			sent := time.Now()
			if first.status != http.StatusBadGateway {
				t.Fatalf("first POST = %d %s, want 502", first.status, first.body)
			}
			// The app comes back once the provider has forgotten the key.
			time.Sleep(time.Until(sent.Add(retention + 100*time.Millisecond)))
			second := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
			executions := gw.sb.Ledger().Executions
			if !guard {
				if second.status != http.StatusCreated || executions != 2 {
					t.Fatalf("retry = %d %s with %d executions; without the guard the forgotten key should execute again (2)",
						second.status, second.body, executions)
				}
				return
			}
			if second.status != http.StatusConflict || !strings.Contains(second.body, `"idempotency_key_expired"`) {
				t.Fatalf("retry = %d %s, want 409 idempotency_key_expired", second.status, second.body)
			}
			if _, n := onlyKey(t, mustPosts(gw)); n != 1 || executions != 1 {
				t.Fatalf("provider saw %d POSTs and executed %d, want 1 and 1: nothing re-sent", n, executions)
			}
			// Still refused, still kept: the operation waits for a person.
			if again := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody); again.status != http.StatusConflict {
				t.Fatalf("second retry = %d %s, want 409 again", again.status, again.body)
			}
		})
	}
}

// TestUnknownOutlivesRecordTTL: an operation whose outcome is unknown is not
// forgotten when RECORD_TTL runs out. Forgotten, the app's next request
// would send it as a new operation, long after a provider that keeps keys
// for a while (here a second) would execute it again; kept, it is still
// refused with nothing sent, and still listed for operators.
func TestUnknownOutlivesRecordTTL(t *testing.T) {
	const retention, ttl = time.Second, 13 * time.Second // the shortest TTL the lease below allows
	gw := newGatewayProvider(t, sandbox.Config{KeyRetention: retention})
	up := httptest.NewServer(gw)
	defer up.Close()
	gw.set(1, true, "")
	p := launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir(),
		"IDEMPROXY_RETRY_MAX_ATTEMPTS=1", "IDEMPROXY_RETRY_BUDGET=1s", "IDEMPROXY_ATTEMPT_TIMEOUT=1s",
		"IDEMPROXY_STORE_LEASE=2s", "IDEMPROXY_RECORD_TTL="+ttl.String(),
		"IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())})

	first := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	sent := time.Now()
	if first.status != http.StatusBadGateway {
		t.Fatalf("first POST = %d %s, want 502", first.status, first.body)
	}
	key := first.header.Get("Idempotency-Key")
	// Past the TTL, rounded up to the next second as stores may round it.
	time.Sleep(time.Until(sent.Add(ttl + 1500*time.Millisecond)))

	list := send(t, "GET", "http://"+p.admin+"/admin/v1/records?state=unknown", "")
	if !strings.Contains(list.body, `"key":"`+key+`"`) || !strings.Contains(list.body, `"expires_at":null`) {
		t.Fatalf("unknown records past the TTL = %s, want %s listed, never expiring", list.body, key)
	}
	second := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if second.status != http.StatusConflict || !strings.Contains(second.body, `"idempotency_key_expired"`) {
		t.Fatalf("retry past the TTL = %d %s, want 409 idempotency_key_expired", second.status, second.body)
	}
	if _, n := onlyKey(t, mustPosts(gw)); n != 1 || gw.sb.Ledger().Executions != 1 {
		t.Fatalf("provider saw %d POSTs and executed %d payments, want 1 and 1: nothing re-sent", n, gw.sb.Ledger().Executions)
	}
}

// TestKeyExpiredKeepsLastError: a retry refused for the provider's key
// retention sends nothing, so it must not replace what the record says the
// provider last did (here the gateway's 504): that is what the operator
// checks with the provider before running records resolve.
func TestKeyExpiredKeepsLastError(t *testing.T) {
	const retention = time.Second
	gw := newGatewayProvider(t, sandbox.Config{KeyRetention: retention})
	up := httptest.NewServer(gw)
	defer up.Close()
	gw.set(1, true, "")
	p := launch(t, launchSpec{env: unknownEnv(up.URL, t.TempDir(), "IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())})
	first := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	sent := time.Now()
	if first.status != http.StatusBadGateway {
		t.Fatalf("first POST = %d %s, want 502", first.status, first.body)
	}
	key := first.header.Get("Idempotency-Key")
	type record struct {
		State     string `json:"state"`
		Attempts  int    `json:"attempts"`
		LastError string `json:"last_error"`
	}
	get := func() record {
		t.Helper()
		r := send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+key, "")
		var rec record
		if err := json.Unmarshal([]byte(r.body), &rec); r.status != http.StatusOK || err != nil {
			t.Fatalf("GET record = %d %s", r.status, r.body)
		}
		return rec
	}
	before := get()
	if before.State != "unknown" || !strings.Contains(before.LastError, "504") {
		t.Fatalf("record after the 502 = %+v, want unknown with a 504 last_error", before)
	}
	time.Sleep(time.Until(sent.Add(retention + 100*time.Millisecond)))
	for i := 0; i < 2; i++ {
		if r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody); r.status != http.StatusConflict ||
			!strings.Contains(r.body, `"idempotency_key_expired"`) {
			t.Fatalf("retry %d = %d %s, want 409 idempotency_key_expired", i+1, r.status, r.body)
		}
	}
	if after := get(); after != before {
		t.Fatalf("record after the refused retries = %+v, want it unchanged: %+v", after, before)
	}
	if _, n := onlyKey(t, mustPosts(gw)); n != 1 {
		t.Fatalf("provider saw %d POSTs, want 1", n)
	}
}

// TestOversizedAnswerKeptUnknown: the provider executes the payment and
// answers with a body larger than a record holds. The app gets 502
// upstream_unavailable ("the outcome may be unknown") and never sees the
// answer, so the operation must be kept as unknown, listed for operators,
// like any answer that could not be stored: released, the app's retry
// after the provider's key retention was a first send, with no retention
// check, and the provider executed the payment a second time.
func TestOversizedAnswerKeptUnknown(t *testing.T) {
	const retention = time.Second
	var mu sync.Mutex
	posts := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		posts[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay-1","status":"succeeded","receipt":"`+strings.Repeat("r", 2<<20)+`"}`)
	}))
	defer up.Close()
	p := launch(t, launchSpec{env: unknownEnv(up.URL, t.TempDir(), "IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())})
	first := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	sent := time.Now()
	if first.status != http.StatusBadGateway || !strings.Contains(first.body, `"upstream_unavailable"`) {
		t.Fatalf("first POST = %d %s, want 502 upstream_unavailable", first.status, first.body)
	}
	key := first.header.Get("Idempotency-Key")
	rec := send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+key, "")
	var got struct {
		State     string `json:"state"`
		LastError string `json:"last_error"`
		Attempts  int    `json:"attempts"`
	}
	if err := json.Unmarshal([]byte(rec.body), &got); rec.status != http.StatusOK || err != nil ||
		got.State != "unknown" || !strings.Contains(got.LastError, "too large") || got.Attempts != 1 {
		t.Fatalf("record after the oversized answer = %d %s, want it kept unknown, 1 attempt, last_error saying the answer was too large",
			rec.status, rec.body)
	}
	if list := send(t, "GET", "http://"+p.admin+"/admin/v1/records?state=unknown", ""); !strings.Contains(list.body, `"key":"`+key+`"`) {
		t.Fatalf("unknown records = %s, want %s listed", list.body, key)
	}
	time.Sleep(time.Until(sent.Add(retention + 100*time.Millisecond)))
	second := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if second.status != http.StatusConflict || !strings.Contains(second.body, `"idempotency_key_expired"`) {
		t.Fatalf("retry past the provider's key retention = %d %s, want 409 idempotency_key_expired", second.status, second.body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(posts) != 1 || posts[key] != 1 {
		t.Fatalf("provider saw POSTs %v, want one, with key %s: nothing re-sent blindly", posts, key)
	}
}
