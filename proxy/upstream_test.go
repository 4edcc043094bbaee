package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/resign"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/sandbox"
	"github.com/idemproxy/idemproxy/upstream"
)

// chain starts idemproxy with the attempt chain main builds (upstream.New) in
// front of provider, and returns the proxy's URL.
func chain(t *testing.T, provider http.Handler, sign resign.Config, pol retry.Policy) string {
	t.Helper()
	up := httptest.NewServer(provider)
	t.Cleanup(up.Close)
	st, err := cache.Open(cache.Options{Dir: t.TempDir(), SyncWrites: true, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	attempts, err := upstream.New(upstream.Config{Sign: sign, Policy: pol, MaxResponseBytes: st.MaxBodyBytes(), Wire: up.Client().Transport})
	if err != nil {
		t.Fatal(err)
	}
	sources, _ := idemkey.ParseSources("json:order_id")
	u, _ := url.Parse(up.URL)
	h, err := proxy.New(proxy.Options{Upstream: u, Store: st, KeySources: sources,
		Transport: attempts})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func fastPolicy(attempts int) retry.Policy {
	return retry.Policy{MaxAttempts: attempts, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond,
		AttemptTimeout: 5 * time.Second, Statuses: map[int]bool{429: true, 500: true, 502: true, 503: true, 504: true},
		Codes: retry.ParseCodes("idempotency.in_progress,payout.funds_maturing,payout.frozen")}
}

func post(t *testing.T, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var secret = []byte("test-secret-not-for-production")

// The payments provider checks HMAC over method, path, timestamp, nonce, key and body
// hash, a 300 s window and single-use nonces; the proxy must satisfy it for legacy
// requests that carry no key and a stale signature of their own.
func TestPaymentsProviderAcceptsEveryAttempt(t *testing.T) {
	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderPayments, Secret: secret, Seed: 1,
		Faults: sandbox.Faults{DropBeforeProcessing: 0.15, DropAfterProcessing: 0.15, Status5xx: 0.15}})
	if err != nil {
		t.Fatal(err)
	}
	tpl, _ := resign.ParseTemplate(sandbox.PaymentsCanonical)
	url := chain(t, sb, resign.Config{Secret: secret, Template: tpl, NonceHeader: "X-Nonce"}, fastPolicy(12))
	const orders = 40
	for i := range orders {
		body := fmt.Sprintf(`{"order_id":"ord-%d","amount":"%d.00","currency":"USD"}`, i, i+1)
		resp, got := post(t, url+"/payments", body, "X-Signature", "stale", "X-Nonce", "reused", "X-Timestamp", "1")
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("order %d: %d %s", i, resp.StatusCode, got)
		}
		again, replay := post(t, url+"/payments", body)
		if again.Header.Get("Idempotent-Replayed") != "true" || replay != got {
			t.Fatalf("order %d: repeat not a byte-identical replay", i)
		}
	}
	led := sb.Ledger()
	if led.Executions != orders || len(led.DuplicateOrders) != 0 {
		t.Fatalf("ledger: %d executions, duplicates %v; want %d and none", led.Executions, led.DuplicateOrders, orders)
	}
	for k, n := range led.ByKey {
		if n != 1 {
			t.Errorf("key %s executed %d times", k, n)
		}
	}
	faults := 0
	for _, n := range led.Faults {
		faults += n
	}
	if faults == 0 {
		t.Error("no faults were injected: the test proved nothing")
	}
}

// Retriable 409 business codes (the payouts provider) are retried with the same key until
// the operation succeeds; the attempt count reaches the client.
func TestPayoutsMaturingIsRetriedWithSameKey(t *testing.T) {
	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderPayouts, Secret: secret, PublicID: "pub-1",
		MaturingAttempts: 2, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	static := http.Header{"X-Public-Id": {"pub-1"}}
	url := chain(t, sb, resign.Config{Secret: secret, StaticHeaders: static}, fastPolicy(5))
	resp, body := post(t, url+"/v1/payout", `{"order_id":"payout-1","amount":"25","currency":"USDT"}`)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		t.Fatalf("payout: %d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get(proxy.AttemptsHeader); got != "3" {
		t.Errorf("attempts = %q, want 3 (two funds_maturing, one success)", got)
	}
	led := sb.Ledger()
	if led.Executions != 1 || len(led.ByKey) != 1 || led.ByKey[resp.Header.Get("Idempotency-Key")] != 1 {
		t.Errorf("ledger %+v: want one execution under the echoed key", led)
	}
}

// A final refusal is stored: payout.insufficient_funds is not retried.
func TestPayoutsFinalRefusalIsNotRetried(t *testing.T) {
	sb, _ := sandbox.New(sandbox.Config{Provider: sandbox.ProviderPayouts, Balance: 10, Seed: 3})
	url := chain(t, sb, resign.Config{}, fastPolicy(5))
	body := `{"order_id":"payout-big","amount":"1000","currency":"USDT"}`
	resp, got := post(t, url+"/v1/payout", body)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(got, "insufficient_funds") || resp.Header.Get(proxy.AttemptsHeader) != "1" {
		t.Fatalf("got %d %s attempts=%s, want one 409 insufficient_funds", resp.StatusCode, got, resp.Header.Get(proxy.AttemptsHeader))
	}
	again, _ := post(t, url+"/v1/payout", body)
	if again.Header.Get("Idempotent-Replayed") != "true" {
		t.Error("final refusal was not replayed from the store")
	}
}
