package main

// Outside-in tests of how the binary talks to each provider of the seeds,
// against seedProvider: an httptest provider written from the seed text
// alone (not from the sandbox), which verifies every request as the seed
// says and can be told how to answer the next money-moving requests.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const seedSecret = "seed-secret"

// seenRequest is one request as the seed provider received it.
type seenRequest struct {
	at      time.Time
	method  string
	path    string
	header  http.Header
	body    string
	authErr string // why it was refused before anything else; "" = authentic
}

// scripted is a canned answer to the next money-moving request.
type scripted struct {
	status int
	header map[string]string
	body   string
}

// seedProvider behaves like one provider of the seeds ("payouts",
// "payments" or "cards").
type seedProvider struct {
	scheme   string
	publicID string // payouts: the X-Public-Id it expects

	mu     sync.Mutex
	seen   []seenRequest
	nonces map[string]bool
	sigs   map[string]bool   // cards: signatures accepted (its replay protection)
	byKey  map[string]string // Idempotency-Key → stored body
	sums   map[string]string // Idempotency-Key → body it came with
	byExt  map[string]string // cards: cardholder external_id → body
	execs  int               // operations executed
	script []scripted        // answers to the next money-moving requests
}

func newSeedProvider(t *testing.T, scheme string) (*seedProvider, string) {
	p := &seedProvider{scheme: scheme, publicID: "pub-seed", nonces: map[string]bool{}, sigs: map[string]bool{}, byKey: map[string]string{},
		sums: map[string]string{}, byExt: map[string]string{}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv.URL
}

// env is the whole configuration an operator writes for the preset.
func (p *seedProvider) env(t *testing.T, upstream string, extra ...string) []string {
	vars := []string{"IDEMPROXY_PRESET=" + p.scheme, "IDEMPROXY_SIGN_SECRET=" + seedSecret}
	if p.scheme == "payouts" {
		vars = append(vars, "IDEMPROXY_STATIC_HEADERS=X-Public-Id="+p.publicID)
	}
	return baseEnv(upstream, t.TempDir(), append(vars, extra...)...)
}

func (p *seedProvider) then(answers ...scripted) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.script = append(p.script, answers...)
}

func (p *seedProvider) requests() []seenRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.seen...)
}

func (p *seedProvider) executions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.execs
}

func hmacHex(canonical string) string {
	m := hmac.New(sha256.New, []byte(seedSecret))
	m.Write([]byte(canonical))
	return hex.EncodeToString(m.Sum(nil))
}

// authenticate checks a request as the seed says; it returns the refusal or
// "" and spends the nonce of an authentic request.
func (p *seedProvider) authenticate(r *http.Request, body []byte) (status int, code string) {
	ts := r.Header.Get("X-Timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(sec, 0)).Abs() > 300*time.Second {
		return 401, "timestamp_out_of_window"
	}
	path := r.URL.EscapedPath()
	var canonical string
	switch p.scheme {
	case "payments":
		// method, path, timestamp, nonce, idempotency key, SHA-256 of the body
		sum := sha256.Sum256(body)
		canonical = strings.Join([]string{r.Method, path, ts, r.Header.Get("X-Nonce"),
			r.Header.Get("Idempotency-Key"), hex.EncodeToString(sum[:])}, "\n")
		if r.Header.Get("X-Nonce") == "" {
			return 401, "invalid_signature"
		}
	default:
		// payouts: ts\nMETHOD\npath\nbody, the key NOT signed; cards: "new time"
		canonical = ts + "\n" + r.Method + "\n" + path + "\n" + string(body)
	}
	if len(r.Header.Values("X-Signature")) != 1 || r.Header.Get("X-Signature") != hmacHex(canonical) {
		return 401, "invalid_signature"
	}
	if p.scheme == "payouts" && (len(r.Header.Values("X-Public-Id")) != 1 || r.Header.Get("X-Public-Id") != p.publicID) {
		return 401, "invalid_public_id"
	}
	if p.scheme == "cards" {
		// "a new signature (new time)" on every retry, see its replay protection
		if p.sigs[r.Header.Get("X-Signature")] {
			return 401, "signature_reused"
		}
		p.sigs[r.Header.Get("X-Signature")] = true
	}
	if p.scheme == "payments" {
		n := r.Header.Get("X-Nonce")
		if p.nonces[n] {
			return 409, "nonce_reused"
		}
		p.nonces[n] = true
	}
	return 0, ""
}

func (p *seedProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	defer p.mu.Unlock()
	status, code := p.authenticate(r, body)
	p.seen = append(p.seen, seenRequest{at: time.Now(), method: r.Method, path: r.URL.Path, header: r.Header.Clone(),
		body: string(body), authErr: code})
	w.Header().Set("Content-Type", "application/json")
	if status != 0 {
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"code":%q}}`, code)
		return
	}
	if r.Method != http.MethodPost {
		w.WriteHeader(200)
		fmt.Fprintf(w, `{"path":%q}`, r.URL.Path)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/info") {
		w.WriteHeader(404)
		io.WriteString(w, `{"error":{"code":"payout.not_found"}}`)
		return
	}
	if len(p.script) > 0 {
		s := p.script[0]
		p.script = p.script[1:]
		for k, v := range s.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(s.status)
		io.WriteString(w, s.body)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if p.scheme == "cards" {
		if r.URL.Path == "/cardholders" {
			ext := jsonStr(body, "external_id")
			if prev, ok := p.byExt[ext]; ok {
				w.WriteHeader(200)
				io.WriteString(w, prev)
				return
			}
			p.execs++
			p.byExt[ext] = fmt.Sprintf(`{"id":"ch-%d","external_id":%q}`, p.execs, ext)
			w.WriteHeader(201)
			io.WriteString(w, p.byExt[ext])
			return
		}
		if key == "" {
			w.WriteHeader(422)
			io.WriteString(w, `{"error":{"code":"validation_error","message":"Idempotency-Key is required"}}`)
			return
		}
	}
	if p.scheme == "payments" && key == "" {
		w.WriteHeader(422)
		io.WriteString(w, `{"error":{"code":"idempotency_key_missing"}}`)
		return
	}
	if prev, ok := p.byKey[key]; ok && key != "" {
		if p.scheme == "payments" && p.sums[key] != string(body) {
			w.WriteHeader(409)
			io.WriteString(w, `{"error":{"code":"idempotency_conflict"}}`)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(201)
		io.WriteString(w, prev)
		return
	}
	p.execs++
	out := fmt.Sprintf(`{"id":"op-%d","status":"processing"}`, p.execs)
	if key != "" {
		p.byKey[key], p.sums[key] = out, string(body)
	}
	w.WriteHeader(201)
	io.WriteString(w, out)
}

// jsonStr is a top-level string member of a JSON body, "" if none.
func jsonStr(body []byte, name string) string {
	_, rest, ok := strings.Cut(string(body), `"`+name+`":"`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// moneyPath is a money-moving path of each provider, with a body.
func moneyPath(scheme, order string) (string, string) {
	switch scheme {
	case "payouts":
		return "/v1/payout", `{"amount":"25","currency":"USDT","order_id":"` + order + `"}`
	case "payments":
		return "/payments", `{"order_id":"` + order + `","amount":"10"}`
	default:
		return "/cards", `{"tariff_id":"t1","holder_external_id":"` + order + `","amount":"50"}`
	}
}

// Every attempt reaches each provider freshly signed as its seed says, with
// the credentials the operator set and none the app sent: an app's own stale
// signature, timestamp, nonce and public id are replaced, and the attempts
// after a Retry-After carry a new timestamp (and nonce) that verify.
func TestSeedEveryAttemptSigned(t *testing.T) {
	for _, scheme := range []string{"payouts", "payments", "cards"} {
		t.Run(scheme, func(t *testing.T) {
			prov, url := newSeedProvider(t, scheme)
			p := launch(t, launchSpec{env: prov.env(t, url, "IDEMPROXY_RETRY_BASE_DELAY=10ms")})
			prov.then(scripted{503, map[string]string{"Retry-After": "1"}, `{"error":{"code":"maintenance"}}`},
				scripted{500, nil, `{"error":{"code":"internal"}}`})
			path, body := moneyPath(scheme, "sig-1")
			r := send(t, "POST", "http://"+p.proxy+path, body, "X-Signature", "app-stale", "X-Timestamp", "1",
				"X-Nonce", "app-nonce", "X-Public-Id", "app-public", "Content-Type", "application/json")
			if r.status != 201 {
				t.Fatalf("= %d %s, want 201", r.status, r.body)
			}
			seen := prov.requests()
			if len(seen) != 3 {
				t.Fatalf("%d attempts, want 3", len(seen))
			}
			stamps, nonces := map[string]bool{}, map[string]bool{}
			for i, s := range seen {
				if s.authErr != "" {
					t.Errorf("attempt %d refused: %s (headers %v)", i+1, s.authErr, s.header)
				}
				if s.header.Get("Idempotency-Key") == "" || s.header.Get("Idempotency-Key") != seen[0].header.Get("Idempotency-Key") {
					t.Errorf("attempt %d key %q, want the first attempt's", i+1, s.header.Get("Idempotency-Key"))
				}
				stamps[s.header.Get("X-Timestamp")] = true
				nonces[s.header.Get("X-Nonce")] = true
			}
			if stamps[seen[0].header.Get("X-Timestamp")] && seen[1].header.Get("X-Timestamp") == seen[0].header.Get("X-Timestamp") {
				t.Errorf("the attempt a second after the first has its timestamp %s", seen[0].header.Get("X-Timestamp"))
			}
			if scheme == "payments" && len(nonces) != 3 {
				t.Errorf("nonces %v, want a new one per attempt", nonces)
			}
		})
	}
}

// What each preset retries and what it takes as final, against the seeds:
// payouts retries 429/500/502/503/504 and three 409 codes, nothing else
// ("other 409s: not blindly, check */info"); payments retries 429 and every
// status of 500 or more ("if res.status < 500 and res.status not in (429,):
// break"); cards retries timeouts, any 5xx, 503 maintenance and 429, never a
// 4xx business code, a failed or a needs_review operation. Each answer is
// given to all three attempts the test allows; a retried one ends in 502
// upstream_unavailable after three, a final one reaches the app as it came
// after one.
func TestSeedRetriedPerPreset(t *testing.T) {
	type answer struct {
		status  int
		body    string
		retried bool
	}
	limited := `{"state":1,"message":"rate limit exceeded"}`
	cases := map[string][]answer{
		"payouts": {
			{429, limited, true}, {500, `{}`, true}, {502, `<html>bad gateway</html>`, true}, {503, `{}`, true}, {504, `{}`, true},
			{409, `{"error":{"code":"payout.funds_maturing"}}`, true},
			{409, `{"error":{"code":"idempotency.in_progress"}}`, true},
			{409, `{"error":{"code":"payout.frozen"}}`, true},
			{409, `{"error":{"code":"payout.insufficient_funds"}}`, false},
			{409, `{"error":{"code":"payout.duplicate"}}`, false},
			{400, `{"error":{"code":"validation"}}`, false}, {404, `{"error":{"code":"not_found"}}`, false},
			{501, `{}`, false}, {505, `{}`, false},
		},
		"payments": {
			{429, `{"error":{"code":"rate_limited"}}`, true}, {500, `{}`, true}, {501, `{}`, true}, {502, `{}`, true},
			{503, `{}`, true}, {505, `{}`, true}, {507, `{}`, true}, {520, `{}`, true}, {599, `{}`, true},
			{409, `{"error":{"code":"idempotency_conflict"}}`, false}, {400, `{"error":{"code":"invalid_amount"}}`, false},
			{422, `{"error":{"code":"card_declined"}}`, false},
		},
		"cards": {
			{429, `{"error":{"code":"rate_limited"}}`, true}, {503, `{"error":{"code":"maintenance"}}`, true},
			{500, `{}`, true}, {501, `{}`, true}, {508, `{}`, true}, {524, `{}`, true},
			{422, `{"error":{"code":"balance_exhausted"}}`, false}, {409, `{"error":{"code":"card_not_active"}}`, false},
			{200, `{"id":"op-f","status":"failed"}`, false}, {200, `{"id":"op-r","status":"needs_review"}`, false},
		},
	}
	for scheme, answers := range cases {
		t.Run(scheme, func(t *testing.T) {
			prov, url := newSeedProvider(t, scheme)
			p := launch(t, launchSpec{env: prov.env(t, url, "IDEMPROXY_RETRY_BASE_DELAY=1ms",
				"IDEMPROXY_RETRY_MAX_DELAY=10ms", "IDEMPROXY_RETRY_MAX_ATTEMPTS=3")})
			for i, a := range answers {
				before := len(prov.requests())
				given := scripted{a.status, map[string]string{"Retry-After": "0"}, a.body}
				prov.then(given, given, given)
				path, body := moneyPath(scheme, fmt.Sprintf("st-%d", i))
				r := send(t, "POST", "http://"+p.proxy+path, body)
				attempts := len(prov.requests()) - before
				prov.mu.Lock()
				prov.script = nil
				prov.mu.Unlock()
				switch {
				case a.retried && (attempts != 3 || r.status != http.StatusBadGateway || errorCodeOf(t, r.body) != "upstream_unavailable"):
					t.Errorf("%d %s: %d attempts, app got %d %s; want it retried: 3 attempts, 502 upstream_unavailable",
						a.status, a.body, attempts, r.status, r.body)
				case !a.retried && (attempts != 1 || r.status != a.status || r.body != a.body):
					t.Errorf("%d %s: %d attempts, app got %d %s; want it final: 1 attempt, passed on as it came",
						a.status, a.body, attempts, r.status, r.body)
				}
			}
		})
	}
}

// The payouts provider's own 429 ("Retry-After: 60", body
// {"state":1,"message":"rate limit exceeded"}, no error code) pauses
// everything idemproxy sends it, for Retry-After capped by
// IDEMPROXY_RETRY_MAX_DELAY: other payouts, a status lookup and a GET sent
// during the pause reach the provider only after it, spread out rather than
// at one instant, and the 429'd payout is then sent again under its key,
// freshly signed, and made.
func TestSeedPayoutsRateLimitPausesAll(t *testing.T) {
	const capped = 2 * time.Second
	prov, url := newSeedProvider(t, "payouts")
	p := launch(t, launchSpec{env: prov.env(t, url, "IDEMPROXY_RETRY_MAX_DELAY="+capped.String())})
	base := "http://" + p.proxy
	prov.then(scripted{429, map[string]string{"Retry-After": "60"}, `{"state":1,"message":"rate limit exceeded"}`})
	first := goSend("POST", base+"/v1/payout", `{"order_id":"rl-first","amount":"25"}`)
	p.waitLine(t, "provider asked to pause")
	var during []<-chan sentReply
	for i := range 4 {
		during = append(during, goSend("POST", base+"/v1/payout", fmt.Sprintf(`{"order_id":"rl-%d","amount":"25"}`, i)))
	}
	during = append(during, goSend("POST", base+"/v1/payout/info", `{"order_id":"rl-0"}`),
		goSend("GET", base+"/v1/balance", ""))
	for i, c := range append(during, first) {
		r := <-c
		if r.err != nil || r.status == http.StatusTooManyRequests || r.status >= 500 {
			t.Errorf("request %d: %d %s %v, want the provider's answer after the pause", i, r.status, r.body, r.err)
		}
	}
	seen := prov.requests()
	if len(seen) != 1+1+len(during) {
		t.Fatalf("the provider saw %d requests, want %d (the 429, its retry, one each for the rest)", len(seen), 2+len(during))
	}
	pausedAt := seen[0].at
	var lo, hi time.Time
	for i, s := range seen[1:] {
		if s.authErr != "" {
			t.Errorf("request %d (%s %s) refused: %s", i+2, s.method, s.path, s.authErr)
		}
		// The pause runs from when idemproxy read the 429, a little after the
		// provider wrote it.
		if s.at.Before(pausedAt.Add(capped - 20*time.Millisecond)) {
			t.Errorf("%s %s %s arrived %v after the 429, inside the %v pause", s.method, s.path, s.body,
				s.at.Sub(pausedAt).Round(time.Millisecond), capped)
		}
		if lo.IsZero() || s.at.Before(lo) {
			lo = s.at
		}
		if s.at.After(hi) {
			hi = s.at
		}
		if s.at.After(pausedAt.Add(capped + 5*time.Second)) {
			t.Errorf("%s %s arrived %v after the 429: held far past the %v pause", s.method, s.path, s.at.Sub(pausedAt), capped)
		}
	}
	if hi.Sub(lo) < 20*time.Millisecond {
		t.Errorf("the %d held requests reached the provider within %v of each other, want them spread out", len(seen)-1, hi.Sub(lo))
	}
	if k := seen[0].header.Get("Idempotency-Key"); k == "" || prov.keyOf("rl-first") != k {
		t.Errorf("the 429'd payout was not made under its first key %q", k)
	}
}

// keyOf is the Idempotency-Key of the last request the provider saw for the
// order.
func (p *seedProvider) keyOf(order string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.seen) - 1; i >= 0; i-- {
		if jsonStr([]byte(p.seen[i].body), "order_id") == order {
			return p.seen[i].header.Get("Idempotency-Key")
		}
	}
	return ""
}
