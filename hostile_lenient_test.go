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
// without a key each time. A comment before the object (j7), which those
// parsers skip too, was not looked past until a later fix: its body was not
// taken for JSON at all, with the same result.
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
				`/* v2 */ {"order_id": "j7", "amount": 5}`,  // a comment before the object
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

// surrogateProvider executes each Idempotency-Key once and reads order_id as
// JavaScript's JSON.parse, Python's json and Java's Jackson do: a lone
// surrogate escape is kept as that surrogate, so "s\ud800" and "s\udbff" are
// two orders (Go's encoding/json would read both as "s\ufffd"). It counts
// executions per order by the member's text as sent, which tells those
// apart as such a parser does.
type surrogateProvider struct {
	mu     sync.Mutex
	keys   map[string]bool
	orders map[string]int
}

func (p *surrogateProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var in struct {
		OrderID json.RawMessage `json:"order_id"`
	}
	if err := json.Unmarshal(b, &in); err != nil || len(in.OrderID) == 0 {
		http.Error(w, `{"error":"order_id required"}`, http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if key := r.Header.Get("Idempotency-Key"); key == "" || !p.keys[key] {
		p.keys[key] = true
		p.orders[string(in.OrderID)]++
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%s}`, in.OrderID)
}

// Two orders whose ids differ only in a lone surrogate escape ("s\ud800",
// "s\udbff": an id cut in the middle of an emoji by JavaScript's slice) are
// two orders to a provider in JavaScript, Python or Java, and one to a Go
// provider. Before the fix idemproxy read both as "s\ufffd" and gave them
// one key: the first was executed, the second answered 409
// idempotency_conflict under the first's key, every time, under every
// IDEMPROXY_MISSING_KEY. Now each is 422 idempotency_key_missing with
// nothing sent, as a body in invalid UTF-8 (which encoding/json also reads
// as U+FFFD) already was; an id with a whole surrogate pair is still one
// execution.
func TestHostileLoneSurrogateOrders(t *testing.T) {
	for _, policy := range []string{"reject", "generate", "passthrough"} {
		t.Run(policy, func(t *testing.T) {
			prov := &surrogateProvider{keys: map[string]bool{}, orders: map[string]int{}}
			up := httptest.NewServer(prov)
			defer up.Close()
			p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_MISSING_KEY="+policy)...)
			post := func(body string) reply {
				return rawExchange(t, p.addr, fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", len(body), body))
			}
			var keys []string
			for _, body := range []string{
				`{"order_id":"s\ud800","amount":5}`,
				`{"order_id":"s\udbff","amount":5}`,
				`{"order_id":"s\ud83d","amount":7}`,
			} {
				for try := 1; try <= 2; try++ { // the app's blind retry
					got := post(body)
					if k := got.header.Get("Idempotency-Key"); k != "" {
						keys = append(keys, k)
					}
					if got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) {
						t.Errorf("%s, try %d: %d %s (key %q), want 422 idempotency_key_missing", body, try, got.status, got.body, got.header.Get("Idempotency-Key"))
					}
				}
			}
			if len(keys) > 0 {
				t.Errorf("three orders answered under keys %q", keys)
			}
			// A whole pair is one character: the order is executed once.
			for try := 1; try <= 2; try++ {
				if got := post(`{"order_id":"s\ud83d\ude00","amount":5}`); got.status != http.StatusCreated {
					t.Errorf("s😀, try %d: %d %s, want 201", try, got.status, got.body)
				}
			}
			prov.mu.Lock()
			defer prov.mu.Unlock()
			if want := map[string]int{`"s\ud83d\ude00"`: 1}; fmt.Sprint(prov.orders) != fmt.Sprint(want) {
				t.Errorf("the provider executed %v, want %v", prov.orders, want)
			}
		})
	}
}
