// Package proxy is idemproxy's request path: it gives every protected request an
// idempotency key, claims the key in the record store, runs the upstream operation
// detached from the client, stores the final answer and replays it to repeats.
package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/internal/heldbody"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/routes"
	"github.com/idemproxy/idemproxy/store"
)

// Header names idemproxy reads or writes.
const (
	KeyHeader      = idemkey.HeaderName
	ReplayedHeader = "Idempotent-Replayed"
	AttemptsHeader = retry.AttemptsHeader // set by the attempt layer
)

// DefaultTenant namespaces records while client authentication is off.
const DefaultTenant = "default"

// Store is the part of the record store contract (package store) the proxy uses.
// Every store.Store implements it.
type Store interface {
	Begin(ctx context.Context, id store.ID, req store.Request, owner string, lease time.Duration) (store.Record, bool, error)
	Complete(ctx context.Context, id store.ID, owner string, resp store.Response, sent time.Time) error
	Abandon(ctx context.Context, id store.ID, owner string) error
	Park(ctx context.Context, id store.ID, owner string, o store.Outcome) error
	Renew(ctx context.Context, id store.ID, owner string, lease time.Duration) error
	Get(ctx context.Context, id store.ID) (store.Record, error)
	// MaxBodyBytes bounds the request bytes a parked record keeps for its
	// resume (store.Outcome.Sent).
	MaxBodyBytes() int64
}

var _ Store = store.Store(nil)

// MissingKey is the policy for a protected request with no key and no key source.
type MissingKey int

const (
	// Reject answers 422 idempotency_key_missing and sends nothing (the default).
	Reject MissingKey = iota
	// Generate uses a random key: the request is stored, but the app's own blind
	// retries are not recognised as repeats.
	Generate
	// Passthrough forwards the request untouched, without a key or a record.
	Passthrough
)

// ParseMissingKey parses IDEMPROXY_MISSING_KEY.
func ParseMissingKey(s string) (MissingKey, error) {
	switch s {
	case "reject", "":
		return Reject, nil
	case "generate":
		return Generate, nil
	case "passthrough":
		return Passthrough, nil
	}
	return 0, fmt.Errorf("unknown policy %q (want reject, generate or passthrough)", s)
}

// Options configure a Handler. Zero values have the defaults stated.
type Options struct {
	// Upstream is the one provider base URL requests go to. Required.
	Upstream *url.URL
	// Transport performs the upstream attempt sequence (retry → sign → wire)
	// and decides each answer's disposition (stored or not). Nil means one
	// attempt, unsigned, through http.DefaultTransport.
	Transport *retry.Transport
	// Store holds idempotency records. Required.
	Store Store
	// Protected lists the methods that get keys and records. Nil means POST.
	Protected []string
	// KeySources are tried in order when the client sent no Idempotency-Key.
	KeySources []idemkey.Source
	// MissingKey is the policy when no key can be found (zero: Reject).
	MissingKey MissingKey
	// Routes are per-endpoint rules tried before Protected and KeySources;
	// requests no rule matches follow those. The zero Table has no rules.
	Routes routes.Table
	// MaxBodyBytes caps request bodies (413 above). Zero means 1 MiB.
	MaxBodyBytes int64
	// MaxInflight bounds the requests served at once, from the moment a
	// request is ready to be served (once its body has been read; an
	// unprotected one whose body is streamed, at arrival) to its answer (an
	// operation whose client left, until it ends). Past it a request is
	// answered 503 overloaded with Retry-After, nothing sent and no record
	// written; a repeat of a stored order is still replayed. A client still
	// sending its body does not count, nor a repeat while it waits for its
	// key in flight (it takes a slot again before it claims the key). Zero:
	// no bound.
	MaxInflight int64
	// MaxInflightBytes bounds the request body bytes held at once, reserved
	// as the body is read into memory: a declared length up to 64 KiB
	// (heldbody.MaxPrealloc) before it is read, a longer one and a chunked
	// body as the bytes arrive (the buffer doubles, never past the declared
	// length), held until the operation ends. Past it: 503 overloaded, as
	// above; among bodies being read, the one holding the most goes on and
	// the others give way (byteBudget). It should be at least MaxBodyBytes.
	// Zero: no bound.
	MaxInflightBytes int64
	// SignsBody says that Transport's signing layer signs over the request
	// body (resign.Config.SignsBody), so that nothing is sent before a body
	// has been read whole. An unprotected request's body is then read here
	// first, within MaxInflightBytes, and the request takes its slot of
	// MaxInflight once it is read, as a protected one does; otherwise the
	// body is streamed upstream as it comes, from arrival.
	SignsBody bool
	// InflightWait bounds how long a repeat waits for the same key in flight
	// before 409 idempotency_in_progress. Zero means 10 s.
	InflightWait time.Duration
	// InProgressStatus and InProgressCode are the answer past InflightWait,
	// always with Retry-After, so that it reads as the provider's own "busy"
	// to an app written against the provider. Zero means 409 and
	// "idempotency_in_progress".
	InProgressStatus int
	InProgressCode   string
	// Lease is how long an in-flight record is owned; it is renewed every third
	// of it while the attempt sequence runs. Zero means 5 min.
	Lease time.Duration
	// Logger receives operational errors; nil discards them.
	Logger *slog.Logger
	// Clients, if set, authenticates every request (401 otherwise) and
	// namespaces its records by client. Nil: one DefaultTenant for all.
	Clients *ClientTokens
	// KeySecret binds every key sent upstream to its client (idemkey.Bind),
	// the app's own keys included, so that no client can compute or claim
	// another's upstream key. Required with Clients; unused without.
	KeySecret []byte
	// OwnedHeaders names the headers the attempt layer sets on every
	// attempt besides the key (signature, timestamp, nonce, static
	// credentials). A client header that spells one of them, the key's or
	// the client token's with underscores for dashes is never forwarded
	// (see rewrite).
	OwnedHeaders []string
	// OnDone, if set, is called once per request with its summary (logs, metrics).
	OnDone func(Summary)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Handler is the proxy's http.Handler. Close nothing: call Drain on shutdown to wait
// for detached upstream operations.
type Handler struct {
	opt        Options
	protected  map[string]bool
	inProgress busy
	rp         *httputil.ReverseProxy
	ops        sync.WaitGroup
	flights    flights
	windows    windowLocks
	adm        *admission
	reads      bodyReads
	streams    streamReads
	// graceOver is closed by AnswerRunning: requests still waiting for an
	// operation in flight are answered at once.
	graceOver chan struct{}
	graceOnce sync.Once
	// underscored holds the dashed canonical names of the headers
	// idemproxy owns (Options.OwnedHeaders, the key's, the client
	// token's): a client header that reads as one of them once its
	// underscores are dashes is dropped (dropUnderscored).
	underscored map[string]bool
}

// New checks opts and builds a Handler.
func New(opts Options) (*Handler, error) {
	if opts.Upstream == nil || opts.Upstream.Host == "" {
		return nil, errors.New("proxy: upstream URL with a host is required")
	}
	if opts.Store == nil {
		return nil, errors.New("proxy: store is required")
	}
	if opts.Clients != nil && len(opts.KeySecret) == 0 {
		return nil, errors.New("proxy: a key secret is required with client authentication")
	}
	if opts.Transport == nil {
		opts.Transport = &retry.Transport{}
	}
	if opts.Protected == nil {
		opts.Protected = []string{http.MethodPost}
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 1 << 20
	}
	if opts.InflightWait <= 0 {
		opts.InflightWait = 10 * time.Second
	}
	if opts.Lease <= 0 {
		opts.Lease = 5 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	h := &Handler{opt: opts, protected: map[string]bool{}, inProgress: busyError(opts.InProgressStatus, opts.InProgressCode)}
	for _, m := range opts.Protected {
		h.protected[strings.ToUpper(m)] = true
	}
	h.underscored = map[string]bool{}
	owned := append([]string{KeyHeader}, replayLicenceHeaders...)
	if opts.Clients != nil {
		owned = append(owned, opts.Clients.Header())
	}
	for _, n := range append(owned, opts.OwnedHeaders...) {
		h.underscored[textproto.CanonicalMIMEHeaderKey(strings.ReplaceAll(n, "_", "-"))] = true
	}
	h.flights.m = map[store.ID]*flight{}
	h.adm = newAdmission(opts.MaxInflight, opts.MaxInflightBytes)
	h.graceOver = make(chan struct{})
	h.rp = &httputil.ReverseProxy{
		// Rewrite, not Director: hop-by-hop headers are removed after Director
		// runs, which could strip headers set there (Go issue 50580). The
		// per-request copies made by reverseProxy replace it.
		// Rewrite and Transport are set per request (reverseProxy).
		ErrorHandler: h.upstreamError,
		ErrorLog:     slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
		// Responses are passed on as they come: forward's statusWriter
		// flushes every write. (Protected requests do not use it: see
		// roundTrip.)
		// Without a pool every request allocates a fresh 32 KiB copy buffer.
		BufferPool: bufferPool{},
	}
	return h, nil
}

// Drain waits until every detached upstream operation has finished and been stored,
// or ctx ends.
func (h *Handler) Drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() { h.ops.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("drain: %w", ctx.Err())
	}
}

// AnswerRunning answers at once the requests still waiting for an
// operation in flight, called shortly before the shutdown grace runs out:
// the client of an operation still running gets 504 upstream_unavailable
// with its key (its outcome is unknown: the app's retry resumes it with the
// same key), a repeat waiting for it 409 idempotency_in_progress (or the
// configured in-progress answer), and a request about to claim its key 503
// upstream_unavailable, nothing sent. Their connections were otherwise cut
// without an answer when the process exited at the end of the grace. The
// operations themselves go on until the grace ends (Drain); what is still
// running then stays in flight in the store. Calling it again does nothing.
func (h *Handler) AnswerRunning() {
	h.graceOnce.Do(func() { close(h.graceOver) })
}

// graceIsOver reports whether AnswerRunning was called.
func (h *Handler) graceIsOver() bool {
	select {
	case <-h.graceOver:
		return true
	default:
		return false
	}
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sum := newSummary(r, h.opt.Now())
	defer h.done(sum)
	r = ignoreH2CUpgrade(keepEscapes(r))
	if err := checkShape(r); err != nil {
		h.echoProtectedKey(w, r)
		if err == ErrFraming {
			// What follows on the connection cannot be told from
			// this request's body (RFC 9112 §6.1: close after it).
			w.Header().Set("Connection", "close")
		}
		h.fail(w, sum, err)
		return
	}
	tenant, err := h.tenant(r)
	if err != nil {
		h.echoProtectedKey(w, r)
		h.fail(w, sum, err)
		return
	}
	// Runs after the request's slot and bytes are given back (below).
	defer lingerRefused(w, r, r.Body, sum)
	if r.ContentLength > h.opt.MaxBodyBytes { // refused before a streamed request leaves
		h.echoProtectedKey(w, r)
		// Close after the answer: net/http would otherwise read the rest
		// of a body under 256 KiB before answering, to keep the connection,
		// and a client that declared more than it sends (or sends slowly)
		// would wait for its 413 until the read timeout.
		w.Header().Set("Connection", "close")
		h.fail(w, sum, ErrBodyTooLong)
		return
	}
	if r.ContentLength < 0 {
		// A declared length was checked above, and the server ends such a
		// body at it: only a body of unknown length needs the bound.
		// It goes on a copy of the request: net/http closes the
		// connection after a chunked body whose read failed (a trailer
		// section past its 4 KiB buffer) only while the request it
		// holds still has its own body; with another reader there, its
		// discard of the rest reads "already closed", takes the body
		// for consumed, and reads the trailer section's bytes as the
		// next request (TestTrailerTooLongClosesTheConnection).
		r = r.WithContext(r.Context())
		r.Body = http.MaxBytesReader(w, r.Body, h.opt.MaxBodyBytes)
	}
	t := h.adm.admit()
	defer drainRefused(r, sum, t) // after the ticket is released (defers run last first)
	defer t.release()
	rule := h.rule(r)
	switch rule.Policy {
	case routes.Reject:
		w.Header().Set("Allow", h.allowed(r.URL.EscapedPath()))
		h.fail(w, sum, ErrRouteRejected)
	case routes.Unprotected:
		h.serveUnprotected(w, r, tenant, sum, t)
	default:
		// Its request slot is taken once its body is read (serveProtected).
		h.serveProtected(w, r, tenant, rule, sum, t)
	}
}

// Bounds of lingerRefused.
const (
	lingerTime  = 5 * time.Second
	lingerBytes = 64 << 20
)

// lingerRefused reads and drops what comes of the body of a request refused
// 413 body_too_large (body is r.Body as the server gave it, before
// MaxBytesReader), once the answer is out, for at most lingerTime and
// lingerBytes, before the connection is closed (as nginx's lingering close
// does). Closed while the body still arrives, the connection is reset, and
// the reset also drops the answer the client has not read yet: a client
// that writes its whole body before it reads (Python's urllib and
// http.client, most scripts) reported "connection reset by peer" instead of
// the 413. A client that asked for 100-continue and was refused for its
// declared length before any read was not sent 100 Continue and sends no
// body: it is left alone.
func lingerRefused(w http.ResponseWriter, r *http.Request, body io.Reader, sum *Summary) {
	if sum.Status != http.StatusRequestEntityTooLarge ||
		r.ContentLength >= 0 && strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return
	}
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	rc.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, body, lingerBytes)
}

// drainRefused reads and drops the rest of the body of a request refused
// overloaded before its body was read whole. Closing a connection with a
// body still arriving resets it, and most clients then report the reset
// instead of the 503 and its Retry-After. Draining holds no memory and no
// bound. A client that asked for 100-continue sends no body until its first
// read (net/http sends 100 Continue then): refused before that, it was not
// sent it and its body is left alone; refused part way through (the byte
// bound at a growth of the buffer, t.reading), it is sending and is drained.
func drainRefused(r *http.Request, sum *Summary, t *ticket) {
	if sum.Outcome == OutcomeOverloaded && (t.reading || !strings.EqualFold(r.Header.Get("Expect"), "100-continue")) {
		io.Copy(io.Discard, r.Body) // r.Body stops at MaxBodyBytes
	}
}

// rule is the route rule for r: the first IDEMPROXY_ROUTES rule that matches,
// else the default one (protected methods get keys from KeySources, others are
// unprotected).
func (h *Handler) rule(r *http.Request) routes.Rule {
	return h.ruleFor(r.Method, r.URL.EscapedPath())
}

// allowed is the Allow header of a 405 for escapedPath (RFC 9110, 15.5.6):
// the usual methods no reject rule refuses there, empty when they all are.
func (h *Handler) allowed(escapedPath string) string {
	var ms []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions} {
		if h.ruleFor(m, escapedPath).Policy != routes.Reject {
			ms = append(ms, m)
		}
	}
	return strings.Join(ms, ", ")
}

func (h *Handler) ruleFor(method, escapedPath string) routes.Rule {
	if rule, ok := h.opt.Routes.Match(method, escapedPath, h.protected[method]); ok {
		return rule
	}
	if h.protected[method] {
		return routes.Rule{Policy: routes.Key, Sources: h.opt.KeySources}
	}
	return routes.Rule{Policy: routes.Unprotected}
}

func (h *Handler) tenant(r *http.Request) (string, error) {
	if h.opt.Clients == nil {
		return DefaultTenant, nil
	}
	return h.opt.Clients.Tenant(r)
}

func modeFor(method string) retry.Mode {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return retry.Safe
	}
	return retry.Once
}

// forward passes an unprotected request through, streaming the answer.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, m retry.Mode, key outgoingKey, sum *Summary) {
	h.forwardStream(w, r, m, key, sum, nil)
}

// forwardStream is forward for a request whose body, if stream is not nil,
// is streamed upstream as it arrives (Handler.stream).
func (h *Handler) forwardStream(w http.ResponseWriter, r *http.Request, m retry.Mode, key outgoingKey, sum *Summary, stream *streamBody) {
	ex := &retry.Exchange{Transport: h.opt.Transport, Call: retry.Call{Mode: m}}
	sw := &statusWriter{ResponseWriter: w, stream: stream}
	h.reverseProxy(key, ex).ServeHTTP(sw, r)
	if sw.clientGone { // logged as before, answered as a protected request (fail)
		sum.settle(result{resp: store.Response{Status: ErrClientGone.Status}, report: ex.Report}, nil)
		panic(http.ErrAbortHandler)
	}
	if sw.failed != nil { // idemproxy's own error, not the provider's answer
		a := *sw.failed
		a.Attempts = max(a.Attempts, ex.Report.Attempts)
		sum.settle(result{}, &a)
		return
	}
	sum.settle(result{resp: store.Response{Status: sw.status}, report: ex.Report}, nil)
}

// serveUnprotected passes an unprotected request through. Its request slot
// is taken when its attempt can start: at once when its body is streamed
// upstream as it comes, but when the signature covers the body
// (Options.SignsBody) nothing leaves before the body is read whole, so it
// is read here first, its bytes reserved as for a protected request
// (readHeld), and the slot taken after: a client sending such a body slowly,
// or stalling in it, holds only the bytes it sent, not one of MaxInflight.
func (h *Handler) serveUnprotected(w http.ResponseWriter, r *http.Request, tenant string, sum *Summary, t *ticket) {
	key, err := h.unprotectedKey(r, tenant)
	if err != nil {
		h.fail(w, sum, err)
		return
	}
	var stream *streamBody
	if h.opt.SignsBody && r.ContentLength != 0 {
		body, err := h.readBody(w, r, t)
		if errors.Is(err, errBodyBytes) {
			h.fail(w, sum, ErrOverloadedBytes)
			return
		}
		if err != nil { // nothing was sent
			h.fail(w, sum, fmt.Errorf("%w: %w", retry.ErrRequestBody, err))
			return
		}
		// Held whole, it goes with its length; the signer signs these
		// bytes in place (heldbody.Unread).
		r.Body, r.ContentLength, r.TransferEncoding = heldbody.New(body), int64(len(body)), nil
	} else {
		// Streamed as it arrives: a shutdown cuts it if it is still
		// arriving near the grace's end (CutBodyReads).
		r, stream = h.stream(w, r)
		defer h.streamDone(stream)
	}
	if !t.takeSlot() {
		h.fail(w, sum, ErrOverloaded)
		return
	}
	h.forwardStream(w, r, modeFor(r.Method), key, sum, stream)
}

// upstreamError is the ReverseProxy's error handler (unprotected requests,
// streamed): it answers the client, unless the client left (forward then
// closes the connection without an answer).
func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if sw, ok := w.(*statusWriter); ok && sw.stream.wasCut() {
		// The shutdown cut the body, and cancelled the request's context
		// with it: answered, not taken for the client gone.
		h.opt.Logger.Warn("shutting down: request body still arriving cut; its request upstream was broken off before the body ended",
			"method", r.Method, "path", r.URL.Path)
		w.Header().Set("Connection", "close") // what follows the cut on it cannot be read
		a := classify(ErrDrainingStreamed)
		sw.failed = &a
		writeClassified(w, ErrDrainingStreamed, a, "")
		return
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		if sw, ok := w.(*statusWriter); ok {
			sw.clientGone = true
			return
		}
	}
	if !errors.Is(err, context.Canceled) {
		h.opt.Logger.Warn("upstream request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	a := classify(err)
	if sw, ok := w.(*statusWriter); ok {
		sw.failed = &a // its outcome is this error's (upstream_unavailable), not forwarded
	}
	writeClassified(w, err, a, "")
}

func (h *Handler) serveProtected(w http.ResponseWriter, r *http.Request, tenant string, rule routes.Rule, sum *Summary, t *ticket) {
	// Trailers the client did not declare reach r.Trailer only as the body
	// ends. They are ignored (declared ones were refused by checkShape):
	// nothing reads a key or a signature from them, and none goes upstream
	// (rewrite).
	echoClientKey(w, r)
	body, err := h.readBody(w, r, t)
	if errors.Is(err, errBodyBytes) {
		h.fail(w, sum, ErrOverloadedBytes)
		return
	}
	if err != nil { // nothing was sent: not an unknown outcome
		h.fail(w, sum, fmt.Errorf("%w: %w", retry.ErrRequestBody, err))
		return
	}
	// The request slot is taken now that the body is here, not at arrival:
	// a client sending its body slowly, or stalling in it, holds only the
	// bytes it sent (readHeld), and MaxInflight counts requests ready to be
	// served. Past MaxInflight the request is still served if it repeats a
	// stored order: its answer is replayed (obtain), which sends nothing
	// upstream and costs a store read.
	t.takeSlot()
	// A gzip or deflate body is read decoded, as the provider reads it; it
	// is sent as it came.
	plain, undecodable, err := decodedBody(r.Header, body, h.opt.MaxBodyBytes, t)
	if err != nil {
		h.fail(w, sum, ErrOverloadedBytes)
		return
	}
	// The escaped path is what goes upstream: /cards/a%2Fb and /cards/a/b are
	// two resources and must be two keys.
	kr := idemkey.Request{Method: r.Method, Path: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery,
		ContentType: r.Header.Get("Content-Type"), Header: r.Header, Body: plain}
	if tenant != DefaultTenant {
		kr.Tenant = tenant
	}
	// The fingerprint takes the path as it came; a key derived from a
	// source or a fingerprint window takes it in its normal form
	// (keyPath), so that one order spelled two ways is one key, and a
	// second spelling is 409 idempotency_conflict, nothing sent. One pass
	// over the body gives the fingerprint and the key sources' values.
	parsed := idemkey.Parse(rule.Sources, kr)
	fp := parsed.Fingerprint
	windowFP := fp
	if keyPath(kr.Path) != kr.Path {
		if rule.Policy == routes.Fingerprint {
			windowFP, err = h.windowFingerprint(r.Context(), kr, fp, rule.Window)
		}
		if err == nil {
			kr.Path, err = h.derivationPath(r.Context(), kr, &parsed, rule, tenant)
		}
		if err != nil {
			h.fail(w, sum, err)
			return
		}
	}
	key, err := h.resolveKey(r.Context(), kr, &parsed, rule, windowFP, undecodable, r.URL.EscapedPath())
	if err != nil {
		h.fail(w, sum, err)
		return
	}
	if key == "" { // Passthrough policy
		if !t.slot {
			h.fail(w, sum, ErrOverloaded)
			return
		}
		// The body is held whole: it goes with its length, so an empty one
		// is "Content-Length: 0", never a zero-length chunked body (some
		// providers and WAFs answer 411).
		r.Body, r.ContentLength, r.TransferEncoding = heldbody.New(body), int64(len(body)), nil
		h.forward(w, r, retry.Once, outgoingKey{}, sum)
		return
	}
	sum.Key, sum.UpstreamKey = key, h.upstreamKey(tenant, key)
	w.Header().Set(KeyHeader, idemkey.HeaderValue(key))
	id := store.ID{Tenant: tenant, Key: key}
	res, err := h.obtain(r, id, &sum.UpstreamKey, fp[:], body, t)
	for gen := 2; err != nil && gen <= maxGenerations; gen++ {
		var sup superseded
		if !errors.As(err, &sup) {
			break
		}
		// An operator renewed the order: its next generation's key, which
		// only a key derived from the request can follow.
		kr.Generation = gen
		next, _, derived := parsed.Derive(kr)
		if _, sent, _ := idemkey.FromHeader(r.Header); sent || rule.Policy != routes.Key || !derived {
			// The key stays this generation's: its answer is replayed to
			// the same request only, as for any final record (obtain).
			res, err = result{resp: sup.rec.Response, replayed: true}, nil
			if !bytes.Equal(sup.rec.Fingerprint, fp[:]) {
				err = ErrConflict
			}
			break
		}
		id.Key, sum.Key, sum.UpstreamKey = next, next, h.upstreamKey(tenant, next)
		w.Header().Set(KeyHeader, next)
		res, err = h.obtain(r, id, &sum.UpstreamKey, fp[:], body, t)
	}
	if err == nil {
		err = res.err
	}
	if err != nil {
		h.fail(w, sum, err)
		return
	}
	writeResult(w, res, id.Key, sum)
}

// echoClientKey puts the app's own Idempotency-Key, if it sent a valid one,
// on the answer to a protected request: an answer refused before the key is
// resolved (body too large or unreadable, overloaded) carries the key as
// every other answer does (docs/contract.md), the one the app's retry must
// send. A key derived from the body is set once the body is read.
func echoClientKey(w http.ResponseWriter, r *http.Request) {
	if key, present, err := idemkey.FromHeader(r.Header); present && err == nil {
		w.Header().Set(KeyHeader, idemkey.HeaderValue(key))
	}
}

// echoProtectedKey is echoClientKey for a request refused before its rule
// is acted on (its shape, its client token, its declared length): the app's
// own valid key, as it came, when the rule protects the request. An
// unprotected request's answers carry none of idemproxy's (they are the
// provider's).
func (h *Handler) echoProtectedKey(w http.ResponseWriter, r *http.Request) {
	if p := h.rule(r).Policy; p == routes.Key || p == routes.Fingerprint {
		echoClientKey(w, r)
	}
}

// resolveKey returns the key for a protected request: the client's own, else the
// fingerprint window's key for a fingerprint rule, else one derived from the first
// of the rule's sources present (parsed is r's body read for them: Parse), else
// what the MissingKey policy says ("" for Passthrough). undecodable says r's body has a Content-Encoding that was not
// undone (decodedBody), so that its key sources could not be read: such a
// request is refused under every policy. sentPath is the escaped path as
// the request came (r.Path is in its normal form, keyPath): the routes
// matched that one, so it is the one keyedAsSpeltOtherwise reads.
func (h *Handler) resolveKey(ctx context.Context, r idemkey.Request, parsed *idemkey.Parsed, rule routes.Rule, fp [32]byte, undecodable bool, sentPath string) (string, error) {
	key, present, err := idemkey.FromHeader(r.Header)
	if err != nil {
		return "", err
	}
	if present {
		return h.clientKey(ctx, r.Tenant, key)
	}
	if rule.Policy == routes.Fingerprint {
		return h.windowKey(ctx, r.Tenant, fp, rule.Window)
	}
	if key, _, ok := parsed.Derive(r); ok {
		return key, nil
	}
	if undecodable {
		// Whatever the policy: the order's id may be in the body, and a
		// random key, or none, would have each blind retry executed again.
		return "", ErrKeyMissingEncoded
	}
	if why := idemkey.UnreadableReason(rule.Sources, r); why != idemkey.ReasonNone {
		// Whatever the policy, for the same reason: a source is there
		// (repeated with other values, in another letter case, in JSON
		// that does not parse whole), which the provider may read as the
		// order's id. The answer names the cause when it is one an app
		// cannot see in the generic message.
		return "", keyMissingFor(why)
	}
	if h.opt.MissingKey != Reject && h.protected[r.Method] && h.keyedAsSpeltOtherwise(r.Method, sentPath) {
		// Whatever the policy: a key or fingerprint rule is meant for this
		// endpoint, which a lenient provider routes it to, and the defaults
		// that apply in its place found no key (routes.Table.Match).
		return "", ErrKeyMissingSpelling
	}
	switch h.opt.MissingKey {
	case Generate:
		return uuid.NewString(), nil
	case Passthrough:
		return "", nil
	}
	return "", ErrKeyMissing
}

// keyMissingFor is the 422 for a request whose key source is there without
// one value, naming why when the generic message does not.
func keyMissingFor(why idemkey.Reason) *Error {
	switch why {
	case idemkey.ReasonLoneSurrogate:
		return ErrKeyMissingSurrogate
	case idemkey.ReasonFormSemicolon:
		return ErrKeyMissingFormSemicolon
	case idemkey.ReasonQuerySemicolon:
		return ErrKeyMissingQuerySemicolon
	}
	return ErrKeyMissing
}

// keyedAsSpeltOtherwise reports whether a key or fingerprint rule of
// IDEMPROXY_ROUTES matches a request of method, protected by default, to
// escapedPath only as a lenient server reads the path ("/cards/", "//cards",
// "/Cards" for a rule of "/cards"). routes.Table.Match does not apply such a
// rule to a method protected by default, so that a key the defaults derive
// for it stays what it was; when they derive none, the request is refused
// (resolveKey) rather than given a random key or none, which a provider
// that routes the path leniently would execute on every blind retry.
func (h *Handler) keyedAsSpeltOtherwise(method, escapedPath string) bool {
	if _, ok := h.opt.Routes.Match(method, escapedPath, true); ok {
		return false
	}
	rule, ok := h.opt.Routes.Match(method, escapedPath, false)
	return ok && (rule.Policy == routes.Key || rule.Policy == routes.Fingerprint)
}

// maxGenerations bounds how many renewed key generations one request follows.
const maxGenerations = 1000

// OrderKeys are the keys the proxy derives for client (DefaultTenant or ""
// for none) from a request of method and path whose key source has value,
// in the order's key generation gen (1 first): one per key source of the
// request's route, in their order, since a request's key comes from the
// first source it has (an order sent as a form has the form source's key,
// though a JSON source is listed first). It is what an operator needs to
// find an order's record. path is read as a request target is (a query is
// no part of the key); one no request can have is an error, not the key of
// an order that cannot exist. It fails for requests that get no derived key
// (unprotected, rejected or fingerprint routes).
//
// The keys are derived over the path in its normal form (keyPath), unless
// a record exists under a generation 1 key derived over path as it came,
// which is what versions before keyPath derived: the order's requests keep
// that key (derivationPath), and so does its look-up, so that an operator
// finds, settles or renews an order left unknown across an upgrade. Reading
// the store, OrderKeys may fail with its error (store.ErrUnavailable).
func (h *Handler) OrderKeys(method, path, value, client string, gen int) ([]string, error) {
	path, err := requestPath(path)
	if err != nil {
		return nil, err
	}
	rule := h.ruleFor(method, path)
	if rule.Policy == routes.Fingerprint {
		// No order value names such an operation: an operator looking
		// for one (a failed card issue to try again) is told what does
		// happen, not only that nothing can be derived.
		return nil, fmt.Errorf("%s %s is keyed by a fingerprint window (%s), not by an order value: its operations are found by key "+
			"(records list, records get), and the same request after the window is sent under a new key, a new operation",
			method, path, rule.Window)
	}
	if rule.Policy != routes.Key || len(rule.Sources) == 0 {
		return nil, fmt.Errorf("%s %s gets no key derived from a source (policy %s)", method, path, rule.Policy)
	}
	kr := idemkey.Request{Method: method, Path: keyPath(path), Generation: gen}
	if client != DefaultTenant {
		kr.Tenant = client
	}
	if kr.Path != path {
		first := kr
		first.Path, first.Generation = path, 1
		tenant := client
		if tenant == "" {
			tenant = DefaultTenant
		}
		for _, src := range rule.Sources {
			_, err := h.opt.Store.Get(context.Background(), store.ID{Tenant: tenant, Key: idemkey.KeyFor(src, value, first)})
			if err == nil || errors.Is(err, store.ErrUnreadable) { // a record is there
				kr.Path = path
				break
			}
			if !errors.Is(err, store.ErrNotFound) {
				return nil, fmt.Errorf("reading the record of the path as it came: %w", err)
			}
		}
	}
	keys := make([]string, len(rule.Sources))
	for i, src := range rule.Sources {
		keys[i] = idemkey.KeyFor(src, value, kr)
	}
	return keys, nil
}

// requestPath is the escaped path (r.URL.EscapedPath) of a request whose
// target is target, as the proxy keys and routes it; an error for a target
// the proxy refuses or no client can send (no leading /, white space or a
// control character, a fragment, a dot-segment).
func requestPath(target string) (string, error) {
	if !strings.HasPrefix(target, "/") || strings.ContainsFunc(target, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '#' }) {
		return "", fmt.Errorf("path %q is not one a request can have: it begins with / and holds no white space, control character or #", target)
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return "", fmt.Errorf("path %q is not one a request can have", target)
	}
	if hasDotSegment(u.EscapedPath()) {
		return "", fmt.Errorf("path %q has a dot-segment: idemproxy refuses such requests, so no order has it", target)
	}
	return u.EscapedPath(), nil
}

// newOwner returns a random owner token for an in-flight lease.
func newOwner() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// bufferPool lends ReverseProxy its 32 KiB copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
