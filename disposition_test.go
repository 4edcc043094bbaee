package main

// End-to-end tests of what is final, through the real binary: one owner
// decides, so an answer the attempt loop gives up on can never be stored.

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// A 429 is never final, even with 429 left out of IDEMPROXY_RETRY_STATUSES.
// Before, that 429 was stored and replayed to the app's clean retry for the
// whole TTL.
func TestBinary429NeverStored(t *testing.T) {
	var limited atomic.Bool
	limited.Store(true)
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		if limited.Load() {
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"state":1,"message":"rate limit exceeded"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"po_1"}`)
	}))
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_RETRY_STATUSES=500,502,503,504", "IDEMPROXY_RETRY_MAX_ATTEMPTS=2",
		"IDEMPROXY_RETRY_BASE_DELAY=1ms", "IDEMPROXY_RETRY_MAX_DELAY=2ms")
	url := "http://" + p.addr + "/v1/payout"
	first := send(t, http.MethodPost, url, `{"order_id":"rl-1"}`)
	if first.status != http.StatusBadGateway || !strings.Contains(first.body, "upstream_unavailable") {
		t.Fatalf("while limited: %d %s, want 502 upstream_unavailable", first.status, first.body)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("provider saw %d attempts, want 2 (the 429 retried)", n)
	}
	limited.Store(false)
	second := send(t, http.MethodPost, url, `{"order_id":"rl-1"}`)
	if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after the limit: %d replayed=%q %s, want a fresh 201", second.status, second.header.Get("Idempotent-Replayed"), second.body)
	}
	if second.header.Get("Idempotency-Key") != first.header.Get("Idempotency-Key") {
		t.Error("the retry did not resume with the same key")
	}
}

// An answer that is final but cannot be held in a record (its headers push it
// over) is passed on unstored every time, not refused with 503 on every retry.
func TestBinaryOversizedAnswerHeadersPassedOn(t *testing.T) {
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		for i := range 4 {
			w.Header().Set("X-Big-"+string(rune('a'+i)), strings.Repeat("h", 60<<10))
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("b", 900<<10))
	}))
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir())
	for i := range 3 {
		got := send(t, http.MethodPost, "http://"+p.addr+"/v1/payout", `{"order_id":"hdr-1"}`)
		if got.status != http.StatusCreated || len(got.body) != 900<<10 || got.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("try %d: %d, %d bytes, replayed=%q; want the provider's 201 passed on", i, got.status, len(got.body), got.header.Get("Idempotent-Replayed"))
		}
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("provider saw %d requests, want 3 (nothing stored)", n)
	}
}

// Configuration is checked whole before anything is opened: a signing
// template that cannot be satisfied, or a status that can never be retried,
// exits 2 naming the variable, and the data directory is never created.
// Before, the template panicked after the store was open.
func TestBinaryRefusesConfigBeforeOpening(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want string
	}{
		{"nonce in template without a nonce header", []string{"IDEMPROXY_SIGN_SECRET=s", "IDEMPROXY_SIGN_CANONICAL={timestamp}{nonce}"}, "IDEMPROXY_SIGN_CANONICAL"},
		{"nonce header named like the signature", []string{"IDEMPROXY_SIGN_SECRET=s", "IDEMPROXY_NONCE_HEADER=X-Signature"}, "IDEMPROXY_NONCE_HEADER"},
		{"signature header is the key", []string{"IDEMPROXY_SIGNATURE_HEADER=Idempotency-Key"}, "IDEMPROXY_SIGNATURE_HEADER"},
		{"static header is the timestamp", []string{"IDEMPROXY_STATIC_HEADERS=X-Timestamp=1"}, "IDEMPROXY_STATIC_HEADERS"},
		{"retry a success", []string{"IDEMPROXY_RETRY_STATUSES=200,503"}, "IDEMPROXY_RETRY_STATUSES"},
		{"retry a redirect", []string{"IDEMPROXY_RETRY_STATUSES=302"}, "IDEMPROXY_RETRY_STATUSES"},
		{"retry 401", []string{"IDEMPROXY_RETRY_STATUSES=401"}, "IDEMPROXY_RETRY_STATUSES"},
		{"retry 403", []string{"IDEMPROXY_RETRY_STATUSES=500,403"}, "IDEMPROXY_RETRY_STATUSES"},
		{"client tokens without a key secret", []string{"IDEMPROXY_CLIENT_TOKENS=a=0123456789abcdef"}, "IDEMPROXY_KEY_SECRET"},
		{"short key secret", []string{"IDEMPROXY_CLIENT_TOKENS=a=0123456789abcdef", "IDEMPROXY_KEY_SECRET=short"}, "IDEMPROXY_KEY_SECRET"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			out := startStops(t, 2, append([]string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + dir}, c.env...)...)
			if !strings.Contains(out, c.want) || strings.Contains(out, "panic") {
				t.Errorf("output does not name %s, or panicked:\n%s", c.want, out)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("data directory was created or opened (stat: %v)", err)
			}
		})
	}
}

// A 415 or a 431 says the provider refused the request for its headers
// (Content-Type, Content-Encoding, or headers too large) before reading
// it. Headers are not part of the fingerprint, so, stored, such an answer
// was replayed to the app's corrected retry of the same order for the
// whole TTL: an order sent once without its Content-Type could never be
// placed. Now it is passed on and the key left free, and the corrected
// retry is executed, once.
func TestBinaryHeaderRefusalsNotStored(t *testing.T) {
	var calls, execs atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if len(r.Header.Get("Cookie")) > 8<<10 {
			w.WriteHeader(http.StatusRequestHeaderFieldsTooLarge)
			io.WriteString(w, `{"error":{"code":"headers_too_large"}}`)
			return
		}
		if r.Header.Get("Content-Type") != "application/json" {
			w.WriteHeader(http.StatusUnsupportedMediaType)
			io.WriteString(w, `{"error":{"code":"unsupported_media_type"}}`)
			return
		}
		execs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"po_1"}`)
	}))
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir())
	for _, c := range []struct {
		order, refusing string
		status          int
	}{
		{"hr-1", "Content-Type: text/plain\n", http.StatusUnsupportedMediaType},
		{"hr-2", "Content-Type: application/json\nCookie: " + strings.Repeat("c", 9<<10) + "\n", http.StatusRequestHeaderFieldsTooLarge},
	} {
		body := `{"order_id":"` + c.order + `","amount":"1.00"}`
		req := func(headers string) string {
			return "POST /v1/payout HTTP/1.1\nHost: x\n" + headers + "Content-Length: " + strconv.Itoa(len(body)) + "\n\n" + body
		}
		if got := rawExchange(t, p.addr, req(c.refusing)); got.status != c.status {
			t.Fatalf("%s as sent first: %d %s, want the provider's %d", c.order, got.status, got.body, c.status)
		}
		for try := range 2 {
			got := rawExchange(t, p.addr, req("Content-Type: application/json\n"))
			if got.status != http.StatusCreated || (try == 1) != (got.header.Get("Idempotent-Replayed") == "true") {
				t.Errorf("%s corrected, try %d: %d replayed=%q %s, want 201, executed the first time and replayed the second",
					c.order, try+1, got.status, got.header.Get("Idempotent-Replayed"), got.body)
			}
		}
	}
	if n, e := calls.Load(), execs.Load(); n != 4 || e != 2 {
		t.Errorf("provider saw %d requests and executed %d, want 4 and 2 (each order once)", n, e)
	}
}
