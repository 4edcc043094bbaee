package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/upstream"
)

// provider is an httptest upstream that behaves like the payments provider
// as far as this package cares: it executes each Idempotency-Key once, replays
// it afterwards, and counts executions and requests per key.
type provider struct {
	mu       sync.Mutex
	execs    map[string]int    // executions per key
	requests map[string]int    // requests seen per key
	stored   map[string][]byte // response per key
	total    int
	// hold, when non-nil, blocks each execution until it is closed.
	hold chan struct{}
	// entered is signalled when an execution starts (buffered by the test).
	entered chan string
	// status, when set, answers every request with it and executes nothing.
	status int
	// early sends 103 Early Hints before each answer.
	early bool
	// leaked counts requests that arrived with idemproxy's client token header.
	leaked int
	// chunked counts requests that arrived with a chunked body.
	chunked int
	// targets are the request targets (method and URI as sent) in arrival order.
	targets []string
	// last is the body of the last request, as it arrived.
	last []byte
}

func newProvider() *provider {
	return &provider{execs: map[string]int{}, requests: map[string]int{}, stored: map[string][]byte{}}
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.total++
	p.requests[key]++
	p.targets = append(p.targets, r.Method+" "+r.RequestURI)
	p.last = body
	if r.Header.Get(proxy.DefaultClientHeader) != "" {
		p.leaked++
	}
	if len(r.TransferEncoding) > 0 {
		p.chunked++
	}
	status, hold, entered, early := p.status, p.hold, p.entered, p.early
	prev, replay := p.stored[key]
	p.mu.Unlock()
	if early {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
	}
	if status != 0 {
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"code":"http_%d"}}`, status)
		return
	}
	if r.Method == http.MethodGet {
		fmt.Fprintf(w, `{"path":%q}`, r.URL.Path)
		return
	}
	if key != "" && replay {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Write(prev)
		return
	}
	if entered != nil {
		entered <- key
	}
	if hold != nil {
		<-hold
	}
	var in map[string]any
	json.Unmarshal(body, &in)
	if in["amount"] == "-1" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"code":"invalid_amount","message":"amount must be positive"}}`)
		p.record(key, nil)
		return
	}
	p.mu.Lock()
	n := len(p.stored) + 1
	p.mu.Unlock()
	if in["amount"] == "66.66" { // the cards provider: carried out, for a person to review
		out := []byte(fmt.Sprintf(`{"id":"op_%d","status":"needs_review"}`, n))
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
		p.record(key, out)
		return
	}
	out := []byte(fmt.Sprintf(`{"id":"pay_%d","order_id":%q,"status":"succeeded","path":%q}`, n, in["order_id"], r.URL.Path))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Provider-Request", fmt.Sprint(n))
	w.WriteHeader(http.StatusCreated)
	w.Write(out)
	p.record(key, out)
}

func (p *provider) record(key string, out []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.execs[key]++
	if out != nil {
		p.stored[key] = out
	}
}

// takeTargets returns the request targets seen since the last call.
func (p *provider) takeTargets() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.targets
	p.targets = nil
	return t
}

// lastBody returns the body of the last request, as it arrived.
func (p *provider) lastBody() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return string(p.last)
}

func (p *provider) counts() (total int, execs map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]int{}
	for k, v := range p.execs {
		m[k] = v
	}
	return p.total, m
}

type env struct {
	prov  *provider
	up    *httptest.Server
	store *cache.Store
	h     *proxy.Handler
	tr    *retry.Transport // the handler's attempt chain
	srv   *httptest.Server
}

type envOpt func(*proxy.Options, *retry.Policy)

func newEnv(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	return newEnvUpstream(t, nil, opts...)
}

// newEnvUpstream is newEnv with the attempt chain's configuration adjusted
// by up (the status probe, the key retention), if not nil.
func newEnvUpstream(t *testing.T, up func(*upstream.Config), opts ...envOpt) *env {
	t.Helper()
	e := &env{prov: newProvider()}
	e.up = httptest.NewServer(e.prov)
	t.Cleanup(e.up.Close)
	st, err := cache.Open(cache.Options{Dir: t.TempDir(), SyncWrites: true, TTL: time.Hour, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	t.Cleanup(func() { st.Close() })
	u, _ := url.Parse(e.up.URL)
	sources, err := idemkey.ParseSources("json:order_id,query:order_id")
	if err != nil {
		t.Fatal(err)
	}
	pol := retry.Policy{MaxAttempts: 1, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond,
		Statuses: map[int]bool{500: true, 502: true, 503: true, 504: true, 429: true}}
	o := proxy.Options{Upstream: u, Store: st, KeySources: sources, InflightWait: 5 * time.Second}
	for _, f := range opts {
		f(&o, &pol)
	}
	cfg := upstream.Config{Policy: pol, MaxResponseBytes: st.MaxBodyBytes(), Wire: e.up.Client().Transport}
	if up != nil {
		up(&cfg)
	}
	e.tr, err = upstream.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o.Transport = e.tr
	h, err := proxy.New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.h = h
	e.srv = httptest.NewServer(h)
	t.Cleanup(e.srv.Close)
	t.Cleanup(func() { h.Drain(context.Background()) })
	return e
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (e *env) do(t *testing.T, method, path, body string, hdr ...string) answer {
	t.Helper()
	a, err := e.send(method, path, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// send is do for goroutines other than the test's, which must not call
// t.Fatal: the caller reports the error from the test goroutine.
func (e *env) send(method, path, body string, hdr ...string) (answer, error) {
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{resp.StatusCode, resp.Header, b}, nil
}

// sent is the answer to a request sent from another goroutine, or its error.
type sent struct {
	answer
	err error
}

// goSend sends a request from a new goroutine, which must not call t.Fatal:
// the answer or error arrives on the channel for the test goroutine to check.
func (e *env) goSend(method, path, body string, hdr ...string) <-chan sent {
	c := make(chan sent, 1)
	go func() {
		a, err := e.send(method, path, body, hdr...)
		c <- sent{a, err}
	}()
	return c
}

func errorCode(t *testing.T, a answer) string {
	t.Helper()
	var v struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal(a.body, &v); err != nil {
		t.Fatalf("error body %q: %v", a.body, err)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type = %q", ct)
	}
	return v.Error.Code
}

const order = `{"order_id":"ord-1","amount":"10.00","currency":"USD"}`

func TestConcurrentIdenticalPostsExecuteOnce(t *testing.T) {
	e := newEnv(t)
	const n = 50
	answers := make([]answer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = e.send("POST", "/v1/payments", order)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	total, execs := e.prov.counts()
	if len(execs) != 1 || total != 1 {
		t.Fatalf("provider saw %d requests, executions %v; want exactly one", total, execs)
	}
	key := answers[0].header.Get("Idempotency-Key")
	if execs[key] != 1 {
		t.Fatalf("execution not under the echoed key %q: %v", key, execs)
	}
	replays := 0
	for i, a := range answers {
		if a.status != http.StatusCreated || !bytes.Equal(a.body, answers[0].body) {
			t.Fatalf("answer %d = %d %q, want 201 %q", i, a.status, a.body, answers[0].body)
		}
		if a.header.Get("Idempotency-Key") != key {
			t.Fatalf("answer %d key %q, want %q", i, a.header.Get("Idempotency-Key"), key)
		}
		if a.header.Get("Idempotent-Replayed") == "true" {
			replays++
		}
	}
	if replays != n-1 {
		t.Errorf("%d answers marked replayed, want %d", replays, n-1)
	}
}

func TestReplayIsByteIdenticalAndSkipsUpstream(t *testing.T) {
	e := newEnv(t)
	first := e.do(t, "POST", "/v1/payments", order)
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first = %d replayed=%q", first.status, first.header.Get("Idempotent-Replayed"))
	}
	// Same JSON with other key order and whitespace is the same request.
	again := e.do(t, "POST", "/v1/payments", "{ \"currency\":\"USD\",\n \"amount\":\"10.00\", \"order_id\":\"ord-1\" }")
	if again.status != first.status || !bytes.Equal(again.body, first.body) {
		t.Fatalf("replay = %d %q, want %d %q", again.status, again.body, first.status, first.body)
	}
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay lacks Idempotent-Replayed: true")
	}
	for _, h := range []string{"Content-Type", "X-Provider-Request", "Idempotency-Key"} {
		if again.header.Get(h) != first.header.Get(h) {
			t.Errorf("replay header %s = %q, want %q", h, again.header.Get(h), first.header.Get(h))
		}
	}
	if total, _ := e.prov.counts(); total != 1 {
		t.Errorf("provider saw %d requests, want 1", total)
	}
}

func TestConflictingBodySends409AndNothingUpstream(t *testing.T) {
	e := newEnv(t)
	e.do(t, "POST", "/v1/payments", order)
	a := e.do(t, "POST", "/v1/payments", `{"order_id":"ord-1","amount":"99.00","currency":"USD"}`)
	if a.status != http.StatusConflict || errorCode(t, a) != "idempotency_conflict" {
		t.Fatalf("got %d %s, want 409 idempotency_conflict", a.status, a.body)
	}
	if a.header.Get("Idempotency-Key") == "" {
		t.Error("conflict answer lacks the Idempotency-Key header")
	}
	if total, _ := e.prov.counts(); total != 1 {
		t.Errorf("provider saw %d requests, want 1", total)
	}
}

func TestKeyResolution(t *testing.T) {
	e := newEnv(t)
	pay := e.do(t, "POST", "/v1/payments", order)
	refund := e.do(t, "POST", "/v1/refunds", order)
	if pay.header.Get("Idempotency-Key") == refund.header.Get("Idempotency-Key") {
		t.Error("a payment and a refund of one order got the same key")
	}
	bare := e.do(t, "POST", "/v1/payments", `{"amount":"1"}`, "Idempotency-Key", "client-key-1")
	quoted := e.do(t, "POST", "/v1/payments", `{"amount":"1"}`, "Idempotency-Key", `"client-key-1"`)
	if bare.header.Get("Idempotency-Key") != "client-key-1" || quoted.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("bare and RFC 8941 quoted key were not one record: %v / %v", bare.header, quoted.header)
	}
	q := e.do(t, "POST", "/v1/payments?order_id=ord-q", `{"amount":"1"}`)
	if q.status != http.StatusCreated || q.header.Get("Idempotency-Key") == "" {
		t.Errorf("query source: %d %v", q.status, q.header)
	}
	_, execs := e.prov.counts()
	for _, k := range []string{pay.header.Get("Idempotency-Key"), "client-key-1", q.header.Get("Idempotency-Key")} {
		if execs[k] != 1 {
			t.Errorf("key %q executed %d times, want 1 (all: %v)", k, execs[k], execs)
		}
	}
}

// An app's quoted key with a space, '"' or ',' is answered quoted, so that
// the key the app keeps from the answer and sends back is the same key:
// answered bare, it was refused 400 bad_request.
func TestQuotedKeyAnsweredAsItReadsBack(t *testing.T) {
	e := newEnv(t)
	for _, sent := range []string{`"pay 7, retry"`, `"say \"hi\""`} {
		first := e.do(t, "POST", "/v1/payments", `{"amount":"1"}`, "Idempotency-Key", sent)
		kept := first.header.Get("Idempotency-Key")
		if first.status != http.StatusCreated || kept != sent {
			t.Fatalf("sent %s: %d, answered Idempotency-Key %s; want 201, %s", sent, first.status, kept, sent)
		}
		again := e.do(t, "POST", "/v1/payments", `{"amount":"1"}`, "Idempotency-Key", kept)
		if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" ||
			again.header.Get("Idempotency-Key") != sent {
			t.Errorf("key %s sent back as answered: %d %v %s; want the replay", sent, again.status, again.header, again.body)
		}
	}
	total, execs := e.prov.counts()
	if total != 2 || execs["pay 7, retry"] != 1 || execs[`say "hi"`] != 1 {
		t.Errorf("upstream saw %d requests %v, want one per key, sent as the key", total, execs)
	}
}

func TestMissingAndInvalidKeys(t *testing.T) {
	cases := []struct {
		name     string
		policy   proxy.MissingKey
		key      string
		status   int
		code     string
		sentKey  bool // the upstream got an Idempotency-Key
		upstream int  // requests the upstream saw
	}{
		{"reject", proxy.Reject, "", 422, "idempotency_key_missing", false, 0},
		{"generate", proxy.Generate, "", 201, "", true, 1},
		{"passthrough", proxy.Passthrough, "", 201, "", false, 1},
		{"too long", proxy.Reject, strings.Repeat("k", 256), 400, "bad_request", false, 0},
		{"non-ASCII", proxy.Reject, "ключ", 400, "bad_request", false, 0},
		{"empty quoted", proxy.Reject, `""`, 400, "bad_request", false, 0},
		{"quoted with outer spaces", proxy.Reject, `" k-1 "`, 400, "bad_request", false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.MissingKey = c.policy })
			var hdr []string
			if c.key != "" {
				hdr = []string{"Idempotency-Key", c.key}
			}
			a := e.do(t, "POST", "/v1/payments", `{"amount":"1"}`, hdr...)
			if a.status != c.status {
				t.Fatalf("status %d %s, want %d", a.status, a.body, c.status)
			}
			if c.code != "" && errorCode(t, a) != c.code {
				t.Errorf("code %s, want %s", a.body, c.code)
			}
			total, execs := e.prov.counts()
			if total != c.upstream {
				t.Errorf("upstream saw %d requests, want %d", total, c.upstream)
			}
			_, unkeyed := execs[""]
			if c.upstream > 0 && unkeyed == c.sentKey {
				t.Errorf("upstream keyed=%v, want %v (%v)", !unkeyed, c.sentKey, execs)
			}
		})
	}
}

func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.MaxBodyBytes = 64 })
	for _, m := range []string{"POST", "PUT"} {
		a := e.do(t, m, "/v1/payments", `{"order_id":"big","pad":"`+strings.Repeat("x", 100)+`"}`)
		if a.status != http.StatusRequestEntityTooLarge || errorCode(t, a) != "body_too_large" {
			t.Errorf("%s: got %d %s, want 413 body_too_large", m, a.status, a.body)
		}
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("upstream saw %d requests, want 0", total)
	}
}

// A protected request refused 413 carries the app's own key, as every
// answer to a protected request with a key does; an unprotected one does not.
func TestBodyTooLargeCarriesTheAppsKey(t *testing.T) {
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.MaxBodyBytes = 64 })
	big := `{"order_id":"big","pad":"` + strings.Repeat("x", 100) + `"}`
	cases := []struct {
		name, method string
		chunked      bool
		want         string
	}{
		{"POST", "POST", false, "app-key-413"},
		{"POST chunked", "POST", true, "app-key-413"},
		{"PUT, unprotected", "PUT", false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(big)
			if c.chunked {
				body = io.MultiReader(body) // no length known: sent chunked
			}
			req, err := http.NewRequest(c.method, e.srv.URL+"/v1/payments", body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", "app-key-413")
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge || resp.Header.Get("Idempotency-Key") != c.want {
				t.Errorf("got %d with Idempotency-Key %q, want 413 with %q", resp.StatusCode, resp.Header.Get("Idempotency-Key"), c.want)
			}
		})
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("upstream saw %d requests, want 0", total)
	}
}

// A protected request's body is read whole before it is sent, so it goes
// with its length, the keyless one passed through included: an empty chunked
// body goes as "Content-Length: 0", never as a zero-length chunked body.
func TestHeldBodiesGoWithTheirLength(t *testing.T) {
	for _, policy := range []proxy.MissingKey{proxy.Reject, proxy.Passthrough} {
		e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.MissingKey = policy })
		for _, body := range []string{"", `{"note":"no order id"}`, order} {
			req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/payments", io.MultiReader(strings.NewReader(body)))
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = -1      // sent chunked
			if policy == proxy.Reject { // keyed by the app; else passed through without a key, or keyed by order_id
				req.Header.Set("Idempotency-Key", "held-"+fmt.Sprint(len(body)))
			}
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("%v, body %q: status %d, want 201", policy, body, resp.StatusCode)
			}
		}
		e.prov.mu.Lock()
		total, chunked := e.prov.total, e.prov.chunked
		e.prov.mu.Unlock()
		if total != 3 || chunked != 0 {
			t.Errorf("%v: provider got %d requests, %d of them chunked; want 3, none chunked", policy, total, chunked)
		}
	}
}

func TestClientDisconnectDoesNotStopTheOperation(t *testing.T) {
	e := newEnv(t)
	e.prov.hold = make(chan struct{})
	e.prov.entered = make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/payments", strings.NewReader(order))
	errc := make(chan error, 1)
	go func() {
		resp, err := e.srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	key := <-e.prov.entered // the operation reached the provider
	cancel()                // the legacy client times out
	if err := <-errc; err == nil {
		t.Fatal("client request did not fail after cancel")
	}
	close(e.prov.hold) // the provider finishes after the client left
	if err := e.h.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := e.do(t, "POST", "/v1/payments", order)
	if a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after disconnect = %d replayed=%q, want the stored 201", a.status, a.header.Get("Idempotent-Replayed"))
	}
	if _, execs := e.prov.counts(); execs[key] != 1 || len(execs) != 1 {
		t.Errorf("executions %v, want one for %q", execs, key)
	}
}

func TestInProgressPastTheWaitBound(t *testing.T) {
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.InflightWait = 50 * time.Millisecond })
	e.prov.hold = make(chan struct{})
	e.prov.entered = make(chan string, 1)
	type sent struct {
		a   answer
		err error
	}
	first := make(chan sent, 1)
	go func() {
		a, err := e.send("POST", "/v1/payments", order)
		first <- sent{a, err}
	}()
	select {
	case <-e.prov.entered:
	case r := <-first:
		t.Fatalf("the first request ended before reaching the provider: %d %s, %v", r.a.status, r.a.body, r.err)
	}
	a := e.do(t, "POST", "/v1/payments", order)
	if a.status != http.StatusConflict || errorCode(t, a) != "idempotency_in_progress" || a.header.Get("Retry-After") == "" {
		t.Fatalf("got %d %s Retry-After=%q, want 409 idempotency_in_progress with Retry-After", a.status, a.body, a.header.Get("Retry-After"))
	}
	// A different body with the key in flight is a conflict at once, not a wait.
	c := e.do(t, "POST", "/v1/payments", `{"order_id":"ord-1","amount":"1"}`)
	if c.status != http.StatusConflict || errorCode(t, c) != "idempotency_conflict" {
		t.Fatalf("got %d %s, want 409 idempotency_conflict", c.status, c.body)
	}
	close(e.prov.hold)
	r1 := <-first
	if r1.err != nil {
		t.Fatal(r1.err)
	}
	f := r1.a
	r := e.do(t, "POST", "/v1/payments", order)
	if !bytes.Equal(r.body, f.body) || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("after the first finished: %d %q, want replay of %q", r.status, r.body, f.body)
	}
	if total, _ := e.prov.counts(); total != 1 {
		t.Errorf("upstream saw %d requests, want 1", total)
	}
}

func TestFinalAndNonFinalResponses(t *testing.T) {
	e := newEnv(t)
	// A non-retriable 4xx is final: stored and replayed.
	bad := `{"order_id":"ord-bad","amount":"-1"}`
	a := e.do(t, "POST", "/v1/payments", bad)
	b := e.do(t, "POST", "/v1/payments", bad)
	if a.status != 400 || b.status != 400 || b.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(a.body, b.body) {
		t.Errorf("4xx: %d/%d replayed=%q", a.status, b.status, b.header.Get("Idempotent-Replayed"))
	}
	// A retriable failure that spent the budget is not stored: 502 upstream_unavailable,
	// and the next request resumes with the same key.
	e.prov.mu.Lock()
	e.prov.status = http.StatusServiceUnavailable
	e.prov.mu.Unlock()
	u := e.do(t, "POST", "/v1/payments", order)
	if u.status != http.StatusBadGateway || errorCode(t, u) != "upstream_unavailable" {
		t.Fatalf("got %d %s, want 502 upstream_unavailable", u.status, u.body)
	}
	var eb struct {
		Error struct {
			Key      string `json:"idempotency_key"`
			Attempts int    `json:"attempts"`
		} `json:"error"`
	}
	json.Unmarshal(u.body, &eb)
	key := u.header.Get("Idempotency-Key")
	if eb.Error.Key != key || eb.Error.Attempts != 1 {
		t.Errorf("error body %s: want key %q and attempts 1", u.body, key)
	}
	e.prov.mu.Lock()
	e.prov.status = 0
	e.prov.mu.Unlock()
	ok := e.do(t, "POST", "/v1/payments", order)
	if ok.status != http.StatusCreated || ok.header.Get("Idempotent-Replayed") == "true" || ok.header.Get("Idempotency-Key") != key {
		t.Errorf("resume: %d replayed=%q key=%q, want a fresh 201 under %q", ok.status, ok.header.Get("Idempotent-Replayed"), ok.header.Get("Idempotency-Key"), key)
	}
	e.prov.mu.Lock()
	seen := e.prov.requests[key]
	e.prov.mu.Unlock()
	if seen != 2 {
		t.Errorf("provider saw key %q %d times, want 2 (failed attempt, resumed attempt)", key, seen)
	}
}

func TestStoreUnavailableSendsNothing(t *testing.T) {
	e := newEnv(t)
	e.store.Close()
	a := e.do(t, "POST", "/v1/payments", order)
	if a.status != http.StatusServiceUnavailable || errorCode(t, a) != "store_unavailable" {
		t.Fatalf("got %d %s, want 503 store_unavailable", a.status, a.body)
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("upstream saw %d requests, want 0", total)
	}
}

// TestStoreFailsAfterSend: the provider answers, but the answer cannot be
// stored (the store closes while the attempt runs). The app gets 503
// store_unavailable with its key, saying the operation may have run, and
// the one attempt the request made, in the answer (body and
// Idemproxy-Attempts) and in its Summary, which the request log and the
// metrics read: not zero, as for a request refused before anything left.
func TestStoreFailsAfterSend(t *testing.T) {
	done := make(chan proxy.Summary, 1)
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.OnDone = func(s proxy.Summary) { done <- s }
	})
	e.prov.hold, e.prov.entered = make(chan struct{}), make(chan string, 1)
	r := e.goSend("POST", "/v1/payments", order)
	key := <-e.prov.entered
	e.store.Close()
	close(e.prov.hold)
	a := <-r
	if a.err != nil {
		t.Fatal(a.err)
	}
	var eb struct {
		Error struct {
			Code     string
			Message  string
			Key      string `json:"idempotency_key"`
			Attempts int    `json:"attempts"`
		} `json:"error"`
	}
	json.Unmarshal(a.body, &eb)
	if a.status != http.StatusServiceUnavailable || eb.Error.Code != "store_unavailable" ||
		!strings.Contains(eb.Error.Message, "may have been executed") || eb.Error.Key != key {
		t.Fatalf("got %d %s, want 503 store_unavailable saying the operation may have run, with key %q", a.status, a.body, key)
	}
	if eb.Error.Attempts != 1 || a.header.Get(proxy.AttemptsHeader) != "1" {
		t.Errorf("answer %s %s=%q, want attempts 1 in the body and the header", a.body, proxy.AttemptsHeader, a.header.Get(proxy.AttemptsHeader))
	}
	if s := <-done; s.Outcome != proxy.OutcomeStoreError || s.Attempts != 1 {
		t.Errorf("summary: outcome %s attempts %d, want %s and 1", s.Outcome, s.Attempts, proxy.OutcomeStoreError)
	}
}

func TestUnprotectedForwarded(t *testing.T) {
	e := newEnv(t)
	a := e.do(t, "GET", "/v1/payments/pay_1?x=1", "")
	if a.status != 200 || string(a.body) != `{"path":"/v1/payments/pay_1"}` || a.header.Get("Idempotency-Key") != "" {
		t.Fatalf("GET: %d %q %v", a.status, a.body, a.header)
	}
}

// rawRequest writes a request line by hand, for shapes net/http clients won't send.
func rawRequest(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, req)
	line, _ := bufio.NewReader(c).ReadString('\n')
	return line
}

func TestRefusesForwardProxyAndUpgrades(t *testing.T) {
	e := newEnv(t)
	addr := strings.TrimPrefix(e.srv.URL, "http://")
	cases := []struct{ name, req, want string }{
		{"absolute URI", "GET http://evil.example/x HTTP/1.1\r\nHost: evil.example\r\n\r\n", "400"},
		{"CONNECT", "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n", "405"},
		{"upgrade", "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", "400"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if line := rawRequest(t, addr, c.req); !strings.Contains(line, " "+c.want+" ") {
				t.Errorf("status line %q, want %s", line, c.want)
			}
		})
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("upstream saw %d requests, want 0", total)
	}
}

func (p *provider) set(f func(*provider)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// A 1xx before the final answer (103 Early Hints, 100 Continue) must not become
// the stored status: a declined payment would replay as 200.
func TestInformationalAnswerIsNotTheStatus(t *testing.T) {
	e := newEnv(t)
	e.prov.set(func(p *provider) { p.early = true })
	bad := `{"order_id":"ord-early","amount":"-1"}`
	for i, wantReplay := range []string{"", "true"} {
		a := e.do(t, "POST", "/v1/payments", bad)
		if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), "invalid_amount") || a.header.Get("Idempotent-Replayed") != wantReplay {
			t.Fatalf("request %d: %d %s replayed=%q, want 400 invalid_amount replayed=%q", i, a.status, a.body, a.header.Get("Idempotent-Replayed"), wantReplay)
		}
	}
}

// Only 2xx and 4xx where the provider acted are stored; other answers pass
// through and the next request asks the provider again with the same key.
func TestAnswersThatAreNotStored(t *testing.T) {
	for _, status := range []int{524, 501, 401, 403, 408, 302} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			e := newEnv(t)
			e.prov.set(func(p *provider) { p.status = status })
			first := e.do(t, "POST", "/v1/payments", order)
			if first.status != status {
				t.Fatalf("got %d %s, want the provider's %d passed on", first.status, first.body, status)
			}
			e.prov.set(func(p *provider) { p.status = 0 })
			next := e.do(t, "POST", "/v1/payments", order)
			if next.status != http.StatusCreated || next.header.Get("Idempotent-Replayed") != "" ||
				next.header.Get("Idempotency-Key") != first.header.Get("Idempotency-Key") {
				t.Errorf("next: %d replayed=%q key=%q; want a fresh 201 under %q", next.status,
					next.header.Get("Idempotent-Replayed"), next.header.Get("Idempotency-Key"), first.header.Get("Idempotency-Key"))
			}
		})
	}
}

// An unprotected GET that keeps failing gets the provider's own last answer,
// not a 502 about idempotency keys it never had.
func TestUnprotectedGetGetsLastAnswer(t *testing.T) {
	e := newEnv(t, func(_ *proxy.Options, p *retry.Policy) { p.MaxAttempts = 3 })
	e.prov.set(func(p *provider) { p.status = http.StatusServiceUnavailable })
	a := e.do(t, "GET", "/v1/payments/pay_1", "")
	if a.status != http.StatusServiceUnavailable || string(a.body) != `{"error":{"code":"http_503"}}` {
		t.Fatalf("got %d %s, want the provider's 503", a.status, a.body)
	}
	if total, _ := e.prov.counts(); total != 3 {
		t.Errorf("provider saw %d GETs, want 3 (a safe method is retried on 5xx)", total)
	}
}

// /cards/a%2Fb/topup and /cards/a/b/topup are two resources, so two keys.
func TestEscapedPathsAreDistinctOperations(t *testing.T) {
	e := newEnv(t)
	a := e.do(t, "POST", "/cards/a%2Fb/topup", order)
	b := e.do(t, "POST", "/cards/a/b/topup", order)
	if a.header.Get("Idempotency-Key") == b.header.Get("Idempotency-Key") || b.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("escaped and unescaped paths shared a key: %v / %v", a.header, b.header)
	}
	if total, _ := e.prov.counts(); total != 2 {
		t.Errorf("provider saw %d requests, want 2", total)
	}
}

// With client tokens on, each app's records (and derived keys) are its own: the
// same order_id from two apps is two operations, and neither sees the other's.
func TestTenantsAreIsolated(t *testing.T) {
	const tokA, tokB = "token-of-app-a-0123456789", "token-of-app-b-0123456789"
	clients, err := proxy.ParseClientTokens("", "app-a="+tokA+", app-b="+tokB)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.Clients, o.KeySecret = clients, []byte("key-secret-for-tests")
	})
	for _, c := range []struct{ name, token string }{{"no token", ""}, {"unknown token", "token-of-nobody-0123456789"}} {
		var hdr []string
		if c.token != "" {
			hdr = []string{proxy.DefaultClientHeader, c.token}
		}
		for _, m := range []string{"POST", "GET"} {
			a := e.do(t, m, "/v1/payments", order, hdr...)
			if a.status != http.StatusUnauthorized || errorCode(t, a) != "unauthorized" {
				t.Errorf("%s %s: %d %s, want 401 unauthorized", c.name, m, a.status, a.body)
			}
		}
	}
	a1 := e.do(t, "POST", "/v1/payments", order, proxy.DefaultClientHeader, tokA)
	b1 := e.do(t, "POST", "/v1/payments", order, proxy.DefaultClientHeader, tokB)
	a2 := e.do(t, "POST", "/v1/payments", order, proxy.DefaultClientHeader, tokA)
	if a1.status != 201 || b1.status != 201 || b1.header.Get("Idempotent-Replayed") != "" || bytes.Equal(a1.body, b1.body) {
		t.Fatalf("app b got app a's answer: a=%d %s b=%d %s replayed=%q", a1.status, a1.body, b1.status, b1.body, b1.header.Get("Idempotent-Replayed"))
	}
	if a1.header.Get("Idempotency-Key") == b1.header.Get("Idempotency-Key") {
		t.Error("two apps' orders reached the provider under one key")
	}
	if a2.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(a2.body, a1.body) {
		t.Errorf("app a's repeat was not its own replay: %s", a2.body)
	}
	e.prov.mu.Lock()
	defer e.prov.mu.Unlock()
	if e.prov.total != 2 || e.prov.leaked != 0 {
		t.Errorf("provider saw %d requests, %d carrying the client token; want 2 and 0", e.prov.total, e.prov.leaked)
	}
}

func TestParseClientTokens(t *testing.T) {
	for _, c := range []struct{ list, err string }{
		{"", ""},
		{"a=0123456789abcdef", ""},
		{"a", "entry 1"},
		{"a=short", "shorter than 16"},
		{"a=0123456789abcdef,b=0123456789abcdef", "another client"},
		{"=0123456789abcdef", "entry 1"},
		{"a= 0123456789abcde ", "shorter than 16"},
		{"a=0123456789abcdef, b = 0123456789abcdef", "another client"},
		{"a=0123456789\x01abcdef", "control character"},
		// "default" names the records stored without tokens.
		{"default=0123456789abcdef", `entry 1: the client name "default" is reserved`},
		{"a=0123456789abcdef, default = fedcba9876543210", "entry 2: the client name \"default\" is reserved"},
		{"default-app=0123456789abcdef", ""},
		// One client's two tokens (a rotation) are under one name; names
		// that differ only in case, white space or Unicode form, or by a
		// character that does not print, would be two clients that read
		// as one.
		{"app-a=0123456789abcdef, app-a=fedcba9876543210", ""},
		{"app a=0123456789abcdef, app-b=fedcba9876543210", ""},
		{"кассa=0123456789abcdef, café=fedcba9876543210", ""},
		{"app-a=0123456789abcdef, App-A=fedcba9876543210", `entry 2: the client name "App-A" differs from "app-a" only in`},
		{"app a=0123456789abcdef, app  a=fedcba9876543210", `entry 2: the client name "app  a" differs from "app a"`},
		{"caf\u00e9=0123456789abcdef, cafe\u0301=fedcba9876543210", "differs from"},
		{"ＡＰＰ=0123456789abcdef, app=fedcba9876543210", "differs from"},
		{"\ufeffapp-a=0123456789abcdef", `entry 1: the client name "\ufeffapp-a" holds U+FEFF`},
		{"app-a=0123456789abcdef, app-a\u200b=fedcba9876543210", "entry 2: the client name \"app-a\\u200b\" holds U+200B"},
		{"app\u00a0a=0123456789abcdef", "holds U+00A0"},
	} {
		_, err := proxy.ParseClientTokens("", c.list)
		if (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("ParseClientTokens(%q) = %v, want error containing %q", c.list, err, c.err)
		}
		if err != nil && strings.Contains(err.Error(), "0123456789abcdef") {
			t.Errorf("error %q shows a token", err)
		}
	}
}

// A token written with white space around it ("a = token", natural in a
// list) is the token without it: HTTP drops white space around a header
// value, so the client could never authenticate and got 401 for ever, from a
// configuration the start accepted.
func TestClientTokensAroundEquals(t *testing.T) {
	clients, err := proxy.ParseClientTokens("", "a = 0123456789abcdef , b=\tfedcba9876543210\n")
	if err != nil {
		t.Fatal(err)
	}
	for token, want := range map[string]string{"0123456789abcdef": "a", "fedcba9876543210": "b"} {
		r := httptest.NewRequest("POST", "/v1/payout", nil)
		r.Header.Set(proxy.DefaultClientHeader, token)
		if got, err := clients.Tenant(r); err != nil || got != want {
			t.Errorf("token of %s: Tenant = %q, %v; want %q", want, got, err, want)
		}
	}
}

// A GET whose upstream never answers gets 502 upstream_unavailable that does not
// tell the app to retry with a key it never had.
func TestUnprotectedNetworkFailureMessage(t *testing.T) {
	e := newEnv(t)
	e.up.Close()
	a := e.do(t, "GET", "/v1/payments/pay_1", "")
	if a.status != http.StatusBadGateway || errorCode(t, a) != "upstream_unavailable" {
		t.Fatalf("got %d %s, want 502 upstream_unavailable", a.status, a.body)
	}
	if strings.Contains(string(a.body), "Idempotency-Key") {
		t.Errorf("message for an unkeyed request mentions a key: %s", a.body)
	}
}
