package main

// End-to-end tests of what a hostile or sloppy client sends, through the real
// binary: hop-by-hop lists naming idemproxy's own headers, trailers, odd
// methods, dot-segments, bodies sent slowly. Each asserts on what the
// provider received.

import (
	"bufio"
	"compress/gzip"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/idemproxy/idemproxy/sandbox"
)

// wireRequest is one request as the provider received it.
type wireRequest struct {
	Method, URI   string
	Host          string // the Host the request named
	Header        http.Header
	Trailer       http.Header
	ContentLength string // the Content-Length header; "" when none
	Chunked       bool
	Body          string
}

// recordingProvider records every request. It executes each request, but the
// first `drop` of them get no answer: the connection is closed after the body
// was read, so the proxy cannot know whether it acted (the case of defect 1).
type recordingProvider struct {
	mu   sync.Mutex
	drop int
	seen []wireRequest
}

func (p *recordingProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	wr := wireRequest{Method: r.Method, URI: r.RequestURI, Host: r.Host, Header: r.Header.Clone(), Trailer: r.Trailer.Clone(),
		ContentLength: r.Header.Get("Content-Length"), Chunked: len(r.TransferEncoding) > 0, Body: string(b)}
	p.mu.Lock()
	p.seen = append(p.seen, wr)
	drop := p.drop > 0
	if drop {
		p.drop--
	}
	n := len(p.seen)
	p.mu.Unlock()
	if drop {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"op_%d"}`, n)
}

func (p *recordingProvider) take() []wireRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.seen
	p.seen, p.drop = nil, 0
	return out
}

func (p *recordingProvider) dropNext(n int) {
	p.mu.Lock()
	p.drop = n
	p.mu.Unlock()
}

// sendRaw dials addr and writes raw, an HTTP/1.1 request with "\n" line
// ends, as bytes with "\r\n"; the connection has a minute's deadline, which
// only a hung binary reaches.
func sendRaw(t *testing.T, addr, raw string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(conn, strings.ReplaceAll(raw, "\n", "\r\n")); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return conn
}

// rawExchange writes raw, an HTTP/1.1 request as bytes, to addr and reads one
// answer. Raw bytes let a test send what Go's client would tidy up.
func rawExchange(t *testing.T, addr, raw string) reply {
	t.Helper()
	conn := sendRaw(t, addr, raw)
	defer conn.Close()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", raw, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

const hostileSecret = "hostile-test-signing-secret"

// hostileEnv runs the binary with signing, a nonce and a static credential,
// against a provider under the base path /provider-a.
func hostileEnv(t *testing.T, upstream string, extra ...string) []string {
	return append([]string{
		"IDEMPROXY_UPSTREAM_URL=" + upstream + "/provider-a",
		"IDEMPROXY_DATA_DIR=" + t.TempDir(),
		"IDEMPROXY_SIGN_SECRET=" + hostileSecret,
		"IDEMPROXY_NONCE_HEADER=X-Nonce",
		"IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-real",
		"IDEMPROXY_RETRY_BASE_DELAY=1ms",
		"IDEMPROXY_RETRY_MAX_DELAY=2ms",
	}, extra...)
}

// checkOwned fails unless w carries exactly idemproxy's own headers: the key
// (want), one valid signature of this request, the configured credential, and
// no client copy of any of them.
func checkOwned(t *testing.T, w wireRequest, wantKey string) {
	t.Helper()
	if got := w.Header.Values("Idempotency-Key"); len(got) != 1 || got[0] != wantKey {
		t.Errorf("%s %s: Idempotency-Key %q upstream, want exactly %q", w.Method, w.URI, got, wantKey)
	}
	if got := w.Header.Values("X-Public-Id"); len(got) != 1 || got[0] != "pub-real" {
		t.Errorf("%s %s: X-Public-Id %q upstream, want the configured one only", w.Method, w.URI, got)
	}
	for _, name := range []string{"X-Signature", "X-Timestamp", "X-Nonce"} {
		if got := w.Header.Values(name); len(got) != 1 || strings.Contains(got[0], "forged") {
			t.Errorf("%s %s: %s %q upstream, want one of idemproxy's", w.Method, w.URI, name, got)
		}
	}
	if len(w.Header.Values("X-Idempotency-Key")) > 0 || len(w.Trailer) > 0 {
		t.Errorf("%s %s: client's X-Idempotency-Key or trailers upstream: %v %v", w.Method, w.URI, w.Header, w.Trailer)
	}
	path, _, _ := strings.Cut(w.URI, "?")
	mac := hmac.New(sha256.New, []byte(hostileSecret))
	fmt.Fprintf(mac, "%s\n%s\n%s\n%s", w.Header.Get("X-Timestamp"), w.Method, path, w.Body)
	if got := w.Header.Get("X-Signature"); got != hex.EncodeToString(mac.Sum(nil)) {
		t.Errorf("%s %s: signature %q does not verify", w.Method, w.URI, got)
	}
}

// Headers idemproxy owns (key, signature, timestamp, nonce, static
// credential) reach the provider on every attempt, whatever hop-by-hop list,
// duplicate or forged copy the client sends. Before the fix, "Connection:
// Idempotency-Key" sent both attempts of a dropped operation without a key.
func TestHostileHopByHopHeaders(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL)...)
	owned := []string{"Idempotency-Key", "X-Signature", "X-Timestamp", "X-Nonce", "X-Public-Id"}
	cases := []struct {
		name    string
		headers string // extra raw header lines
		key     string // the app's own key; "" derives one from order_id
	}{
		{"Connection names the key", "Connection: Idempotency-Key\n", ""},
		{"Connection names the app's own key", "Idempotency-Key: app-key-1\nConnection: keep-alive, Idempotency-Key\n", "app-key-1"},
		{"Connection names every owned header", "Connection: " + strings.Join(owned, ", ") + "\n", ""},
		{"lower-case list", "Connection: idempotency-key, x-signature, x-public-id\n", ""},
		{"upper-case list", "Connection: IDEMPOTENCY-KEY,X-NONCE\n", ""},
		{"two Connection lines", "Connection: keep-alive\nConnection: Idempotency-Key, X-Timestamp\n", ""},
		{"forged copies", "X-Signature: forged\nX-Timestamp: forged\nX-Nonce: forged\nX-Public-Id: forged\nX-Idempotency-Key: forged\n", ""},
		{"forged copies, listed", "X-Signature: forged\nX-Public-Id: forged\nConnection: X-Signature, X-Public-Id, Idempotency-Key\n", ""},
		{"duplicated forged copies", "X-Signature: forged\nx-signature: forged-too\nX-Public-Id: forged\nX-Public-Id: forged-2\n", ""},
		{"app key, duplicated identical", "Idempotency-Key: app-key-2\nIdempotency-Key: app-key-2\nConnection: Idempotency-Key\n", "app-key-2"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prov.dropNext(1) // the first attempt executes and loses its answer
			body := fmt.Sprintf(`{"order_id":"atk-%d","amount":"1.00"}`, i)
			got := rawExchange(t, p.addr, fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n%s\n%s",
				len(body), c.headers, body))
			if got.status != http.StatusCreated {
				t.Fatalf("answer %d %s", got.status, got.body)
			}
			want := got.header.Get("Idempotency-Key")
			if c.key != "" && want != c.key {
				t.Errorf("answer names key %q, want the app's %q", want, c.key)
			}
			seen := prov.take()
			if len(seen) != 2 {
				t.Fatalf("provider saw %d attempts, want 2 (one dropped, one answered)", len(seen))
			}
			for _, w := range seen {
				checkOwned(t, w, want)
			}
		})
	}
}

// No trailer reaches the provider, and an empty body goes as Content-Length:
// 0. Declared trailers are refused with nothing sent; undeclared ones are
// dropped. Before the fix, forged trailers reached the provider on an empty
// chunked body, and the empty body went chunked.
func TestHostileTrailersAndEmptyBody(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL)...)
	refused := []struct{ name, raw string }{
		{"declared, chunked, empty body", "POST /cards/c1/close HTTP/1.1\nHost: x\nIdempotency-Key: k-close-1\nTransfer-Encoding: chunked\nTrailer: X-Signature, Idempotency-Key\n\n0\nX-Signature: forged\nIdempotency-Key: other\n\n"},
		{"declared, fixed body", "POST /cards HTTP/1.1\nHost: x\nContent-Length: 19\nTrailer: X-Signature\n\n{\"order_id\":\"tr-2\"}"},
		{"declared on a GET", "GET /cards/c1 HTTP/1.1\nHost: x\nTrailer: X-Signature\nTransfer-Encoding: chunked\n\n0\nX-Signature: forged\n\n"},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			got := rawExchange(t, p.addr, c.raw)
			if got.status != http.StatusBadRequest || !strings.Contains(got.body, `"bad_request"`) {
				t.Errorf("answer %d %s, want 400 bad_request", got.status, got.body)
			}
			if seen := prov.take(); len(seen) != 0 {
				t.Errorf("provider received %d requests: %+v", len(seen), seen)
			}
		})
	}
	passed := []struct{ name, raw, length string }{
		{"chunked empty body", "POST /cards/c1/close HTTP/1.1\nHost: x\nIdempotency-Key: k-close-3\nTransfer-Encoding: chunked\n\n0\n\n", "0"},
		{"no body at all", "POST /cards/c1/close HTTP/1.1\nHost: x\nIdempotency-Key: k-close-4\n\n", "0"},
		{"Content-Length 0", "POST /cards/c1/close HTTP/1.1\nHost: x\nIdempotency-Key: k-close-5\nContent-Length: 0\n\n", "0"},
		// Undeclared trailers are dropped by net/http's server before idemproxy sees them.
		{"undeclared trailers, empty body", "POST /cards/c1/close HTTP/1.1\nHost: x\nIdempotency-Key: k-close-2\nTransfer-Encoding: chunked\n\n0\nX-Signature: forged\nIdempotency-Key: other\n\n", "0"},
		{"undeclared trailers, with body", "POST /cards HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n\n13\n{\"order_id\":\"tr-1\"}\n0\nX-Public-Id: forged\nIdempotency-Key: other\n\n", "19"},
	}
	for _, c := range passed {
		t.Run(c.name, func(t *testing.T) {
			prov.dropNext(1)
			got := rawExchange(t, p.addr, c.raw)
			if got.status != http.StatusCreated {
				t.Fatalf("answer %d %s", got.status, got.body)
			}
			seen := prov.take()
			if len(seen) != 2 {
				t.Fatalf("provider saw %d attempts, want 2", len(seen))
			}
			for _, w := range seen {
				checkOwned(t, w, got.header.Get("Idempotency-Key"))
				if w.Chunked || w.ContentLength != c.length {
					t.Errorf("body went chunked=%v Content-Length=%q, want Content-Length: %s", w.Chunked, w.ContentLength, c.length)
				}
			}
		})
	}
}

// A method is protected whatever a client makes of it: non-upper-case
// methods, TRACE, CONNECT and method override headers are refused with
// nothing sent. Before the fix, "post" went three times without a key.
func TestHostileMethods(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL)...)
	body := `{"order_id":"m-1"}`
	cases := []struct {
		name, method, extra string
		status              int
	}{
		{"lower case", "post", "", http.StatusBadRequest},
		{"mixed case", "Post", "", http.StatusBadRequest},
		{"lower-case get", "get", "", http.StatusBadRequest},
		{"TRACE", "TRACE", "", http.StatusMethodNotAllowed},
		{"TRACK", "TRACK", "", http.StatusMethodNotAllowed},
		{"override on GET", "GET", "X-HTTP-Method-Override: POST\n", http.StatusBadRequest},
		{"X-HTTP-Method on GET", "GET", "X-HTTP-Method: POST\n", http.StatusBadRequest},
		{"X-Method-Override on POST", "POST", "x-method-override: DELETE\n", http.StatusBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for range 3 { // a legacy app's blind retries
				got := rawExchange(t, p.addr, fmt.Sprintf("%s /v1/payout HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n%s\n%s",
					c.method, len(body), c.extra, body))
				if got.status != c.status {
					t.Errorf("answer %d %s, want %d", got.status, got.body, c.status)
				}
			}
			if seen := prov.take(); len(seen) != 0 {
				t.Errorf("provider received %d requests, want none: %+v", len(seen), seen)
			}
		})
	}
	t.Run("CONNECT", func(t *testing.T) {
		got := rawExchange(t, p.addr, "CONNECT other.example:443 HTTP/1.1\nHost: other.example:443\n\n")
		if got.status/100 != 4 || len(prov.take()) != 0 {
			t.Errorf("CONNECT: %d, want a 4xx and nothing sent", got.status)
		}
	})
}

// Nothing reaches a path outside the upstream base path: dot-segments, plain
// or percent-encoded or hidden behind encoded slashes, are refused with 400
// and nothing sent. Paths whose dots are not segments pass.
func TestHostileDotSegments(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL)...)
	refused := []string{
		"/../provider-b/admin",
		"/%2e%2e/provider-b/admin",
		"/%2E%2e/provider-b/admin",
		"/.%2e/provider-b/admin",
		"//x/../../provider-b/admin",
		"/x/..%2fprovider-b",
		"/x/..%5C..%5Cprovider-b",
		"/./x",
		"/x/%2e",
		"/x/..",
		// Path parameters, which servlet containers drop before resolving.
		"/x/..;/provider-b",
		"/..;jsessionid=1/provider-b/admin",
		"/x/%2e%2e;/provider-b",
		"/x/..%3b/provider-b",
		"/.;x/y",
		// Decoded, a query or fragment delimiter (or a NUL a C-string
		// upstream stops at) ends the segment at the dots: an upstream
		// that decodes the path and parses it again sees "..".
		"/x/%2e%2e%3f/y",
		"/x/..%3Fa=1/provider-b",
		"/x/..%23/provider-b",
		"/x/.%23frag/y",
		"/x/..%00/provider-b",
	}
	for _, path := range refused {
		for _, method := range []string{"GET", "POST"} {
			got := rawExchange(t, p.addr, fmt.Sprintf("%s %s HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: 18\n\n{\"order_id\":\"d-1\"}", method, path))
			if got.status != http.StatusBadRequest || !strings.Contains(got.body, `"bad_request"`) {
				t.Errorf("%s %s: %d %s, want 400 bad_request", method, path, got.status, got.body)
			}
		}
	}
	if seen := prov.take(); len(seen) != 0 {
		t.Errorf("provider received %d requests, want none: %+v", len(seen), seen)
	}
	for _, path := range []string{"/v1/file.json", "/cards/a%2Fb", "/x/.../y", "/x/..y", "/x/.hidden", "/x/a;b", "/x/..a;b"} {
		got := rawExchange(t, p.addr, fmt.Sprintf("GET %s HTTP/1.1\nHost: x\n\n", path))
		seen := prov.take()
		if got.status != http.StatusCreated || len(seen) != 1 || seen[0].URI != "/provider-a"+path {
			t.Errorf("GET %s: %d, provider saw %+v; want it forwarded under /provider-a", path, got.status, seen)
		}
	}
}

// Requests net/http's server refuses before idemproxy's handler runs (a
// control character in the key, two Host headers, headers over 64 KiB) get
// idemproxy's JSON error, not net/http's text/plain, and nothing is sent.
func TestHostileMalformedHeaders(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL)...)
	body := `{"order_id":"mh-1"}`
	cases := []struct {
		name, headers string
		status        int
	}{
		{"control character in the key", "Idempotency-Key: k\x01ey\n", http.StatusBadRequest},
		{"two Host headers", "Host: other.example\n", http.StatusBadRequest},
		{"headers over 64 KiB", "X-Big: " + strings.Repeat("a", 80<<10) + "\n", http.StatusRequestHeaderFieldsTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := rawExchange(t, p.addr, fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\n%sContent-Type: application/json\nContent-Length: %d\n\n%s",
				c.headers, len(body), body))
			if got.status != c.status || got.header.Get("Content-Type") != "application/json" ||
				!strings.HasPrefix(got.body, `{"error":{"code":"bad_request","message":"`) {
				t.Errorf("answer %d %q %s, want %d application/json bad_request", got.status, got.header.Get("Content-Type"), got.body, c.status)
			}
		})
	}
	if seen := prov.take(); len(seen) != 0 {
		t.Errorf("provider received %d requests, want none: %+v", len(seen), seen)
	}
}

// No request reaches any server but the configured upstream, under its base
// path, whatever the client names: a Host header or forwarding headers
// naming another server are not followed (the provider gets its own host,
// and no forwarding header), a path that starts with "//host" stays a path,
// and absolute-form request targets (forward-proxy use), to another server
// or to the upstream itself, are 400 bad_request with nothing sent anywhere.
func TestHostileHostAndAbsoluteForm(t *testing.T) {
	prov, other := &recordingProvider{}, &recordingProvider{}
	up, ou := httptest.NewServer(prov), httptest.NewServer(other)
	defer up.Close()
	defer ou.Close()
	p := startBinary(t, hostileEnv(t, up.URL)...)
	upHost, otherHost := strings.TrimPrefix(up.URL, "http://"), strings.TrimPrefix(ou.URL, "http://")
	body := `{"order_id":"host-1"}`
	for _, c := range []struct{ name, raw, uri string }{
		{"Host of another server", "GET /x HTTP/1.1\nHost: " + otherHost + "\n\n", "/provider-a/x"},
		{"forwarding headers", "GET /x HTTP/1.1\nHost: " + otherHost + "\nX-Forwarded-Host: " + otherHost +
			"\nForwarded: host=" + otherHost + ";proto=https\nX-Forwarded-Proto: https\nX-Forwarded-For: 10.0.0.1\n\n", "/provider-a/x"},
		{"protected, Host of another server", fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: %s\nX-Forwarded-Host: %s\nContent-Type: application/json\nContent-Length: %d\n\n%s",
			otherHost, otherHost, len(body), body), "/provider-a/v1/payout"},
		{"path that looks like an authority", "GET //" + otherHost + "/x HTTP/1.1\nHost: x\n\n", "/provider-a//" + otherHost + "/x"},
		{"HTTP/1.0 without Host", "GET /x HTTP/1.0\n\n", "/provider-a/x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := rawExchange(t, p.addr, c.raw)
			seen := prov.take()
			if got.status != http.StatusCreated || len(seen) != 1 {
				t.Fatalf("answer %d %s, provider saw %d requests; want it forwarded once", got.status, got.body, len(seen))
			}
			if seen[0].URI != c.uri || seen[0].Host != upHost {
				t.Errorf("provider saw %s %s with Host %q, want %s with Host %q", seen[0].Method, seen[0].URI, seen[0].Host, c.uri, upHost)
			}
			for _, h := range forwardingHeaderNames {
				if v := seen[0].Header.Values(h); len(v) > 0 {
					t.Errorf("%s: %q reached the provider", h, v)
				}
			}
		})
	}
	for _, target := range []string{ou.URL + "/x", "https://" + otherHost + "/x", up.URL + "/provider-a/x", "http://" + upHost + "/x"} {
		for _, method := range []string{"GET", "POST"} {
			got := rawExchange(t, p.addr, fmt.Sprintf("%s %s HTTP/1.1\nHost: %s\nContent-Type: application/json\nContent-Length: %d\n\n%s",
				method, target, otherHost, len(body), body))
			if got.status != http.StatusBadRequest || !strings.Contains(got.body, `"bad_request"`) {
				t.Errorf("%s %s: %d %s, want 400 bad_request", method, target, got.status, got.body)
			}
		}
	}
	if a, b := prov.take(), other.take(); len(a)+len(b) != 0 {
		t.Errorf("absolute-form requests reached the provider (%d) or the other server (%d)", len(a), len(b))
	}
}

// An asterisk-form request target ("OPTIONS *", RFC 9112 §3.2.4) is a request
// target not starting with "/", which the contract answers 400 bad_request in
// idemproxy's JSON error shape (docs/contract.md, Errors). net/http answered
// "OPTIONS *" itself before any handler ran: 200 with no body, not JSON, no
// Cache-Control, and, with a body, the connection kept for what followed.
func TestHostileAsteriskTarget(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL)...)
	for _, raw := range []string{
		"OPTIONS * HTTP/1.1\nHost: x\n\n",
		"OPTIONS * HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}",
		"OPTIONS * HTTP/1.0\n\n",
		"GET * HTTP/1.1\nHost: x\n\n",
		"POST * HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: 21\n\n{\"order_id\":\"star-1\"}",
	} {
		got := rawExchange(t, p.addr, raw)
		if got.status != http.StatusBadRequest || got.header.Get("Content-Type") != "application/json" ||
			got.header.Get("Cache-Control") != "no-store" || !strings.Contains(got.body, `"code":"bad_request"`) {
			t.Errorf("%q: %d %v %q, want 400 bad_request as JSON with Cache-Control: no-store", raw, got.status, got.header, got.body)
		}
	}
	if seen := prov.take(); len(seen) != 0 {
		t.Errorf("provider received %d requests, want none: %+v", len(seen), seen)
	}
}

var forwardingHeaderNames = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// A client's copy of a header idemproxy owns never reaches the provider
// under an underscore spelling either (Idempotency_Key, X_Signature,
// X_Public_Id, the client token's): servers that map header names to
// CGI-style variables (Rack, WSGI, PHP: HTTP_IDEMPOTENCY_KEY) read
// Idempotency_Key as Idempotency-Key, so a copy would stand beside, or in
// place of, the one idemproxy set (Puma's CVE-2024-45614). Before the fix
// every one of them went upstream, on every attempt.
func TestHostileUnderscoreSpellings(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_CLIENT_TOKENS=app-a="+tokenA, "IDEMPROXY_KEY_SECRET="+keySecret)...)
	owned := []string{"Idempotency-Key", "X-Idempotency-Key", "X-Signature", "X-Timestamp", "X-Nonce", "X-Public-Id", "Idemproxy-Client-Token"}
	forged := "Idempotency_Key: forged\nidempotency_key: forged\nX_Idempotency_Key: forged\nX_Signature: forged\nx-signature_: kept\n" +
		"X_Timestamp: forged\nX_NONCE: forged\nX_Public_Id: forged\nX-Public_Id: forged\nIdemproxy_Client_Token: " + tokenA + "\nX_Other_Header: kept\n"
	body := `{"order_id":"us-1"}`
	for _, raw := range []string{
		fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nIdemproxy-Client-Token: %s\nContent-Type: application/json\nContent-Length: %d\n%s\n%s", tokenA, len(body), forged, body),
		fmt.Sprintf("GET /v1/payout/p-1 HTTP/1.1\nHost: x\nIdemproxy-Client-Token: %s\n%s\n", tokenA, forged),
	} {
		prov.dropNext(1) // two attempts: the retry carries what the first did
		got := rawExchange(t, p.addr, raw)
		seen := prov.take()
		if got.status != http.StatusCreated || len(seen) != 2 {
			t.Fatalf("answer %d %s, provider saw %d attempts; want 201 after 2", got.status, got.body, len(seen))
		}
		for _, w := range seen {
			kept := 0
			for name, vals := range w.Header {
				if !strings.Contains(name, "_") {
					continue
				}
				dashed := strings.ReplaceAll(name, "_", "-")
				if slices.ContainsFunc(owned, func(o string) bool { return strings.EqualFold(o, dashed) }) {
					t.Errorf("%s %s: %s: %q reached the provider", w.Method, w.URI, name, vals)
				} else {
					kept++
				}
			}
			if kept != 2 {
				t.Errorf("%s %s: %d other underscore headers reached the provider, want X_Other_Header and x-signature_: %v", w.Method, w.URI, kept, w.Header)
			}
		}
	}
}

// halfClosedExchange writes raw, a whole request, to addr, then shuts down
// its write side, as HTTP/1.0-era clients and `nc -N` do once the request is
// sent, and returns every byte the proxy wrote back before closing.
func halfClosedExchange(t *testing.T, addr, raw string) string {
	t.Helper()
	conn := sendRaw(t, addr, raw)
	defer conn.Close()
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(conn)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading after the half-close: %v", err)
	}
	return string(b)
}

// A client that shuts down its write side once its request is sent is
// taken for gone (net/http cancels the request at the end of its input), and
// sees nothing, as docs/contract.md says of every client that leaves: no
// made-up answer. Before the fix it was answered 499 client_closed_request,
// a 4xx SPEC's error table does not have, while its payment went on to be
// made; an app that takes an unknown 4xx as final marks the order failed. A
// dropped connection is what a legacy app retries, and its retry gets the
// stored answer.
func TestHostileHalfClosedClientSeesNoMadeUpAnswer(t *testing.T) {
	prov := newHeldProvider(2)
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir())
	body := `{"order_id":"half-closed-1","amount":"7.00"}`
	req := fmt.Sprintf("POST /v1/payments HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", len(body), body)
	if got := halfClosedExchange(t, p.addr, req); got != "" {
		t.Errorf("the half-closed client was answered %q, want nothing", got)
	}
	close(prov.release)
	got := rawExchange(t, p.addr, req)
	if got.status != http.StatusCreated || !strings.Contains(got.body, `"succeeded"`) {
		t.Fatalf("retry = %d %s, want the payment's 201", got.status, got.body)
	}
	key := got.header.Get("Idempotency-Key")
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs[key] != 1 || len(prov.execs) != 1 {
		t.Errorf("provider executions %v, want one of %s", prov.execs, key)
	}
	if !strings.Contains(p.logText(), `"outcome":"client_gone"`) {
		t.Errorf("no client_gone line in the log:\n%s", p.logText())
	}
}

// So is a half-closed client of an unprotected request: the attempt is
// cancelled as for any client that left, and nothing is written back.
// Before the fix it got 499 client_closed_request.
func TestHostileHalfClosedClientUnprotected(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // held until idemproxy gives up the attempt
	}))
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir())
	if got := halfClosedExchange(t, p.addr, "GET /v1/payments/pay-1 HTTP/1.1\nHost: x\n\n"); got != "" {
		t.Errorf("the half-closed client was answered %q, want nothing", got)
	}
}

// gzipProvider compresses its answers for a request that accepts gzip, as a
// provider behind a compressing gateway does. Its first answer to each key
// is the payouts provider's retriable 409 payout.funds_maturing; the next
// one executes the payout.
type gzipProvider struct {
	mu    sync.Mutex
	seen  map[string]int
	execs int
}

func (p *gzipProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	p.mu.Lock()
	p.seen[r.Header.Get("Idempotency-Key")]++
	first := p.seen[r.Header.Get("Idempotency-Key")] == 1
	if !first {
		p.execs++
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	status, body := http.StatusCreated, `{"id":"po_1","status":"succeeded"}`
	if first {
		status, body = http.StatusConflict, `{"error":{"code":"payout.funds_maturing","message":"funds are maturing"}}`
	}
	var out io.Writer = w
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		defer zw.Close()
		out = zw
	}
	w.WriteHeader(status)
	io.WriteString(out, body)
}

// A protected request's answer is read and stored as plain bytes whatever
// Accept-Encoding the app sent: the app's Accept-Encoding never reaches the
// provider on a protected request (Go's transport asks for gzip and decodes
// it). Before the fix, an app's "Accept-Encoding: gzip" went upstream, so
// the retriable 409 payout.funds_maturing came compressed, its code could not
// be read, and it was stored as the payout's final answer; and a stored gzip
// answer was replayed, Content-Encoding: gzip, to apps that never asked for it.
func TestHostileAcceptEncodingNotStored(t *testing.T) {
	prov := &gzipProvider{seen: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_RETRY_BASE_DELAY=1ms", "IDEMPROXY_RETRY_MAX_DELAY=2ms")
	body := `{"order_id":"gz-1","amount":"9.00"}`
	const want = `{"id":"po_1","status":"succeeded"}`
	for _, ae := range []string{"Accept-Encoding: gzip\n", "Accept-Encoding: gzip, deflate, br\n", ""} {
		got := rawExchange(t, p.addr, fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\n%sContent-Type: application/json\nContent-Length: %d\n\n%s",
			ae, len(body), body))
		if got.status != http.StatusCreated || got.body != want || got.header.Get("Content-Encoding") != "" {
			t.Errorf("%q: answer %d Content-Encoding %q %q, want 201 %s as is", ae, got.status, got.header.Get("Content-Encoding"), got.body, want)
		}
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs != 1 {
		t.Errorf("the payout was executed %d times, want once", prov.execs)
	}
}

// A reject rule cannot be passed by spelling its path as servers commonly
// route it the same: an encoded slash or backslash, repeated or trailing
// slashes, a path parameter, another letter case. Each is 405 with nothing
// sent, as the plain path is; other paths pass. Before the fix each of them
// was forwarded, to a provider that (behind nginx's merge_slashes and
// decoding, a servlet container, a lenient or case-insensitive router such
// as Express's default) serves /internal/admin.
func TestHostileRejectRuleSpellings(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_ROUTES=GET /internal/health=unprotected; * /internal/*=reject; POST /v1/refunds=reject")...)
	for _, path := range []string{
		"/internal/admin",
		"/internal%2Fadmin", "/internal%2fadmin", "/internal%5Cadmin", "/internal\\admin",
		"//internal/admin", "/internal//admin", "/internal/admin/", "///internal///admin//",
		"/internal;x/admin", "/internal/admin;jsessionid=1", "/;x/internal/admin",
		"/%69nternal/admin", "/internal%2F%2Fadmin%2F",
		"/v1/refunds/", "//v1/refunds", "/v1%2Frefunds", "/v1/refunds;x",
		"/Internal/admin", "/INTERNAL/ADMIN", "/V1/Refunds", "//v1/REFUNDS/",
	} {
		for _, method := range []string{"GET", "POST"} {
			body := `{"order_id":"rj-1"}`
			got := rawExchange(t, p.addr, fmt.Sprintf("%s %s HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", method, path, len(body), body))
			want := http.StatusMethodNotAllowed
			if method == "GET" && strings.Contains(strings.ToLower(path), "refunds") {
				want = http.StatusCreated // the refunds rule rejects POST only
			}
			if got.status != want {
				t.Errorf("%s %s: %d %s, want %d", method, path, got.status, got.body, want)
			}
		}
	}
	for _, w := range prov.take() {
		if w.Method != "GET" || !strings.Contains(strings.ToLower(w.URI), "refunds") {
			t.Errorf("%s %s reached the provider", w.Method, w.URI)
		}
	}
	// Paths no rule rejects still pass, whatever their spelling.
	for _, path := range []string{"/internal/health", "//internal/health", "/internal/a/b", "/internals/admin", "/cards/a%2Fb", "/v1/refunds/r-1"} {
		got := rawExchange(t, p.addr, fmt.Sprintf("GET %s HTTP/1.1\nHost: x\n\n", path))
		if seen := prov.take(); got.status != http.StatusCreated || len(seen) != 1 {
			t.Errorf("GET %s: %d %s, provider saw %d; want it forwarded", path, got.status, got.body, len(seen))
		}
	}
}

// A request target with a fragment is refused with nothing sent: a request
// never carries one (RFC 9112 §3.2), and net/http keeps it in the path, so
// it went upstream, signed, as /v1/payout%23x, a path the app never named,
// whose 404 was stored as the order's final answer.
func TestHostileFragmentInTarget(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL)...)
	body := `{"order_id":"frag-1"}`
	for _, target := range []string{"/v1/payout#x", "/v1/payout#", "/v1/payout?a=1#x", "/v1/payout/#/../admin"} {
		for _, method := range []string{"GET", "POST"} {
			got := rawExchange(t, p.addr, fmt.Sprintf("%s %s HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s",
				method, target, len(body), body))
			if got.status != http.StatusBadRequest || !strings.Contains(got.body, `"bad_request"`) {
				t.Errorf("%s %s: %d %s, want 400 bad_request", method, target, got.status, got.body)
			}
		}
	}
	if seen := prov.take(); len(seen) != 0 {
		t.Errorf("provider received %d requests, want none: %+v", len(seen), seen)
	}
}

// TestHostileSlowBodies: clients that send their headers and a kilobyte of a
// body declared at a megabyte, then stall, do not make the binary's other
// clients overloaded until the server's read timeout: they hold no slot of
// IDEMPROXY_MAX_INFLIGHT (taken once a body is read) and not the lengths they
// declared of IDEMPROXY_MAX_INFLIGHT_BYTES (reserved as the bytes come).
func TestHostileSlowBodies(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL="+up.URL, "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_MAX_INFLIGHT=2", "IDEMPROXY_MAX_INFLIGHT_BYTES=2097152") // two bodies of the 1 MiB cap
	pad := strings.Repeat("x", 1000<<10)
	for i := range 2 {
		body := fmt.Sprintf(`{"order_id":"stalled-%d","note":%q}`, i, pad)
		// 100 Continue comes when the proxy first reads the body: from
		// then on the client is stalled in it.
		conn := sendRaw(t, p.addr, fmt.Sprintf("POST /v1/payments HTTP/1.1\nHost: x\nContent-Type: application/json\nExpect: 100-continue\nContent-Length: %d\n\n", len(body)))
		defer conn.Close()
		if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("stalled client %d: %q, %v; want 100 Continue", i, line, err)
		}
		if _, err := io.WriteString(conn, body[:1<<10]); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post("http://"+p.addr+"/v1/payments", "application/json",
		strings.NewReader(fmt.Sprintf(`{"order_id":"normal","note":%q}`, pad[:600<<10])))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("an order next to two stalled clients: %d %s; want the provider's 201", resp.StatusCode, b)
	}
	if seen := prov.take(); len(seen) != 1 || !strings.Contains(seen[0].Body, `"order_id":"normal"`) {
		t.Errorf("the provider saw %d requests; want the order once", len(seen))
	}
}

// holdingProvider is a recordingProvider that holds a request to a path
// with "/held-" in it, after saying so on entered, until release is closed.
type holdingProvider struct {
	recordingProvider
	entered chan string
	release chan struct{}
}

func (p *holdingProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.Contains(r.URL.Path, "/held-") {
		p.entered <- r.URL.Path
		<-p.release
	}
	p.recordingProvider.ServeHTTP(w, r)
}

// stallRaw sends a POST of body to path whose first sent bytes only are
// written, and returns its connection and a reader of what comes back. It
// asks for 100-continue and waits for it: it comes when the proxy first
// reads the body, and from then on the client is stalled in it.
func stallRaw(t *testing.T, addr, path, key, body string, sent int) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn := sendRaw(t, addr, fmt.Sprintf("POST %s HTTP/1.1\nHost: x\nContent-Type: application/json\nIdempotency-Key: %s\nExpect: 100-continue\nContent-Length: %d\n\n", path, key, len(body)))
	t.Cleanup(func() { conn.Close() })
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("stalled client %s: %q, %v; want 100 Continue", path, line, err)
	}
	if blank, err := br.ReadString('\n'); err != nil || blank != "\r\n" {
		t.Fatalf("stalled client %s after 100 Continue: %q, %v", path, blank, err)
	}
	if _, err := io.WriteString(conn, body[:sent]); err != nil {
		t.Fatal(err)
	}
	return conn, br
}

// checkRefusedOverloaded fails unless a is 503 overloaded with Retry-After.
func checkRefusedOverloaded(t *testing.T, what string, a reply) {
	t.Helper()
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, `"code":"overloaded"`) || a.header.Get("Retry-After") == "" {
		t.Errorf("%s: %d %s, Retry-After %q; want 503 overloaded with Retry-After", what, a.status, a.body, a.header.Get("Retry-After"))
	}
}

// TestHostileSlowUnprotectedSignedBodies: with a signature over the body
// (the default template), an unprotected request is read whole before
// anything is sent, so clients that send headers and part of such a body,
// then stall, hold no slot of IDEMPROXY_MAX_INFLIGHT: another unprotected
// request and an order are served and signed. Before, an unprotected request
// took its slot at arrival, and two stalled clients made every other request
// 503 overloaded until the server's read timeout. The bound still holds when
// two requests are held at the provider: a third, and a stalled client
// whose body then comes whole, get 503 overloaded with Retry-After and
// nothing reaches the provider.
func TestHostileSlowUnprotectedSignedBodies(t *testing.T) {
	prov := &holdingProvider{entered: make(chan string, 2), release: make(chan struct{})}
	up := httptest.NewServer(prov)
	defer up.Close()
	release := sync.OnceFunc(func() { close(prov.release) })
	defer release()
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_MAX_INFLIGHT=2",
		"IDEMPROXY_ROUTES=POST /v1/lookup/*=unprotected")...)
	base := "http://" + p.addr
	lookup := func(id string) string {
		return fmt.Sprintf(`{"lookup_id":%q,"note":%q}`, id, strings.Repeat("x", 4<<10))
	}

	stalled, stalledAnswer := stallRaw(t, p.addr, "/v1/lookup/stalled-1", "k-stalled-1", lookup("stalled-1"), 100)
	stallRaw(t, p.addr, "/v1/lookup/stalled-2", "k-stalled-2", lookup("stalled-2"), 100)

	if a := send(t, http.MethodPost, base+"/v1/lookup/normal", lookup("normal"), "Idempotency-Key", "k-normal"); a.status != http.StatusCreated {
		t.Errorf("an unprotected request next to two stalled clients: %d %s; want the provider's 201", a.status, a.body)
	}
	if a := send(t, http.MethodPost, base+"/v1/payments", `{"order_id":"normal"}`, "Idempotency-Key", "k-order"); a.status != http.StatusCreated {
		t.Errorf("an order next to two stalled clients: %d %s; want the provider's 201", a.status, a.body)
	}

	// The order's slot is given back when its handler returns, which may be
	// just after its client has read the answer: wait for it, so that the
	// two requests below find both slots free. The stalled clients are in
	// their handlers too, reading their bodies (holding no slot).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := scrape(t, "http://"+p.admin+"/metrics")["idemproxy_requests_in_flight"]
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idemproxy_requests_in_flight = %v 10 s after the order's answer, want 2 (the stalled clients)", n)
		}
	}

	held := make(chan error, 2)
	for _, id := range []string{"held-1", "held-2"} {
		go func() {
			a, err := trySend(http.MethodPost, base+"/v1/lookup/"+id, lookup(id), "Idempotency-Key", "k-"+id)
			if err == nil && a.status != http.StatusCreated {
				err = fmt.Errorf("%s: %d %s; want the provider's 201", id, a.status, a.body)
			}
			held <- err
		}()
	}
	for range 2 {
		select {
		case <-prov.entered:
		case err := <-held:
			t.Fatalf("a request to hold at the provider was answered before reaching it: %v", err)
		}
	}
	checkRefusedOverloaded(t, "an unprotected request with two held at the provider",
		send(t, http.MethodPost, base+"/v1/lookup/past-bound", lookup("past-bound"), "Idempotency-Key", "k-past-bound"))
	checkRefusedOverloaded(t, "an order with two held at the provider",
		send(t, http.MethodPost, base+"/v1/payments", `{"order_id":"past-bound"}`, "Idempotency-Key", "k-order-past-bound"))
	if _, err := io.WriteString(stalled, lookup("stalled-1")[100:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(stalledAnswer, nil)
	if err != nil {
		t.Fatalf("the stalled client's answer once its body came: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkRefusedOverloaded(t, "a stalled client whose body came with two held at the provider", reply{resp.StatusCode, resp.Header, string(b)})

	release()
	for range 2 {
		if err := <-held; err != nil {
			t.Error(err)
		}
	}
	// Each once, with its key, signed over its body, sent with its length.
	want := map[string]string{"/provider-a/v1/lookup/normal": "k-normal", "/provider-a/v1/payments": "k-order",
		"/provider-a/v1/lookup/held-1": "k-held-1", "/provider-a/v1/lookup/held-2": "k-held-2"}
	for _, w := range prov.take() {
		key, ok := want[w.URI]
		if !ok {
			t.Errorf("the provider saw %s %s (%s), which it should not have, or not twice", w.Method, w.URI, w.Header.Get("Idempotency-Key"))
			continue
		}
		delete(want, w.URI)
		checkOwned(t, w, key)
		if w.Chunked || w.ContentLength != strconv.Itoa(len(w.Body)) {
			t.Errorf("%s upstream with Content-Length %q (chunked %v) for %d bytes", w.URI, w.ContentLength, w.Chunked, len(w.Body))
		}
	}
	if len(want) > 0 {
		t.Errorf("the provider never saw %v", slices.Collect(maps.Keys(want)))
	}
}

// goOrderProvider executes each Idempotency-Key once and reads order_id as a
// Go provider does (encoding/json into a struct, whose member keys match in
// any letter case, the last one winning; r.FormValue for forms), or, for a
// body with neither, from X-Order-Id as PHP reads HTTP_X_ORDER_ID behind a
// server that passes underscored names (X_Order_Id, sent last here, wins),
// counting executions per order.
type goOrderProvider struct {
	mu     sync.Mutex
	keys   map[string]bool
	orders map[string]int
}

func (p *goOrderProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var in struct {
		OrderID string `json:"order_id"`
	}
	if err := json.Unmarshal(b, &in); err != nil {
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		in.OrderID = r.FormValue("order_id")
	}
	if in.OrderID == "" {
		in.OrderID = r.Header.Get("X-Order-Id")
		if v := r.Header.Values("X_order_id"); len(v) > 0 {
			in.OrderID = v[len(v)-1]
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if key := r.Header.Get("Idempotency-Key"); !p.keys[key] {
		p.keys[key] = true
		p.orders[in.OrderID]++
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%q}`, in.OrderID)
}

// A body naming the order twice, once in another letter case, gives no key:
// a Go provider (and ASP.NET, Json.NET) reads the last of
// {"order_id":"c1","ORDER_ID":"c2"}, order c2, where idemproxy read c1. It was
// sent with c1's key, and the app's own request for c2 then went with c2's:
// order c2 executed twice, and c1 could no longer be placed (409
// idempotency_conflict with the first). Now it is 422 with nothing sent, as
// for a member repeated as written; a form field repeated in another letter
// case (ASP.NET reads form fields without regard to case) is the same, and so
// is a header source repeated with underscores for dashes.
func TestHostileKeySourceInAnotherSpelling(t *testing.T) {
	prov := &goOrderProvider{keys: map[string]bool{}, orders: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_KEY_SOURCES=json:order_id,form:order_id,header:X-Order-Id")...)
	post := func(ctype, body string, hdr ...string) reply {
		return rawExchange(t, p.addr, fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nContent-Type: %s\n%sContent-Length: %d\n\n%s",
			ctype, strings.Join(hdr, ""), len(body), body))
	}
	for _, c := range []struct {
		ctype, body string
		hdr         []string
	}{
		{"application/json", `{"order_id":"c1","ORDER_ID":"c2","amount":5}`, nil},
		{"application/json", `{"Order_Id":"c2","order_id":"c1","amount":5}`, nil},
		{"application/x-www-form-urlencoded", "order_id=c1&Order_ID=c2&amount=5", nil},
		{"application/json", `{"amount":5}`, []string{"X-Order-Id: h1\n", "X_Order_Id: h2\n"}},
	} {
		// The message says why a source that is there gave no key.
		if got := post(c.ctype, c.body, c.hdr...); got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) ||
			!strings.Contains(got.body, "given twice with different values") {
			t.Errorf("%s %q: %d %s, want 422 idempotency_key_missing saying a source was given twice", c.body, c.hdr, got.status, got.body)
		}
	}
	for _, order := range []string{"c1", "c2"} {
		body := fmt.Sprintf(`{"order_id":%q,"amount":5}`, order)
		if got := post("application/json", body); got.status != http.StatusCreated {
			t.Errorf("%s: %d %s, want 201", body, got.status, got.body)
		}
	}
	for _, order := range []string{"h1", "h2"} {
		if got := post("application/json", `{"amount":5}`, "X-Order-Id: "+order+"\n"); got.status != http.StatusCreated {
			t.Errorf("X-Order-Id %s: %d %s, want 201", order, got.status, got.body)
		}
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if want := map[string]int{"c1": 1, "c2": 1, "h1": 1, "h2": 1}; !maps.Equal(prov.orders, want) {
		t.Errorf("provider executed orders %v, want each once: %v", prov.orders, want)
	}
}

// An order whose key source is in the body but gives no one value (repeated
// with another value, also in another letter case, only in another letter
// case, or in JSON with data after the object) is 422 with nothing sent
// under IDEMPROXY_MISSING_KEY=generate and passthrough too, as under reject:
// the provider may read an order id from it. Under generate each blind
// retry of such a body went with a new random key, and the sandbox executed
// the order it read from {"order_id":"u1","order_id":"u1b"} (u1b) and from
// {"order_id":"u2","ORDER_ID":"u2b"} (u2) once per retry; under passthrough
// it went without a key every time.
func TestHostileUnreadableKeySourceUnderEveryPolicy(t *testing.T) {
	for _, policy := range []string{"generate", "passthrough"} {
		t.Run(policy, func(t *testing.T) {
			sb, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderPayments})
			p := startBinary(t, presetEnv(t, "payments", url, "IDEMPROXY_MISSING_KEY="+policy)...)
			post := func(body string) reply {
				return rawExchange(t, p.addr, fmt.Sprintf("POST /payments HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", len(body), body))
			}
			for _, body := range []string{
				`{"order_id":"u1","order_id":"u1b","amount":"10"}`,
				`{"order_id":"u2","ORDER_ID":"u2b","amount":"10"}`,
				`{"ORDER_ID":"u3","amount":"10"}`,
				`{"order_id":"u4","amount":"10"} {"order_id":"u4"}`,
			} {
				for try := 1; try <= 2; try++ { // the app's blind retry
					if got := post(body); got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) {
						t.Errorf("%s, try %d: %d %s, want 422 idempotency_key_missing", body, try, got.status, got.body)
					}
				}
			}
			// An order with one order_id is still one execution.
			for try := 1; try <= 2; try++ {
				if got := post(`{"order_id":"u5","amount":"10"}`); got.status != http.StatusCreated {
					t.Errorf("u5, try %d: %d %s, want 201", try, got.status, got.body)
				}
			}
			if l := sb.Ledger(); l.Executions != 1 || l.ByOrder["u5"] != 1 {
				t.Errorf("the sandbox executed %v (%d in all), want u5 once and nothing else", l.ByOrder, l.Executions)
			}
		})
	}
}

// decodingProvider decodes a gzip request body before goOrderProvider reads
// it, as a provider behind a gateway that decodes request bodies does.
type decodingProvider struct{ goOrderProvider }

func (p *decodingProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, "bad gzip", http.StatusBadRequest)
			return
		}
		r.Body = zr
	}
	p.goOrderProvider.ServeHTTP(w, r)
}

// An order whose body comes gzipped, from an app that writes the time into
// the gzip header as Python's gzip.compress does, is executed once however
// often the app sends it. Before the fix idemproxy could not read its
// order_id: with IDEMPROXY_MISSING_KEY=generate each try got a random key
// and the provider, which decodes the body, executed order gz-1 twice; and
// the app's own retry of order gz-2 under its own key, other bytes once
// compressed, was 409 idempotency_conflict instead of its answer.
func TestHostileGzippedOrder(t *testing.T) {
	prov := &decodingProvider{goOrderProvider{keys: map[string]bool{}, orders: map[string]int{}}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_MISSING_KEY=generate")...)
	post := func(order string, try int, hdr string) reply {
		var b strings.Builder
		zw := gzip.NewWriter(&b)
		zw.ModTime = time.Unix(1_800_000_000+int64(try), 0)
		fmt.Fprintf(zw, `{"order_id":%q,"amount":"5.00"}`, order)
		zw.Close()
		return rawExchange(t, p.addr, fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Encoding: gzip\n%sContent-Length: %d\n\n%s",
			hdr, b.Len(), b.String()))
	}
	for try := range 2 {
		for _, c := range []struct{ order, hdr string }{{"gz-1", ""}, {"gz-2", "Idempotency-Key: app-gz-2\n"}} {
			got := post(c.order, try, c.hdr)
			if got.status != http.StatusCreated || (try > 0 && got.header.Get("Idempotent-Replayed") != "true") {
				t.Errorf("%s try %d: %d %s, want 201 (a replay the second time)", c.order, try+1, got.status, got.body)
			}
		}
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if want := map[string]int{"gz-1": 1, "gz-2": 1}; !maps.Equal(prov.orders, want) {
		t.Errorf("provider executed orders %v, want each once: %v", prov.orders, want)
	}
}

// A card issue posted to a spelling of /cards that only a lenient router
// takes for it ("/cards/", "//cards", "/Cards") is 422 with nothing sent
// under IDEMPROXY_MISSING_KEY=generate, as under reject. The cards preset's
// fingerprint rule does not apply to such a path (POST is protected by
// default, and the defaults keep the key they derive), the defaults' order_id
// is not in a card body, and each blind retry got a new random key: behind a
// router that ignores a trailing slash, repeated slashes and letter case
// (Express, Spring, ASP.NET), the sandbox issued a card for every try (two for
// "/cards/" sent twice). The path as the rule writes it is still one card.
func TestHostileKeyedPathSpeltOtherwise(t *testing.T) {
	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderCards})
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(lenientRouter(sb))
	defer up.Close()
	p := startBinary(t, presetEnv(t, "cards", up.URL, "IDEMPROXY_MISSING_KEY=generate")...)
	post := func(path, body string) reply {
		return rawExchange(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", path, len(body), body))
	}
	if got := post("/cardholders", `{"external_id":"cust-1","name":"Ann"}`); got.status != http.StatusOK {
		t.Fatalf("cardholder: %d %s", got.status, got.body)
	}
	issue := `{"tariff_id":"t-1","holder_external_id":"cust-1","amount":"50"}`
	for _, path := range []string{"/cards/", "//cards", "/Cards"} {
		for try := 1; try <= 2; try++ {
			if got := post(path, issue); got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) {
				t.Errorf("%s, try %d: %d %s, want 422 idempotency_key_missing", path, try, got.status, got.body)
			}
		}
	}
	for try := 1; try <= 2; try++ {
		if got := post("/cards", issue); got.status != http.StatusOK {
			t.Errorf("/cards, try %d: %d %s, want 200", try, got.status, got.body)
		}
	}
	if l := sb.Ledger(); l.Executions != 2 { // the cardholder and one card
		t.Errorf("the sandbox executed %d operations, want 2 (the cardholder, one card)", l.Executions)
	}
}

// lenientRouter serves h under the path as a lenient router reads it
// (Express, Spring, ASP.NET Core, Rails): letter case ignored, repeated
// slashes merged, a trailing slash dropped.
func lenientRouter(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := strings.ToLower(r.URL.Path)
		for strings.Contains(p, "//") {
			p = strings.ReplaceAll(p, "//", "/")
		}
		if len(p) > 1 {
			p = strings.TrimSuffix(p, "/")
		}
		r.URL.Path, r.URL.RawPath = p, ""
		h.ServeHTTP(w, r)
	})
}

// One payment posted to /payments and again, as a retry from an app whose
// base URL gained or lost a slash, to /payments/, //payments or
// /payments//, is one operation: each later spelling is 409
// idempotency_conflict under the first's key, nothing sent. Its key is
// derived over the path with repeated and trailing slashes dropped. Before
// the fix each spelling derived its own key, and the payments sandbox
// behind a router that reads them all as /payments executed order sl-1 four
// times.
func TestHostileSlashSpellingsOfOneOrder(t *testing.T) {
	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderPayments})
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(lenientRouter(sb))
	defer up.Close()
	p := startBinary(t, presetEnv(t, "payments", up.URL)...)
	const order = `{"order_id":"sl-1","amount":"10.00","currency":"EUR"}`
	post := func(path string) reply {
		return rawExchange(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", path, len(order), order))
	}
	first := post("/payments")
	if first.status != http.StatusCreated {
		t.Fatalf("/payments: %d %s", first.status, first.body)
	}
	key := first.header.Get("Idempotency-Key")
	for _, path := range []string{"/payments/", "//payments", "/payments//"} {
		got := post(path)
		if got.status != http.StatusConflict || !strings.Contains(got.body, `"idempotency_conflict"`) || got.header.Get("Idempotency-Key") != key {
			t.Errorf("%s after /payments: %d %s key %s, want 409 idempotency_conflict under %s", path, got.status, got.body, got.header.Get("Idempotency-Key"), key)
		}
	}
	if l := sb.Ledger(); l.Executions != 1 || l.ByOrder["sl-1"] != 1 {
		t.Errorf("the sandbox executed %d operations (%v), want order sl-1 once", l.Executions, l.ByOrder)
	}
}

// utf16Provider reads a body sent as "charset=utf-16" as ASP.NET does,
// transcoded to UTF-8 (little-endian after its byte order mark, as .NET's
// Encoding.Unicode writes it), then as goOrderProvider.
type utf16Provider struct{ goOrderProvider }

func (p *utf16Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if strings.Contains(strings.ToLower(r.Header.Get("Content-Type")), "charset=utf-16") {
		b = []byte(strings.TrimPrefix(string(b), "\xff\xfe"))
		u := make([]uint16, len(b)/2)
		for i := range u {
			u[i] = binary.LittleEndian.Uint16(b[2*i:])
		}
		b = []byte(string(utf16.Decode(u)))
	}
	r.Body = io.NopCloser(strings.NewReader(string(b)))
	p.goOrderProvider.ServeHTTP(w, r)
}

// An order sent as JSON in UTF-16 (.NET's StringContent with
// Encoding.Unicode: "application/json; charset=utf-16") has a key source
// idemproxy cannot read: 422 with nothing sent under
// IDEMPROXY_MISSING_KEY=generate too, as under reject. It got a new random
// key on each blind retry, and a provider that reads UTF-16 as ASP.NET does
// executed order w16-1 twice.
func TestHostileUTF16Order(t *testing.T) {
	prov := &utf16Provider{goOrderProvider{keys: map[string]bool{}, orders: map[string]int{}}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_MISSING_KEY=generate")...)
	body := []byte{0xff, 0xfe}
	for _, r := range `{"order_id":"w16-1","amount":"5.00"}` {
		body = binary.LittleEndian.AppendUint16(body, uint16(r))
	}
	for try := 1; try <= 2; try++ {
		got := rawExchange(t, p.addr, fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nContent-Type: application/json; charset=utf-16\nContent-Length: %d\n\n%s", len(body), body))
		if got.status != http.StatusUnprocessableEntity || !strings.Contains(got.body, `"idempotency_key_missing"`) {
			t.Errorf("try %d: %d %s, want 422 idempotency_key_missing", try, got.status, got.body)
		}
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if len(prov.orders) != 0 {
		t.Errorf("provider executed orders %v, want none", prov.orders)
	}
}

// An order posted as multipart/form-data (curl -F, PHP's curl with an array
// of fields) is one order however often it is sent, though the client
// draws a new boundary each time. Before, with form:order_id among the key
// sources its order_id could not be read (422 on every try), and the app's
// own retry under its own key was 409 idempotency_conflict: the bodies
// differed by their boundaries.
func TestHostileMultipartOrder(t *testing.T) {
	prov := &goOrderProvider{keys: map[string]bool{}, orders: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_KEY_SOURCES=json:order_id,form:order_id")...)
	for try := range 2 {
		for _, c := range []struct{ order, key string }{{"mp-1", ""}, {"mp-2", "app-mp-2"}} {
			boundary := fmt.Sprintf("------------------------%d%s", try, c.order)
			body := fmt.Sprintf("--%s\r\nContent-Disposition: form-data; name=\"order_id\"\r\n\r\n%s\r\n"+
				"--%s\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n5.00\r\n--%s--\r\n", boundary, c.order, boundary, boundary)
			req, err := http.NewRequest(http.MethodPost, "http://"+p.addr+"/v1/payout", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "multipart/form-data; boundary="+boundary)
			if c.key != "" {
				req.Header.Set("Idempotency-Key", c.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || (try > 0 && resp.Header.Get("Idempotent-Replayed") != "true") {
				t.Errorf("%s try %d: %d %s, want 201 (a replay the second time)", c.order, try+1, resp.StatusCode, b)
			}
		}
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if want := map[string]int{"mp-1": 1, "mp-2": 1}; !maps.Equal(prov.orders, want) {
		t.Errorf("provider executed orders %v, want each once: %v", prov.orders, want)
	}
}

// Every refusal of a protected request that came with a valid key of its own
// carries that key in Idempotency-Key, as the app sent it (docs/contract.md,
// Headers idemproxy adds to answers), also when it is refused before its key
// is resolved: for its shape (declared trailers, a method override header, a
// dot-segment, an Upgrade, an ambiguous length, an absolute-form target), for
// its size (413) or for its client token (401). Nothing is sent upstream.
// Before, only the 413 carried it.
func TestHostileRefusalsEchoTheAppsKey(t *testing.T) {
	prov := &recordingProvider{}
	up := httptest.NewServer(prov)
	defer up.Close()
	const key = "{0F8FAD5B-D9CB-469F-A165-70867728950E}" // valid, not in its canonical spelling
	const order = `{"order_id":"echo-1","amount":"5.00"}`
	post := func(target, extra string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\nHost: x\nIdempotency-Key: %s\nContent-Type: application/json\n%sContent-Length: %d\n\n%s", target, key, extra, len(order), order)
	}
	check := func(t *testing.T, p *proc, name, raw string, status int, code string) {
		t.Helper()
		got := rawExchange(t, p.addr, raw)
		checkRefusal(t, prov, got, status, code)
		if v := got.header.Values("Idempotency-Key"); len(v) != 1 || v[0] != key {
			t.Errorf("%s: %d %s with Idempotency-Key %q, want the app's own %q", name, got.status, got.body, v, key)
		}
	}
	p := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_MAX_BODY_BYTES=1024")...)
	chunked := fmt.Sprintf("%x\n%s\n0\n\n", len(order), order)
	for _, c := range []struct {
		name, raw string
		status    int
		code      string
	}{
		{"declared trailers", post("/v1/payout", "Trailer: X-Signature\n"), http.StatusBadRequest, "bad_request"},
		{"method override", post("/v1/payout", "X-HTTP-Method-Override: DELETE\n"), http.StatusBadRequest, "bad_request"},
		{"dot-segment", post("/v1/refunds/../payout", ""), http.StatusBadRequest, "bad_request"},
		{"upgrade", post("/v1/payout", "Connection: Upgrade\nUpgrade: websocket\n"), http.StatusBadRequest, "upgrade_not_supported"},
		{"ambiguous length", fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nIdempotency-Key: %s\nTransfer-Encoding: chunked\nContent-Length: %d\n\n%s", key, len(chunked), chunked), http.StatusBadRequest, "bad_request"},
		{"absolute-form target", post("http://x/v1/payout", ""), http.StatusBadRequest, "bad_request"},
		{"body over the cap", fmt.Sprintf("POST /v1/payout HTTP/1.1\nHost: x\nIdempotency-Key: %s\nContent-Length: 4096\n\n%s", key, order), http.StatusRequestEntityTooLarge, "body_too_large"},
	} {
		check(t, p, c.name, c.raw, c.status, c.code)
	}
	tokens := startBinary(t, hostileEnv(t, up.URL, "IDEMPROXY_CLIENT_TOKENS=app-a=token-of-app-a-0123456789", "IDEMPROXY_KEY_SECRET=hostile-key-secret-0123456789")...)
	check(t, tokens, "no client token", post("/v1/payout", ""), http.StatusUnauthorized, "unauthorized")
}
