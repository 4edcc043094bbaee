package upstream_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/resign"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/upstream"
)

// arrivals records what reached the provider.
type arrivals struct {
	mu     sync.Mutex
	keys   []string
	nonces []string
}

func (a *arrivals) add(r *http.Request) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys = append(a.keys, r.Header.Get("Idempotency-Key"))
	a.nonces = append(a.nonces, r.Header.Get("X-Nonce"))
	return len(a.keys)
}

func paymentsSign(t *testing.T) resign.Config {
	t.Helper()
	tmpl, err := resign.ParseTemplate(`{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`)
	if err != nil {
		t.Fatal(err)
	}
	return resign.Config{Secret: []byte("upstream-test-secret"), Template: tmpl, NonceHeader: "X-Nonce"}
}

func protected(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "k-1")
	return req
}

// Every attempt of the chain is signed afresh under the same key: a retry
// after a 500 reaches the provider with a new nonce.
func TestChainSignsEveryAttempt(t *testing.T) {
	var got arrivals
	prov := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if got.add(r) == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer prov.Close()
	statuses, _ := retry.ParseStatuses("500")
	rt, err := upstream.New(upstream.Config{Sign: paymentsSign(t), Wire: prov.Client().Transport,
		Policy: retry.Policy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, Statuses: statuses}})
	if err != nil {
		t.Fatal(err)
	}
	resp, rep, err := rt.Do(protected(t, prov.URL+"/payments", `{"order_id":"o-1"}`), retry.Call{Mode: retry.Protected})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Attempts != 2 || rep.Disposition != retry.Final {
		t.Errorf("report %+v, want 2 attempts, final", rep)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201 after one retry", resp.StatusCode)
	}
	if len(got.keys) != 2 || got.keys[0] != "k-1" || got.keys[1] != "k-1" {
		t.Fatalf("keys upstream %q, want k-1 twice", got.keys)
	}
	if got.nonces[0] == "" || got.nonces[0] == got.nonces[1] {
		t.Errorf("nonces %q: want a fresh one per attempt", got.nonces)
	}
}

// The chain refuses an answer over the cap, and has a gate even when none is
// given, so a 429's Retry-After pauses the provider for everyone (the pause
// is last: it would hold any attempt after it).
func TestChainGateAndCap(t *testing.T) {
	prov := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Write(make([]byte, 2048))
			return
		}
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer prov.Close()
	var paused time.Duration
	statuses, _ := retry.ParseStatuses("429")
	rt, err := upstream.New(upstream.Config{Wire: prov.Client().Transport, MaxResponseBytes: 1024,
		Policy:    retry.Policy{MaxAttempts: 1, Statuses: statuses},
		OnAttempt: func(a retry.AttemptInfo) { paused = a.Paused }})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rt.Do(protected(t, prov.URL+"/big", "{}"), retry.Call{Mode: retry.Protected}); !errors.Is(err, retry.ErrResponseTooLarge) {
		t.Errorf("2 KiB answer over a 1 KiB cap: %v, want ErrResponseTooLarge", err)
	}
	var ex *retry.ExhaustedError
	if _, _, err := rt.Do(protected(t, prov.URL+"/limited", "{}"), retry.Call{Mode: retry.Protected}); !errors.As(err, &ex) {
		t.Fatalf("429 with one attempt: %v, want an ExhaustedError", err)
	}
	if paused != 30*time.Second {
		t.Errorf("Retry-After paused the provider for %v, want 30s (no gate?)", paused)
	}
}

func TestNewRefusesBadSigning(t *testing.T) {
	tmpl, err := resign.ParseTemplate(`{nonce}`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = upstream.New(upstream.Config{Sign: resign.Config{Secret: []byte("s"), Template: tmpl}})
	if !errors.Is(err, resign.ErrConfig) {
		t.Fatalf("{nonce} without a nonce header: %v, want resign.ErrConfig", err)
	}
}

// An attempt that never had a connection to the provider was never sent:
// with the provider's only connection busy (MaxConns 1, a statement still
// streaming), an order waits for a connection until its attempt times out.
// That wait is not a timeout after sending: the sequence ends NotSent (the
// key can be released, the app told nothing was sent), not Unknown, and the
// provider never saw the order. Before, *http.Transport's bare "context
// deadline exceeded" read as a send that timed out, and the order was parked
// unknown, answered 504 "the outcome may be unknown".
func TestChainNoConnectionIsNotSent(t *testing.T) {
	var got arrivals
	release := make(chan struct{})
	prov := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		got.add(r)
		if r.Method == http.MethodGet { // a statement that streams until the end of the test
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-release
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer prov.Close()
	defer close(release)
	rt, err := upstream.New(upstream.Config{MaxConns: 1,
		Policy: retry.Policy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond,
			AttemptTimeout: 300 * time.Millisecond, Budget: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	get, err := http.NewRequestWithContext(t.Context(), "GET", prov.URL+"/statement", nil)
	if err != nil {
		t.Fatal(err)
	}
	stmt, _, err := rt.Do(get, retry.Call{Mode: retry.Safe})
	if err != nil {
		t.Fatalf("statement: %v", err)
	}
	defer stmt.Body.Close() // holds the one connection until then

	_, rep, err := rt.Do(protected(t, prov.URL+"/payments", `{"order_id":"o-1"}`), retry.Call{Mode: retry.Protected})
	var ex *retry.ExhaustedError
	if !errors.As(err, &ex) {
		t.Fatalf("no connection to be had: %v, want an ExhaustedError", err)
	}
	if !ex.NotSent || ex.Unknown || !ex.FirstSentAt.IsZero() || rep.Disposition != retry.NotSent {
		t.Errorf("no connection to be had: NotSent %v, Unknown %v, FirstSentAt %v, disposition %v (%v); want not sent, not unknown",
			ex.NotSent, ex.Unknown, ex.FirstSentAt, rep.Disposition, err)
	}
	if ex.Attempts != 2 {
		t.Errorf("attempts %d, want 2 (waiting for a connection is retried)", ex.Attempts)
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	if len(got.keys) != 1 || got.keys[0] != "" {
		t.Errorf("the provider saw keys %q, want only the statement's (none)", got.keys)
	}
}
