package proxy_test

import (
	"bytes"
	"context"
	"io"
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
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream"
)

// bytesProvider keeps each key's first request body as it came, as the
// payments provider's "one unchanged request body per key" reads: the first
// request with a key executes and is answered 504 (executed, answer lost on
// the way); a later one with the same bytes gets the stored payment, with
// other bytes 409 idempotency_conflict.
type bytesProvider struct {
	mu    sync.Mutex
	first map[string][]byte
	execs int
}

func (p *bytesProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	prev, seen := p.first[key]
	if !seen {
		p.first[key] = body
		p.execs++
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case !seen:
		w.WriteHeader(http.StatusGatewayTimeout)
		io.WriteString(w, `{"error":{"code":"gateway_timeout"}}`)
	case !bytes.Equal(prev, body):
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"error":{"code":"idempotency_conflict","message":"Idempotency-Key was used with another request body"}}`)
	default:
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"payment_id":"pay_1","status":"succeeded"}`)
	}
}

// An operation whose outcome is unknown is resumed with the bytes first
// sent (TestResumeSendsFirstBytes), unless its record could not keep them:
// a body larger than a record's body may be (here a store of small
// records) is resumed with the bytes of the app's retry, which idemproxy
// takes for the same request when only their member order differs (a Java
// HashMap serialised after a restart). A provider that compares the bytes
// answers 409 idempotency_conflict: its operation under the key exists,
// and this answer does not say how it ended. It is passed on and the
// record stays unknown, so that the next retry, with the first bytes, gets
// the payment. Before, it was stored as the order's final answer and
// replayed for the whole TTL: the payment's answer was lost, and an
// operator's renew (allowed on a final 4xx) moved the order to a new key,
// whose next request paid it again.
func TestProviderConflictIsNotFinal(t *testing.T) {
	prov := &bytesProvider{first: map[string][]byte{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	st, err := cache.Open(cache.Options{Dir: t.TempDir(), SyncWrites: true, TTL: time.Hour, GCInterval: -1, MemTableSize: 512 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pad := strings.Repeat("x", int(st.MaxBodyBytes())) // too large to be kept for the resume
	u, _ := url.Parse(up.URL)
	sources, _ := idemkey.ParseSources("json:order_id")
	tr, err := upstream.New(upstream.Config{Policy: retry.Policy{MaxAttempts: 1, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond,
		Statuses: map[int]bool{500: true, 502: true, 503: true, 504: true, 429: true}}, MaxResponseBytes: st.MaxBodyBytes(), Wire: up.Client().Transport})
	if err != nil {
		t.Fatal(err)
	}
	h, err := proxy.New(proxy.Options{Upstream: u, Store: st, KeySources: sources, InflightWait: 5 * time.Second, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer h.Drain(context.Background())
	e := &env{srv: srv}

	first := `{"order_id":"pc-1","amount":100,"currency":"EUR","note":"` + pad + `"}`
	reordered := `{"amount":100,"currency":"EUR","order_id":"pc-1","note":"` + pad + `"}`
	a := e.do(t, "POST", "/payments", first)
	if a.status != http.StatusBadGateway {
		t.Fatalf("first try: %d %s, want 502 upstream_unavailable", a.status, a.body)
	}
	key := a.header.Get(proxy.KeyHeader)
	a = e.do(t, "POST", "/payments", reordered)
	if a.status != http.StatusConflict || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("reordered retry: %d %s (replayed %q), want the provider's 409 passed on", a.status, a.body, a.header.Get("Idempotent-Replayed"))
	}
	rec, err := st.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: key})
	if err != nil || rec.State != store.Unknown {
		t.Fatalf("after the provider's conflict the record is %v (%v), want unknown: the payment's answer is still to come", rec.State, err)
	}
	for try := range 2 {
		a = e.do(t, "POST", "/payments", first)
		if a.status != http.StatusCreated || !bytes.Contains(a.body, []byte(`"pay_1"`)) {
			t.Fatalf("retry %d with the first bytes: %d %s, want 201 with the payment", try+1, a.status, a.body)
		}
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs != 1 {
		t.Errorf("the provider executed %d payments, want 1", prov.execs)
	}
}
