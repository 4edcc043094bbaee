package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
	"github.com/idemproxy/idemproxy/resign"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream"
)

const (
	fuzzSecret   = "fuzz-signing-secret"
	fuzzPublicID = "pub-configured"
	fuzzToken    = "fuzz-client-token-0123456789"
	fuzzBase     = "/base"
)

// wireSeen is one request as the recording upstream received it.
type wireSeen struct {
	method, uri string
	header      http.Header
	trailer     http.Header
	body        []byte
}

// recordingUpstream records every request and answers the status it is told.
type recordingUpstream struct {
	mu     sync.Mutex
	status int
	seen   []wireSeen
}

func (u *recordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.seen = append(u.seen, wireSeen{r.Method, r.RequestURI, r.Header.Clone(), r.Trailer.Clone(), b})
	status := u.status
	u.mu.Unlock()
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"status":"done","n":%d}`, len(b))
}

func (u *recordingUpstream) reset(status int) {
	u.mu.Lock()
	u.seen, u.status = nil, status
	u.mu.Unlock()
}

func (u *recordingUpstream) take() []wireSeen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen
}

// fuzzStatuses are the answers the upstream gives, chosen by the fuzzer.
var fuzzStatuses = []int{200, 201, 302, 400, 401, 403, 404, 408, 409, 422, 429, 500, 501, 502, 503, 524}

// FuzzHandler runs the whole handler in process, with the production chain
// (retry → sign → OneShot → wire) and a Badger store, against a recording
// upstream under a base path, for requests parsed from fuzzed bytes as
// net/http's server parses them: any method, path, headers (Connection,
// Trailer, duplicates, forged credentials) and body. Whatever the input:
//   - every attempt of a protected request carries exactly one key, the one
//     the app is told;
//   - no client signature, timestamp, nonce, credential, client token or
//     trailer reaches the upstream: each is idemproxy's own;
//   - no request reaches a path outside the base path;
//   - nothing is stored for a status that must not be.
func FuzzHandler(f *testing.F) {
	seeds := []struct {
		method, path, headers, body string
		status                      uint8
	}{
		{"POST", "/v1/payout", "Connection: Idempotency-Key\n", `{"order_id":"a"}`, 1},
		{"POST", "/v1/payout", "Idempotency-Key: k1\nConnection: keep-alive, Idempotency-Key, X-Signature\nX-Signature: forged\n", `{}`, 1},
		{"post", "/v1/payout", "", `{"order_id":"b"}`, 1},
		{"TRACE", "/v1/payout", "", "", 0},
		{"GET", "/v1/x", "X-HTTP-Method-Override: POST\n", "", 0},
		{"POST", "/../admin", "", `{"order_id":"c"}`, 1},
		{"GET", "/%2e%2e/admin", "", "", 0},
		{"POST", "//x/../../admin", "", `{"order_id":"d"}`, 1},
		{"POST", "/cards/c1/close", "Idempotency-Key: k2\nTrailer: X-Signature\n", "", 1},
		{"POST", "/cards", "X-Public-Id: forged\nX-Public-Id: forged2\nX-Nonce: n\nX-Timestamp: 1\n", `{"order_id":"e"}`, 10},
		{"POST", "/cards", "Idempotency-Key: k3\nIdempotency-Key: k4\n", `{}`, 12},
		{"POST", "/cards?order_id=q", "X-Idempotency-Key: other\n", ``, 13},
		{"PUT", "/v1/item", "Idempotency-Key: k5\nConnection: Idempotency-Key\n", `x`, 0},
		{"POST", "/v1/payout", "Transfer-Encoding: chunked\n", "", 5},
		{"DELETE", "/v1/a%2Fb", "Expect: 100-continue\n", "", 4},
	}
	for _, s := range seeds {
		f.Add(s.method, s.path, s.headers, []byte(s.body), s.status)
	}
	up := &recordingUpstream{}
	srv := httptest.NewServer(up)
	f.Cleanup(srv.Close)
	st, err := cache.Open(cache.Options{InMemory: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	h := fuzzHandler(f, srv.URL, st)

	f.Fuzz(func(t *testing.T, method, path, headers string, body []byte, statusPick uint8) {
		req := fuzzRequest(method, path, headers, body)
		if req == nil {
			return // net/http's server would have refused it before any handler
		}
		status := fuzzStatuses[int(statusPick)%len(fuzzStatuses)]
		up.reset(status)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		answerKey := rec.Header().Get(proxy.KeyHeader)
		for _, w := range up.take() {
			checkWire(t, w, answerKey, method)
		}
		if answerKey != "" {
			checkStored(t, st, answerKey, status)
		}
	})
}

// fuzzHandler builds the handler as main does: the production chain with
// signing, a nonce and a static credential, client tokens, a Badger store.
func fuzzHandler(f *testing.F, upURL string, st *cache.Store) http.Handler {
	u, _ := url.Parse(upURL + fuzzBase)
	static, _ := resign.ParseStaticHeaders("X-Public-Id=" + fuzzPublicID)
	statuses, _ := retry.ParseStatuses("429,500,502,503,504")
	chain, err := upstream.New(upstream.Config{
		Sign:   resign.Config{Secret: []byte(fuzzSecret), NonceHeader: "X-Nonce", StaticHeaders: static},
		Policy: retry.Policy{MaxAttempts: 2, BaseDelay: time.Microsecond, MaxDelay: time.Microsecond, Statuses: statuses},
	})
	if err != nil {
		f.Fatal(err)
	}
	clients, err := proxy.ParseClientTokens("", "app="+fuzzToken)
	if err != nil {
		f.Fatal(err)
	}
	sources, _ := idemkey.ParseSources("json:order_id,query:order_id")
	h, err := proxy.New(proxy.Options{Upstream: u, Transport: chain, Store: st, KeySources: sources,
		Clients: clients, KeySecret: []byte("fuzz-key-secret-0123"), InflightWait: time.Second})
	if err != nil {
		f.Fatal(err)
	}
	return h
}

// fuzzRequest builds the bytes of an HTTP/1.1 request and parses them as the
// server does; nil when they do not parse. The client token is always sent,
// so that requests reach the proxy's logic.
func fuzzRequest(method, path, headers string, body []byte) *http.Request {
	if strings.ContainsAny(method+path, " \r\n") || strings.Contains(headers, "\r") {
		return nil
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: proxy.test\r\nIdemproxy-Client-Token: %s\r\n", method, path, fuzzToken)
	for line := range strings.SplitSeq(headers, "\n") {
		if line != "" {
			b.WriteString(line + "\r\n")
		}
	}
	chunked := strings.Contains(strings.ToLower(headers), "transfer-encoding")
	if !chunked {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	if chunked {
		if len(body) > 0 {
			fmt.Fprintf(&b, "%x\r\n%s\r\n", len(body), body)
		}
		b.WriteString("0\r\nX-Signature: forged-trailer\r\n\r\n")
	} else {
		b.Write(body)
	}
	req, err := http.ReadRequest(bufio.NewReader(&b))
	if err != nil {
		return nil
	}
	req.RemoteAddr = "192.0.2.1:1234"
	return req.WithContext(context.Background())
}

// checkWire asserts what reached the upstream is idemproxy's to send.
func checkWire(t *testing.T, w wireSeen, answerKey, clientMethod string) {
	t.Helper()
	if w.method == http.MethodPost { // protected: every attempt carries the key
		keys := w.header.Values(proxy.KeyHeader)
		if len(keys) != 1 || keys[0] == "" {
			t.Fatalf("protected attempt %s %s with keys %q", w.method, w.uri, keys)
		}
		if answerKey != "" && keys[0] == answerKey {
			t.Fatalf("the app's key %q went upstream unbound", answerKey)
		}
	}
	if got := w.header.Values("X-Public-Id"); len(got) != 1 || got[0] != fuzzPublicID {
		t.Fatalf("X-Public-Id %q upstream, want only the configured one", got)
	}
	for _, name := range []string{"X-Signature", "X-Timestamp", "X-Nonce"} {
		if len(w.header.Values(name)) != 1 {
			t.Fatalf("%s %q upstream, want exactly idemproxy's", name, w.header.Values(name))
		}
	}
	if len(w.header.Values("Idemproxy-Client-Token")) > 0 || len(w.header.Values("X-Idempotency-Key")) > 0 || len(w.trailer) > 0 {
		t.Fatalf("a client credential or trailer reached the upstream: %v %v", w.header, w.trailer)
	}
	path, _, _ := strings.Cut(w.uri, "?")
	mac := hmac.New(sha256.New, []byte(fuzzSecret))
	fmt.Fprintf(mac, "%s\n%s\n%s\n%s", w.header.Get("X-Timestamp"), w.method, path, w.body)
	if w.header.Get("X-Signature") != hex.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("signature of %s %s does not verify: not idemproxy's", w.method, w.uri)
	}
	if w.method != clientMethod {
		t.Fatalf("client method %q went upstream as %q", clientMethod, w.method)
	}
	if !strings.HasPrefix(path, fuzzBase+"/") || leaves(path) {
		t.Fatalf("request reached %q, outside %s", w.uri, fuzzBase)
	}
}

// leaves reports a dot-segment, plain or encoded, that a server resolving
// the path would follow upwards.
func leaves(escaped string) bool {
	for seg := range strings.SplitSeq(escaped, "/") {
		dec, err := url.PathUnescape(seg)
		if err != nil {
			return true
		}
		for part := range strings.FieldsFuncSeq(dec, func(r rune) bool { return r == '/' || r == '\\' }) {
			if part == "." || part == ".." {
				return true
			}
		}
	}
	return false
}

// checkStored asserts a stored answer has a status that may be final.
func checkStored(t *testing.T, st *cache.Store, key string, upstreamStatus int) {
	t.Helper()
	rec, err := st.Get(context.Background(), store.ID{Tenant: "app", Key: key})
	if err != nil || rec.State != store.Final {
		return
	}
	s := rec.Response.Status
	storable := s >= 200 && s < 300 || s >= 400 && s < 500 && s != 401 && s != 403 && s != 408 && s != 429
	if !storable {
		t.Fatalf("status %d stored as final for key %s (upstream answered %d)", s, key, upstreamStatus)
	}
}
