package proxy_test

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// TestAnswerInACodingGoDoesNotDecode: Go's transport asks for gzip and
// decodes an answer only when it says "gzip". A gateway that answers
// "x-gzip" (the same coding, RFC 9110 §8.4.1.3) or "deflate" left the
// answer compressed: the payouts provider's retriable 409
// payout.funds_maturing could not be read, so it was stored as the payout's
// final answer (never sent again: the payout never made) and replayed, still
// compressed, to an app that never asked for a coding. Now such an answer is
// decoded before it is judged and stored: the 409 is retried with the same
// key, the payout is made once, and the app and its repeat get the plain
// JSON without Content-Encoding.
func TestAnswerInACodingGoDoesNotDecode(t *testing.T) {
	for _, coding := range []string{"x-gzip", "deflate", "X-GZip, identity"} {
		t.Run(coding, func(t *testing.T) {
			var mu sync.Mutex
			seen := map[string]int{}
			execs := 0
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				mu.Lock()
				seen[r.Header.Get("Idempotency-Key")]++
				first := seen[r.Header.Get("Idempotency-Key")] == 1
				if !first {
					execs++
				}
				mu.Unlock()
				status, body := http.StatusCreated, `{"id":"po_1","status":"succeeded"}`
				if first {
					status, body = http.StatusConflict, `{"error":{"code":"payout.funds_maturing","message":"funds are maturing"}}`
				}
				var buf bytes.Buffer
				var zw io.WriteCloser
				if strings.Contains(strings.ToLower(coding), "gzip") {
					zw = gzip.NewWriter(&buf)
				} else {
					zw = zlib.NewWriter(&buf)
				}
				io.WriteString(zw, body)
				zw.Close()
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Encoding", coding)
				w.WriteHeader(status)
				w.Write(buf.Bytes())
			}))
			t.Cleanup(up.Close)
			upURL, _ := url.Parse(up.URL)
			e := newEnv(t, func(o *proxy.Options, p *retry.Policy) {
				o.Upstream = upURL
				p.MaxAttempts = 3
				p.Codes = map[string]bool{"payout.funds_maturing": true}
			})
			order := `{"order_id":"coded-1","amount":"10.00"}`
			for i, what := range []string{"answer", "repeat"} {
				resp, err := http.Post(e.srv.URL+"/v1/payouts", "application/json", strings.NewReader(order))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated || string(b) != `{"id":"po_1","status":"succeeded"}` || resp.Header.Get("Content-Encoding") != "" {
					t.Errorf("%s: %d %q Content-Encoding %q; want the payout's 201 as plain JSON", what, resp.StatusCode, b, resp.Header.Get("Content-Encoding"))
				}
				if i == 1 && resp.Header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("repeat not replayed")
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if execs != 1 {
				t.Errorf("provider executed the payout %d times, want 1 (attempts per key %v)", execs, seen)
			}
		})
	}
}
