package main

// End-to-end tests of tenancy at the provider, through the real binary: with
// client tokens, the key sent upstream is bound to the client with a secret,
// so one client can neither read nor pre-empt another's operation at the
// provider, whose key namespace all clients share.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/idemkey"
)

// keyedProvider executes each Idempotency-Key once and returns the same
// operation for it after (the cards provider's rule), echoing the key.
type keyedProvider struct {
	mu   sync.Mutex
	ops  map[string]string // upstream key → operation
	keys []string          // every key received, in order
}

func (p *keyedProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys = append(p.keys, key)
	op, ok := p.ops[key]
	if !ok {
		var req struct{ Amount string }
		json.Unmarshal(b, &req)
		op = fmt.Sprintf(`{"id":"card_%d","amount":%q}`, len(p.ops)+1, req.Amount)
		p.ops[key] = op
	}
	w.Header().Set("Idempotency-Key", key) // providers echo the key they saw
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, op)
}

func (p *keyedProvider) received() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys...)
}

const (
	tokenA    = "token-of-app-a-0123456789"
	tokenB    = "token-of-app-b-0123456789"
	keySecret = "tenancy-key-secret-0123456789"
)

func tenancyEnv(upstream, dataDir string) []string {
	return []string{"IDEMPROXY_UPSTREAM_URL=" + upstream, "IDEMPROXY_DATA_DIR=" + dataDir,
		"IDEMPROXY_CLIENT_TOKENS=app-a=" + tokenA + ",app-b=" + tokenB, "IDEMPROXY_KEY_SECRET=" + keySecret}
}

// appKey is the key an app gets for an order: computable by anyone, since
// its inputs (method, path, order_id, client name) are not secret.
func appKey(t *testing.T, tenant, order string) string {
	t.Helper()
	sources, err := idemkey.ParseSources("json:order_id")
	if err != nil {
		t.Fatal(err)
	}
	key, _, ok := idemkey.Derive(sources, idemkey.Request{Method: "POST", Path: "/cards",
		Body: []byte(`{"order_id":"` + order + `"}`), Tenant: tenant})
	if !ok {
		t.Fatal("no key derived")
	}
	return key
}

func TestBinaryTenantsCannotReachEachOther(t *testing.T) {
	prov := &keyedProvider{ops: map[string]string{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, tenancyEnv(up.URL, t.TempDir())...)
	post := func(token, body string, header ...string) reply {
		return send(t, http.MethodPost, "http://"+p.addr+"/cards", body, append([]string{"Idemproxy-Client-Token", token}, header...)...)
	}

	// app-a's order; app-b then sends app-a's key (computed or observed).
	a := post(tokenA, `{"order_id":"o-1","amount":"900.00"}`)
	if a.status != http.StatusCreated {
		t.Fatalf("app-a: %d %s", a.status, a.body)
	}
	if got, want := a.header.Get("Idempotency-Key"), appKey(t, "app-a", "o-1"); got != want {
		t.Errorf("app-a sees key %q, want its own %q (not the upstream one)", got, want)
	}
	b := post(tokenB, `{"order_id":"x","amount":"1.00"}`, "Idempotency-Key", a.header.Get("Idempotency-Key"))
	if b.status != http.StatusCreated || b.body == a.body {
		t.Errorf("app-b, sending app-a's key, got %d %s: app-a's operation is %s", b.status, b.body, a.body)
	}

	// app-b claims the key of app-a's next order first.
	next := appKey(t, "app-a", "o-2")
	claim := post(tokenB, `{"order_id":"y","amount":"1.00"}`, "Idempotency-Key", next)
	real := post(tokenA, `{"order_id":"o-2","amount":"900.00"}`)
	if real.status != http.StatusCreated || !strings.Contains(real.body, `"900.00"`) || real.body == claim.body {
		t.Errorf("app-a's 900.00 order came back as %d %s (app-b's claim: %s)", real.status, real.body, claim.body)
	}

	keys := prov.received()
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			t.Errorf("upstream key %q reached the provider twice: two clients met there", k)
		}
		seen[k] = true
		for _, visible := range []string{a.header.Get("Idempotency-Key"), next} {
			if k == visible {
				t.Errorf("an app-visible key %q went upstream as it is", k)
			}
		}
	}
	if len(keys) != 4 {
		t.Errorf("provider saw %d requests, want 4", len(keys))
	}
	if !strings.Contains(p.logText(), `"upstream_key":"`+keys[0]+`"`) {
		t.Errorf("the request log does not show the upstream key %s:\n%s", keys[0], p.logText())
	}
	// The admin API shows the key that went upstream, not the app's.
	ar := send(t, http.MethodGet, "http://"+p.admin+"/admin/v1/records/"+a.header.Get("Idempotency-Key")+"?client=app-a", "")
	var rec struct {
		Key         string `json:"key"`
		UpstreamKey string `json:"upstream_key"`
		Method      string `json:"method"`
		Path        string `json:"path"`
	}
	if err := json.Unmarshal([]byte(ar.body), &rec); err != nil || ar.status != http.StatusOK {
		t.Fatalf("admin record of app-a's order = %d %s", ar.status, ar.body)
	}
	if rec.UpstreamKey != keys[0] || rec.Key != a.header.Get("Idempotency-Key") || rec.Method != "POST" || rec.Path != "/cards" {
		t.Errorf("admin record = %s; want key %s, upstream_key %s (what the provider saw), POST /cards",
			ar.body, a.header.Get("Idempotency-Key"), keys[0])
	}

	// Another replica (or a restart) with the same secret sends the same
	// upstream key: the provider returns app-a's operation, not a new one.
	p2 := startBinary(t, tenancyEnv(up.URL, t.TempDir())...)
	again := send(t, http.MethodPost, "http://"+p2.addr+"/cards", `{"order_id":"o-1","amount":"900.00"}`, "Idemproxy-Client-Token", tokenA)
	if again.body != a.body {
		t.Errorf("same order through another replica: %s, want the provider's %s", again.body, a.body)
	}
	if got := prov.received(); got[len(got)-1] != keys[0] {
		t.Errorf("upstream key changed across replicas: %q then %q", keys[0], got[len(got)-1])
	}
}

// Without client tokens, keys go upstream exactly as before: the app's own
// key as sent, a derived key as derived (no tenant, no secret).
func TestBinaryKeysUnchangedWithoutClientTokens(t *testing.T) {
	prov := &keyedProvider{ops: map[string]string{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir())
	derived := send(t, http.MethodPost, "http://"+p.addr+"/cards", `{"order_id":"o-1"}`)
	own := send(t, http.MethodPost, "http://"+p.addr+"/cards", `{"order_id":"o-2"}`, "Idempotency-Key", "app-chosen-1")
	keys := prov.received()
	if want := appKey(t, "", "o-1"); len(keys) != 2 || keys[0] != want || keys[1] != "app-chosen-1" {
		t.Errorf("upstream keys %q, want [%s app-chosen-1]", keys, want)
	}
	if derived.header.Get("Idempotency-Key") != keys[0] || own.header.Get("Idempotency-Key") != "app-chosen-1" {
		t.Errorf("answers name keys %q and %q", derived.header.Get("Idempotency-Key"), own.header.Get("Idempotency-Key"))
	}
}

// An unprotected request with the app's own Idempotency-Key goes upstream
// under the bound key, and a provider that echoes the key it saw (as the
// seeds' providers do) must not show the app that bound key: the app sees
// its own key in every answer, as for protected requests. The binary once
// passed the echoed upstream key on to the app.
func TestBinaryUnprotectedAnswerShowsTheAppsKey(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		seen = append(seen, key)
		mu.Unlock()
		if key != "" {
			w.Header().Set("Idempotency-Key", key)
		}
		io.WriteString(w, `{"status":"found"}`)
	}))
	defer up.Close()
	p := startBinary(t, tenancyEnv(up.URL, t.TempDir())...)
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		got := send(t, method, "http://"+p.addr+"/cards/c-1", "", "Idemproxy-Client-Token", tokenA, "Idempotency-Key", "app-a-own-key")
		mu.Lock()
		upstream := seen[len(seen)-1]
		mu.Unlock()
		if upstream == "" || upstream == "app-a-own-key" {
			t.Fatalf("%s: the provider saw key %q, want app-a's key bound to it", method, upstream)
		}
		if got.status != http.StatusOK || got.header.Get("Idempotency-Key") != "app-a-own-key" {
			t.Errorf("%s: answer %d with Idempotency-Key %q, want 200 with the app's own key (the upstream one is %s)",
				method, got.status, got.header.Get("Idempotency-Key"), upstream)
		}
	}
	// Without a key of the app's, whatever the provider says passes as it came.
	got := send(t, http.MethodGet, "http://"+p.addr+"/cards/c-1", "", "Idemproxy-Client-Token", tokenA)
	if got.status != http.StatusOK || got.header.Get("Idempotency-Key") != "" {
		t.Errorf("GET without a key: %d with Idempotency-Key %q, want 200 and none", got.status, got.header.Get("Idempotency-Key"))
	}
}

// With client tokens, a request without exactly one known token is 401
// unauthorized with nothing sent, even when it repeats another client's
// stored order with that client's key: it never gets the stored answer. No
// token, wrong ones included, and not the key secret, appears in the log
// (at debug level), in an answer, or upstream.
func TestBinaryTenancyRefusalsAndSecrets(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, append(tenancyEnv(up.URL, t.TempDir()), "IDEMPROXY_LOG_LEVEL=debug")...)
	url, body := "http://"+p.addr+"/v1/payments", `{"order_id":"sec-1","amount":"5.00"}`
	stored := send(t, http.MethodPost, url, body, "Idemproxy-Client-Token", tokenA, "Idempotency-Key", "a-key-1")
	if stored.status != http.StatusCreated {
		t.Fatalf("app-a's order: %d %s", stored.status, stored.body)
	}
	prov.take()
	wrong := "token-of-nobody-0123456789"
	var answers []reply
	for _, c := range []struct{ name, raw string }{
		{"no token", ""},
		{"unknown token", "Idemproxy-Client-Token: " + wrong + "\n"},
		{"app-a's token with a character more", "Idemproxy-Client-Token: " + tokenA + "x\n"},
		{"app-a's token cut short", "Idemproxy-Client-Token: " + tokenA[:len(tokenA)-1] + "\n"},
		{"two tokens", "Idemproxy-Client-Token: " + tokenA + "\nIdemproxy-Client-Token: " + tokenB + "\n"},
		{"app-a's token twice", "Idemproxy-Client-Token: " + tokenA + "\nIdemproxy-Client-Token: " + tokenA + "\n"},
		{"empty token", "Idemproxy-Client-Token: \n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, req := range []string{
				rawPost(body, c.raw+"Idempotency-Key: a-key-1\n"),
				"GET /v1/payments/op_1 HTTP/1.1\nHost: x\n" + c.raw + "\n",
			} {
				got := rawExchange(t, p.addr, req)
				checkRefusal(t, prov, got, http.StatusUnauthorized, "unauthorized")
				if got.header.Get("Idempotent-Replayed") != "" || strings.Contains(got.body, "op_") {
					t.Errorf("refused request got the stored answer: %v %s", got.header, got.body)
				}
				answers = append(answers, got)
			}
		})
	}
	answers = append(answers, send(t, http.MethodPost, url, body, "Idemproxy-Client-Token", tokenA, "Idempotency-Key", "a-key-1"),
		send(t, http.MethodGet, "http://"+p.addr+"/v1/payments/op_1", "", "Idemproxy-Client-Token", tokenB))
	if r := answers[len(answers)-2]; r.status != http.StatusCreated || r.body != stored.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("app-a's repeat: %d %s, want its stored answer replayed", r.status, r.body)
	}
	seen := prov.take()
	if len(seen) != 1 || seen[0].Method != http.MethodGet {
		t.Errorf("provider saw %d requests after app-a's order, want app-b's GET only: %+v", len(seen), seen)
	}
	secrets := map[string]string{"app-a's token": tokenA, "app-b's token": tokenB, "key secret": keySecret, "unknown token": wrong}
	for name, s := range secrets {
		if strings.Contains(p.logText(), s) {
			t.Errorf("%s appears in the log", name)
		}
		for _, a := range answers {
			if strings.Contains(a.body, s) || strings.Contains(fmt.Sprint(a.header), s) {
				t.Errorf("%s appears in an answer: %v %s", name, a.header, a.body)
			}
		}
		for _, w := range seen {
			if strings.Contains(fmt.Sprint(w.Header), s) || strings.Contains(w.URI, s) || strings.Contains(w.Body, s) {
				t.Errorf("%s went upstream: %+v", name, w)
			}
		}
	}
	if !strings.Contains(p.logText(), `"level":"DEBUG"`) || strings.Contains(p.logText(), "[redacted]") {
		t.Errorf("log not at debug level, or its safety net had to redact a secret:\n%s", p.logText())
	}
}

// TestBinaryAdminCallsNameAClient: with client tokens on, every record
// belongs to a client, so the admin calls that look one up must name the
// client. Without ?client=, or naming a client that has no token, they are
// refused with 400 saying which clients there are; they looked under a
// client no request can have, and so GET /admin/v1/orders said of app-a's
// executed order that nothing was sent for it (record null), and
// /admin/v1/records/{key} that there was no such record.
func TestBinaryAdminCallsNameAClient(t *testing.T) {
	prov := &keyedProvider{ops: map[string]string{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, tenancyEnv(up.URL, t.TempDir())...)
	a := send(t, http.MethodPost, "http://"+p.addr+"/cards", `{"order_id":"o-9","amount":"5.00"}`, "Idemproxy-Client-Token", tokenA)
	if a.status != http.StatusCreated {
		t.Fatalf("app-a: %d %s", a.status, a.body)
	}
	key := a.header.Get("Idempotency-Key")
	admin := "http://" + p.admin
	order := admin + "/admin/v1/orders?method=POST&path=/cards&value=o-9"
	if r := send(t, http.MethodGet, order+"&client=app-a", ""); r.status != http.StatusOK ||
		!strings.Contains(r.body, `"key":"`+key+`"`) || !strings.Contains(r.body, `"state":"final"`) {
		t.Fatalf("app-a's order = %d %s, want its final record under %s", r.status, r.body, key)
	}
	for _, c := range []struct{ method, url, body string }{
		{http.MethodGet, order, ""},
		{http.MethodGet, order + "&client=app-c", ""},
		{http.MethodGet, admin + "/admin/v1/records/" + key, ""},
		{http.MethodGet, admin + "/admin/v1/records/" + key + "?client=default", ""},
		{http.MethodPost, admin + "/admin/v1/orders/renew", `{"method":"POST","path":"/cards","value":"o-9"}`},
	} {
		r := send(t, c.method, c.url, c.body)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, `"bad_request"`) ||
			!strings.Contains(r.body, "app-a, app-b") {
			t.Errorf("%s %s %s = %d %s, want 400 bad_request naming the clients app-a, app-b", c.method, c.url, c.body, r.status, r.body)
		}
	}
}

// TestBinaryClientTokensSpacedList: a token list written with white space
// around '=' and ',' ("app-a = token , app-b = token", as lists are written
// by hand) authenticates both apps. The tokens were kept with their spaces,
// which no header carries (HTTP drops them around a value): the start
// accepted the list and every request of those apps got 401 for ever.
func TestBinaryClientTokensSpacedList(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_CLIENT_TOKENS=app-a = "+tokenA+" , app-b =\t"+tokenB, "IDEMPROXY_KEY_SECRET="+keySecret)
	for _, token := range []string{tokenA, tokenB} {
		got := send(t, http.MethodPost, "http://"+p.addr+"/v1/payments", `{"order_id":"sp-1"}`, "Idemproxy-Client-Token", token)
		if got.status != http.StatusCreated {
			t.Errorf("token %s...: %d %s, want 201", token[:12], got.status, got.body)
		}
	}
	if seen := prov.take(); len(seen) != 2 {
		t.Errorf("provider saw %d requests, want 2", len(seen))
	}
}

// TestBinaryClientNamedDefaultRefused: records stored without client tokens
// live under the client "default". A token list that named a client
// "default" gave that client those records, every app's: its order with
// another app's order_id and body was answered with that app's stored
// answer, and nothing went to the provider. Such a list now stops the start
// with status 2 naming IDEMPROXY_CLIENT_TOKENS and the name (no token), and
// the records stored without tokens are left as they were.
func TestBinaryClientNamedDefaultRefused(t *testing.T) {
	prov := &keyedProvider{ops: map[string]string{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	dir, order := t.TempDir(), `{"order_id":"o-1","amount":"900.00"}`
	before := launch(t, launchSpec{env: baseEnv(up.URL, dir)})
	stored := send(t, http.MethodPost, "http://"+before.proxy+"/cards", order)
	if stored.status != http.StatusCreated {
		t.Fatalf("order without tokens: %d %s", stored.status, stored.body)
	}
	if err := before.terminate(t); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, before.text())
	}

	p := startProc(t, launchSpec{env: baseEnv(up.URL, dir,
		"IDEMPROXY_CLIENT_TOKENS=app-a="+tokenA+",default="+tokenB, "IDEMPROXY_KEY_SECRET="+keySecret)})
	if p.servesOrExits(t) {
		got := send(t, http.MethodPost, "http://"+p.proxy+"/cards", order, "Idemproxy-Client-Token", tokenB)
		t.Fatalf("started with a client named default; its order got %d %s (Idempotent-Replayed %q), "+
			"the answer stored without tokens being %s; the provider saw %d requests",
			got.status, got.body, got.header.Get("Idempotent-Replayed"), stored.body, len(prov.received()))
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("exit %v, want status 2", p.err)
	}
	out := p.text()
	// The error's JSON log line: its quotes escaped.
	for _, want := range []string{"IDEMPROXY_CLIENT_TOKENS", `client name \"default\" is reserved`} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not say %s:\n%s", want, out)
		}
	}
	for _, s := range []string{tokenA, tokenB, keySecret} {
		if strings.Contains(out, s) {
			t.Errorf("output shows a secret:\n%s", out)
		}
	}

	// Without tokens, as before, the order is replayed from its record.
	after := launch(t, launchSpec{env: baseEnv(up.URL, dir)})
	again := send(t, http.MethodPost, "http://"+after.proxy+"/cards", order)
	if again.status != http.StatusCreated || again.body != stored.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("order repeated without tokens: %d %s, want its stored answer %s replayed", again.status, again.body, stored.body)
	}
	if n := len(prov.received()); n != 1 {
		t.Errorf("provider saw %d requests, want 1", n)
	}
}

// TestBinaryStatusLookupFindsAnUpperCaseUUIDKey: with client tokens, an
// app's UUID key is one operation however it is spelt (idemkey.Canonical: a
// key given back upper-cased by a SQL Server uniqueidentifier column, or in
// braces), and the order goes upstream under that key, canonical, bound to
// the app. A status lookup (an unprotected request) carrying the same key
// as the app holds it must reach the provider under the same upstream key,
// or the provider finds no operation for it: the lookup was bound over the
// key as sent, and the app was told its executed order did not exist.
func TestBinaryStatusLookupFindsAnUpperCaseUUIDKey(t *testing.T) {
	prov := &keyedProvider{ops: map[string]string{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, tenancyEnv(up.URL, t.TempDir())...)
	const lower = "6f1c2b9e-3d4a-4b8c-9e2f-0a1b2c3d4e5f"
	upper := strings.ToUpper(lower)
	order := send(t, http.MethodPost, "http://"+p.addr+"/cards", `{"amount":"5.00"}`,
		"Idemproxy-Client-Token", tokenA, "Idempotency-Key", upper)
	if order.status != http.StatusCreated {
		t.Fatalf("order: %d %s", order.status, order.body)
	}
	sent := prov.received()[0]
	for _, spelling := range []string{upper, "{" + upper + "}", lower, "{" + lower + "}"} {
		for _, method := range []string{http.MethodGet, http.MethodDelete} {
			got := send(t, method, "http://"+p.addr+"/cards/status", "", "Idemproxy-Client-Token", tokenA, "Idempotency-Key", spelling)
			keys := prov.received()
			if last := keys[len(keys)-1]; last != sent {
				t.Errorf("%s status lookup with key %s went upstream as %s; the order went as %s", method, spelling, last, sent)
			}
			if got.status != http.StatusCreated || got.header.Get("Idempotency-Key") != spelling {
				t.Errorf("%s status lookup with key %s: %d with Idempotency-Key %q, want the app's key as it sent it",
					method, spelling, got.status, got.header.Get("Idempotency-Key"))
			}
		}
	}
	// app-b's lookup with the same key is app-b's, not app-a's operation.
	send(t, http.MethodGet, "http://"+p.addr+"/cards/status", "", "Idemproxy-Client-Token", tokenB, "Idempotency-Key", upper)
	if keys := prov.received(); keys[len(keys)-1] == sent {
		t.Errorf("app-b's lookup with app-a's key went upstream under app-a's upstream key %s", sent)
	}
}

// TestBinaryClientNamesThatLookAlikeRefused: a client's name is its tenant:
// its records, its derived keys and its upstream keys hang on it. An
// operator rotating app-a's token who writes the new entry "App-A=…", or a
// token file saved with a byte order mark before its first name, made a
// second client that reads as app-a: the app, moved to its new token, was a
// stranger to its own records, and its order o-1, already executed, was
// executed again under a new key. Such a list now stops the start with
// status 2 naming IDEMPROXY_CLIENT_TOKENS and the names (no token).
func TestBinaryClientNamesThatLookAlikeRefused(t *testing.T) {
	prov := &keyedProvider{ops: map[string]string{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	dir, order := t.TempDir(), `{"order_id":"o-1","amount":"900.00"}`
	const tokenA2 = "token-of-app-a-rotated-0123456789"
	before := launch(t, launchSpec{env: baseEnv(up.URL, dir,
		"IDEMPROXY_CLIENT_TOKENS=app-a="+tokenA+",app-b="+tokenB, "IDEMPROXY_KEY_SECRET="+keySecret)})
	stored := send(t, http.MethodPost, "http://"+before.proxy+"/cards", order, "Idemproxy-Client-Token", tokenA)
	if stored.status != http.StatusCreated {
		t.Fatalf("app-a's order: %d %s", stored.status, stored.body)
	}
	if err := before.terminate(t); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, before.text())
	}

	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("\ufeffapp-a="+tokenA2+",app-b="+tokenB+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, setting, says string }{
		{"rotation in another case", "IDEMPROXY_CLIENT_TOKENS=app-a=" + tokenA + ",App-A=" + tokenA2 + ",app-b=" + tokenB,
			`the client name \"App-A\" differs from \"app-a\" only in letter case`},
		// Refused as the file is read (config's secret), before the
		// names are: any secret file's leading mark is.
		{"file with a byte order mark", "IDEMPROXY_CLIENT_TOKENS_FILE=" + file,
			`the value begins with a byte order mark (U+FEFF)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startProc(t, launchSpec{env: baseEnv(up.URL, dir, c.setting, "IDEMPROXY_KEY_SECRET="+keySecret)})
			if p.servesOrExits(t) {
				got := send(t, http.MethodPost, "http://"+p.proxy+"/cards", order, "Idemproxy-Client-Token", tokenA2)
				p.terminate(t)
				t.Fatalf("started; app-a's order o-1 with its new token got %d %s (Idempotent-Replayed %q), its stored answer being %s; "+
					"the provider executed %d operations", got.status, got.body, got.header.Get("Idempotent-Replayed"), stored.body, len(prov.ops))
			}
			var ee *exec.ExitError
			if !errors.As(p.err, &ee) || ee.ExitCode() != 2 {
				t.Errorf("exit %v, want status 2", p.err)
			}
			out := p.text()
			for _, want := range []string{"IDEMPROXY_CLIENT_TOKENS", c.says} {
				if !strings.Contains(out, want) {
					t.Errorf("output does not say %s:\n%s", want, out)
				}
			}
			for _, s := range []string{tokenA, tokenA2, tokenB, keySecret} {
				if strings.Contains(out, s) {
					t.Errorf("output shows a secret:\n%s", out)
				}
			}
		})
	}
	if n := len(prov.received()); n != 1 {
		t.Errorf("provider saw %d requests, want 1", n)
	}
}

// TestBinarySpacedTokenListRedacted: the log's safety net blanks any value
// holding a secret, a client token included. With the token list written by
// hand ("app-a = token , app-b = token"), the net looked for each token with
// its white space, so an app that sent its token in the wrong header (as its
// Idempotency-Key, here) had the token written to the request log as its key.
func TestBinarySpacedTokenListRedacted(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_CLIENT_TOKENS=app-a = "+tokenA+" , app-b =\t"+tokenB+"\t", "IDEMPROXY_KEY_SECRET="+keySecret)
	for _, token := range []string{tokenA, tokenB} {
		got := send(t, http.MethodPost, "http://"+p.addr+"/v1/payments", `{"order_id":"rd-1"}`,
			"Idemproxy-Client-Token", token, "Idempotency-Key", token)
		if got.status != http.StatusCreated {
			t.Fatalf("order: %d %s", got.status, got.body)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(p.logText(), `"msg":"request"`) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	log := p.logText()
	for name, s := range map[string]string{"app-a's token": tokenA, "app-b's token": tokenB} {
		if strings.Contains(log, s) {
			t.Errorf("%s appears in the log:\n%s", name, log)
		}
	}
	if !strings.Contains(log, "[redacted]") {
		t.Errorf("no request line was redacted:\n%s", log)
	}
}
