package resign_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/resign"
)

// base is the tests' fixed "now".
var base = time.Unix(1_700_000_000, 0)

// roundTripFunc is a hand-written http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

var _ http.RoundTripper = (*resign.Transport)(nil)

// clock returns a Now that yields the given times in turn, then the last.
func clock(times ...time.Time) func() time.Time {
	var mu sync.Mutex
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t := times[0]
		if len(times) > 1 {
			times = times[1:]
		}
		return t
	}
}

// nonces returns a NewNonce that yields the given nonces in turn, then the last.
func nonces(ns ...string) func() string {
	var mu sync.Mutex
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		n := ns[0]
		if len(ns) > 1 {
			ns = ns[1:]
		}
		return n
	}
}

func mustTemplate(t testing.TB, s string) *resign.Template {
	t.Helper()
	tmpl, err := resign.ParseTemplate(s)
	if err != nil {
		t.Fatalf("ParseTemplate(%q): %v", s, err)
	}
	return tmpl
}

func mustNew(t testing.TB, cfg resign.Config, next http.RoundTripper) *resign.Transport {
	t.Helper()
	tr, err := resign.New(cfg, next)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return tr
}

// configFor is the Transport configuration matching a provider scheme.
func configFor(t testing.TB, s scheme, template string) resign.Config {
	cfg := resign.Config{
		Secret:          s.secret,
		SignatureHeader: s.sigHeader,
		TimestampHeader: s.tsHeader,
		NonceHeader:     s.nonceHeader,
	}
	if template != "" {
		cfg.Template = mustTemplate(t, template)
	}
	if s.name == "cards" {
		cfg.Encoding = resign.EncodingBase64
	}
	if s.publicID != "" {
		cfg.StaticHeaders = http.Header{"X-Public-Id": {s.publicID}}
	}
	return cfg
}

func post(t testing.TB, rawURL, body, key string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, rawURL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return req
}

// send runs req through tr and returns the provider's error code ("" = 200).
func send(t *testing.T, tr http.RoundTripper, req *http.Request) string {
	t.Helper()
	res, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	return errorCode(t, res)
}

// TestProviderSchemes proves each provider's scheme against its independent
// verifier, over two attempts of one operation: both are accepted, and each
// carries its own timestamp, nonce and signature.
func TestProviderSchemes(t *testing.T) {
	tests := []struct {
		scheme   scheme
		template string // "" = the default
		path     string
	}{
		{payoutsScheme(), "", "/v1/payout"},
		{payoutsScheme(), `{timestamp}\n{method}\n{path}\n{body}`, "/v1/payout"},
		{paymentsScheme(), `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`, "/payments"},
		{cardsScheme(), `{timestamp}:{nonce}:{method}:{path}?{query}:{body_sha256}`, "/cards/c_1/topup?currency=EUR&amount=100"},
	}
	for _, tc := range tests {
		t.Run(tc.scheme.name+"/"+tc.template, func(t *testing.T) {
			p, srv := startProvider(t, tc.scheme, base.Add(10*time.Second))
			cfg := configFor(t, tc.scheme, tc.template)
			cfg.Now = clock(base, base.Add(7*time.Second))
			cfg.NewNonce = nonces("nonce-1", "nonce-2")
			tr := mustNew(t, cfg, nil) // nil Next: http.DefaultTransport
			body := `{"order_id":"o-1","amount":100}`
			for attempt := 1; attempt <= 2; attempt++ {
				if code := send(t, tr, post(t, srv.URL+tc.path, body, "key-1")); code != "" {
					t.Fatalf("attempt %d rejected: %s", attempt, code)
				}
			}
			got := p.accepted()
			a, b := got[0].header, got[1].header
			for _, h := range []string{tc.scheme.sigHeader, tc.scheme.tsHeader, tc.scheme.nonceHeader} {
				if h != "" && a.Get(h) == b.Get(h) {
					t.Errorf("%s repeated across attempts: %q", h, a.Get(h))
				}
			}
			if a.Get(tc.scheme.tsHeader) != "1700000000" || b.Get(tc.scheme.tsHeader) != "1700000007" {
				t.Errorf("timestamps = %q, %q; want the injected clock's", a.Get(tc.scheme.tsHeader), b.Get(tc.scheme.tsHeader))
			}
			if a.Get("Idempotency-Key") != "key-1" || b.Get("Idempotency-Key") != "key-1" {
				t.Errorf("Idempotency-Key changed: %q, %q", a.Get("Idempotency-Key"), b.Get("Idempotency-Key"))
			}
			if string(got[1].body) != body {
				t.Errorf("provider got body %q, want %q", got[1].body, body)
			}
		})
	}
}

// TestPayoutsKeyNotSigned: the payouts provider says the Idempotency-Key is
// not part of the signature, so two requests differing only in the key get the
// same signature, and both verify.
func TestPayoutsKeyNotSigned(t *testing.T) {
	_, srv := startProvider(t, payoutsScheme(), base)
	cfg := configFor(t, payoutsScheme(), "")
	cfg.Now = clock(base)
	var sigs []string
	next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sigs = append(sigs, r.Header.Get("X-Signature"))
		return http.DefaultTransport.RoundTrip(r)
	})
	tr := mustNew(t, cfg, next)
	for _, key := range []string{"key-a", "key-b", ""} {
		if code := send(t, tr, post(t, srv.URL+"/v1/payout", `{"order_id":"o-2"}`, key)); code != "" {
			t.Fatalf("key %q rejected: %s", key, code)
		}
	}
	if sigs[0] != sigs[1] || sigs[1] != sigs[2] {
		t.Errorf("signature depends on the Idempotency-Key: %q", sigs)
	}
}

// TestProviderRejects are negative controls: they show the fake provider
// really enforces what the other tests rely on.
func TestProviderRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*resign.Config)
		want   string // error code of the second attempt
	}{
		{"same nonce twice", func(c *resign.Config) { c.NewNonce = nonces("same") }, "nonce_reused"},
		{"clock 301 s behind", func(c *resign.Config) { c.Now = clock(base, base.Add(-301*time.Second)) }, "timestamp_out_of_window"},
		{"other secret", func(c *resign.Config) { c.Secret = []byte("wrong") }, "signature_invalid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := paymentsScheme()
			_, srv := startProvider(t, s, base)
			cfg := configFor(t, s, `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`)
			cfg.Now = clock(base)
			cfg.NewNonce = nonces("n-1", "n-2")
			tc.mutate(&cfg)
			tr := mustNew(t, cfg, nil)
			codes := make([]string, 2)
			for i := range codes {
				codes[i] = send(t, tr, post(t, srv.URL+"/payments", `{"order_id":"o-3"}`, "k"))
			}
			if codes[1] != tc.want {
				t.Errorf("codes = %q, want second %q", codes, tc.want)
			}
		})
	}
}

// TestResentWholeRequestIsRejected shows why signing must happen per attempt:
// the exact bytes of an accepted attempt, sent again, get 409 nonce_reused
// (the payments provider rejects an old HTTP request resent whole), while
// the same request passed through the Transport again is accepted.
func TestResentWholeRequestIsRejected(t *testing.T) {
	s := paymentsScheme()
	p, srv := startProvider(t, s, base)
	cfg := configFor(t, s, `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`)
	cfg.Now = clock(base)
	tr := mustNew(t, cfg, nil)
	if code := send(t, tr, post(t, srv.URL+"/payments", `{"order_id":"o-4"}`, "k-4")); code != "" {
		t.Fatalf("first attempt rejected: %s", code)
	}
	first := p.accepted()[0]
	old := post(t, srv.URL+first.requestURI, string(first.body), "")
	old.Header = first.header.Clone()
	if code := send(t, http.DefaultTransport, old); code != "nonce_reused" {
		t.Errorf("old request resent whole: code %q, want nonce_reused", code)
	}
	if code := send(t, tr, post(t, srv.URL+"/payments", `{"order_id":"o-4"}`, "k-4")); code != "" {
		t.Errorf("re-signed attempt rejected: %s", code)
	}
}

// TestDefaultNoncesAreFreshUUIDs: with NewNonce nil every attempt, even
// concurrent ones through one Transport, gets its own UUID v4.
func TestDefaultNoncesAreFreshUUIDs(t *testing.T) {
	s := paymentsScheme()
	p, srv := startProvider(t, s, time.Now())
	tr := mustNew(t, configFor(t, s, `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`), nil)
	reqs := make([]*http.Request, 20)
	for i := range reqs {
		reqs[i] = post(t, srv.URL+"/payments", fmt.Sprintf(`{"order_id":"o-%d"}`, i), "k")
	}
	codes := make([]string, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() {
			res, err := tr.RoundTrip(req)
			if err != nil {
				codes[i] = err.Error()
				return
			}
			res.Body.Close()
			codes[i] = res.Status
		})
	}
	wg.Wait()
	for i, c := range codes {
		if c != "200 OK" {
			t.Errorf("request %d: %s", i, c)
		}
	}
	if got := len(p.accepted()); got != len(reqs) {
		t.Errorf("provider accepted %d of %d", got, len(reqs))
	}
	for _, r := range p.accepted() {
		u, err := uuid.Parse(r.header.Get("X-Nonce"))
		if err != nil || u.Version() != 4 {
			t.Errorf("nonce %q is not a UUID v4 (%v)", r.header.Get("X-Nonce"), err)
		}
	}
}

// TestClientHeadersReplaced: a legacy app's own signature, timestamp, nonce
// and public id never reach the provider, whatever their case, and exactly
// one value of each, ours, does.
func TestClientHeadersReplaced(t *testing.T) {
	s := paymentsScheme()
	s.publicID = "pub-real"
	p, srv := startProvider(t, s, base)
	cfg := configFor(t, s, `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`)
	cfg.Now = clock(base)
	cfg.NewNonce = nonces("fresh-nonce")
	tr := mustNew(t, cfg, nil)

	req := post(t, srv.URL+"/payments", `{"order_id":"o-5"}`, "k-5")
	req.Header["X-Signature"] = []string{"stale-signature", "second"}
	req.Header["x-signature"] = []string{"non-canonical-stale"}
	req.Header.Set("X-Timestamp", "1")
	req.Header.Set("X-Nonce", "reused-nonce")
	req.Header["x-public-id"] = []string{"pub-evil"}
	if code := send(t, tr, req); code != "" {
		t.Fatalf("rejected: %s", code)
	}
	h := p.accepted()[0].header
	want := map[string]string{"X-Timestamp": "1700000000", "X-Nonce": "fresh-nonce", "X-Public-Id": "pub-real"}
	for name, v := range want {
		if !reflect.DeepEqual(h.Values(name), []string{v}) {
			t.Errorf("%s = %q, want only %q", name, h.Values(name), v)
		}
	}
	if vs := h.Values("X-Signature"); len(vs) != 1 || strings.Contains(vs[0], "stale") {
		t.Errorf("X-Signature = %q, want only the fresh one", vs)
	}
}

// TestNoSecret: without a secret nothing is signed, but client copies of
// the managed headers are still stripped, static headers still set, and the
// body is not read (Next gets the caller's very Body).
func TestNoSecret(t *testing.T) {
	cfg := resign.Config{NonceHeader: "X-Nonce", StaticHeaders: http.Header{"X-Public-Id": {"pub-1"}}}
	var seen *http.Request
	next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen = r
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	})
	tr := mustNew(t, cfg, next)
	req := post(t, "http://provider.test/v1/payout", `{"a":1}`, "k-6")
	req.Header.Set("X-Signature", "stale")
	req.Header.Set("X-Timestamp", "1")
	req.Header.Set("X-Nonce", "old")
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"X-Signature", "X-Timestamp", "X-Nonce"} {
		if vs := seen.Header.Values(name); vs != nil {
			t.Errorf("%s forwarded: %q", name, vs)
		}
	}
	if seen.Header.Get("X-Public-Id") != "pub-1" || seen.Header.Get("Idempotency-Key") != "k-6" {
		t.Errorf("headers = %v", seen.Header)
	}
	if seen.Body != req.Body {
		t.Error("body was replaced although nothing is signed")
	}
}

// TestNothingToChangeIsNotCopied: without a secret or static headers, a
// request with no managed header goes to Next as it is (no copy per
// attempt); one with a stale managed header is still copied and stripped,
// the caller's left alone.
func TestNothingToChangeIsNotCopied(t *testing.T) {
	var seen *http.Request
	next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen = r
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	})
	tr := mustNew(t, resign.Config{NonceHeader: "X-Nonce"}, next)
	req := post(t, "http://provider.test/v1/payout", `{"a":1}`, "k-8")
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if seen != req {
		t.Error("a request with nothing to replace was copied")
	}
	req = post(t, "http://provider.test/v1/payout", `{"a":1}`, "k-9")
	req.Header.Set("x-nonce", "stale")
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if seen == req || seen.Header.Values("X-Nonce") != nil || req.Header.Get("X-Nonce") != "stale" {
		t.Errorf("stale nonce: forwarded %q, caller's now %q", seen.Header.Values("X-Nonce"), req.Header.Values("X-Nonce"))
	}
}

// TestRequestNotMutated: RoundTrip works on a clone (http.RoundTripper
// contract); the caller's headers, URL, GetBody and ContentLength stay as
// they were, stale signature included.
func TestRequestNotMutated(t *testing.T) {
	s := paymentsScheme()
	s.publicID = "pub-real"
	_, srv := startProvider(t, s, base)
	cfg := configFor(t, s, `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`)
	cfg.Now = clock(base)
	tr := mustNew(t, cfg, nil)
	req := post(t, srv.URL+"/payments?x=1", `{"order_id":"o-7"}`, "k-7")
	req.Header.Set("X-Signature", "stale")
	req.Header.Set("X-Public-Id", "pub-evil")
	header, rawURL, cl := req.Header.Clone(), req.URL.String(), req.ContentLength
	if code := send(t, tr, req); code != "" {
		t.Fatalf("rejected: %s", code)
	}
	if !reflect.DeepEqual(req.Header, header) {
		t.Errorf("header mutated:\n got %v\nwant %v", req.Header, header)
	}
	if req.URL.String() != rawURL || req.ContentLength != cl || req.GetBody == nil {
		t.Errorf("request mutated: url %q, ContentLength %d, GetBody nil %v", req.URL, req.ContentLength, req.GetBody == nil)
	}
}

// TestPathsAndQueries: {path} is the escaped path as sent on the wire and
// {query} the raw query, so the provider's verification of what it received
// succeeds for escaped ids, spaces, an empty path and raw query order.
func TestPathsAndQueries(t *testing.T) {
	tests := []struct {
		name    string
		path    string // URL.Path
		rawPath string // URL.RawPath
		query   string
		forceQ  bool
		wantURI string // request-target the provider must see
	}{
		{"plain", "/cards/c_1/topup", "", "", false, "/cards/c_1/topup"},
		{"escaped slash", "/cards/a/b/topup", "/cards/a%2Fb/topup", "", false, "/cards/a%2Fb/topup"},
		{"space", "/cards/a b", "", "", false, "/cards/a%20b"},
		{"unicode", "/cards/карта", "", "", false, "/cards/%D0%BA%D0%B0%D1%80%D1%82%D0%B0"},
		{"empty path", "", "", "", false, "/"},
		{"raw query order", "/cards", "", "z=1&a=%20b&a=2", false, "/cards?z=1&a=%20b&a=2"},
		{"empty forced query", "/cards", "", "", true, "/cards?"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := cardsScheme()
			p, srv := startProvider(t, s, base)
			cfg := configFor(t, s, `{timestamp}:{nonce}:{method}:{path}?{query}:{body_sha256}`)
			cfg.Now = clock(base)
			tr := mustNew(t, cfg, nil)
			req := post(t, srv.URL, `{"amount":1}`, "k")
			req.URL.Path, req.URL.RawPath, req.URL.RawQuery, req.URL.ForceQuery = tc.path, tc.rawPath, tc.query, tc.forceQ
			if code := send(t, tr, req); code != "" {
				t.Fatalf("rejected: %s", code)
			}
			if got := p.accepted()[0].requestURI; got != tc.wantURI {
				t.Errorf("provider saw %q, want %q", got, tc.wantURI)
			}
		})
	}
}

// TestBodyHandling: the signed body is exactly the body forwarded, for known
// and unknown lengths and for an empty body, and the ContentLength is kept.
func TestBodyHandling(t *testing.T) {
	tests := []struct {
		name string
		body io.Reader
		cl   int64
	}{
		{"known length", strings.NewReader(strings.Repeat("x", 5000)), 5000},
		{"unknown length", io.MultiReader(strings.NewReader("abc"), strings.NewReader("def")), 0},
		{"empty", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, srv := startProvider(t, payoutsScheme(), base)
			cfg := configFor(t, payoutsScheme(), "")
			cfg.Now = clock(base)
			var forwardedCL int64
			var forwardedGetBody bool
			next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				forwardedCL, forwardedGetBody = r.ContentLength, r.GetBody != nil
				return http.DefaultTransport.RoundTrip(r)
			})
			tr := mustNew(t, cfg, next)
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/payout", tc.body)
			if err != nil {
				t.Fatal(err)
			}
			var want []byte
			if req.Body != nil {
				// A body of a type net/http does not know, so the
				// signer cannot take a shortcut through GetBody.
				want, _ = io.ReadAll(req.Body)
				req.Body = io.NopCloser(bytes.NewReader(want))
			}
			if code := send(t, tr, req); code != "" {
				t.Fatalf("rejected: %s", code)
			}
			if got := p.accepted()[0].body; !bytes.Equal(got, want) {
				t.Errorf("provider got %d bytes, want %d", len(got), len(want))
			}
			if forwardedCL != tc.cl || forwardedGetBody {
				t.Errorf("forwarded ContentLength %d (want %d), GetBody set %v (want false)", forwardedCL, tc.cl, forwardedGetBody)
			}
		})
	}
}

// errBody fails on Read and records Close.
type errBody struct{ closed bool }

var errDisk = errors.New("disk on fire")

func (b *errBody) Read([]byte) (int, error) { return 0, errDisk }
func (b *errBody) Close() error             { b.closed = true; return nil }

// TestBodyReadError: a body that cannot be read stops the attempt before
// Next, with the cause wrapped, and the body is closed (RoundTripper contract).
func TestBodyReadError(t *testing.T) {
	called := false
	next := roundTripFunc(func(*http.Request) (*http.Response, error) { called = true; return nil, errors.New("unreachable") })
	tr := mustNew(t, resign.Config{Secret: []byte("s")}, next)
	body := &errBody{}
	req := post(t, "http://provider.test/v1/payout", "", "")
	req.Body, req.ContentLength = body, 10
	_, err := tr.RoundTrip(req)
	if !errors.Is(err, errDisk) || called || !body.closed {
		t.Errorf("err %v, Next called %v, body closed %v", err, called, body.closed)
	}
}

// TestUnconfiguredTransport: a Transport not made by New refuses instead of
// forwarding unsigned, and closes the body.
func TestUnconfiguredTransport(t *testing.T) {
	body := &errBody{}
	req := post(t, "http://provider.test/", "", "")
	req.Body = body
	if _, err := (&resign.Transport{}).RoundTrip(req); err == nil || !body.closed {
		t.Errorf("err %v, body closed %v", err, body.closed)
	}
}

func TestNewErrors(t *testing.T) {
	const secretValue = "static-secret-value"
	tests := []struct {
		name string
		cfg  resign.Config
		want string
	}{
		{"bad encoding", resign.Config{Encoding: "base32"}, `Encoding "base32"`},
		{"upper-case encoding", resign.Config{Encoding: "HEX"}, `Encoding "HEX"`},
		{"bad header name", resign.Config{SignatureHeader: "X Signature"}, "SignatureHeader: invalid header name"},
		{"same header twice", resign.Config{SignatureHeader: "x-stamp", TimestampHeader: "X-Stamp"}, "TimestampHeader: X-Stamp is already used"},
		{"timestamp is Content-Type", resign.Config{TimestampHeader: "content-type"}, "TimestampHeader: Content-Type describes the request"},
		{"signature is Host", resign.Config{SignatureHeader: "Host"}, "SignatureHeader: Host describes the request"},
		{"nonce is Content-Length", resign.Config{NonceHeader: "Content-Length"}, "NonceHeader: Content-Length describes the request"},
		{"nonce is key header", resign.Config{NonceHeader: "idempotency-key"}, "NonceHeader: Idempotency-Key is already used"},
		{"nonce without header", resign.Config{Template: mustTemplate(t, "{nonce}")}, "uses {nonce} but NonceHeader is empty"},
		{"static signature", resign.Config{StaticHeaders: http.Header{"X-Signature": {secretValue}}}, "X-Signature: is the signature"},
		{"static custom nonce", resign.Config{NonceHeader: "X-N", StaticHeaders: http.Header{"x-n": {secretValue}}}, "X-N: is the signature"},
		{"static key", resign.Config{StaticHeaders: http.Header{"Idempotency-Key": {secretValue}}}, "Idempotency-Key cannot be static"},
		{"static host", resign.Config{StaticHeaders: http.Header{"Host": {secretValue}}}, "Host: is managed by net/http"},
		{"static no value", resign.Config{StaticHeaders: http.Header{"X-Api-Key": {}}}, "X-Api-Key: no value"},
		{"static empty value", resign.Config{StaticHeaders: http.Header{"X-Api-Key": {""}}}, "X-Api-Key: empty value"},
		{"static CRLF", resign.Config{StaticHeaders: http.Header{"X-Api-Key": {secretValue + "\r\nX-Evil: 1"}}}, "control characters"},
		{"static bad name", resign.Config{StaticHeaders: http.Header{"X Api": {secretValue}}}, "invalid header name"},
		{"static twice", resign.Config{StaticHeaders: http.Header{"X-Api-Key": {"a"}, "x-api-key": {"b"}}}, "X-Api-Key: given twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Secret = []byte("hmac-secret-value")
			_, err := resign.New(tc.cfg, nil)
			if !errors.Is(err, resign.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrConfig containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secretValue) || strings.Contains(err.Error(), "hmac-secret-value") {
				t.Errorf("error leaks a secret: %v", err)
			}
		})
	}
}

// TestSecretsNeverPrinted: no fmt verb and no slog handler prints the HMAC
// secret or a static header value, in any encoding.
func TestSecretsNeverPrinted(t *testing.T) {
	secret := []byte("topsecret-hmac-key")
	cfg := resign.Config{
		Secret:        secret,
		Template:      mustTemplate(t, "{timestamp}"),
		StaticHeaders: http.Header{"X-Api-Key": {"apikey-value-123"}},
	}
	tr := mustNew(t, cfg, nil)
	forbidden := []string{string(secret), fmt.Sprintf("%x", string(secret)), strings.Trim(fmt.Sprint(secret[:4]), "[]"), "apikey-value-123", "dG9wc2VjcmV0"}
	var outputs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%d", "%q"} {
		outputs = append(outputs, fmt.Sprintf(verb, cfg), fmt.Sprintf(verb, &cfg), fmt.Sprintf(verb, tr), fmt.Sprintf(verb, *tr),
			fmt.Sprintf(verb, struct{ t resign.Transport }{*tr}), fmt.Sprintf(verb, struct{ C resign.Config }{cfg}))
	}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("cfg", "cfg", cfg, "tr", tr)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("cfg", "cfg", cfg, "tr", tr)
	outputs = append(outputs, logs.String())
	for _, out := range outputs {
		for _, f := range forbidden {
			if strings.Contains(out, f) {
				t.Errorf("output %q contains %q", out, f)
			}
		}
	}
	if !strings.Contains(cfg.String(), "X-Api-Key") || !strings.Contains(tr.String(), "<redacted>") {
		t.Errorf("String should still describe the settings: %s / %s", cfg, tr)
	}
}

// TestCloseIdleConnections reaches Next.
func TestCloseIdleConnections(t *testing.T) {
	next := &closer{}
	mustNew(t, resign.Config{}, next).CloseIdleConnections()
	if !next.closed {
		t.Error("CloseIdleConnections not passed on")
	}
}

type closer struct {
	roundTripFunc
	closed bool
}

func (c *closer) CloseIdleConnections() { c.closed = true }

// rewindBody is a request body that can be reused across benchmark
// iterations without allocating.
type rewindBody struct{ *bytes.Reader }

func (rewindBody) Close() error { return nil }

func BenchmarkSign(b *testing.B) {
	body := bytes.Repeat([]byte(`{"order_id":"o-1","amount":100}`), 17)[:500]
	canned := &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}
	next := roundTripFunc(func(*http.Request) (*http.Response, error) { return canned, nil })
	templates := []struct{ name, tmpl, nonce string }{
		{"payouts", `{timestamp}\n{method}\n{path}\n{body}`, ""},
		{"payments", `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`, "X-Nonce"},
	}
	for _, bc := range templates {
		b.Run(bc.name, func(b *testing.B) {
			cfg := resign.Config{
				Secret:        []byte("bench-secret"),
				Template:      mustTemplate(b, bc.tmpl),
				NonceHeader:   bc.nonce,
				StaticHeaders: http.Header{"X-Public-Id": {"pub-1"}},
			}
			tr := mustNew(b, cfg, next)
			rb := rewindBody{bytes.NewReader(body)}
			req := &http.Request{
				Method: http.MethodPost, URL: &url.URL{Scheme: "https", Host: "provider.test", Path: "/v1/payout"},
				Header: http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"k-1"}},
				Body:   rb, ContentLength: int64(len(body)),
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				rb.Reset(body)
				if _, err := tr.RoundTrip(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// countingBody counts the bytes read from it.
type countingBody struct {
	io.Reader
	n int
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	b.n += n
	return n, err
}

func (*countingBody) Close() error { return nil }

// TestSignsBody: Config.SignsBody says whether RoundTrip reads the whole
// body before Next is called, which the proxy relies on to take an
// unprotected request's slot only once its body is read
// (proxy.Options.SignsBody).
func TestSignsBody(t *testing.T) {
	const body = "a body to sign"
	for _, tc := range []struct {
		name, secret, template string
		want                   bool
	}{
		{"default template", "s", "", true},
		{"{body}", "s", `{timestamp}\n{body}`, true},
		{"{body_sha256}", "s", `{timestamp}\n{body_sha256}`, true},
		{"no body in the template", "s", `{timestamp}\n{method}\n{path}`, false},
		{"no secret", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := resign.Config{Secret: []byte(tc.secret)}
			if tc.template != "" {
				cfg.Template = mustTemplate(t, tc.template)
			}
			in := &countingBody{Reader: strings.NewReader(body)}
			var readFirst int
			next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				readFirst = in.n
				return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
			})
			req := post(t, "http://provider.test/v1/payout", "", "")
			req.Body, req.ContentLength = in, int64(len(body))
			if _, err := mustNew(t, cfg, next).RoundTrip(req); err != nil {
				t.Fatal(err)
			}
			if got := readFirst == len(body); got != tc.want || cfg.SignsBody() != tc.want {
				t.Errorf("SignsBody %v, body read whole before sending %v (%d bytes); want %v", cfg.SignsBody(), got, readFirst, tc.want)
			}
		})
	}
}
