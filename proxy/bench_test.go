package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/pgstore"
	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/resign"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream"
)

// BenchmarkPath measures one request through a whole proxy in-process: the
// handler's ServeHTTP with a real loopback upstream behind it (the upstream
// server runs in this process, so its allocations are in every figure).
// Compare allocs/op of idemproxy's cases with reverseproxy's, the plain
// httputil.ReverseProxy that bench/cmd/plainproxy runs as target B; direct is
// the client and upstream alone, so "case − direct" is what a proxy adds.
// Every idemproxy case uses the wiring of main.go (retry → resign → OneShot →
// pooled transport) and default settings.
func BenchmarkPath(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(benchUpstream))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	var seq atomic.Uint64
	newPost := func() *http.Request { return benchPost(target.Host, "o-"+strconv.FormatUint(seq.Add(1), 10)) }
	replay := func() *http.Request { return benchPost(target.Host, "r-"+strconv.FormatUint(seq.Add(1)%100, 10)) }
	get := func() *http.Request { return benchGet(target.Host) }

	b.Run("direct/GET", func(b *testing.B) { runDirect(b, get) })
	b.Run("direct/POST", func(b *testing.B) { runDirect(b, newPost) })
	b.Run("reverseproxy/GET", func(b *testing.B) { runHandler(b, plainProxy(target), get) })
	b.Run("reverseproxy/POST", func(b *testing.B) { runHandler(b, plainProxy(target), newPost) })
	b.Run("idemproxy/GET", func(b *testing.B) { runHandler(b, idemproxy(b, target, true, nil), get) })
	b.Run("idemproxy/POST-new-durable", func(b *testing.B) { runHandler(b, idemproxy(b, target, true, nil), newPost) })
	b.Run("idemproxy/POST-new-nosync", func(b *testing.B) { runHandler(b, idemproxy(b, target, false, nil), newPost) })
	b.Run("idemproxy/POST-new-nosync-signed", func(b *testing.B) {
		runHandler(b, idemproxy(b, target, false, paymentsSigning(b)), newPost)
	})
	// 64 concurrent requests, as target E at 64 connections: durable writes
	// share fsyncs (group commit) only under concurrency.
	b.Run("reverseproxy/POST-parallel64", func(b *testing.B) { runParallel(b, plainProxy(target), newPost) })
	b.Run("idemproxy/POST-new-durable-parallel64", func(b *testing.B) {
		runParallel(b, idemproxy(b, target, true, nil), newPost)
	})
	// Target P's path: the same on a PostgreSQL cluster of its own (fsync
	// on), with the statements' round trips on loopback.
	b.Run("idemproxy/POST-new-postgres-parallel64", func(b *testing.B) {
		runParallel(b, idemproxyOn(b, target, postgres(b), nil), newPost)
	})
	b.Run("idemproxy/POST-replay", func(b *testing.B) {
		h := idemproxy(b, target, true, nil)
		for i := range 100 { // store the operations replayed below
			serveOnce(b, h, benchPost(target.Host, "r-"+strconv.Itoa(i)), false)
		}
		runHandler(b, h, replay)
	})
}

// benchResponse is the upstream's answer: a typical small provider reply.
const benchResponse = `{"id":"pay_2c4f9a1e7b3d4e8f","object":"payment","status":"succeeded","amount":1000,"currency":"RUB","created":1732900000}`

// benchBody is a legacy app's payment call; order_id is the default key source.
const benchBody = `{"order_id":"%s","amount":1000,"currency":"RUB","description":"idembench payment","customer":{"id":"cus_0001","email":"buyer@example.com"}}`

func benchUpstream(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header()["Content-Type"] = []string{"application/json"}
	w.Header()["Content-Length"] = []string{strconv.Itoa(len(benchResponse))}
	io.WriteString(w, benchResponse)
}

// benchPost is an inbound request as net/http's server hands it to a handler.
func benchPost(host, orderID string) *http.Request {
	body := []byte(`{"order_id":"` + orderID + benchBody[len(`{"order_id":"%s`):])
	r := &http.Request{
		Method: http.MethodPost, URL: &url.URL{Path: "/v1/payments"}, RequestURI: "/v1/payments",
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Host: host, RemoteAddr: "127.0.0.1:50000",
		Header: http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json"},
			"Content-Length": {strconv.Itoa(len(body))}},
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
	}
	return r
}

func benchGet(host string) *http.Request {
	return &http.Request{
		Method: http.MethodGet, URL: &url.URL{Path: "/v1/payments/pay_1"}, RequestURI: "/v1/payments/pay_1",
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Host: host, RemoteAddr: "127.0.0.1:50000",
		Header: http.Header{"Accept": {"application/json"}}, Body: http.NoBody,
	}
}

// benchWriter is a ResponseWriter that keeps nothing but the status, so the
// writer costs the same in every case.
type benchWriter struct {
	h      http.Header
	status int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *benchWriter) WriteHeader(code int)        { w.status = code }

func serveOnce(b testing.TB, h http.Handler, r *http.Request, wantReplay bool) {
	if err := serveCheck(h, r, wantReplay); err != nil {
		b.Fatal(err)
	}
}

// serveCheck is serveOnce for goroutines other than the test's, which must
// not call t.Fatal: it returns what is wrong with the answer.
func serveCheck(h http.Handler, r *http.Request, wantReplay bool) error {
	w := &benchWriter{h: http.Header{}, status: http.StatusOK}
	h.ServeHTTP(w, r)
	if w.status != http.StatusOK {
		return fmt.Errorf("%s %s: status %d", r.Method, r.URL.Path, w.status)
	}
	if got := w.h.Get(proxy.ReplayedHeader) == "true"; got != wantReplay && r.Method == http.MethodPost {
		return fmt.Errorf("replayed = %v, want %v", got, wantReplay)
	}
	return nil
}

func runHandler(b *testing.B, h http.Handler, next func() *http.Request) {
	wantReplay := false
	if r := next(); r.Method == http.MethodPost && bytes.Contains(mustBody(r), []byte(`"r-`)) {
		wantReplay = true
	}
	b.ReportAllocs()
	for b.Loop() {
		serveOnce(b, h, next(), wantReplay)
	}
}

// runParallel serves from 64 goroutines and reports requests per second.
func runParallel(b *testing.B, h http.Handler, next func() *http.Request) {
	b.SetParallelism(max(64/runtime.GOMAXPROCS(0), 1))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			serveOnce(b, h, next(), false)
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

func mustBody(r *http.Request) []byte {
	b, _ := io.ReadAll(r.Body)
	return b
}

// runDirect sends the requests straight to the upstream with the same tuned
// transport the proxies use: the client and upstream cost alone.
func runDirect(b *testing.B, next func() *http.Request) {
	tr := upstream.NewWire()
	defer tr.CloseIdleConnections()
	b.ReportAllocs()
	for b.Loop() {
		r := next()
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.URL = &url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path}
		resp, err := tr.RoundTrip(out)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func plainProxy(target *url.URL) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: upstream.NewWire(),
	}
}

// idemproxy builds the handler as main.go's run does, with a fresh Badger
// directory; sign nil means the default (no signing secret).
func idemproxy(b testing.TB, target *url.URL, durable bool, sign *resign.Config) http.Handler {
	b.Helper()
	st, err := cache.Open(cache.Options{Dir: b.TempDir(), SyncWrites: durable, TTL: 72 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return idemproxyOn(b, target, st, sign)
}

// postgres opens a PostgreSQL store on a throwaway cluster with fsync on, as
// target P's; without PostgreSQL the benchmark is skipped.
func postgres(b testing.TB) store.Store {
	b.Helper()
	c, err := pgtest.Start(pgtest.Options{Fsync: true})
	if err != nil {
		b.Skipf("PostgreSQL: %v (%s)", err, pgtest.Install)
	}
	b.Cleanup(c.Remove)
	url, err := c.NewDatabase(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	st, err := pgstore.Open(context.Background(), pgstore.Options{URL: url, TTL: 72 * time.Hour, SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// idemproxyOn builds the handler as main.go's run does, on st.
func idemproxyOn(b testing.TB, target *url.URL, st store.Store, sign *resign.Config) http.Handler {
	b.Helper()
	if sign == nil {
		sign = &resign.Config{}
	}
	statuses, _ := retry.ParseStatuses("429,500,502,503,504")
	attempts, err := upstream.New(upstream.Config{
		Sign: *sign,
		Policy: retry.Policy{MaxAttempts: 5, BaseDelay: 500 * time.Millisecond, MaxDelay: time.Minute,
			Budget: 2 * time.Minute, AttemptTimeout: 30 * time.Second, Statuses: statuses,
			Codes: retry.ParseCodes("idempotency.in_progress,idempotency_in_progress,payout.funds_maturing,payout.frozen")},
		MaxResponseBytes: st.MaxBodyBytes(),
	})
	if err != nil {
		b.Fatal(err)
	}
	sources, _ := idemkey.ParseSources("json:order_id")
	h, err := proxy.New(proxy.Options{
		Upstream:   target,
		Transport:  attempts,
		Store:      st,
		KeySources: sources,
		Lease:      3 * time.Minute,
		// main.go always sets both bounds (limits.go): 1024 requests at
		// most, and 64 MiB of bodies where no memory limit is known.
		MaxInflight:      1024,
		MaxInflightBytes: 64 << 20,
	})
	if err != nil {
		b.Fatal(err)
	}
	return h
}

// paymentsSigning is the payments provider's scheme:
// timestamp, nonce, key and body hash.
func paymentsSigning(b testing.TB) *resign.Config {
	tmpl, err := resign.ParseTemplate(`{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`)
	if err != nil {
		b.Fatal(err)
	}
	return &resign.Config{Secret: []byte("bench-secret"), Template: tmpl, NonceHeader: "X-Nonce"}
}
