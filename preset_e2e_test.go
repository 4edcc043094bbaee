package main

// End-to-end tests of presets and routes with the real binary in front of the
// sandbox providers: each preset works with only the provider's URL and
// credentials set; lookups are never stored; card flows go through; a
// fingerprint window replays inside it and executes again after it; the
// in-progress answer speaks the provider's dialect.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
)

const sandboxSecret = "e2e-sandbox-secret"

// startSandbox serves a sandbox provider with signatures checked.
func startSandbox(t *testing.T, cfg sandbox.Config) (*sandbox.Server, string) {
	t.Helper()
	cfg.Secret = []byte(sandboxSecret)
	sb, err := sandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sb)
	t.Cleanup(srv.Close)
	return sb, srv.URL
}

// presetEnv is the whole configuration an operator writes for a preset: the
// preset, the provider's URL and the secret, plus the test's data dir and ports.
func presetEnv(t *testing.T, preset, upstream string, extra ...string) []string {
	return baseEnv(upstream, t.TempDir(), append([]string{"IDEMPROXY_PRESET=" + preset,
		"IDEMPROXY_SIGN_SECRET=" + sandboxSecret}, extra...)...)
}

// field is a top-level string field of a JSON body.
func field(t *testing.T, body, name string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	s, _ := m[name].(string)
	return s
}

func TestPresetPayoutsLookupsAreFresh(t *testing.T) {
	sb, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderPayouts, PublicID: "pub-e2e"})
	p := launch(t, launchSpec{env: presetEnv(t, "payouts", url, "IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-e2e")})
	base := "http://" + p.proxy
	info := `{"order_id":"po-1"}`
	// "Was it created?" before creating: 404, and that answer is not kept.
	for range 2 {
		if a := send(t, "POST", base+"/v1/payout/info", info); a.status != http.StatusNotFound || a.header.Get("Idempotency-Key") != "" {
			t.Fatalf("lookup before the payout: %d key=%q %s, want a fresh 404", a.status, a.header.Get("Idempotency-Key"), a.body)
		}
	}
	payout := `{"amount":"25","currency":"USDT","network":"tron","address":"TXY1","order_id":"po-1"}`
	created := send(t, "POST", base+"/v1/payout", payout)
	if created.status != http.StatusOK || created.header.Get("Idempotency-Key") == "" {
		t.Fatalf("payout: %d %s", created.status, created.body)
	}
	if a := send(t, "POST", base+"/v1/payout/info", info); a.status != http.StatusOK || field(t, a.body, "id") != field(t, created.body, "id") {
		t.Errorf("lookup after the payout: %d %s, want the payout", a.status, a.body)
	}
	if a := send(t, "POST", base+"/v1/payout", payout); a.header.Get("Idempotent-Replayed") != "true" || a.body != created.body {
		t.Errorf("repeat: %d replayed=%q", a.status, a.header.Get("Idempotent-Replayed"))
	}
	// Payments of the same API: /v1/payment/info is as fresh.
	if a := send(t, "POST", base+"/v1/payment/info", `{"order_id":"inv-1"}`); a.status != http.StatusNotFound {
		t.Fatalf("payment lookup before: %d %s", a.status, a.body)
	}
	paid := send(t, "POST", base+"/v1/payment", `{"amount":"70","currency":"USDT","order_id":"inv-1"}`)
	if a := send(t, "POST", base+"/v1/payment/info", `{"order_id":"inv-1"}`); a.status != http.StatusOK || a.body != paid.body {
		t.Errorf("payment lookup after: %d %s, want %s", a.status, a.body, paid.body)
	}
	if l := sb.Ledger(); l.Executions != 2 || l.ByOrder["po-1"] != 1 || l.ByOrder["inv-1"] != 1 {
		t.Errorf("ledger: %d executions %v, want the payout and the payment once each", l.Executions, l.ByOrder)
	}
}

// TestRouteWrittenWithTrailingSlash: an operator who writes the lookup's
// rule with a trailing slash (copied from a URL) means the endpoint
// POST /v1/payout/info, which the app calls without one. Before, the rule
// matched only "/v1/payout/info/": the lookup was keyed by its order_id, its
// 404 stored and replayed after the payout was made, and a reject rule
// written so let its endpoint through to the provider.
func TestRouteWrittenWithTrailingSlash(t *testing.T) {
	sb, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderPayouts, PublicID: "pub-e2e"})
	p := launch(t, launchSpec{env: presetEnv(t, "payouts", url, "IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-e2e",
		"IDEMPROXY_ROUTES=POST /v1/payout/info/=unprotected; POST /v1/payment/=reject;")})
	base := "http://" + p.proxy
	info := `{"order_id":"po-slash"}`
	if a := send(t, "POST", base+"/v1/payout/info", info); a.status != http.StatusNotFound || a.header.Get("Idempotency-Key") != "" {
		t.Fatalf("lookup before the payout: %d key=%q %s, want a 404 not keyed", a.status, a.header.Get("Idempotency-Key"), a.body)
	}
	created := send(t, "POST", base+"/v1/payout", `{"amount":"25","currency":"USDT","network":"tron","address":"TXY1","order_id":"po-slash"}`)
	if created.status != http.StatusOK {
		t.Fatalf("payout: %d %s", created.status, created.body)
	}
	if a := send(t, "POST", base+"/v1/payout/info", info); a.status != http.StatusOK || a.header.Get("Idempotent-Replayed") != "" ||
		field(t, a.body, "id") != field(t, created.body, "id") {
		t.Errorf("lookup after the payout: %d replayed=%q %s, want the payout, fresh", a.status, a.header.Get("Idempotent-Replayed"), a.body)
	}
	if a := send(t, "POST", base+"/v1/payment", `{"amount":"70","currency":"USDT","order_id":"inv-slash"}`); a.status != http.StatusMethodNotAllowed {
		t.Errorf("rejected endpoint: %d %s, want 405", a.status, a.body)
	}
	if l := sb.Ledger(); l.Executions != 1 || l.ByOrder["inv-slash"] != 0 {
		t.Errorf("ledger: %d executions %v, want the payout only", l.Executions, l.ByOrder)
	}
}

func TestPresetPayoutsInProgressDialect(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	_, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderPayouts, PublicID: "pub-e2e",
		ExecuteHook: func(sandbox.Operation) { entered <- struct{}{}; <-release }})
	p := launch(t, launchSpec{env: presetEnv(t, "payouts", url, "IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-e2e",
		"IDEMPROXY_INFLIGHT_WAIT=100ms")})
	base := "http://" + p.proxy
	payout := `{"amount":"25","currency":"USDT","order_id":"po-busy"}`
	first := goSend("POST", base+"/v1/payout", payout)
	<-entered
	a := send(t, "POST", base+"/v1/payout", payout)
	if a.status != http.StatusConflict || errorCodeOf(t, a.body) != "idempotency.in_progress" || a.header.Get("Retry-After") == "" {
		t.Errorf("while in flight: %d %s Retry-After=%q, want the provider's 409 idempotency.in_progress", a.status, a.body, a.header.Get("Retry-After"))
	}
	close(release)
	if f := <-first; f.err != nil || f.status != http.StatusOK {
		t.Errorf("first: %d %s %v", f.status, f.body, f.err)
	}
}

func TestInProgressAnswerForAppsThatRetryOnly5xx(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	_, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderPayments,
		ExecuteHook: func(sandbox.Operation) { entered <- struct{}{}; <-release }})
	p := launch(t, launchSpec{env: presetEnv(t, "payments", url, "IDEMPROXY_INFLIGHT_WAIT=100ms",
		"IDEMPROXY_INPROGRESS_STATUS=503", "IDEMPROXY_INPROGRESS_CODE=busy")})
	base := "http://" + p.proxy
	body := `{"order_id":"pay-busy","amount":"10"}`
	first := goSend("POST", base+"/payments", body)
	<-entered
	a := send(t, "POST", base+"/payments", body)
	if a.status != http.StatusServiceUnavailable || errorCodeOf(t, a.body) != "busy" || a.header.Get("Retry-After") == "" {
		t.Errorf("while in flight: %d %s Retry-After=%q, want 503 busy with Retry-After", a.status, a.body, a.header.Get("Retry-After"))
	}
	close(release)
	f := <-first
	if f.err != nil {
		t.Fatal(f.err)
	}
	if r := send(t, "POST", base+"/payments", body); r.status != http.StatusCreated || r.body != f.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the app's retry: %d %s, want the first answer replayed", r.status, r.body)
	}
}

func TestPresetPayments(t *testing.T) {
	sb, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderPayments})
	p := launch(t, launchSpec{env: presetEnv(t, "payments", url)})
	base := "http://" + p.proxy
	body := `{"order_id":"pay-1","amount":"10.50","currency":"EUR"}`
	a := send(t, "POST", base+"/payments", body)
	b := send(t, "POST", base+"/payments", body)
	if a.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "true" || a.body != b.body {
		t.Fatalf("payment and repeat: %d %s / %d replayed=%q", a.status, a.body, b.status, b.header.Get("Idempotent-Replayed"))
	}
	if g := send(t, "GET", base+"/payments/"+field(t, a.body, "id"), ""); g.status != http.StatusOK {
		t.Errorf("GET the payment: %d %s", g.status, g.body)
	}
	if l := sb.Ledger(); l.Executions != 1 {
		t.Errorf("ledger: %d executions, want 1", l.Executions)
	}
}

func TestPresetCardsFlows(t *testing.T) {
	sb, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderCards})
	p := launch(t, launchSpec{env: presetEnv(t, "cards", url)})
	base := "http://" + p.proxy
	// Cardholders need no key: the provider deduplicates by external_id, and
	// idemproxy neither keys nor stores them.
	holder := `{"external_id":"cust-1","name":"Ann"}`
	h1 := send(t, "POST", base+"/cardholders", holder)
	h2 := send(t, "POST", base+"/cardholders", holder)
	if h1.status != http.StatusOK || h1.header.Get("Idempotency-Key") != "" || h2.header.Get("Idempotent-Replayed") != "" ||
		field(t, h1.body, "id") != field(t, h2.body, "id") {
		t.Fatalf("cardholder twice: %d key=%q / replayed=%q, %s vs %s", h1.status, h1.header.Get("Idempotency-Key"),
			h2.header.Get("Idempotent-Replayed"), h1.body, h2.body)
	}
	// Issue, top-up, close: bodies without an id, each repeat the same operation.
	issue := `{"tariff_id":"t-1","holder_external_id":"cust-1","amount":"50"}`
	op := send(t, "POST", base+"/cards", issue)
	if op.status != http.StatusOK || op.header.Get("Idempotency-Key") == "" {
		t.Fatalf("issue: %d %s", op.status, op.body)
	}
	if again := send(t, "POST", base+"/cards", issue); again.body != op.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("issue repeated: %s, want the same operation replayed", again.body)
	}
	card := field(t, op.body, "card_id")
	topup := send(t, "POST", base+"/cards/"+card+"/topup", `{"amount":"20"}`)
	send(t, "POST", base+"/cards/"+card+"/topup", `{"amount":"20"}`)
	closed := send(t, "POST", base+"/cards/"+card+"/close", "")
	send(t, "POST", base+"/cards/"+card+"/close", "")
	if topup.status != http.StatusOK || closed.status != http.StatusOK {
		t.Fatalf("top-up %d %s, close %d %s", topup.status, topup.body, closed.status, closed.body)
	}
	view := send(t, "GET", base+"/cards/"+card, "")
	if field(t, view.body, "status") != "closed" || field(t, view.body, "balance") != "70" {
		t.Errorf("card after the flow: %s, want closed with balance 70", view.body)
	}
	kinds := map[string]int{}
	for _, e := range sb.Ledger().Entries {
		kinds[e.Kind]++
	}
	want := map[string]int{"cardholder.create": 1, "card.issue": 1, "card.topup": 1, "card.close": 1}
	for k, n := range want {
		if kinds[k] != n {
			t.Errorf("ledger %v, want each operation once: %v", kinds, want)
			break
		}
	}
}

// Operation statuses the cards provider names are final: stored, replayed,
// never retried (a failed operation needs a new key, needs_review an event).
func TestPresetCardsFinalStatuses(t *testing.T) {
	sb, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderCards})
	p := launch(t, launchSpec{env: presetEnv(t, "cards", url)})
	base := "http://" + p.proxy
	for _, c := range []struct{ amount, status string }{{sandbox.AmountFailed, "failed"}, {sandbox.AmountNeedsReview, "needs_review"}} {
		issue := `{"tariff_id":"t-1","holder_external_id":"cust-2","amount":"` + c.amount + `"}`
		a := send(t, "POST", base+"/cards", issue)
		b := send(t, "POST", base+"/cards", issue)
		if a.status != http.StatusOK || field(t, a.body, "status") != c.status || a.header.Get("Idemproxy-Attempts") != "1" ||
			b.header.Get("Idempotent-Replayed") != "true" || b.body != a.body {
			t.Errorf("%s: %d %s attempts=%q, repeat replayed=%q", c.status, a.status, a.body, a.header.Get("Idemproxy-Attempts"), b.header.Get("Idempotent-Replayed"))
		}
	}
	if l := sb.Ledger(); l.Executions != 2 || l.Replays != 0 {
		t.Errorf("ledger: %d executions, %d provider replays; want 2 and none", l.Executions, l.Replays)
	}
}

func TestFingerprintWindowExecutesAgainAfterIt(t *testing.T) {
	sb, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderCards})
	p := launch(t, launchSpec{env: presetEnv(t, "cards", url,
		"IDEMPROXY_ROUTES=POST /cards=fingerprint:10m; POST /cards/*/topup=fingerprint:1s")})
	base := "http://" + p.proxy
	card := field(t, send(t, "POST", base+"/cards", `{"tariff_id":"t","holder_external_id":"c","amount":"5"}`).body, "card_id")
	first := send(t, "POST", base+"/cards/"+card+"/topup", `{"amount":"1"}`)
	answered := time.Now()
	// The window is counted from the first request, which arrived before its
	// answer: once a window has passed since the answer, it is over.
	time.Sleep(time.Until(answered.Add(time.Second + 10*time.Millisecond)))
	second := send(t, "POST", base+"/cards/"+card+"/topup", `{"amount":"1"}`)
	if first.status != http.StatusOK || second.status != http.StatusOK || second.header.Get("Idempotent-Replayed") != "" ||
		second.header.Get("Idempotency-Key") == first.header.Get("Idempotency-Key") {
		t.Fatalf("after the window: %d key %q replayed=%q, want a new operation (first key %q)", second.status,
			second.header.Get("Idempotency-Key"), second.header.Get("Idempotent-Replayed"), first.header.Get("Idempotency-Key"))
	}
	if field(t, second.body, "id") == field(t, first.body, "id") {
		t.Errorf("the provider returned the first top-up again: %s", second.body)
	}
	topups := 0
	for _, e := range sb.Ledger().Entries {
		if e.Kind == "card.topup" {
			topups++
		}
	}
	if topups != 2 {
		t.Errorf("%d top-ups executed, want 2", topups)
	}
}

// errorCodeOf is error.code of a JSON error body.
func errorCodeOf(t *testing.T, body string) string {
	t.Helper()
	var v struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return v.Error.Code
}

// refusing answers 409 nonce_reused, as the payments provider does to an
// attempt whose nonce it has seen, to the next n requests, then passes
// requests to next.
type refusing struct {
	next  http.Handler
	mu    sync.Mutex
	n     int
	seen  []string // X-Nonce of every request
	count int
}

func (h *refusing) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.seen = append(h.seen, r.Header.Get("X-Nonce"))
	refuse := h.n > 0
	if refuse {
		h.n--
	}
	h.mu.Unlock()
	if !refuse {
		h.next.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusConflict)
	io.WriteString(w, `{"error":{"code":"nonce_reused","message":"X-Nonce was already used"}}`)
}

func (h *refusing) refuseNext(n int) {
	h.mu.Lock()
	h.n = n
	h.mu.Unlock()
}

func TestNonceReusedIsResentNeverStored(t *testing.T) {
	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderPayments, Secret: []byte(sandboxSecret)})
	if err != nil {
		t.Fatal(err)
	}
	up := &refusing{next: sb}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	p := launch(t, launchSpec{env: presetEnv(t, "payments", srv.URL, "IDEMPROXY_RETRY_MAX_ATTEMPTS=2",
		"IDEMPROXY_RETRY_BASE_DELAY=1ms", "IDEMPROXY_RETRY_MAX_DELAY=5ms")})
	base := "http://" + p.proxy

	// Refused on every attempt: the app gets 502 and nothing is stored...
	up.refuseNext(2)
	body := `{"order_id":"nr-1","amount":"10"}`
	a := send(t, "POST", base+"/payments", body)
	if a.status != http.StatusBadGateway || errorCodeOf(t, a.body) != "upstream_unavailable" {
		t.Fatalf("refused twice: %d %s, want 502 upstream_unavailable", a.status, a.body)
	}
	// ...and the 502 says so: it said "the outcome may be unknown", which
	// sent operators to the provider about an operation nothing listed.
	if !strings.Contains(a.body, "the operation was not executed") || strings.Contains(a.body, "may be unknown") {
		t.Errorf("refused twice: %s, want it to say the operation was not executed", a.body)
	}
	if l := send(t, "GET", "http://"+p.admin+"/admin/v1/records?state=unknown", ""); l.status != 200 || strings.Contains(l.body, `"key"`) {
		t.Errorf("refused twice: unknown records %d %s, want none", l.status, l.body)
	}
	// ...so its retry reaches the provider and the payment is made.
	b := send(t, "POST", base+"/payments", body)
	if b.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "" || b.header.Get("Idempotency-Key") != a.header.Get("Idempotency-Key") {
		t.Fatalf("retry: %d %s replayed=%q, want the payment made under the same key", b.status, b.body, b.header.Get("Idempotent-Replayed"))
	}
	// Refused once: resent at once with a new signature and nonce.
	up.refuseNext(1)
	c := send(t, "POST", base+"/payments", `{"order_id":"nr-2","amount":"10"}`)
	if c.status != http.StatusCreated || c.header.Get("Idemproxy-Attempts") != "2" {
		t.Errorf("refused once: %d attempts=%q %s, want 201 after 2 attempts", c.status, c.header.Get("Idemproxy-Attempts"), c.body)
	}
	up.mu.Lock()
	nonces := map[string]bool{}
	for _, n := range up.seen {
		nonces[n] = true
	}
	sent := len(up.seen)
	up.mu.Unlock()
	if sent != 5 || len(nonces) != sent || nonces[""] {
		t.Errorf("%d attempts with %d distinct nonces, want 5 attempts each with its own nonce", sent, len(nonces))
	}
	if l := sb.Ledger(); l.Executions != 2 {
		t.Errorf("ledger: %d executions, want 2", l.Executions)
	}
}

// gateway504 passes requests to the payments sandbox, but answers the first
// POST it forwards with the 504 a gateway gives after the provider executed,
// naming the payment it made, as the payments provider does.
type gateway504 struct {
	next http.Handler
	mu   sync.Mutex
	done bool
	gets int
}

func (g *gateway504) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	first := r.Method == http.MethodPost && !g.done
	g.done = g.done || first
	if r.Method == http.MethodGet {
		g.gets++
	}
	g.mu.Unlock()
	if !first {
		g.next.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	g.next.ServeHTTP(rec, r)
	var p struct{ ID string }
	json.Unmarshal(rec.Body.Bytes(), &p)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusGatewayTimeout)
	fmt.Fprintf(w, `{"error":{"code":"gateway_timeout","message":"look it up"},"payment_id":%q}`, p.ID)
}

// The payments preset looks a payment up after a 504 before sending it again
// ("after 504 first GET /payments/{payment_id}"), with no other setting.
func TestPresetPaymentsLooksUpAfter504(t *testing.T) {
	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderPayments, Secret: []byte(sandboxSecret)})
	if err != nil {
		t.Fatal(err)
	}
	gw := &gateway504{next: sb}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	p := launch(t, launchSpec{env: presetEnv(t, "payments", srv.URL)})
	a := send(t, "POST", "http://"+p.proxy+"/payments", `{"order_id":"pay-504","amount":"12"}`)
	if a.status/100 != 2 || a.header.Get("Idemproxy-Reconciled") != "true" || field(t, a.body, "order_id") != "pay-504" {
		t.Fatalf("after a 504: %d %s reconciled=%q, want the payment found by the lookup", a.status, a.body, a.header.Get("Idemproxy-Reconciled"))
	}
	gw.mu.Lock()
	gets := gw.gets
	gw.mu.Unlock()
	if l := sb.Ledger(); l.Executions != 1 || gets != 1 {
		t.Errorf("%d executions and %d lookups, want one of each", l.Executions, gets)
	}
}

// refunds504 is a payments provider with a refund endpoint: the first refund
// is answered with a gateway's 504 naming the payment, and nothing is done;
// the next one is made. The payment itself exists all along.
type refunds504 struct {
	mu             sync.Mutex
	refunds, gets  int
	refundAttempts int
}

func (h *refunds504) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/payments/pay-r1":
		h.gets++
		fmt.Fprint(w, `{"payment_id":"pay-r1","status":"succeeded","amount":"12"}`)
	case r.Method == http.MethodPost && r.URL.Path == "/payments/pay-r1/refunds":
		h.refundAttempts++
		if h.refundAttempts == 1 {
			w.WriteHeader(http.StatusGatewayTimeout)
			fmt.Fprint(w, `{"error":{"code":"gateway_timeout","message":"look it up"},"payment_id":"pay-r1"}`)
			return
		}
		h.refunds++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"refund_id":"rf-1","payment_id":"pay-r1","status":"succeeded"}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":{"code":"not_found"}}`)
	}
}

// The payments preset's lookup after a 504 (GET /payments/{payment_id}) says
// whether a payment exists; it is sent for the creation of a payment only. A
// refund whose 504 names its payment was "reconciled" by it before: the
// payment's 200 was stored and replayed as the refund's answer, and the
// refund, never made, was never sent again. Now the refund is re-sent with
// its key, and the app gets the refund.
func TestPresetPaymentsLookupIsForPaymentsOnly(t *testing.T) {
	up := &refunds504{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	p := launch(t, launchSpec{env: presetEnv(t, "payments", srv.URL, "IDEMPROXY_RETRY_BASE_DELAY=10ms")})
	a := send(t, "POST", "http://"+p.proxy+"/payments/pay-r1/refunds", `{"order_id":"ref-1","amount":"12"}`)
	if a.status != http.StatusCreated || a.header.Get("Idemproxy-Reconciled") != "" || field(t, a.body, "refund_id") != "rf-1" {
		t.Errorf("refund after a 504: %d %s reconciled=%q, want the refund made (201 rf-1)", a.status, a.body, a.header.Get("Idemproxy-Reconciled"))
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.refunds != 1 || up.gets != 0 {
		t.Errorf("%d refunds made and %d payment lookups, want 1 and 0", up.refunds, up.gets)
	}
}

// The cards provider wants every retry signed anew ("a new signature, new
// time") and refuses a signature it has seen (its replay protection). The
// timestamp is in whole seconds and the cards scheme has no nonce, so a retry
// sent within the second of the attempt before it, as one after a gateway's
// 504 with a short backoff is, must wait for the next second: the issue the
// gateway hid is then found under its key, not refused as a replay.
func TestPresetCardsRetryIsSignedAnew(t *testing.T) {
	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderCards, Secret: []byte(sandboxSecret)})
	if err != nil {
		t.Fatal(err)
	}
	gw := &gateway504{next: sb}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	p := launch(t, launchSpec{env: presetEnv(t, "cards", srv.URL, "IDEMPROXY_RETRY_BASE_DELAY=1ms")})
	issue := `{"tariff_id":"t-1","holder_external_id":"cust-504","amount":"50"}`
	a := send(t, "POST", "http://"+p.proxy+"/cards", issue)
	if a.status != http.StatusOK || field(t, a.body, "kind") != "issue" || a.header.Get("Idemproxy-Attempts") != "2" {
		t.Fatalf("issue after a 504: %d %s attempts=%q, want the issue found by its retry (2 attempts)",
			a.status, a.body, a.header.Get("Idemproxy-Attempts"))
	}
	if l := sb.Ledger(); l.Executions != 1 || l.Replays != 1 {
		t.Errorf("ledger: %d executions, %d replays; want the issue once, then its replay", l.Executions, l.Replays)
	}
}

// A signature made in the same second by another process for the same
// request (an idemproxy that died mid-attempt and was restarted, another
// replica taking the app's retry) is refused by the cards provider as a
// replay, 401 signature_reused; that says only that the attempt was refused
// before anything ran, so idemproxy signs a new attempt, which finds the
// issue under its key, instead of passing the 401 to the app.
func TestPresetCardsSignatureReusedElsewhereIsResent(t *testing.T) {
	sb, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderCards})
	p := launch(t, launchSpec{env: presetEnv(t, "cards", url, "IDEMPROXY_RETRY_BASE_DELAY=1ms")})
	const key = "7f0c2a4e-5b6d-4e8f-9a1b-2c3d4e5f6a7b"
	issue := `{"tariff_id":"t-1","holder_external_id":"cust-elsewhere","amount":"50"}`
	// Just after a second begins, so that both sends below fall in it.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
	ts := fmt.Sprint(time.Now().Unix())
	elsewhere := send(t, "POST", url+"/cards", issue, "Idempotency-Key", key, "X-Timestamp", ts,
		"X-Signature", sandbox.Sign([]byte(sandboxSecret), sandbox.TimestampString(ts, "POST", "/cards", []byte(issue))))
	a := send(t, "POST", "http://"+p.proxy+"/cards", issue, "Idempotency-Key", key)
	if elsewhere.status != http.StatusOK {
		t.Fatalf("the other process's attempt: %d %s", elsewhere.status, elsewhere.body)
	}
	if a.status != http.StatusOK || a.body != elsewhere.body {
		t.Fatalf("the app's retry through idemproxy: %d %s attempts=%q, want the issue %s",
			a.status, a.body, a.header.Get("Idemproxy-Attempts"), elsewhere.body)
	}
	if l := sb.Ledger(); l.Executions != 1 {
		t.Errorf("ledger: %d executions, want 1", l.Executions)
	}
}
