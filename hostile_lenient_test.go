package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// lenientOrderProvider executes each Idempotency-Key once and reads order_id
// from a JSON body as a lenient parser does (Json.NET's
// JsonConvert.DeserializeObject, Gson's fromJson): single-quoted strings,
// unquoted member names and comments are read. It turns the bodies of the
// test into strict JSON that way, then decodes them, counting executions
// per order (a request without a key executes each time).
type lenientOrderProvider struct {
	mu     sync.Mutex
	keys   map[string]bool
	orders map[string]int
}

var (
	lenientComment  = regexp.MustCompile(`/\*.*?\*/`)
	lenientBareName = regexp.MustCompile(`([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:`)
	lenientZeros    = regexp.MustCompile(`:\s*0+([0-9])`)
)

func (p *lenientOrderProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s := lenientComment.ReplaceAllString(string(b), "")
	s = strings.ReplaceAll(s, "'", `"`)
	s = lenientBareName.ReplaceAllString(s, `$1"$2":`)
	s = lenientZeros.ReplaceAllString(s, ":$1")
	var in struct {
		OrderID string `json:"order_id"`
	}
	if err := json.Unmarshal([]byte(s), &in); err != nil || in.OrderID == "" {
		http.Error(w, `{"error":"order_id required"}`, http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if key := r.Header.Get("Idempotency-Key"); key == "" || !p.keys[key] { // no key: executed every time
		p.keys[key] = true
		p.orders[in.OrderID]++
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%q}`, in.OrderID)
}

// A body that starts as a JSON object, names order_id, and is not valid
// JSON before it (Python's str(dict) sent for json.dumps, a JavaScript
// object literal, a comment, a leading zero) is read as order j1..j4 by a
// lenient parser (Json.NET, Gson), and one with invalid UTF-8 in the id by
// encoding/json too (U+FFFD in its place), so it is 422 with nothing sent under
// every IDEMPROXY_MISSING_KEY, as a body invalid after the member already
// was. Before the fix idemproxy's Unreadable stopped at the first error, so
// under generate each blind retry got a new random key and the provider
// executed the order once per try (2 for 2); under passthrough it went
// without a key each time.
func TestHostileLenientJSONOrder(t *testing.T) {
	for _, policy := range []string{"generate", "passthrough"} {
		t.Run(policy, func(t *testing.T) {
			prov := &lenientOrderProvider{keys: map[string]bool{}, orders: map[string]int{}}
			up := httptest.NewServer(prov)
			defer up.Close()
			p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_MISSING_KEY="+policy)...)
			post := func(body string) reply {
				return rawExchange(t, p.addr, fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", len(body), body))
			}
			for _, body := range []string{
				`{'order_id': 'j1', 'amount': 5}`,
				`{order_id: "j2", amount: 5}`,
				`{"amount": 5, /* retry */ "order_id": "j3"}`,
				`{"amount": 05, "order_id": "j4"}`,
				"{\"order_id\": \"j6\xff\", \"amount\": 5}", // encoding/json reads "j6\uFFFD"
			} {
				for try := 1; try <= 2; try++ { // the app's blind retry
					if got := post(body); got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) {
						t.Errorf("%s, try %d: %d %s, want 422 idempotency_key_missing", body, try, got.status, got.body)
					}
				}
			}
			// Valid JSON naming the order is one execution.
			for try := 1; try <= 2; try++ {
				if got := post(`{"amount": 5, "order_id": "j5"}`); got.status != http.StatusCreated {
					t.Errorf("j5, try %d: %d %s, want 201", try, got.status, got.body)
				}
			}
			prov.mu.Lock()
			defer prov.mu.Unlock()
			if len(prov.orders) != 1 || prov.orders["j5"] != 1 {
				t.Errorf("provider executed orders %v, want j5 once and nothing else", prov.orders)
			}
		})
	}
}
