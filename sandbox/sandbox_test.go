package sandbox

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/fakeclock"
)

// t0 is the providers' example created_at; every test clock starts there.
var t0 = time.Date(2026, 10, 7, 9, 13, 2, 0, time.UTC)

var testSecret = []byte("sandbox-test-secret")

// newClock returns a clock tests move by hand, starting at t0.
func newClock() *fakeclock.Clock { return fakeclock.New(t0) }

// start serves cfg with httptest; Now defaults to t0.
func start(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return t0 }
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

// result is a response read whole.
type result struct {
	status int
	header http.Header
	body   []byte
}

// code is error.code of the providers' error body.
func (r result) code() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code
}

// field is a top-level string field of a JSON body.
func (r result) field(name string) string {
	var m map[string]any
	_ = json.Unmarshal(r.body, &m)
	s, _ := m[name].(string)
	return s
}

// trySend makes one request on a fresh connection. Keep-alives are off
// because Go's Transport silently resends a request that carries
// Idempotency-Key when a reused connection drops, which would hide or double
// the faults a test counts.
func trySend(ctx context.Context, ts *httptest.Server, method, path, body string, header http.Header) (result, error) {
	req, err := http.NewRequestWithContext(ctx, method, ts.URL+path, strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	for name, values := range header {
		req.Header[name] = values
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return result{}, err
	}
	return result{status: resp.StatusCode, header: resp.Header, body: buf.Bytes()}, nil
}

// send is trySend that fails the test on a transport error.
func send(t *testing.T, ts *httptest.Server, method, path, body string, header http.Header) result {
	t.Helper()
	r, err := trySend(context.Background(), ts, method, path, body, header)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// keyed is a header set with just an Idempotency-Key ("" = none).
func keyed(key string) http.Header {
	h := http.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return h
}

// hmacHex is hex HMAC-SHA256, written here from the providers' schemes rather than
// borrowed from the package.
func hmacHex(secret []byte, msg string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

var nonceSeq atomic.Int64

// paymentsAuth signs a payments request as the payments provider describes:
// canonical(method, path, ts, nonce, idem_key, sha256(body)), new nonce.
func paymentsAuth(method, path, key, body string, at time.Time) http.Header {
	ts := strconv.FormatInt(at.Unix(), 10)
	nonce := fmt.Sprintf("nonce-%d", nonceSeq.Add(1))
	sum := sha256.Sum256([]byte(body))
	canonical := method + "\n" + path + "\n" + ts + "\n" + nonce + "\n" + key + "\n" + hex.EncodeToString(sum[:])
	h := keyed(key)
	h.Set("X-Timestamp", ts)
	h.Set("X-Nonce", nonce)
	h.Set("X-Signature", hmacHex(testSecret, canonical))
	return h
}

// timestampAuth signs as the payouts provider's example client: f"{ts}\nPOST\n{path}\n{body}".
func timestampAuth(method, path, body string, at time.Time) http.Header {
	ts := strconv.FormatInt(at.Unix(), 10)
	h := http.Header{}
	h.Set("X-Public-Id", "pub-1")
	h.Set("X-Timestamp", ts)
	h.Set("X-Signature", hmacHex(testSecret, ts+"\n"+method+"\n"+path+"\n"+body))
	return h
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no provider", Config{}},
		{"unknown provider", Config{Provider: "loans"}},
		{"probability above 1", Config{Provider: ProviderPayouts, Faults: Faults{Status5xx: 1.5}}},
		{"negative probability", Config{Provider: ProviderCards, Faults: Faults{DropAfterProcessing: -0.1}}},
		{"maturing share above 1", Config{Provider: ProviderPayouts, MaturingShare: 2}},
		{"negative slow delay", Config{Provider: ProviderPayments, SlowDelay: -time.Second}},
		{"negative rate limit", Config{Provider: ProviderPayments, RateLimit: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil {
				t.Fatalf("New(%+v) = nil error, want one", tt.cfg)
			}
		})
	}
}

// TestCanonicalTemplates checks the contract with idemproxy: expanding the
// IDEMPROXY_SIGN_CANONICAL templates the sandbox prints gives exactly the
// string the sandbox verifies.
func TestCanonicalTemplates(t *testing.T) {
	body := []byte(`{"order_id":"o-1","amount":"25"}`)
	sum := sha256.Sum256(body)
	expand := strings.NewReplacer(`\n`, "\n", "{method}", "POST", "{path}", "/payments", "{timestamp}", "1791364382",
		"{nonce}", "n-1", "{idempotency_key}", "k-1", "{body_sha256}", hex.EncodeToString(sum[:]), "{body}", string(body))
	tests := []struct {
		name, template, want string
	}{
		{"payments", PaymentsCanonical, PaymentsString("POST", "/payments", "1791364382", "n-1", "k-1", body)},
		{"payouts and cards", TimestampCanonical, TimestampString("1791364382", "POST", "/payments", body)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := expand.Replace(tt.template); got != tt.want {
				t.Fatalf("template expands to %q, sandbox verifies %q", got, tt.want)
			}
		})
	}
}

func TestProxyEnv(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		want    []string
		notWant []string
	}{
		{"payments signed", Config{Provider: ProviderPayments, Secret: []byte("hush")},
			[]string{"IDEMPROXY_PRESET=payments", `IDEMPROXY_SIGN_SECRET="$SANDBOX_SECRET"`}, []string{"hush", "CANONICAL"}},
		{"payouts signed", Config{Provider: ProviderPayouts, Secret: []byte("hush"), PublicID: "pub-1", RateLimit: 5},
			[]string{"IDEMPROXY_PRESET=payouts", "IDEMPROXY_STATIC_HEADERS='X-Public-Id=pub-1'", "IDEMPROXY_RATE_LIMIT=5"},
			[]string{"hush", "NONCE"}},
		{"cards unsigned", Config{Provider: ProviderCards},
			[]string{"IDEMPROXY_PRESET=cards", "IDEMPROXY_UPSTREAM_URL='http://127.0.0.1:8081'"}, []string{"SIGN"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := strings.Join(ProxyEnv(tt.cfg, "http://127.0.0.1:8081"), "\n")
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("ProxyEnv lacks %q:\n%s", w, got)
				}
			}
			for _, nw := range tt.notWant {
				if strings.Contains(got, nw) {
					t.Errorf("ProxyEnv contains %q:\n%s", nw, got)
				}
			}
		})
	}
}

// TestLedgerEndpoint checks GET /_sandbox/ledger against Server.Ledger: it
// counts executions, not replays, and ?full=1 adds the response bodies.
func TestLedgerEndpoint(t *testing.T) {
	s, ts := start(t, Config{Provider: ProviderPayments})
	first := send(t, ts, "POST", "/payments", `{"order_id":"o-1","amount":"10"}`, keyed("k-1"))
	send(t, ts, "POST", "/payments", `{"order_id":"o-1","amount":"10"}`, keyed("k-1")) // replay
	send(t, ts, "POST", "/payments", `{"order_id":"o-1","amount":"10"}`, keyed("k-2")) // a second charge
	send(t, ts, "POST", "/payments", `{"order_id":"o-2","amount":"10"}`, keyed("k-3"))

	var brief, full LedgerSnapshot
	for _, c := range []struct {
		path string
		into *LedgerSnapshot
	}{{"/_sandbox/ledger", &brief}, {"/_sandbox/ledger?full=1", &full}} {
		r := send(t, ts, "GET", c.path, "", nil)
		if err := json.Unmarshal(r.body, c.into); r.status != http.StatusOK || err != nil {
			t.Fatalf("GET %s = %d %s (%v)", c.path, r.status, r.body, err)
		}
	}
	if brief.Executions != 3 || brief.Replays != 1 || brief.ByOrder["o-1"] != 2 || brief.ByKey["k-1"] != 1 {
		t.Errorf("ledger = %+v, want 3 executions, 1 replay, o-1 twice, k-1 once", brief)
	}
	if len(brief.DuplicateOrders) != 1 || brief.DuplicateOrders[0] != "o-1" {
		t.Errorf("duplicate_orders = %v, want [o-1]", brief.DuplicateOrders)
	}
	if len(brief.Faults) != len(faultKinds) || brief.Entries != nil {
		t.Errorf("brief ledger: faults %v (want every kind), entries %d (want none)", brief.Faults, len(brief.Entries))
	}
	var firstBody bytes.Buffer
	if len(full.Entries) != 3 || json.Compact(&firstBody, full.Entries[0].Body) != nil ||
		!bytes.Equal(firstBody.Bytes(), first.body) || full.Entries[0].Kind != "payment.create" {
		t.Errorf("full ledger has %d entries, the first %q, want 3 and the first response %s", len(full.Entries), firstBody.String(), first.body)
	}
	if inproc := s.Ledger(); inproc.Executions != 3 || len(inproc.Entries) != 3 || !inproc.Entries[2].At.Equal(t0) {
		t.Errorf("Server.Ledger() = %+v, want the same 3 entries at t0", inproc)
	}
}
