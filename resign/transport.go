// Package resign signs every upstream attempt afresh, as an http.RoundTripper.
//
// Providers reject stale timestamps and reused nonces (the
// payments provider: X-Timestamp within 300 s, X-Nonce a new
// UUID per attempt, "409 nonce_reused" for a request resent whole), so a retry
// is a new network attempt of the same operation, never the same bytes again.
// A Transport therefore sits below the retry loop: every attempt, the first
// included, passes through it and leaves with a new timestamp, a new nonce and
// a new HMAC-SHA256 signature over a configurable canonical string (docs/signing.md,
// IDEMPROXY_SIGN_*). The Idempotency-Key is left alone: it is what stays the
// same across attempts.
package resign

import (
	"bytes"
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/internal/heldbody"
)

// Default header names (IDEMPROXY_SIGNATURE_HEADER, IDEMPROXY_TIMESTAMP_HEADER).
const (
	DefaultSignatureHeader = "X-Signature"
	DefaultTimestampHeader = "X-Timestamp"
)

// Signature encodings accepted in Config.Encoding (IDEMPROXY_SIGN_ENCODING).
const (
	EncodingHex    = "hex"    // lowercase hex, as the payouts provider's hexdigest()
	EncodingBase64 = "base64" // standard alphabet with padding (RFC 4648 §4)
)

// ErrConfig is wrapped by every error New returns.
var ErrConfig = errors.New("resign: invalid signing configuration")

// Config is what a Transport needs; zero values mean the stated defaults.
// Config never prints its Secret: String, Format (every fmt verb) and
// LogValue redact it. fmt cannot call those methods on an unexported field,
// so do not print a struct that holds a Config in one.
type Config struct {
	// Secret is the HMAC-SHA256 key. Empty means no signing: no signature,
	// timestamp or nonce header is set, but client-sent copies of them are
	// still removed and StaticHeaders are still applied.
	Secret []byte
	// Template builds the canonical string. Nil means DefaultCanonical.
	Template *Template
	// Encoding of the signature: "hex" (the default when "") or "base64".
	Encoding string
	// SignatureHeader carries the signature. "" means X-Signature.
	SignatureHeader string
	// TimestampHeader carries the attempt's unix time in seconds. "" means
	// X-Timestamp.
	TimestampHeader string
	// NonceHeader carries a new UUID v4 per attempt. "" means no nonce
	// header; a Template that uses {nonce} then is a configuration error.
	NonceHeader string
	// StaticHeaders are set on every attempt (e.g. X-Public-Id), replacing
	// whatever the client sent under those names. Nil means none. They may
	// not name the signature, timestamp, nonce or Idempotency-Key headers,
	// nor headers net/http manages (Host, Content-Length, Transfer-Encoding,
	// Connection).
	StaticHeaders http.Header
	// Now is the clock for timestamps. Nil means time.Now, and then, when
	// the timestamp is signed and no nonce is, an attempt whose signature was
	// already sent (a retry within the second of the attempt before it)
	// waits for the next second. A clock of one's own, whose seconds need
	// not pass, gets no such wait.
	Now func() time.Time
	// NewNonce makes one nonce. Nil means uuid.NewString (a random UUID v4).
	NewNonce func() string
}

// Transport signs each request that passes through it, then calls Next.
// Create it with New; a Transport not made by New refuses every request.
// It is safe for concurrent use.
type Transport struct {
	// Next sends the signed request. Nil means http.DefaultTransport.
	Next http.RoundTripper

	// prepare returns the signed clone of a request; nil when the Transport
	// was not made by New. A func rather than a *signer because fmt prints a
	// func as an address under every verb, while it prints a nested struct
	// pointer's fields, secret included, when the verb does not fit (e.g.
	// "%!s(*resign.signer=&{...})" for %s on a Transport value).
	prepare func(*http.Request) (*http.Request, error)
	desc    string // String's text, without secrets
}

// signer is a validated Config.
type signer struct {
	secret      []byte
	tmpl        *Template
	base64      bool
	sigHeader   string
	tsHeader    string
	nonceHeader string // "" = no nonce
	static      http.Header
	strip       []string // canonical names removed from every request
	now         func() time.Time
	newNonce    func() string
	macs        sync.Pool // of *macState
	// used remembers the signatures just sent when nothing but the
	// timestamp makes one new (it is signed, no nonce is); nil otherwise.
	used *sentSignatures
}

// macState is a reusable HMAC and buffers, pooled to keep per-attempt
// allocations down.
type macState struct {
	mac hash.Hash
	buf []byte
	sum []byte
}

// maxPooledBuf bounds the canonical-string buffer kept in the pool, so one
// large body does not pin its size in memory forever.
const maxPooledBuf = 64 << 10

// New validates cfg and returns a Transport that signs and then calls next
// (nil means http.DefaultTransport). Errors wrap ErrConfig and name the field;
// they never contain the secret or static header values. cfg.Secret and
// cfg.StaticHeaders are copied, so later changes to them have no effect.
func New(cfg Config, next http.RoundTripper) (*Transport, error) {
	s, err := newSigner(cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{Next: next, prepare: s.prepare, desc: s.describe()}, nil
}

// newSigner applies defaults and validates cfg.
func newSigner(cfg Config) (*signer, error) {
	s := &signer{
		secret:   bytes.Clone(cfg.Secret),
		tmpl:     cfg.Template,
		now:      cfg.Now,
		newNonce: cfg.NewNonce,
	}
	if err := s.setHeaders(cfg); err != nil {
		return nil, err
	}
	if err := s.setEncoding(cfg.Encoding); err != nil {
		return nil, err
	}
	if err := s.setTemplate(); err != nil {
		return nil, err
	}
	static, err := s.checkStatic(cfg.StaticHeaders)
	if err != nil {
		return nil, err
	}
	s.static = static
	s.fillDefaults()
	return s, nil
}

// setHeaders validates the three managed header names and records them for
// stripping.
func (s *signer) setHeaders(cfg Config) error {
	names := []struct {
		field, value, def string
		dst               *string
	}{
		{"SignatureHeader", cfg.SignatureHeader, DefaultSignatureHeader, &s.sigHeader},
		{"TimestampHeader", cfg.TimestampHeader, DefaultTimestampHeader, &s.tsHeader},
		{"NonceHeader", cfg.NonceHeader, "", &s.nonceHeader},
	}
	for _, n := range names {
		v := cmp.Or(n.value, n.def)
		if v == "" {
			continue
		}
		if err := CheckHeaderName(v); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrConfig, n.field, err)
		}
		v = http.CanonicalHeaderKey(v)
		if slices.Contains(s.strip, v) || v == idemkey.HeaderName {
			return fmt.Errorf("%w: %s: %s is already used for another purpose", ErrConfig, n.field, v)
		}
		if requestOwned(v) {
			// The app's copy is stripped and idemproxy's value set in its
			// place: TimestampHeader=Content-Type would send every body
			// with a timestamp for its type.
			return fmt.Errorf("%w: %s: %s describes the request itself", ErrConfig, n.field, v)
		}
		*n.dst = v
		s.strip = append(s.strip, v)
	}
	return nil
}

// setEncoding validates Config.Encoding.
func (s *signer) setEncoding(enc string) error {
	switch enc {
	case "", EncodingHex:
	case EncodingBase64:
		s.base64 = true
	default:
		return fmt.Errorf("%w: Encoding %q: want %q or %q", ErrConfig, enc, EncodingHex, EncodingBase64)
	}
	return nil
}

// setTemplate defaults the template and checks it can be satisfied.
func (s *signer) setTemplate() error {
	if s.tmpl == nil {
		t, err := ParseTemplate(DefaultCanonical)
		if err != nil {
			return fmt.Errorf("%w: default template: %w", ErrConfig, err)
		}
		s.tmpl = t
	}
	// Why: a signed {nonce} the provider never receives cannot be verified,
	// so every request would fail with 401; better to stop at start.
	if s.tmpl.Uses("nonce") && s.nonceHeader == "" {
		return fmt.Errorf("%w: Template uses {nonce} but NonceHeader is empty", ErrConfig)
	}
	if s.tmpl.Uses("timestamp") && !s.tmpl.Uses("nonce") && s.now == nil {
		s.used = &sentSignatures{}
	}
	return nil
}

// checkStatic validates and deep-copies the static headers, adding their
// names to the strip list.
func (s *signer) checkStatic(in http.Header) (http.Header, error) {
	out := make(http.Header, len(in))
	for name, values := range in {
		if err := CheckHeaderName(name); err != nil {
			return nil, fmt.Errorf("%w: StaticHeaders: %w", ErrConfig, err)
		}
		canon := http.CanonicalHeaderKey(name)
		if _, dup := out[canon]; dup {
			return nil, fmt.Errorf("%w: StaticHeaders: %s: given twice", ErrConfig, canon)
		}
		if err := s.checkStaticEntry(canon, values); err != nil {
			return nil, fmt.Errorf("%w: StaticHeaders: %s: %w", ErrConfig, canon, err)
		}
		out[canon] = slices.Clone(values)
		s.strip = append(s.strip, canon)
	}
	return out, nil
}

// requestOwned reports whether the canonical header name describes the
// request itself (net/http manages all but Content-Type), so that no
// signing or credential header may take its name.
func requestOwned(canon string) bool {
	switch canon {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Content-Type":
		return true
	}
	return false
}

// checkStaticEntry rejects a static header that would fight another layer.
func (s *signer) checkStaticEntry(canon string, values []string) error {
	switch {
	case slices.Contains(s.strip, canon):
		return errors.New("is the signature, timestamp or nonce header, which is set per attempt")
	case canon == idemkey.HeaderName:
		// Why: one key for all attempts of one operation comes from the
		// client or the key layer; a fixed key would merge every operation.
		return errors.New("Idempotency-Key cannot be static")
	case requestOwned(canon) && canon != "Content-Type":
		return errors.New("is managed by net/http")
	case len(values) == 0:
		return errors.New("no value")
	}
	for _, v := range values {
		if v == "" || !validHeaderValue(v) {
			return errors.New("empty value or control characters in value")
		}
	}
	return nil
}

// fillDefaults sets the clock, nonce source and MAC pool.
func (s *signer) fillDefaults() {
	if s.now == nil {
		s.now = time.Now
	}
	if s.newNonce == nil {
		s.newNonce = uuid.NewString
	}
	secret := s.secret
	s.macs.New = func() any { return &macState{mac: hmac.New(sha256.New, secret)} }
}

// signing reports whether a secret is configured.
func (s *signer) signing() bool { return len(s.secret) > 0 }

// RoundTrip signs a clone of req and sends it with Next. req itself is not
// modified (the http.RoundTripper contract), but its Body is consumed and
// closed when the template needs the body ({body} or {body_sha256}); the
// clone then carries a fresh reader over the same bytes with the same
// ContentLength. RoundTrip always closes req.Body on error, as the contract
// requires.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.prepare == nil || req.URL == nil {
		closeBody(req)
		return nil, errors.New("resign: RoundTrip on a Transport not made by New, or a request without URL")
	}
	out, err := t.prepare(req)
	if err != nil {
		return nil, fmt.Errorf("resign: %s %s: %w", req.Method, req.URL.EscapedPath(), err)
	}
	return t.next().RoundTrip(out)
}

// prepare returns a clone of req with the managed headers replaced and,
// when a secret is set, signed; req itself when there is nothing to replace
// or sign.
func (s *signer) prepare(req *http.Request) (*http.Request, error) {
	if !s.signing() && len(s.static) == 0 && !s.hasManaged(req.Header) {
		return req, nil // nothing to change: no copy (RoundTrippers leave req as it is)
	}
	out := req.Clone(req.Context())
	if out.Header == nil {
		out.Header = http.Header{}
	}
	s.replaceHeaders(out.Header)
	if !s.signing() {
		return out, nil
	}
	return out, s.sign(out)
}

// next returns Next or its default.
func (t *Transport) next() http.RoundTripper {
	if t.Next == nil {
		return http.DefaultTransport
	}
	return t.Next
}

// CloseIdleConnections passes the call on to Next when it supports it, so
// http.Client.CloseIdleConnections works through a Transport.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.next().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// hasManaged says whether h holds a header replaceHeaders would remove.
func (s *signer) hasManaged(h http.Header) bool {
	for name := range h {
		for _, m := range s.strip {
			if strings.EqualFold(name, m) {
				return true
			}
		}
	}
	return false
}

// replaceHeaders removes every client-sent copy of the managed headers and
// sets the static ones.
//
// Why (docs/signing.md: signature and credential headers from the client are
// replaced):
// a legacy app may still send its own, stale X-Signature or X-Timestamp; if
// forwarded next to ours, the provider may check the wrong one, and a stale
// copy leaks a replayable credential upstream. The comparison ignores case
// because a caller-built Header map need not hold canonical keys.
func (s *signer) replaceHeaders(h http.Header) {
	for name := range h {
		for _, m := range s.strip {
			if strings.EqualFold(name, m) {
				delete(h, name)
				break
			}
		}
	}
	for name, values := range s.static {
		h[name] = slices.Clone(values) // Next may modify the request's header values
	}
}

// sign sets the timestamp, nonce and signature headers on out, reading the
// body first when the template needs it.
func (s *signer) sign(out *http.Request) error {
	var body []byte
	if s.tmpl.needsBody() {
		b, err := takeBody(out)
		if err != nil {
			return fmt.Errorf("read body for signing: %w", err)
		}
		body = b
	}
	// Why: with GetBody set (and an Idempotency-Key present) net/http may
	// transparently resend this request on a reused connection that failed
	// (Request.isReplayable). A resend carries the same nonce and timestamp,
	// which the payments provider answers with 409 nonce_reused; the retry
	// layer above must re-sign instead.
	out.GetBody = nil
	f := Fields{
		Method:         canonicalMethod(out.Method),
		Path:           wirePath(out.URL),
		Query:          out.URL.RawQuery,
		IdempotencyKey: out.Header.Get(idemkey.HeaderName),
		Body:           body,
	}
	if s.nonceHeader != "" {
		f.Nonce = s.newNonce()
		out.Header[s.nonceHeader] = []string{f.Nonce}
	}
	// Why the loop: without a nonce, a retry sent within the second of the
	// attempt before it (a 503 answered at once, a backoff of a few hundred
	// milliseconds) would carry that attempt's timestamp and signature, which
	// a provider that wants a new signature ("new time") on every retry
	// refuses as a replay. Such an attempt waits for the next second.
	for waits := 0; ; waits++ {
		now := s.now()
		f.Timestamp = strconv.FormatInt(now.Unix(), 10)
		sig := s.signature(f)
		if s.used == nil || waits == maxUniqueWaits || s.used.claim(sig, now.Unix()) {
			out.Header[s.tsHeader] = []string{f.Timestamp}
			out.Header[s.sigHeader] = []string{sig}
			return nil
		}
		if err := untilNextSecond(out.Context(), now); err != nil {
			return fmt.Errorf("wait for a new timestamp: %w", err)
		}
	}
}

// signature renders the canonical string for f and returns its encoded
// HMAC-SHA256.
func (s *signer) signature(f Fields) string {
	st := s.macs.Get().(*macState)
	st.buf = s.tmpl.Append(st.buf[:0], f)
	st.mac.Reset()
	st.mac.Write(st.buf)
	st.sum = st.mac.Sum(st.sum[:0])
	var sig string
	if s.base64 {
		sig = base64.StdEncoding.EncodeToString(st.sum)
	} else {
		sig = hex.EncodeToString(st.sum)
	}
	if cap(st.buf) > maxPooledBuf {
		st.buf = nil
	}
	s.macs.Put(st)
	return sig
}

// canonicalMethod is the method as {method} renders it: upper-case, with
// net/http's "" meaning GET.
func canonicalMethod(m string) string {
	if m == "" {
		return http.MethodGet
	}
	return strings.ToUpper(m)
}

// wirePath is {path}: the path exactly as net/http writes it in the request
// line, i.e. URL.RequestURI without the query. That is EscapedPath (RawPath
// when it is a valid encoding of Path, else Go's own escaping), "/" for an
// empty path, or Opaque when set.
//
// Why the escaped form: the provider verifies against the request-target it
// receives, not against a decoded path. Signing the decoded Path would break
// every request whose path holds an escaped byte, e.g. an id with %2F or a
// space sent as %20.
func wirePath(u *url.URL) string {
	uri := u.RequestURI()
	if u.ForceQuery || u.RawQuery != "" {
		uri = uri[:len(uri)-len(u.RawQuery)-1]
	}
	return uri
}

// takeBody reads and closes out.Body and gives out a fresh reader over the
// same bytes, keeping ContentLength. The original Body belongs to the caller's
// request too; the clone shares it, so it is read exactly once here.
//
// A body the retry loop holds (heldbody) is not read: its bytes are signed
// in place and the body goes on unread, so the attempt makes no copy.
func takeBody(out *http.Request) ([]byte, error) {
	if out.Body == nil || out.Body == http.NoBody {
		return nil, nil
	}
	if b, ok := heldbody.Unread(out.Body); ok {
		return b, nil
	}
	b, err := readAll(out.Body, out.ContentLength)
	out.Body.Close()
	if err != nil {
		return nil, err
	}
	if len(b) == 0 && out.ContentLength <= 0 {
		out.Body = http.NoBody
		return nil, nil
	}
	rb := &readerBody{}
	rb.Reset(b)
	out.Body = rb
	return b, nil
}

// readerBody is a request body over bytes already read: one allocation
// instead of io.NopCloser(bytes.NewReader(b))'s two.
type readerBody struct{ bytes.Reader }

// Close does nothing; the bytes need no release.
func (*readerBody) Close() error { return nil }

// readAll reads a request body whose length the sender declares: a
// client request's ContentLength of 0 with a Body means unknown, as -1 does.
func readAll(r io.Reader, declared int64) ([]byte, error) {
	if declared <= 0 {
		declared = -1
	}
	return heldbody.ReadAll(r, declared, 0, nil)
}

// closeBody closes req.Body if there is one.
func closeBody(req *http.Request) {
	if req != nil && req.Body != nil {
		req.Body.Close()
	}
}

// String describes the Transport without its secret or static header values.
func (t *Transport) String() string {
	if t.prepare == nil {
		return "resign.Transport{unconfigured}"
	}
	return "resign.Transport{" + t.desc + "}"
}

// GoString is String, so %#v does not print the secret either.
func (t *Transport) GoString() string { return t.String() }

// describe lists the settings, redacting secrets.
func (s *signer) describe() string {
	enc := EncodingHex
	if s.base64 {
		enc = EncodingBase64
	}
	return describeSettings(s.signing(), s.tmpl, enc, s.sigHeader, s.tsHeader, s.nonceHeader, s.static)
}

// describeSettings formats settings for String; static header values are
// left out because they are often credentials.
func describeSettings(signing bool, tmpl *Template, enc, sig, ts, nonce string, static http.Header) string {
	secret := "none (signing off)"
	if signing {
		secret = "<redacted>"
	}
	tmplText := "<default>"
	if tmpl != nil {
		tmplText = tmpl.String()
	}
	names := make([]string, 0, len(static))
	for name := range static {
		names = append(names, name)
	}
	slices.Sort(names)
	return fmt.Sprintf("Secret:%s Template:%q Encoding:%q SignatureHeader:%q TimestampHeader:%q NonceHeader:%q StaticHeaders:%q",
		secret, tmplText, enc, sig, ts, nonce, names)
}

// Headers names the headers the signing layer sets on every attempt: the
// signature's and the timestamp's (their defaults when unset), the nonce's
// when set, and the static ones.
func (c Config) Headers() []string {
	names := []string{cmp.Or(c.SignatureHeader, DefaultSignatureHeader), cmp.Or(c.TimestampHeader, DefaultTimestampHeader)}
	if c.NonceHeader != "" {
		names = append(names, c.NonceHeader)
	}
	for name := range c.StaticHeaders {
		names = append(names, name)
	}
	return names
}

// SignsBody says whether the signature covers the request body ({body} or
// {body_sha256} in the template, as in DefaultCanonical): the signing layer
// then reads a request's whole body before it sends anything.
func (c Config) SignsBody() bool {
	return len(c.Secret) > 0 && (c.Template == nil || c.Template.needsBody())
}

// String describes the Config without its secret or static header values.
func (c Config) String() string {
	return "resign.Config{" + describeSettings(len(c.Secret) > 0, c.Template, c.Encoding,
		c.SignatureHeader, c.TimestampHeader, c.NonceHeader, c.StaticHeaders) + "}"
}

// Format makes every fmt verb (%v, %+v, %#v, %x, %d ...) print String, so
// no verb can print the Secret bytes.
func (c Config) Format(f fmt.State, _ rune) {
	io.WriteString(f, c.String())
}

// LogValue makes slog log String, never the Secret (slog's JSON handler
// would otherwise base64 the []byte).
func (c Config) LogValue() slog.Value {
	return slog.StringValue(c.String())
}
