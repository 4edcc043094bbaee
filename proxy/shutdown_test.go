package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/ratelimit"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream"
)

// shutdownEnv is an env whose provider answers every attempt with status and
// Retry-After: 60, so that a sequence waits a minute for its next attempt,
// and whose Gate the test closes as the shutdown does. Each attempt's report
// arrives on the returned channel; sent counts what reached the provider.
func shutdownEnv(t *testing.T, status int) (e *env, gate *ratelimit.Gate, attempts <-chan retry.AttemptInfo, sent func() int) {
	t.Helper()
	var (
		mu sync.Mutex
		n  int
	)
	prov := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(status)
	}))
	t.Cleanup(prov.Close)
	gate = ratelimit.New(0, 1)
	infos := make(chan retry.AttemptInfo, 16)
	e = newEnvUpstream(t, func(c *upstream.Config) {
		c.Gate = gate
		c.OnAttempt = func(i retry.AttemptInfo) { infos <- i }
	}, func(o *proxy.Options, p *retry.Policy) {
		o.Upstream, _ = url.Parse(prov.URL)
		p.MaxAttempts, p.MaxDelay = 3, time.Hour // the Retry-After is waited out whole
	})
	return e, gate, infos, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// shutdownAnswer is what the client was told: its error body's fields.
type shutdownAnswer struct {
	answer
	code, message, key string
	attempts           int
}

func readShutdownAnswer(t *testing.T, a answer) shutdownAnswer {
	t.Helper()
	var v struct {
		Error struct {
			Code     string `json:"code"`
			Message  string `json:"message"`
			Key      string `json:"idempotency_key"`
			Attempts int    `json:"attempts"`
		} `json:"error"`
	}
	if err := json.Unmarshal(a.body, &v); err != nil {
		t.Fatalf("error body %q: %v", a.body, err)
	}
	return shutdownAnswer{a, v.Error.Code, v.Error.Message, v.Error.Key, v.Error.Attempts}
}

// sendThenShutDown sends order, waits for its first attempt's report (a wait
// for the next attempt follows), closes the Gate and returns the answer.
func sendThenShutDown(t *testing.T, e *env, gate *ratelimit.Gate, attempts <-chan retry.AttemptInfo, order string) shutdownAnswer {
	t.Helper()
	res := e.goSend("POST", "/v1/payments", order)
	if i := <-attempts; i.Attempt != 1 || i.Last || i.Wait <= 0 {
		t.Fatalf("first attempt report %+v, want one followed by a wait", i)
	}
	gate.Close()
	got := <-res
	if got.err != nil {
		t.Fatal(got.err)
	}
	return readShutdownAnswer(t, got.answer)
}

// A request that was sent and is waiting out a Retry-After when the
// shutdown begins gets what a spent retry budget gets, 502
// upstream_unavailable with its key and attempts, not a 503 (which the
// contract keeps for requests never sent, and for the store and overload).
// After a 429 the key is released and the message does not say the outcome
// may be unknown, nor that nothing was sent.
func TestShutdownAfterA429IsA502WithTheKeyReleased(t *testing.T) {
	e, gate, attempts, sent := shutdownEnv(t, http.StatusTooManyRequests)
	a := sendThenShutDown(t, e, gate, attempts, order)
	if a.status != http.StatusBadGateway || a.code != proxy.CodeUpstreamUnavailable || a.key == "" || a.attempts != 1 {
		t.Fatalf("got %d %s, want 502 upstream_unavailable with the key and 1 attempt", a.status, a.body)
	}
	if !strings.Contains(a.message, "shutting down") || strings.Contains(a.message, "unknown") || strings.Contains(a.message, "nothing was sent") {
		t.Errorf("message %q: want it to say idemproxy is shutting down, and neither that the outcome may be unknown nor that nothing was sent", a.message)
	}
	if _, err := e.store.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: a.key}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("record after a 429 cut off by shutdown: err %v, want none kept (key released)", err)
	}
	if n := sent(); n != 1 {
		t.Errorf("provider saw %d attempts, want 1", n)
	}
}

// After an answer that leaves the outcome unknown (500), the shutdown's
// answer is 502 saying the outcome may be unknown, and the record is kept
// unknown. The app's next request, which resumes it, is not sent either (the
// Gate is closed), and is told the outcome may be unknown, not that nothing
// was sent: its own sequence sent nothing, an earlier one did. A request
// never sent at all keeps the shutdown's 503 with its key.
func TestShutdownAfterAnUnknownOutcome(t *testing.T) {
	e, gate, attempts, sent := shutdownEnv(t, http.StatusInternalServerError)
	a := sendThenShutDown(t, e, gate, attempts, order)
	if a.status != http.StatusBadGateway || a.code != proxy.CodeUpstreamUnavailable || a.key == "" || a.attempts != 1 {
		t.Fatalf("got %d %s, want 502 upstream_unavailable with the key and 1 attempt", a.status, a.body)
	}
	if !strings.Contains(a.message, "shutting down") || !strings.Contains(a.message, "outcome may be unknown") {
		t.Errorf("message %q: want it to say idemproxy is shutting down and the outcome may be unknown", a.message)
	}
	rec, err := e.store.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: a.key})
	if err != nil || rec.State != store.Unknown {
		t.Fatalf("record: %+v %v, want it kept unknown", rec, err)
	}

	again := readShutdownAnswer(t, e.do(t, "POST", "/v1/payments", order))
	if again.status != http.StatusBadGateway || again.code != proxy.CodeUpstreamUnavailable || again.key != a.key {
		t.Fatalf("resumed at shutdown: got %d %s, want 502 upstream_unavailable with key %s", again.status, again.body, a.key)
	}
	if !strings.Contains(again.message, "shutting down") || !strings.Contains(again.message, "outcome may be unknown") || strings.Contains(again.message, "nothing was sent") {
		t.Errorf("resumed at shutdown: message %q, want shutting down and outcome may be unknown, not nothing was sent", again.message)
	}
	if rec, err := e.store.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: a.key}); err != nil || rec.State != store.Unknown {
		t.Errorf("record after the resume: %+v %v, want it still unknown", rec, err)
	}

	fresh := readShutdownAnswer(t, e.do(t, "POST", "/v1/payments", `{"order_id":"ord-never-sent"}`))
	if fresh.status != http.StatusServiceUnavailable || fresh.code != proxy.CodeUpstreamUnavailable || fresh.key == "" ||
		fresh.header.Get("Retry-After") == "" || !strings.Contains(fresh.message, "nothing was sent") {
		t.Errorf("never sent at shutdown: got %d %s (Retry-After %q), want 503 with its key, Retry-After and nothing was sent",
			fresh.status, fresh.body, fresh.header.Get("Retry-After"))
	}
	if n := sent(); n != 1 {
		t.Errorf("provider saw %d attempts, want 1: nothing leaves a closed Gate", n)
	}
}
