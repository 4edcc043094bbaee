package proxy_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream"
)

// readingProvider is bytesProvider behind a provider that reads each body
// as its headers say: a gzip body is decoded, a multipart one parsed by its
// Content-Type's boundary, and one that does not read is refused 400 (a
// final answer), as a provider refuses a malformed request.
type readingProvider struct {
	*bytesProvider
	requests *atomic.Int64
}

func (p readingProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	plain := body
	if strings.Contains(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err == nil {
			plain, err = io.ReadAll(zr)
		}
		if err != nil {
			http.Error(w, `{"error":{"code":"invalid_request","message":"body is not gzip"}}`, http.StatusBadRequest)
			return
		}
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/form-data") {
		rr := r.Clone(r.Context())
		rr.Body = io.NopCloser(bytes.NewReader(plain))
		if err := rr.ParseMultipartForm(1 << 20); err != nil || rr.FormValue("order_id") == "" {
			http.Error(w, `{"error":{"code":"invalid_request","message":"bad multipart body"}}`, http.StatusBadRequest)
			return
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	p.bytesProvider.ServeHTTP(w, r)
}

func multipartBody(t *testing.T, boundary string, fields ...string) (body, contentType string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	if err := mw.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(fields); i += 2 {
		mw.WriteField(fields[i], fields[i+1])
	}
	mw.Close()
	return b.String(), mw.FormDataContentType()
}

// resendHandler is a handler in front of prov on st: one attempt per
// request, a 504 retried (so a budget spent on it leaves the outcome
// unknown).
func resendHandler(t *testing.T, prov http.Handler, st proxy.Store) *env {
	t.Helper()
	up := httptest.NewServer(prov)
	t.Cleanup(up.Close)
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
	t.Cleanup(srv.Close)
	t.Cleanup(func() { h.Drain(context.Background()) })
	return &env{srv: srv}
}

// An operation whose outcome is unknown is resumed with the bytes first
// sent, and the headers that say how to read them, not those of the app's
// retry, which idemproxy takes for the same request (same fingerprint) but
// which differ in bytes: JSON members in another order or other whitespace,
// a multipart body drawn with another boundary, a gzip body compressed at
// another time or not at all. The provider compares the bytes under its key
// (payments: 409 idempotency_conflict for another body) and reads the body
// by its headers. Before, the retry's bytes were sent: the reordered,
// respaced and recompressed retries got the provider's 409, kept unknown
// for ever, so that the order could never complete through idemproxy (an
// operator's new order is a second charge), and the multipart retry got a
// final 400 once the first bytes went with another boundary. Now each
// retry gets the payment, executed once, and its repeat the replay. Run on
// both stores: the bytes are in the record, so they survive a restart and
// reach another replica.
func TestResumeSendsFirstBytes(t *testing.T) {
	mtime := time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC)
	stores := map[string]func(t *testing.T) proxy.Store{
		"badger": func(t *testing.T) proxy.Store {
			st, err := cache.Open(cache.Options{Dir: t.TempDir(), SyncWrites: true, TTL: time.Hour, GCInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
		"postgres": func(t *testing.T) proxy.Store {
			st, _ := sharedPG(t, ownCluster(t))
			return st
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			prov := &bytesProvider{first: map[string][]byte{}}
			var requests atomic.Int64
			e := resendHandler(t, readingProvider{prov, &requests}, st)
			formA, typeA := multipartBody(t, "boundary-first-try", "order_id", "mp-1", "amount", "100")
			formB, typeB := multipartBody(t, "boundary-app-retry", "order_id", "mp-1", "amount", "100")
			cases := []struct {
				name               string
				first, retry       string
				firstHdr, retryHdr []string
			}{
				{name: "members reordered",
					first: `{"order_id":"rs-1","amount":100,"currency":"EUR"}`,
					retry: `{"currency":"EUR","amount":100,"order_id":"rs-1"}`},
				{name: "whitespace",
					first: "{\n  \"order_id\": \"rs-2\",\n  \"amount\": 100\n}\n",
					retry: `{"order_id":"rs-2","amount":100}`},
				{name: "multipart boundary",
					first: formA, firstHdr: []string{"Content-Type", typeA, "Idempotency-Key", "mp-1"},
					retry: formB, retryHdr: []string{"Content-Type", typeB, "Idempotency-Key", "mp-1"}},
				{name: "gzip then plain",
					first: gzipped(t, `{"order_id":"rs-4","amount":100}`, mtime), firstHdr: []string{"Content-Encoding", "gzip"},
					retry: `{"amount":100,"order_id":"rs-4"}`},
				{name: "gzip of another time",
					first: gzipped(t, `{"order_id":"rs-5","amount":100}`, mtime), firstHdr: []string{"Content-Encoding", "gzip"},
					retry: gzipped(t, `{"order_id":"rs-5","amount":100}`, mtime.Add(time.Second)), retryHdr: []string{"Content-Encoding", "gzip"}},
			}
			for _, c := range cases {
				a := e.do(t, "POST", "/payments", c.first, c.firstHdr...)
				if a.status != http.StatusBadGateway {
					t.Fatalf("%s: first try %d %s, want 502 upstream_unavailable", c.name, a.status, a.body)
				}
				key := a.header.Get(proxy.KeyHeader)
				for try := range 2 {
					a = e.do(t, "POST", "/payments", c.retry, c.retryHdr...)
					if a.status != http.StatusCreated || !bytes.Contains(a.body, []byte(`"pay_1"`)) {
						t.Fatalf("%s: retry %d: %d %s, want 201 with the payment", c.name, try+1, a.status, a.body)
					}
				}
				if n := requests.Swap(0); n != 2 {
					t.Fatalf("%s: the provider got %d requests, want 2 (the first try and one resume; the repeat replayed)", c.name, n)
				}
				rec, err := st.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: key})
				if err != nil || rec.State != store.Final || rec.Outcome.Sent != nil {
					t.Fatalf("%s: record %v (%v), bytes kept %v; want final, none kept", c.name, rec.State, err, rec.Outcome.Sent != nil)
				}
			}
			prov.mu.Lock()
			defer prov.mu.Unlock()
			if prov.execs != len(cases) {
				t.Errorf("the provider executed %d payments for %d orders", prov.execs, len(cases))
			}
		})
	}
}
