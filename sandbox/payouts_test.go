package sandbox

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// Written from the payouts provider's documented behaviour; requests are
// signed as its example client does: X-Public-Id, X-Timestamp, hex HMAC of "ts\nPOST\npath\nbody".

// payoutBody is the provider's example payout for an order.
func payoutBody(order, amount string) string {
	return `{"amount":"` + amount + `","currency":"USDT","network":"tron","address":"TXY...","order_id":"` + order + `"}`
}

func startPayouts(t *testing.T, cfg Config) (*Server, *httptest.Server, func(path, key, body string) result) {
	t.Helper()
	cfg.Provider, cfg.Secret, cfg.PublicID = ProviderPayouts, testSecret, "pub-1"
	s, ts := start(t, cfg)
	return s, ts, func(path, key, body string) result {
		t.Helper()
		h := timestampAuth("POST", path, body, t0)
		if key != "" {
			h.Set("Idempotency-Key", key) // not part of the signature
		}
		return send(t, ts, "POST", path, body, h)
	}
}

// TestPayoutsDedup: order_id deduplicates (a repeat returns the existing
// object); a known key answers with Idempotent-Replayed: true.
func TestPayoutsDedup(t *testing.T) {
	s, _, do := startPayouts(t, Config{})
	first := do("/v1/payout", "", payoutBody("payout-1", "25"))
	if first.status != http.StatusOK || first.field("order_id") != "payout-1" || first.field("id") == "" {
		t.Fatalf("first payout = %d %s", first.status, first.body)
	}
	keyedFirst := do("/v1/payout", "k-2", payoutBody("payout-2", "25"))
	tests := []struct {
		name, key, body string
		want            []byte
		replayed        bool
	}{
		{"same order, no key", "", payoutBody("payout-1", "25"), first.body, false},
		{"same order, new key", "k-new", payoutBody("payout-1", "25"), first.body, false},
		{"that key again", "k-new", payoutBody("payout-1", "25"), first.body, true},
		{"same key and order", "k-2", payoutBody("payout-2", "25"), keyedFirst.body, true},
		{"same key, other body", "k-2", payoutBody("payout-3", "30"), keyedFirst.body, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do("/v1/payout", tt.key, tt.body)
			if r.status != http.StatusOK || !bytes.Equal(r.body, tt.want) || (r.header.Get("Idempotent-Replayed") == "true") != tt.replayed {
				t.Fatalf("= %d %v %s, want %s replayed=%v", r.status, r.header, r.body, tt.want, tt.replayed)
			}
		})
	}
	if l := s.Ledger(); l.Executions != 2 || l.Replays != 5 || l.ByOrder["payout-1"] != 1 || l.ByOrder["payout-3"] != 0 {
		t.Fatalf("ledger = %+v, want payout-1 and payout-2 once each", l)
	}
}

func TestPayoutsValidation(t *testing.T) {
	s, _, do := startPayouts(t, Config{})
	tests := []struct {
		name, body string
		code       string
	}{
		// order_id is required for payouts.
		{"no order_id", `{"amount":"25","currency":"USDT"}`, "request.order_id_required"},
		{"no amount", `{"order_id":"payout-1"}`, "request.invalid_amount"},
		{"not json", `amount=25`, "request.invalid_json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r := do("/v1/payout", "", tt.body); r.status != http.StatusBadRequest || r.code() != tt.code {
				t.Fatalf("= %d %s, want 400 %s", r.status, r.body, tt.code)
			}
		})
	}
	if l := s.Ledger(); l.Executions != 0 {
		t.Fatalf("executions = %d, want 0", l.Executions)
	}
}

// TestPayoutsInfo: 404 payout.not_found means it was never created; a payout
// object means it exists.
func TestPayoutsInfo(t *testing.T) {
	_, _, do := startPayouts(t, Config{})
	created := do("/v1/payout", "", payoutBody("payout-1", "25"))
	tests := []struct {
		name, body string
		status     int
		code       string
	}{
		{"created", `{"order_id":"payout-1"}`, 200, ""},
		{"never created", `{"order_id":"payout-9"}`, 404, "payout.not_found"},
		{"no order_id", `{}`, 400, "request.order_id_required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do("/v1/payout/info", "", tt.body)
			if r.status != tt.status || r.code() != tt.code {
				t.Fatalf("= %d %s, want %d %q", r.status, r.body, tt.status, tt.code)
			}
			if tt.status == 200 && !bytes.Equal(r.body, created.body) {
				t.Fatalf("info = %s, want %s", r.body, created.body)
			}
		})
	}
}

func TestPayoutsAuthentication(t *testing.T) {
	s, ts, _ := startPayouts(t, Config{})
	body := payoutBody("payout-1", "25")
	sign := func(at time.Time) http.Header { return timestampAuth("POST", "/v1/payout", body, at) }
	otherID := sign(t0)
	otherID.Set("X-Public-Id", "pub-2")
	forged := sign(t0)
	forged.Set("X-Signature", hmacHex([]byte("not the secret"), "x"))
	withKey := sign(t0)
	withKey.Set("Idempotency-Key", "k-1")
	tests := []struct {
		name   string
		header http.Header
		status int
		code   string
	}{
		{"unknown public id", otherID, 401, "auth.invalid_public_id"},
		{"stale timestamp", sign(t0.Add(-6 * time.Minute)), 401, "auth.timestamp_expired"},
		{"wrong signature", forged, 401, "auth.invalid_signature"},
		{"key added to a signed request", withKey, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := send(t, ts, "POST", "/v1/payout", body, tt.header)
			if r.status != tt.status || r.code() != tt.code {
				t.Fatalf("= %d %s, want %d %q", r.status, r.body, tt.status, tt.code)
			}
		})
	}
	if l := s.Ledger(); l.Executions != 1 {
		t.Fatalf("executions = %d, want 1", l.Executions)
	}
}

// TestPayoutsOwnRateLimit: the 429 comes in its own shape,
// {"state":1,"message":"rate limit exceeded"} without error.code, with
// Retry-After.
func TestPayoutsOwnRateLimit(t *testing.T) {
	clk := newClock()
	s, _, do := startPayouts(t, Config{Now: clk.Now, RateLimit: 1, RetryAfter: 7})
	steps := []struct {
		name    string
		advance time.Duration
		status  int
	}{
		{"first", 0, 200},
		{"second in the same instant", 0, 429},
		{"a second later", time.Second, 200},
	}
	for i, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clk.Advance(st.advance)
			r := do("/v1/payout/info", "", `{"order_id":"payout-`+strconv.Itoa(i)+`"}`)
			if st.status == 429 {
				if r.status != 429 || r.header.Get("Retry-After") != "7" || string(r.body) != `{"state":1,"message":"rate limit exceeded"}` {
					t.Fatalf("= %d %v %s, want the provider's 429", r.status, r.header, r.body)
				}
				return
			}
			if r.status == 429 {
				t.Fatalf("= 429, want to pass the limiter")
			}
		})
	}
	if l := s.Ledger(); l.Throttled != 1 {
		t.Fatalf("throttled = %d, want 1", l.Throttled)
	}
}

// TestPayoutsMaturing: payout.funds_maturing and payout.frozen are retried later:
// the first attempts are refused, a later one succeeds, once.
func TestPayoutsMaturing(t *testing.T) {
	s, _, do := startPayouts(t, Config{MaturingAttempts: 2})
	var codes []string
	for range 2 {
		r := do("/v1/payout", "k-1", payoutBody("payout-1", "25"))
		if r.status != http.StatusConflict {
			t.Fatalf("early attempt = %d %s, want 409", r.status, r.body)
		}
		codes = append(codes, r.code())
	}
	if codes[0] != codes[1] || (codes[0] != "payout.funds_maturing" && codes[0] != "payout.frozen") {
		t.Fatalf("codes = %v, want one of the retriable hold codes, twice", codes)
	}
	if r := do("/v1/payout", "k-1", payoutBody("payout-1", "25")); r.status != http.StatusOK {
		t.Fatalf("third attempt = %d %s, want 200", r.status, r.body)
	}
	if other := do("/v1/payout", "", payoutBody("payout-2", "25")); other.status != http.StatusConflict {
		t.Fatalf("another order's first attempt = %d, want 409 (every order matures)", other.status)
	}
	if l := s.Ledger(); l.Executions != 1 {
		t.Fatalf("executions = %d, want 1", l.Executions)
	}
}

// TestPayoutsInsufficientFunds: payout.insufficient_funds is not retried (final).
func TestPayoutsInsufficientFunds(t *testing.T) {
	s, _, do := startPayouts(t, Config{Balance: 100})
	tests := []struct {
		name, amount string
		status       int
		code         string
	}{
		{"above balance", "100.01", 409, "payout.insufficient_funds"},
		{"at balance", "100", 200, ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do("/v1/payout", "", payoutBody("payout-"+strconv.Itoa(i), tt.amount))
			if r.status != tt.status || r.code() != tt.code {
				t.Fatalf("= %d %s, want %d %q", r.status, r.body, tt.status, tt.code)
			}
		})
	}
	if l := s.Ledger(); l.Executions != 1 {
		t.Fatalf("executions = %d, want 1", l.Executions)
	}
}

// TestPayoutsInProgress holds an execution in ExecuteHook: 409
// idempotency.in_progress means a request with this key is executing right
// now; wait and repeat to get the first attempt's result.
func TestPayoutsInProgress(t *testing.T) {
	entered, release := make(chan Operation, 1), make(chan struct{})
	s, ts, do := startPayouts(t, Config{ExecuteHook: func(op Operation) {
		select {
		case entered <- op:
		default:
		}
		<-release
	}})
	firstDone := make(chan result, 1)
	go func() {
		body := payoutBody("payout-1", "25")
		h := timestampAuth("POST", "/v1/payout", body, t0)
		h.Set("Idempotency-Key", "k-1")
		r, _ := trySend(context.Background(), ts, "POST", "/v1/payout", body, h)
		firstDone <- r
	}()
	if op := <-entered; op.OrderID != "payout-1" || op.IdempotencyKey != "k-1" || op.Kind != "payout.create" {
		t.Fatalf("hook got %+v", op)
	}
	tests := []struct {
		name, key, body string
	}{
		{"same key and order", "k-1", payoutBody("payout-1", "25")},
		{"same order, no key", "", payoutBody("payout-1", "25")},
		{"same key, other order", "k-1", payoutBody("payout-2", "25")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r := do("/v1/payout", tt.key, tt.body); r.status != http.StatusConflict || r.code() != "idempotency.in_progress" {
				t.Fatalf("= %d %s, want 409 idempotency.in_progress", r.status, r.body)
			}
		})
	}
	if r := do("/v1/payout/info", "", `{"order_id":"payout-1"}`); r.status != http.StatusNotFound {
		t.Errorf("info while executing = %d, want 404", r.status)
	}
	close(release)
	first := <-firstDone
	again := do("/v1/payout", "k-1", payoutBody("payout-1", "25"))
	if first.status != http.StatusOK || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first = %d %s, retry = %s, want the same payout replayed", first.status, first.body, again.body)
	}
	if l := s.Ledger(); l.Executions != 1 {
		t.Fatalf("executions = %d, want 1", l.Executions)
	}
}

// TestPaymentsOfThePayoutsAPI: /v1/payment/info for payments, for payouts
// /v1/payout/info". Payments are deduplicated like payouts, in their own book.
func TestPaymentsOfThePayoutsAPI(t *testing.T) {
	s, _, do := startPayouts(t, Config{MaturingAttempts: 5, Balance: 1})
	info := `{"order_id":"inv-1"}`
	if r := do("/v1/payment/info", "", info); r.status != http.StatusNotFound || r.code() != "payment.not_found" {
		t.Fatalf("info before = %d %s, want 404 payment.not_found", r.status, r.body)
	}
	body := `{"amount":"70","currency":"USDT","order_id":"inv-1"}`
	created := do("/v1/payment", "k-inv", body) // payout-only refusals do not apply
	if created.status != http.StatusOK || created.field("order_id") != "inv-1" {
		t.Fatalf("payment = %d %s", created.status, created.body)
	}
	if r := do("/v1/payment", "k-inv", body); !bytes.Equal(r.body, created.body) || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("repeat = %s replayed=%q", r.body, r.header.Get("Idempotent-Replayed"))
	}
	if r := do("/v1/payment/info", "", info); r.status != http.StatusOK || !bytes.Equal(r.body, created.body) {
		t.Errorf("info after = %d %s, want the payment", r.status, r.body)
	}
	if r := do("/v1/payout/info", "", info); r.status != http.StatusNotFound || r.code() != "payout.not_found" {
		t.Errorf("payout info of a payment's order = %d %s, want 404 payout.not_found", r.status, r.body)
	}
	if l := s.Ledger(); l.Executions != 1 || l.Entries[0].Kind != "payment.create" {
		t.Errorf("ledger = %+v, want one payment.create", l.Entries)
	}
}
