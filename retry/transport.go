package retry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/internal/heldbody"
	"github.com/idemproxy/idemproxy/ratelimit"
)

// AttemptsHeader is set on every response Transport returns: the number of
// attempts the sequence made, so the app and the proxy's logs can see it.
const AttemptsHeader = "Idemproxy-Attempts"

// DefaultMaxResponseBytes is the response body cap when
// [Transport.MaxResponseBytes] is zero.
const DefaultMaxResponseBytes = 16 << 20

// ErrBudget is wrapped in an [ExhaustedError] when the next wait would end
// after the budget deadline: the sequence ends instead of sleeping.
var ErrBudget = errors.New("retry: next wait would pass the budget deadline")

// Transport is an http.RoundTripper that runs the attempt sequence of one
// request: attempt, decide, wait. Every attempt is a clone of the caller's
// request with the same headers (the Idempotency-Key included) and the same
// body bytes, sent by a separate Next.RoundTrip call so that the signing
// layer below gives it fresh signature headers.
//
// Which failures are retried depends on the [Mode] of the [Call] the caller
// passes to [Transport.Do] (an [Exchange] adapts one Call to
// http.RoundTripper). Transport is safe for concurrent use; its fields must
// not change once it is in use.
type Transport struct {
	// Next sends one attempt; it is the re-signing layer. If nil,
	// OneShot{Next: http.DefaultTransport} is used, so that net/http cannot
	// resend an attempt behind the loop's back (see [OneShot]).
	Next http.RoundTripper
	// Policy says what is retried and how long to wait.
	Policy Policy
	// Gate paces attempts and holds the provider-wide Retry-After pause.
	// If nil, attempts are not paced and Retry-After only delays its own
	// request.
	Gate *ratelimit.Gate
	// Now returns the current time. If nil, time.Now is used. The budget is
	// also a context deadline, so Now must stay close to the real time.
	Now func() time.Time
	// Sleep waits for d or until ctx is done, returning ctx's error in the
	// latter case. If nil, a timer honouring ctx is used.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a float in [0, 1) for the backoff jitter. If nil,
	// math/rand/v2 is used.
	Rand func() float64
	// MaxResponseBytes caps a response body, which is held in memory.
	// Zero means DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// OnAttempt, if not nil, is called after every attempt is decided, from
	// the goroutine running RoundTrip, for metrics and logs.
	OnAttempt func(AttemptInfo)
	// Prober, if set, builds the status lookup sent before re-sending a
	// protected request whose outcome is unknown (after a timeout, a broken
	// connection or a 5xx such as 504, or when the request resumes such an
	// operation, see [Call.Resume]): a 2xx answer about the operation is the
	// final answer, marked [ReconciledHeader]; only the provider's own "no
	// such operation" (see [Prober]) means it did not happen. Nil means no
	// probe: the request is re-sent with the same key.
	Prober Prober
	// KeyRetention is how long the provider keeps idempotency keys. An
	// operation whose outcome is unknown and that was first sent longer ago
	// is never re-sent blindly: unless the probe finds it or says it did not
	// happen, the sequence ends with [ErrKeyExpired]. Zero means forever.
	KeyRetention time.Duration
	// OnProbe, if not nil, is called after every probe, for metrics and logs.
	OnProbe func(ProbeInfo)
}

// AttemptInfo describes one attempt for [Transport.OnAttempt]. It carries no
// header, body or query, so it is safe to log.
type AttemptInfo struct {
	Method   string        // request method
	Path     string        // URL path only
	Mode     Mode          // the request's mode
	Attempt  int           // 1 for the first attempt
	GateWait time.Duration // time spent at the Gate before the attempt left
	Duration time.Duration // from sending to the end of the response body
	Status   int           // response status; 0 when none came
	Err      error         // the attempt's network error; nil when a response came
	Reason   Reason        // why another attempt is wanted; ReasonNone when the result is final
	Wait     time.Duration // the wait before the next attempt, when one follows
	Last     bool          // no attempt follows: the result is final or the sequence gave up
	// Paused is the provider-wide pause this attempt's 429/503 Retry-After
	// set at the Gate; 0 when it set none (no Gate, other status, no header).
	Paused time.Duration
}

// Do sends req as c says until the answer is final or the policy gives up.
// For a protected request it returns a final response with its body in
// memory and the [AttemptsHeader]; for an unprotected one (Safe, Once) the
// response streams, with no size cap, and Safe retries happen only before it
// is returned, and only when the request has no body to resend. It returns
// an *[ExhaustedError] when retriable failures used up the attempts or the
// budget (never the last retriable response, which must not pass as final);
// the caller's context error, wrapped, when the caller's context ends. The
// Report is filled in every case. Do reads and closes req.Body.
func (t *Transport) Do(req *http.Request, c Call) (*http.Response, Report, error) {
	// On Do's stack: nothing keeps the sequence past the return.
	s := &sequence{t: t, req: req, mode: c.Mode, stop: c.Stop}
	if err := s.begin(c); err != nil { // nothing was sent (the caller's body could not be read)
		return nil, Report{Disposition: t.Policy.Dispose(Answer{Mode: c.Mode, Err: err}).Disposition}, err
	}
	handedOff := false // a streamed body, once returned, ends the sequence when closed
	defer func() {
		if !handedOff && s.cancel != nil {
			s.cancel()
		}
	}()
	for {
		if s.unknown {
			resp, err := s.resolve()
			if resp != nil { // the probe found the operation: its answer is the result
				return resp, s.reportAs(Final), nil
			}
			if err != nil {
				return nil, s.ended(), err
			}
		}
		o, err := s.attempt()
		if err != nil {
			return nil, s.ended(), err
		}
		wait, v, done, err := s.decide(o)
		switch {
		case err != nil:
			return nil, s.ended(), err
		case done:
			handedOff = s.stream
			d := v.Disposition
			if d == PassOn && s.unknown {
				// An answer passed on (401, 403…) says this attempt was
				// not acted on, not that an earlier one, or the sequence
				// this one resumed, was not: the operation's outcome is
				// still unknown, and its record must keep saying so.
				d = Unknown
			}
			return s.response(o), s.reportAs(d), nil
		}
		s.discard(o)
		if err := s.wait(wait); err != nil {
			return nil, s.ended(), err
		}
	}
}

// sequence is the state of one RoundTrip.
type sequence struct {
	t    *Transport
	req  *http.Request
	body []byte // the request body, read once, sent by every attempt
	mode Mode
	stop *Stop // Call.Stop; nil for none
	// stream: an unprotected request, whose bodies are not held: the
	// request's is sent as it comes, again only when resendable (none, or
	// the caller's GetBody), and the answer's is returned unread.
	stream     bool
	resendable bool
	ctx        context.Context // req's context, bounded by the budget (not for a stream: it would cut the answer); see budgetContext
	cancel     context.CancelFunc
	deadline   time.Time // the budget's deadline (or req's, if earlier); zero when none
	attempts   int
	sent       bool // an attempt may have reached the upstream
	last       outcome
	// What is known of the operation upstream (protected requests only).
	firstSent time.Time // when an attempt first reached the provider, by the Transport's clock; zero if none did
	// resumedSent is Call.Resume's FirstSentAt, by the store's clock, while
	// firstSent is the resumed one carried to the Transport's clock (with
	// Call.Store); zero otherwise. It is reported as given: carried there
	// and back, it came back earlier by Since (see StoreClock), so that each
	// resume moved the record's first send earlier by the time its claim
	// took, and a takeover's (the claim time, created_at) read a few
	// milliseconds before the record was created.
	resumedSent time.Time
	sentAnew    bool   // the status probe said the operation had not happened (the provider's not-found): firstSent is of a send after it
	unknown     bool   // the provider may have acted on an attempt whose answer was lost
	lastBody    []byte // the body of the last ambiguous answer, for the probe
	// The record store's clock (Call.Store), and the Transport's time when
	// the sequence began, which the store's At is counted from.
	store  *StoreClock
	origin time.Time
}

// outcome is the result of one attempt.
type outcome struct {
	resp          *http.Response // nil when err != nil; its body is already read
	body          []byte
	err           error
	timeout       bool
	retryAfter    time.Duration // capped; valid when hasRetryAfter
	hasRetryAfter bool
	gateWait      time.Duration
	start         time.Time // when the attempt left
	duration      time.Duration
	paused        time.Duration // the Gate pause this attempt's Retry-After set
}

// begin buffers the body so that every attempt sends identical bytes, and
// bounds the sequence by the budget.
func (s *sequence) begin(c Call) error {
	t, req := s.t, s.req
	if s.mode != Protected {
		s.stream = true
		s.resendable = req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
		s.ctx, s.cancel = context.WithCancel(req.Context())
		if b := t.Policy.Budget; b > 0 {
			s.deadline = t.now().Add(b) // bounds the waits, not the answer
		}
		return nil
	}
	body, err := readBody(req, c.Body)
	if err != nil {
		return fmt.Errorf("retry: %s %s: %w: %w", req.Method, req.URL.Path, ErrRequestBody, err)
	}
	s.body = body
	// The budget's context is made only if a wait needs it (budgetContext):
	// an attempt's own context carries the budget's deadline too, so a
	// sequence that sends once and is answered builds one context, not two.
	if b := t.Policy.Budget; b > 0 {
		s.deadline = t.now().Add(b)
	}
	if d, ok := req.Context().Deadline(); ok && (s.deadline.IsZero() || d.Before(s.deadline)) {
		s.deadline = d
	}
	if c.Store != nil {
		s.store, s.origin = c.Store, t.now()
	}
	if r := c.Resume; r != nil {
		s.unknown, s.firstSent, s.lastBody = true, r.FirstSentAt, r.LastBody
		if s.store != nil && !r.FirstSentAt.IsZero() {
			// Its age by the store's clock at the claim, and the time since
			// the claim was sent, carried to this clock (see StoreClock).
			s.firstSent = s.origin.Add(-(s.store.At.Sub(r.FirstSentAt) + s.store.Since))
			s.resumedSent = r.FirstSentAt
		}
	}
	return nil
}

// readBody returns the body bytes every attempt sends: held, the caller's
// (closing req.Body unread), else read from req.Body.
func readBody(req *http.Request, held []byte) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return held, nil
	}
	defer req.Body.Close()
	if held != nil {
		return held, nil
	}
	return io.ReadAll(req.Body)
}

// attempt passes the Gate and sends one attempt. An error means the
// sequence is over: the caller left, the Gate could not let the attempt out
// within the budget, or the response was too large to hold.
func (s *sequence) attempt() (outcome, error) {
	if err := s.callerErr(); err != nil {
		return outcome{}, s.callerGone(err)
	}
	var o outcome
	waited, err := s.passGate()
	o.gateWait = waited
	if err != nil {
		return o, s.stopped(err)
	}
	if waited > 0 { // Call.Stop's time may have come during the wait
		if err := s.callerErr(); err != nil {
			return o, s.callerGone(err)
		}
	}
	s.attempts++
	o.start = s.t.now()
	o.resp, o.body, o.err = s.send()
	o.duration = s.t.now().Sub(o.start)
	if errors.Is(o.err, ErrResponseTooLarge) {
		s.sent = true // the provider answered
		if s.mode == Protected {
			// It may have acted (a 201 with a large receipt), and its
			// answer reaches no one: the operation's outcome is unknown, and
			// its record must say so, not release the key for a first send.
			s.unknown = true
			if s.firstSent.IsZero() {
				s.firstSent = o.start
			}
		}
		return o, fmt.Errorf("retry: %s %s: attempt %d: %w", s.req.Method, s.req.URL.Path, s.attempts, o.err)
	}
	if o.err != nil {
		if err := s.callerErr(); err != nil {
			return o, s.callerGone(err)
		}
		o.err, o.timeout = redact(o.err), isTimeout(o.err)
	} else {
		s.noteRetryAfter(&o)
	}
	s.last = o
	return o, nil
}

func (s *sequence) passGate() (time.Duration, error) {
	if s.t.Gate == nil || s.t.Gate.Free() { // no wait: no budget context needed for it
		return 0, nil
	}
	ctx := s.budgetContext()
	if s.stream && !s.deadline.IsZero() {
		// A stream's context is not bounded by the budget (it would cut
		// the answer), but its wait at the Gate is, as a protected one's:
		// without a deadline it waited out any pause, or a shared rate
		// limit waiting for the database, however long.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, s.deadline)
		defer cancel()
	}
	return s.t.Gate.Wait(ctx)
}

// send makes one attempt and reads the whole response body within the
// attempt's timeout, so a slow body counts as that attempt's timeout.
func (s *sequence) send() (*http.Response, []byte, error) {
	if s.stream {
		resp, err := s.sendStream()
		return resp, nil, err
	}
	ctx, cancel := s.attemptContext()
	defer s.endAttempt(cancel)
	resp, err := s.t.next().RoundTrip(s.newRequest(ctx))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := readLimited(resp.Body, resp.ContentLength, s.t.maxResponseBytes())
	if err == nil {
		body, err = decodeAnswer(resp, body, s.t.maxResponseBytes())
	}
	if err == nil && cutShort(resp, s.req.Method, body) {
		err = ErrCutShort
	}
	if err != nil {
		// A body cut short is an answer lost on the way: outcome unknown.
		return nil, nil, err
	}
	return resp, body, nil
}

// sendStream makes one attempt of an unprotected request. The attempt
// timeout bounds the wait for the answer's header only: an event stream or a
// large statement may take longer than any timeout to pass on. The answer's
// body stays open; closing it ends the attempt.
func (s *sequence) sendStream() (*http.Response, error) {
	ctx, cancel := context.WithCancel(s.ctx)
	var timer *time.Timer
	if d := s.t.Policy.AttemptTimeout; d > 0 {
		timer = time.AfterFunc(d, cancel)
	}
	r := s.req.WithContext(ctx)
	r.GetBody = nil
	if s.attempts > 1 && s.req.GetBody != nil { // resent only when resendable
		body, err := s.req.GetBody()
		if err != nil {
			cancel()
			return nil, err
		}
		r.Body = body
	}
	resp, err := s.t.next().RoundTrip(r)
	if timer != nil && !timer.Stop() {
		// The timer fired: the attempt timed out, whatever RoundTrip says.
		// Its error is the context.Canceled the timer's cancel left, which
		// would read as the caller gone (answered 499 while the app waits);
		// a caller that did leave is told apart by callerErr.
		if err == nil {
			resp.Body.Close() // the header came just as the attempt timed out
		}
		resp, err = nil, fmt.Errorf("waiting for the answer's header: %w", context.DeadlineExceeded)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose ends a streamed attempt's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// discard closes a streamed answer that is not passed on because another
// attempt follows.
func (s *sequence) discard(o outcome) {
	if s.stream && o.resp != nil {
		io.Copy(io.Discard, io.LimitReader(o.resp.Body, 64<<10)) // lets a short body's connection be reused
		o.resp.Body.Close()
	}
}

// attemptContext bounds one attempt (or probe) of a protected sequence by
// the attempt timeout and the budget's deadline, whichever comes first. It
// derives from req's context directly, not from budgetContext, which a
// sequence without waits never makes. Call.Stop cancels it until
// endAttempt.
func (s *sequence) attemptContext() (context.Context, context.CancelFunc) {
	deadline := s.deadline
	if d := s.t.Policy.AttemptTimeout; d > 0 {
		// The real clock, as context.WithTimeout reads it: a context's
		// deadline is real time whatever Transport.Now says.
		if at := time.Now().Add(d); deadline.IsZero() || at.Before(deadline) {
			deadline = at
		}
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if deadline.IsZero() {
		ctx, cancel = context.WithCancel(s.req.Context())
	} else {
		ctx, cancel = context.WithDeadline(s.req.Context(), deadline)
	}
	s.stop.setAttempt(cancel)
	return ctx, cancel
}

// endAttempt cancels an attempt's (or probe's) context, which Call.Stop
// then no longer needs to.
func (s *sequence) endAttempt(cancel context.CancelFunc) {
	s.stop.setAttempt(nil)
	cancel()
}

// callerErr says why the sequence must end now, from outside: the caller's
// context ended, or Call.Stop was called. Nil while neither happened.
func (s *sequence) callerErr() error {
	if err := s.req.Context().Err(); err != nil {
		return err
	}
	return s.stop.err()
}

// budgetContext is req's context bounded by the budget's deadline, for the
// Gate and the waits between attempts; made on first use (a stream's is made
// by begin, without the deadline, which would cut its answer).
func (s *sequence) budgetContext() context.Context {
	if s.ctx == nil {
		if s.deadline.IsZero() {
			s.ctx, s.cancel = context.WithCancel(s.req.Context())
		} else {
			s.ctx, s.cancel = context.WithDeadline(s.req.Context(), s.deadline)
		}
		s.stop.setBudget(s.cancel)
	}
	return s.ctx
}

// newRequest clones the caller's request for one attempt: same method, URL
// and headers (the Idempotency-Key included), a fresh reader over the same
// body bytes. GetBody is nil: an attempt is sent once, and net/http must not
// resend it on its own with the same signature (see OneShot); only this loop
// sends again, through the signer.
func (s *sequence) newRequest(ctx context.Context) *http.Request {
	// A shallow copy: RoundTrippers must not modify the request (the signer
	// below clones before it sets headers), so the header map can be shared
	// and every attempt saves a deep clone.
	r := s.req.WithContext(ctx)
	r.Body, _ = s.getBody()
	r.GetBody = nil
	r.ContentLength = int64(len(s.body))
	r.TransferEncoding = nil // the length is known: send Content-Length
	return r
}

func (s *sequence) getBody() (io.ReadCloser, error) {
	if len(s.body) == 0 {
		return http.NoBody, nil
	}
	return heldbody.New(s.body), nil // the signer and the wire read s.body itself
}

// readLimited reads r to its end, or fails with ErrResponseTooLarge once
// more than limit bytes came. size, the length the answer declares (-1 if
// unknown), sizes the first buffer (heldbody.ReadAll).
func readLimited(r io.Reader, size, limit int64) ([]byte, error) {
	b, err := heldbody.ReadAll(r, size, limit, nil)
	if errors.Is(err, heldbody.ErrTooLarge) {
		return nil, fmt.Errorf("%w (over %d bytes)", ErrResponseTooLarge, limit)
	}
	return b, err
}

// ErrCutShort is the error of an answer whose body ended with its
// connection (no Content-Length, not chunked) and whose bytes are not the
// JSON its Content-Type says: the connection was cut before the body's end,
// which HTTP cannot tell from the end itself (RFC 9112 §6.3). It wraps
// io.ErrUnexpectedEOF, as a body short of its Content-Length does.
var ErrCutShort = fmt.Errorf("answer cut short: its body ended with the connection, and is not the JSON its Content-Type says: %w", io.ErrUnexpectedEOF)

// cutShort reports an answer to a request of method whose body, read whole
// and decoded, ended with its connection and is not the JSON its
// Content-Type says. Stored, the truncated bytes would be replayed as the
// operation's result for the record's whole life, while the provider holds
// the whole answer under the key for the next attempt.
func cutShort(resp *http.Response, method string, body []byte) bool {
	return closeDelimited(resp, method) && jsonType(resp.Header.Get("Content-Type")) && !json.Valid(body)
}

// closeDelimited reports an HTTP/1 answer whose body ends where its
// connection does: neither a length nor chunked framing, and a body the
// status and method allow (a HEAD's answer has none, nor has a 204 or 304,
// whose ContentLength net/http sets to 0). An answer net/http decoded from
// the gzip it asked for has no length either, whatever its framing, but its
// gzip trailer proves it whole (a cut one fails to read); one in a coding
// left undone (br) is not JSON as it is.
func closeDelimited(resp *http.Response, method string) bool {
	return resp.ProtoMajor == 1 && resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 &&
		!resp.Uncompressed && len(resp.Header.Values("Content-Encoding")) == 0 && method != http.MethodHead
}

// jsonType reports a Content-Type of application/json, or of any */json or
// */*+json type (RFC 6839 §3.1).
func jsonType(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	_, sub, _ := strings.Cut(mt, "/")
	return sub == "json" || strings.HasSuffix(sub, "+json")
}

// noteRetryAfter records the response's Retry-After, capped by MaxDelay, and
// for 429/503 pauses ALL outbound attempts until it ends (docs/retries.md;
// the payouts provider's 429 comes with Retry-After: 60). The pause
// is set whatever the mode, since it describes the provider, not this
// request.
func (s *sequence) noteRetryAfter(o *outcome) {
	v := o.resp.Header.Get("Retry-After")
	if v == "" {
		return
	}
	now := s.t.now()
	d, ok := ParseRetryAfter(v, now)
	if !ok {
		return
	}
	o.retryAfter, o.hasRetryAfter = s.t.Policy.capDelay(d), true
	if s.t.Gate != nil && pausesProvider(o.resp.StatusCode) && o.retryAfter > 0 {
		s.t.Gate.PauseUntil(now.Add(o.retryAfter))
		o.paused = o.retryAfter
	}
}

// decide classifies the outcome and plans the next step: done with a final
// response (err nil) whose verdict is v, done with an error, or another
// attempt after wait.
func (s *sequence) decide(o outcome) (wait time.Duration, v Verdict, done bool, err error) {
	v = s.verdict(o)
	reason := v.Reason
	s.noteSent(o, v)
	switch {
	case reason == ReasonNone && o.err != nil:
		err = s.exhausted(nil) // Once mode: a network error is not an answer
	case reason != ReasonNone:
		wait = s.waitFor(o, reason)
		err = s.limit(wait)
	}
	done = reason == ReasonNone || err != nil
	if err != nil && s.mode != Protected && o.resp != nil {
		// An unprotected request has no record left unfinished: the client
		// gets the provider's own last answer rather than a 502 about keys.
		err, v = nil, Verdict{Disposition: PassOn}
	}
	s.report(o, reason, wait, done)
	return wait, v, done, err
}

// verdict is the outcome's disposition, as Policy.Dispose decides it.
func (s *sequence) verdict(o outcome) Verdict {
	mode := s.mode
	if s.stream && !s.resendable {
		mode = Once // a body sent as it came cannot be sent again
	}
	a := Answer{Mode: mode, Err: o.err}
	if o.resp != nil {
		a.Status, a.Header, a.Body = o.resp.StatusCode, o.resp.Header, o.body
	}
	return s.t.Policy.Dispose(a)
}

// reportAs is the sequence's Report, ending with disposition d.
func (s *sequence) reportAs(d Disposition) Report {
	return Report{Attempts: s.attempts, Disposition: d, FirstSentAt: s.reportedSend(), LastBody: s.lastBody,
		SentAnew: s.sentAnew && !s.firstSent.IsZero()}
}

// reportedSend is the first send as the sequence reports it: by the store's
// clock with Call.Store (see StoreClock), else as the Transport's clock read it.
func (s *sequence) reportedSend() time.Time {
	if s.store == nil || s.firstSent.IsZero() {
		return s.firstSent
	}
	if !s.resumedSent.IsZero() {
		return s.resumedSent
	}
	return s.store.At.Add(s.firstSent.Sub(s.origin))
}

// ended is the Report of a sequence that ended without an answer.
func (s *sequence) ended() Report {
	switch {
	case s.unknown:
		return s.reportAs(Unknown)
	case !s.sent:
		return s.reportAs(NotSent)
	}
	return s.reportAs(Retry)
}

// waitFor is the wait before the next attempt. Waits never collapse to
// zero: a Retry-After of 0 or a date already past falls back to the backoff,
// and an attempt that never reached the upstream (dial failure) waits the
// DialBackoff, whose floor is half the backoff ceiling.
func (s *sequence) waitFor(o outcome, r Reason) time.Duration {
	switch {
	case r == ReasonNotSent:
		return s.t.Policy.DialBackoff(s.attempts-1, s.t.Rand)
	case o.hasRetryAfter && o.retryAfter > 0:
		return o.retryAfter
	default:
		return s.t.Policy.Backoff(s.attempts-1, s.t.Rand)
	}
}

// limit ends the sequence when no attempt is left, or when the wait would
// end after the budget deadline: sleeping into a deadline that then cuts the
// attempt short only delays the client's 502/504.
func (s *sequence) limit(wait time.Duration) error {
	if s.attempts >= s.t.Policy.maxAttempts() {
		return s.exhausted(nil)
	}
	if !s.deadline.IsZero() && !s.t.now().Add(wait).Before(s.deadline) {
		return s.exhausted(ErrBudget)
	}
	return nil
}

// wait sleeps d before the next attempt. Shutdown (the Gate's Close) ends
// it at once: no attempt leaves the Gate after it, so the sequence ends
// now with what it knows, and the client gets its answer within the grace.
func (s *sequence) wait(d time.Duration) error {
	if d <= 0 {
		return nil
	}
	ctx := s.budgetContext()
	if s.t.Gate != nil {
		var cancel context.CancelFunc
		ctx, cancel = s.t.Gate.UntilClosed(ctx)
		defer cancel()
	}
	if err := s.t.sleep(ctx, d); err != nil {
		if errors.Is(context.Cause(ctx), ratelimit.ErrClosed) {
			err = ratelimit.ErrClosed
		}
		return s.stopped(err)
	}
	return nil
}

// stopped turns an interrupted wait into the sequence's error: the caller's
// context error if the caller left (or ErrStopped), else exhaustion (the
// budget ended).
func (s *sequence) stopped(err error) error {
	if cerr := s.callerErr(); cerr != nil {
		return s.callerGone(cerr)
	}
	return s.exhausted(err)
}

func (s *sequence) callerGone(err error) error {
	return fmt.Errorf("retry: %s %s: stopped after %d attempts: %w", s.req.Method, s.req.URL.Path, s.attempts, err)
}

// exhausted builds the error for a sequence that ends without a final answer.
// cause, when not nil, is why it ended before the attempts ran out.
func (s *sequence) exhausted(cause error) *ExhaustedError {
	o := s.last
	e := &ExhaustedError{
		Method:   s.req.Method,
		Path:     s.req.URL.Path,
		Attempts: s.attempts,
		Timeout:  o.timeout || s.attempts == 0,
		Err:      o.err,
		Unknown:  s.unknown,
		// The first send of this sequence, or of the one it resumes.
		FirstSentAt: s.reportedSend(),
		LastBody:    s.lastBody,
		NotSent:     !s.sent,
		NotActed:    s.mode == Protected && s.sent && !s.unknown,
	}
	if o.resp != nil {
		e.LastStatus = o.resp.StatusCode
	}
	switch {
	case cause != nil && e.Err != nil:
		e.Err = fmt.Errorf("%w; last error: %w", cause, e.Err)
	case cause != nil:
		e.Err = cause
	}
	return e
}

func (s *sequence) report(o outcome, r Reason, wait time.Duration, last bool) {
	if s.t.OnAttempt == nil {
		return
	}
	info := AttemptInfo{
		Method: s.req.Method, Path: s.req.URL.Path, Mode: s.mode,
		Attempt: s.attempts, GateWait: o.gateWait, Duration: o.duration,
		Err: o.err, Reason: r, Last: last, Paused: o.paused,
	}
	if o.resp != nil {
		info.Status = o.resp.StatusCode
	}
	if !last {
		info.Wait = wait
	}
	s.t.OnAttempt(info)
}

// response returns the final response: its body in memory, or streaming.
func (s *sequence) response(o outcome) *http.Response {
	resp := o.resp
	if s.stream {
		body := resp.Body.(*cancelOnClose)
		body.cancel = s.cancel // closing the answer ends the whole sequence
	} else {
		resp.Body = heldbody.New(o.body) // a caller may take the bytes (heldbody.Unread) instead of copying them
		if s.req.Method != http.MethodHead {
			resp.ContentLength = int64(len(o.body))
		}
	}
	if resp.Header == nil {
		resp.Header = make(http.Header)
	}
	// Only the status probe's answer is marked reconciled (reconciled sets
	// it after this): the provider's own answer may not say so.
	delete(resp.Header, ReconciledHeader)
	if s.attempts < len(attemptCounts) {
		resp.Header[AttemptsHeader] = attemptCounts[s.attempts] // shared: no one writes into a header's values in place
	} else {
		resp.Header.Set(AttemptsHeader, strconv.Itoa(s.attempts))
	}
	resp.Request = s.req
	return resp
}

// attemptCounts are the AttemptsHeader values of the usual sequences.
var attemptCounts = func() [][]string {
	v := make([][]string, 16)
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}
	}
	return v
}()

func (t *Transport) next() http.RoundTripper {
	if t.Next != nil {
		return t.Next
	}
	return OneShot{Next: http.DefaultTransport}
}

func (t *Transport) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

func (t *Transport) sleep(ctx context.Context, d time.Duration) error {
	if t.Sleep != nil {
		return t.Sleep(ctx, d)
	}
	return ratelimit.SleepContext(ctx, d)
}

func (t *Transport) maxResponseBytes() int64 {
	if t.MaxResponseBytes > 0 {
		return t.MaxResponseBytes
	}
	return DefaultMaxResponseBytes
}
