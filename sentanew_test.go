package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// TestProbeNotFoundRestartsKeyRetention: a payment whose first send got a
// 504 from the provider's gateway, never having reached the provider, is
// kept unknown. The app retries past IDEMPROXY_PROVIDER_KEY_RETENTION: the
// probe says 404 (it did not happen), the payment is sent again with the
// same key, and that send's answer is lost too. The provider can have kept
// the key only from that send, so the retention counts from it: the record's
// first_sent_at is the re-send's, and the app's next retry, with the probe
// failing (500), is re-sent with the same key and executed once. Before, the
// record kept the first send that never reached the provider: the retry was
// refused 409 idempotency_key_expired seconds after the provider got the key,
// and the order waited for a person. (A 404 followed by a 503 released the
// key, a fresh first send; a 404 followed by a 504 did not.)
func TestProbeNotFoundRestartsKeyRetention(t *testing.T) {
	const retention = 2 * time.Second
	for _, c := range retentionCases(retention) {
		t.Run(c.name, func(t *testing.T) {
			gw := newGatewayProvider(t, sandbox.Config{KeyRetention: retention})
			var probeFails atomic.Bool
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && probeFails.Load() {
					http.Error(w, `{"error":"internal"}`, http.StatusInternalServerError)
					return
				}
				gw.ServeHTTP(w, r)
			}))
			defer up.Close()
			a, b := c.launch(t, up.URL)

			gw.set(1, false, "pay_never_made") // the gateway's 504; the provider never saw it
			first := send(t, "POST", "http://"+a.proxy+"/payments", paymentBody)
			sent := time.Now()
			if first.status != http.StatusGatewayTimeout && first.status != http.StatusBadGateway {
				t.Fatalf("first POST = %d %s, want 502/504", first.status, first.body)
			}
			key := first.header.Get("Idempotency-Key")

			// Past the retention: the probe says 404, the re-send's answer is lost.
			time.Sleep(time.Until(sent.Add(retention + 200*time.Millisecond)))
			gw.set(1, false, "pay_never_made")
			resent := time.Now()
			if second := send(t, "POST", "http://"+b.proxy+"/payments", paymentBody); second.status != http.StatusGatewayTimeout &&
				second.status != http.StatusBadGateway {
				t.Fatalf("retry past the retention = %d %s, want 502/504 (probe 404, re-sent, answer lost)", second.status, second.body)
			}
			r := send(t, "GET", "http://"+a.admin+"/admin/v1/records/"+key, "")
			var rec struct {
				State       string    `json:"state"`
				FirstSentAt time.Time `json:"first_sent_at"`
			}
			if err := json.Unmarshal([]byte(r.body), &rec); err != nil || rec.State != "unknown" ||
				rec.FirstSentAt.Before(resent.Add(-time.Second)) {
				t.Errorf("record after the re-send = %d %s; want unknown, first sent at the re-send (%s), not at the first send (%s)",
					r.status, r.body, resent.UTC().Format(time.RFC3339Nano), sent.UTC().Format(time.RFC3339Nano))
			}

			// Within the retention of the re-send, the probe failing: re-sent.
			probeFails.Store(true)
			third := send(t, "POST", "http://"+a.proxy+"/payments", paymentBody)
			posts, _ := gw.postCounts()
			if k, n := onlyKey(t, posts); third.status != http.StatusCreated || k != key || n != 3 || gw.sb.Ledger().Executions != 1 {
				t.Fatalf("retry %v after the re-send = %d %s; provider saw %v, executed %d; want 201, 3 POSTs with key %s, 1 execution",
					time.Since(resent).Round(time.Millisecond), third.status, third.body, posts, gw.sb.Ledger().Executions, key)
			}
		})
	}
}

// TestProbeNotFoundDropsTheAnswerItReadFrom: the first send's 504 names a
// payment the provider never made; the app's retry probes by that id, is
// told 404, and re-sends with the same key: the provider executes it, and
// the connection drops before the answer. The id that filled the probe
// names nothing the provider has, so the record no longer keeps it: the
// app's next retry, past the provider's key retention, has no answer to
// fill the probe from and is refused 409 idempotency_key_expired, nothing
// sent. Before, the record kept the stale 504: that probe was told 404
// again, however long after, and the payment was re-sent past the
// retention to a provider that had forgotten the key: executed twice.
func TestProbeNotFoundDropsTheAnswerItReadFrom(t *testing.T) {
	const retention = 2 * time.Second
	for _, c := range retentionCases(retention) {
		t.Run(c.name, func(t *testing.T) {
			gw := newGatewayProvider(t, sandbox.Config{KeyRetention: retention})
			var dropNext atomic.Bool // the next POST is executed, its answer dropped
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || !dropNext.CompareAndSwap(true, false) {
					gw.ServeHTTP(w, r)
					return
				}
				gw.ServeHTTP(httptest.NewRecorder(), r)
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
			}))
			defer up.Close()
			a, b := c.launch(t, up.URL)

			gw.set(1, false, "pay_never_made") // the gateway's 504 names a payment never made
			first := send(t, "POST", "http://"+a.proxy+"/payments", paymentBody)
			if first.status != http.StatusGatewayTimeout && first.status != http.StatusBadGateway {
				t.Fatalf("first POST = %d %s, want 502/504", first.status, first.body)
			}
			key := first.header.Get("Idempotency-Key")

			dropNext.Store(true) // probe 404, re-sent, executed, answer lost
			second := send(t, "POST", "http://"+b.proxy+"/payments", paymentBody)
			resent := time.Now()
			if second.status != http.StatusGatewayTimeout && second.status != http.StatusBadGateway || gw.sb.Ledger().Executions != 1 {
				t.Fatalf("retry = %d %s with %d executions, want 502/504 after the re-send executed once",
					second.status, second.body, gw.sb.Ledger().Executions)
			}

			// Past the retention of the re-send: the provider forgot the key.
			time.Sleep(time.Until(resent.Add(retention + 200*time.Millisecond)))
			third := send(t, "POST", "http://"+a.proxy+"/payments", paymentBody)
			posts, gets := gw.postCounts()
			if k, n := onlyKey(t, posts); third.status != http.StatusConflict || !strings.Contains(third.body, `"idempotency_key_expired"`) ||
				k != key || n != 2 || gw.sb.Ledger().Executions != 1 {
				t.Fatalf("retry past the retention = %d %s; provider saw %v and %d probes, executed %d; want 409 idempotency_key_expired, 2 POSTs, 1 execution",
					third.status, third.body, posts, gets, gw.sb.Ledger().Executions)
			}
		})
	}
}

// retentionCase runs a key-retention test on one store layout: a and b
// are the replicas the app's tries reach (one process twice on Badger).
type retentionCase struct {
	name   string
	launch func(t *testing.T, upstream string) (a, b *opsProc)
}

// retentionCases are one Badger process and two PostgreSQL replicas, each
// with one attempt per request, the payments probe and the given provider
// key retention.
func retentionCases(retention time.Duration) []retentionCase {
	env := []string{"IDEMPROXY_RETRY_MAX_ATTEMPTS=1", "IDEMPROXY_RETRY_BASE_DELAY=10ms", "IDEMPROXY_RETRY_MAX_DELAY=50ms",
		"IDEMPROXY_RETRY_BUDGET=5s", "IDEMPROXY_ATTEMPT_TIMEOUT=2s", "IDEMPROXY_STATUS_PROBE=GET /payments/{resp.payment_id}",
		"IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES=payment_not_found", // the sandbox's answer for a payment it does not have
		"IDEMPROXY_PROVIDER_KEY_RETENTION=" + retention.String()}
	return []retentionCase{
		{"one replica, Badger", func(t *testing.T, upstream string) (*opsProc, *opsProc) {
			p := launch(t, launchSpec{env: baseEnv(upstream, t.TempDir(), env...)})
			return p, p
		}},
		{"two replicas, PostgreSQL", func(t *testing.T, upstream string) (*opsProc, *opsProc) {
			e := sharedEnv(upstream, pgtest.Database(t), env...)
			return launch(t, launchSpec{env: e}), launch(t, launchSpec{env: e})
		}},
	}
}
