package proxy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// TestAnswerTooLargeForARecord: a provider that acts and answers a protected
// request with a body larger than a record can hold gets the app a 502
// upstream_unavailable that, like every other, carries the key and the
// attempts made (body and Idemproxy-Attempts), says what happened (the
// provider answered; its answer could not be kept), and the request log
// counts the attempt. It said "upstream request failed" with no attempt
// count, and the log said 0 attempts, although the provider was reached
// once and may have executed the order.
func TestAnswerTooLargeForARecord(t *testing.T) {
	var hits atomic.Int32
	var limit atomic.Int64 // set once the store is open, before the first request
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_1","status":"succeeded","receipt":%q}`, strings.Repeat("x", int(limit.Load())+1))
	}))
	t.Cleanup(big.Close)
	bigURL, _ := url.Parse(big.URL)
	done := make(chan proxy.Summary, 1)
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.Upstream = bigURL
		o.OnDone = func(s proxy.Summary) { done <- s }
	})
	limit.Store(e.store.MaxBodyBytes())

	a := e.do(t, "POST", "/v1/payments", order)
	var eb struct {
		Error struct {
			Code     string
			Message  string
			Key      string `json:"idempotency_key"`
			Attempts int    `json:"attempts"`
		} `json:"error"`
	}
	if err := json.Unmarshal(a.body, &eb); err != nil {
		t.Fatalf("answer %d %q: %v", a.status, a.body, err)
	}
	key := a.header.Get("Idempotency-Key")
	if a.status != http.StatusBadGateway || eb.Error.Code != "upstream_unavailable" || key == "" || eb.Error.Key != key {
		t.Fatalf("got %d %s (key header %q), want 502 upstream_unavailable with the key", a.status, a.body, key)
	}
	if hits.Load() != 1 {
		t.Fatalf("provider reached %d times, want 1", hits.Load())
	}
	if eb.Error.Attempts != 1 || a.header.Get(proxy.AttemptsHeader) != "1" {
		t.Errorf("answer %s %s=%q, want attempts 1 in the body and the header", a.body, proxy.AttemptsHeader, a.header.Get(proxy.AttemptsHeader))
	}
	if !strings.Contains(eb.Error.Message, "too large") || !strings.Contains(eb.Error.Message, "may have") {
		t.Errorf("message %q: want it to say the answer was too large to keep and the operation may have run", eb.Error.Message)
	}
	if s := <-done; s.Outcome != proxy.OutcomeUnavailable || s.Attempts != 1 {
		t.Errorf("summary: outcome %s attempts %d, want %s and 1", s.Outcome, s.Attempts, proxy.OutcomeUnavailable)
	}
}
