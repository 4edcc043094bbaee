package sandbox

import (
	"bytes"
	"net/http"
	"testing"
	"time"
)

// Written from the payments provider's documented behaviour; every request is
// signed as that provider describes, with a new nonce per attempt.

func startPayments(t *testing.T) (*Server, func(method, path, key, body string) result) {
	t.Helper()
	s, ts := start(t, Config{Provider: ProviderPayments, Secret: testSecret})
	return s, func(method, path, key, body string) result {
		t.Helper()
		return send(t, ts, method, path, body, paymentsAuth(method, path, key, body, t0))
	}
}

// TestPaymentsKeyRequired: the header is required on every POST.
func TestPaymentsKeyRequired(t *testing.T) {
	s, do := startPayments(t)
	r := do("POST", "/payments", "", `{"order_id":"o-1","amount":"10"}`)
	if r.status != http.StatusUnprocessableEntity || r.code() != "idempotency_key_required" {
		t.Fatalf("POST without key = %d %s, want 422", r.status, r.body)
	}
	if l := s.Ledger(); l.Executions != 0 {
		t.Fatalf("executions = %d, want 0", l.Executions)
	}
}

// TestPaymentsReplayAndConflict: same key and body → stored response with
// Idempotent-Replayed: true; same key, other body → 409 idempotency_conflict.
func TestPaymentsReplayAndConflict(t *testing.T) {
	s, do := startPayments(t)
	body := `{"order_id":"o-1","amount":"10","currency":"EUR"}`
	first := do("POST", "/payments", "k-1", body)
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" || first.field("status") != "succeeded" {
		t.Fatalf("first = %d %v %s, want 201 succeeded without replay marker", first.status, first.header, first.body)
	}
	tests := []struct {
		name, body string
		status     int
		code       string
		replayed   bool
	}{
		{"same body", body, 201, "", true},
		{"same JSON, other layout", `{"currency":"EUR", "amount":"10", "order_id":"o-1"}`, 201, "", true},
		{"other body", `{"order_id":"o-1","amount":"11","currency":"EUR"}`, 409, "idempotency_conflict", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do("POST", "/payments", "k-1", tt.body)
			if r.status != tt.status || r.code() != tt.code || (r.header.Get("Idempotent-Replayed") == "true") != tt.replayed {
				t.Fatalf("= %d %v %s, want %d %q replayed=%v", r.status, r.header, r.body, tt.status, tt.code, tt.replayed)
			}
			if tt.replayed && !bytes.Equal(r.body, first.body) {
				t.Fatalf("replayed body %s, want the stored %s", r.body, first.body)
			}
		})
	}
	if l := s.Ledger(); l.Executions != 1 || l.Replays != 2 || l.ByOrder["o-1"] != 1 {
		t.Fatalf("ledger = %+v, want 1 execution and 2 replays", l)
	}
}

// TestPaymentsAuthentication: 300 s window, HMAC over the canonical string,
// single-use nonce (an old HTTP request resent whole gets 409
// nonce_reused").
func TestPaymentsAuthentication(t *testing.T) {
	s, ts := start(t, Config{Provider: ProviderPayments, Secret: testSecret})
	body := `{"order_id":"o-1","amount":"10"}`
	sign := func(at time.Time) http.Header { return paymentsAuth("POST", "/payments", "k-1", body, at) }
	resent := sign(t0)
	send(t, ts, "POST", "/payments", body, resent)
	wrongKey := sign(t0)
	wrongKey.Set("Idempotency-Key", "k-other") // the key is signed
	noNonce := sign(t0)
	noNonce.Del("X-Nonce")
	tests := []struct {
		name   string
		header http.Header
		status int
		code   string
	}{
		{"old request resent whole", resent, 409, "nonce_reused"},
		{"timestamp 301 s old", sign(t0.Add(-301 * time.Second)), 401, "timestamp_out_of_window"},
		{"timestamp 301 s ahead", sign(t0.Add(301 * time.Second)), 401, "timestamp_out_of_window"},
		{"key not the signed one", wrongKey, 401, "invalid_signature"},
		{"no nonce", noNonce, 401, "invalid_signature"},
		{"no headers", keyed("k-1"), 401, "timestamp_out_of_window"},
		{"retry signed anew", sign(t0.Add(299 * time.Second)), 201, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := send(t, ts, "POST", "/payments", body, tt.header)
			if r.status != tt.status || r.code() != tt.code {
				t.Fatalf("= %d %s, want %d %q", r.status, r.body, tt.status, tt.code)
			}
		})
	}
	if l := s.Ledger(); l.Executions != 1 || l.Replays != 1 {
		t.Fatalf("ledger = %+v, want 1 execution and 1 replay", l)
	}
}

// TestPaymentsGet: after a 504, first GET /payments/{payment_id}.
func TestPaymentsGet(t *testing.T) {
	_, do := startPayments(t)
	created := do("POST", "/payments", "k-1", `{"order_id":"o-1","amount":"10"}`)
	id := created.field("id")
	tests := []struct {
		name, path string
		status     int
		code       string
	}{
		{"known", "/payments/" + id, 200, ""},
		{"unknown", "/payments/nope", 404, "payment_not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do("GET", tt.path, "", "")
			if r.status != tt.status || r.code() != tt.code {
				t.Fatalf("= %d %s, want %d %q", r.status, r.body, tt.status, tt.code)
			}
			if tt.status == 200 && !bytes.Equal(r.body, created.body) {
				t.Fatalf("GET = %s, want %s", r.body, created.body)
			}
		})
	}
}

func TestPaymentsValidation(t *testing.T) {
	_, do := startPayments(t)
	for _, body := range []string{`{"amount":"10"}`, `{"order_id":"o-1"}`, `{"order_id":"o-1","amount":"ten"}`, `not json`} {
		t.Run(body, func(t *testing.T) {
			if r := do("POST", "/payments", "k-"+body, body); r.status != http.StatusBadRequest || r.code() != "validation_error" {
				t.Fatalf("= %d %s, want 400 validation_error", r.status, r.body)
			}
		})
	}
}

// TestPaymentsNewKeyIsSecondCharge: a new key for the same operation is a
// second charge; the ledger must show it.
func TestPaymentsNewKeyIsSecondCharge(t *testing.T) {
	s, do := startPayments(t)
	do("POST", "/payments", "k-1", `{"order_id":"o-1","amount":"10"}`)
	do("POST", "/payments", "k-2", `{"order_id":"o-1","amount":"10"}`)
	if l := s.Ledger(); l.ByOrder["o-1"] != 2 || len(l.DuplicateOrders) != 1 {
		t.Fatalf("ledger = %+v, want o-1 executed twice and listed as duplicate", l)
	}
}

// TestPaymentsKeyRetention: keys are kept at least 48 hours; after the
// configured retention the same key and body execute again, which is the
// second charge a blind resend risks.
func TestPaymentsKeyRetention(t *testing.T) {
	clk := newClock()
	s, ts := start(t, Config{Provider: ProviderPayments, KeyRetention: 48 * time.Hour, Now: clk.Now})
	body := `{"order_id":"o-1","amount":"10"}`
	post := func() result { return send(t, ts, "POST", "/payments", body, http.Header{"Idempotency-Key": {"k-1"}}) }
	first := post()
	clk.Advance(48*time.Hour - time.Second)
	if r := post(); r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, first.body) {
		t.Fatalf("repeat within retention = %d %s, want the stored payment replayed", r.status, r.body)
	}
	clk.Advance(time.Second)
	if r := post(); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" || r.field("id") == first.field("id") {
		t.Fatalf("repeat after retention = %d %s, want a new payment", r.status, r.body)
	}
	if l := s.Ledger(); l.Executions != 2 || l.ByOrder["o-1"] != 2 {
		t.Fatalf("ledger = %+v, want order o-1 executed twice", l)
	}
}

// TestPaymentsGatewayTimeoutNamesPayment: the 504 after processing carries
// the payment_id, and GET /payments/{payment_id} finds the payment.
func TestPaymentsGatewayTimeoutNamesPayment(t *testing.T) {
	s, ts := start(t, Config{Provider: ProviderPayments, Faults: Faults{GatewayTimeoutAfterProcessing: 1}})
	r := send(t, ts, "POST", "/payments", `{"order_id":"o-1","amount":"10"}`, http.Header{"Idempotency-Key": {"k-1"}})
	if r.status != http.StatusGatewayTimeout || r.code() != "gateway_timeout" || r.field("payment_id") == "" {
		t.Fatalf("POST = %d %s, want 504 gateway_timeout with payment_id", r.status, r.body)
	}
	l := s.Ledger()
	if l.Executions != 1 || l.Faults[FaultTimeout504] != 1 {
		t.Fatalf("ledger = %+v, want 1 execution and 1 gateway timeout", l)
	}
	if got := l.Entries[0].Body; !bytes.Contains(got, []byte(r.field("payment_id"))) {
		t.Fatalf("payment_id %s is not the executed payment %s", r.field("payment_id"), got)
	}
}
