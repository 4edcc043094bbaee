package resign_test

// A fake provider that verifies signatures the way the providers document them.
// The verifiers below are written from the providers' descriptions, independently of
// the package's Template: they build the string by hand from what arrived on
// the wire (the request-target, the headers, the body), so a bug shared by
// the signer and its template would still be caught here.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
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

// window is the payments provider's timestamp window: X-Timestamp must be
// within 300 seconds.
const window = 300

// scheme is one provider's signing rules.
type scheme struct {
	name        string
	secret      []byte
	sigHeader   string
	tsHeader    string
	nonceHeader string // "" = the provider uses no nonce
	publicID    string // required X-Public-Id value; "" = not required
	// canonical builds the string to sign from the received request.
	canonical func(r *http.Request, body []byte) string
	// decode turns the signature header back into MAC bytes.
	decode func(string) ([]byte, error)
}

// wireRequestPath is the path part of the request-target as received.
func wireRequestPath(r *http.Request) string {
	p, _, _ := strings.Cut(r.RequestURI, "?")
	return p
}

// payoutsScheme follows the payouts provider: signing =
// f"{ts}\nPOST\n{path}\n{body}", hmac.new(SECRET, ..., sha256).hexdigest(),
// headers X-Public-Id, X-Timestamp, X-Signature; the Idempotency-Key is not
// signed.
func payoutsScheme() scheme {
	return scheme{
		name:      "payouts",
		secret:    []byte("payouts-secret"),
		sigHeader: "X-Signature",
		tsHeader:  "X-Timestamp",
		publicID:  "pub-123",
		canonical: func(r *http.Request, body []byte) string {
			return r.Header.Get("X-Timestamp") + "\n" + r.Method + "\n" + wireRequestPath(r) + "\n" + string(body)
		},
		decode: hex.DecodeString,
	}
}

// paymentsScheme follows the payments provider:
// hmac_sha256(secret, canonical(method, path, ts, nonce, idem_key,
// sha256(body))) with X-Timestamp, X-Nonce, X-Signature. The provider names the
// parts and their order; newline-joined and hex is this test's concrete
// choice of that canonical form.
func paymentsScheme() scheme {
	return scheme{
		name:        "payments",
		secret:      []byte("payments-secret"),
		sigHeader:   "X-Signature",
		tsHeader:    "X-Timestamp",
		nonceHeader: "X-Nonce",
		canonical: func(r *http.Request, body []byte) string {
			sum := sha256.Sum256(body)
			return strings.Join([]string{
				r.Method, wireRequestPath(r), r.Header.Get("X-Timestamp"), r.Header.Get("X-Nonce"),
				r.Header.Get("Idempotency-Key"), hex.EncodeToString(sum[:]),
			}, "\n")
		},
		decode: hex.DecodeString,
	}
}

// cardsScheme is a cards-style variant (the cards provider only says "new
// signature per retry"): own header names, the query signed, base64.
func cardsScheme() scheme {
	return scheme{
		name:        "cards",
		secret:      []byte("cards-secret"),
		sigHeader:   "X-Cards-Signature",
		tsHeader:    "X-Cards-Timestamp",
		nonceHeader: "X-Cards-Nonce",
		canonical: func(r *http.Request, body []byte) string {
			sum := sha256.Sum256(body)
			_, query, _ := strings.Cut(r.RequestURI, "?")
			return r.Header.Get("X-Cards-Timestamp") + ":" + r.Header.Get("X-Cards-Nonce") + ":" +
				r.Method + ":" + wireRequestPath(r) + "?" + query + ":" + hex.EncodeToString(sum[:])
		},
		decode: base64.StdEncoding.DecodeString,
	}
}

// received is what the provider accepted.
type received struct {
	header     http.Header
	requestURI string
	body       []byte
}

// provider is an httptest upstream that checks the signature, the timestamp
// window against its own clock, and that no nonce is used twice.
type provider struct {
	scheme scheme
	now    func() time.Time

	mu     sync.Mutex
	nonces map[string]bool
	got    []received
}

// startProvider runs a provider whose clock reads now.
func startProvider(t *testing.T, s scheme, now time.Time) (*provider, *httptest.Server) {
	t.Helper()
	p := &provider{scheme: s, now: func() time.Time { return now }, nonces: map[string]bool{}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		reject(w, http.StatusBadRequest, "body_unreadable")
		return
	}
	if status, code := p.check(r, body); status != 0 {
		reject(w, status, code)
		return
	}
	p.mu.Lock()
	p.got = append(p.got, received{header: r.Header.Clone(), requestURI: r.RequestURI, body: body})
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"status":"created"}`)
}

// check returns a non-zero status and an error code when the request fails
// verification.
func (p *provider) check(r *http.Request, body []byte) (int, string) {
	s := p.scheme
	if s.publicID != "" && !single(r.Header, "X-Public-Id", s.publicID) {
		return http.StatusUnauthorized, "public_id_invalid"
	}
	if len(r.Header.Values(s.tsHeader)) != 1 {
		return http.StatusUnauthorized, "timestamp_missing"
	}
	ts, err := strconv.ParseInt(r.Header.Get(s.tsHeader), 10, 64)
	if err != nil || abs(p.now().Unix()-ts) > window {
		return http.StatusUnauthorized, "timestamp_out_of_window"
	}
	if len(r.Header.Values(s.sigHeader)) != 1 {
		return http.StatusUnauthorized, "signature_missing"
	}
	got, err := s.decode(r.Header.Get(s.sigHeader))
	mac := hmac.New(sha256.New, s.secret)
	mac.Write([]byte(s.canonical(r, body)))
	if err != nil || !hmac.Equal(got, mac.Sum(nil)) {
		return http.StatusUnauthorized, "signature_invalid"
	}
	return p.checkNonce(r)
}

// checkNonce records the nonce; a second use is 409 nonce_reused, as the
// payments provider says.
func (p *provider) checkNonce(r *http.Request) (int, string) {
	if p.scheme.nonceHeader == "" {
		return 0, ""
	}
	vs := r.Header.Values(p.scheme.nonceHeader)
	if len(vs) != 1 || vs[0] == "" {
		return http.StatusUnauthorized, "nonce_missing"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nonces[vs[0]] {
		return http.StatusConflict, "nonce_reused"
	}
	p.nonces[vs[0]] = true
	return 0, ""
}

// accepted returns a copy of the accepted requests.
func (p *provider) accepted() []received {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]received(nil), p.got...)
}

func single(h http.Header, name, want string) bool {
	vs := h.Values(name)
	return len(vs) == 1 && vs[0] == want
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

func reject(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code}})
}

// errorCode reads the provider's error code from a response, closing it.
func errorCode(t *testing.T, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	var v struct {
		Error struct{ Code string } `json:"error"`
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	if res.StatusCode == http.StatusOK {
		return ""
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %d response %q: %v", res.StatusCode, b, err)
	}
	return v.Error.Code
}
