package retry

import (
	"errors"
	"net/http"
	"strings"
)

// Disposition is what becomes of one upstream attempt, and what it says about
// the operation upstream. It is decided in one place, [Policy.Dispose], for
// the attempt loop (another attempt or not, a probe first or not) and for the
// proxy (store, release or keep as unknown), so the two can never disagree.
//
// Whether another attempt follows is the [Verdict]'s Reason: none for Final
// and PassOn, always one for Retry, and for Unknown and NotSent one unless
// the mode or the answer rules a resend out.
type Disposition int

const (
	// Retry: the provider did not act on this attempt (429, 503, a retriable
	// business code, a refused attempt). Another attempt with the same key
	// follows while attempts and budget last; it is never stored.
	Retry Disposition = iota
	// Final: the operation's answer. It is stored and replayed to repeats.
	Final
	// PassOn: the answer goes to the app as it is, but is not kept: the key
	// is released and the app's next request resumes with it. Answers to
	// unprotected requests, and statuses that do not show the provider
	// acted (401, 403, 408, 415, 431, 1xx, 3xx).
	PassOn
	// Unknown: the provider may have acted and the attempt does not say how
	// (a timeout or a broken connection after sending, a 5xx other than 503,
	// another request with the key in progress). With a Reason another
	// attempt follows with the same key, after the status probe; without
	// one (a 5xx that is not retried) the answer is passed on unstored. A
	// protected operation that ends here is kept as unknown for the next
	// request with its key.
	Unknown
	// NotSent: the attempt never reached the provider (the dial failed, the
	// TLS handshake was given up, the caller's body could not be read), so
	// nothing can have happened there and a resend duplicates nothing.
	NotSent
)

// String returns the disposition's name, for logs.
func (d Disposition) String() string {
	switch d {
	case Final:
		return "final"
	case PassOn:
		return "pass_on"
	case Unknown:
		return "unknown"
	case NotSent:
		return "not_sent"
	default:
		return "retry"
	}
}

// Answer is what [Policy.Dispose] sees of one attempt: its response, or the
// error that stood in for one.
type Answer struct {
	Mode   Mode
	Status int
	Header http.Header
	// Body is the whole body for protected requests; nil for unprotected
	// ones, whose answers are streamed and decided on the status alone.
	Body []byte
	// Err is the attempt's error when no response came. Dispose decides
	// such attempts itself (not sent or unknown); a Classifier never sees
	// them.
	Err error
}

// Verdict is an attempt's disposition and, when another attempt follows, why.
type Verdict struct {
	Disposition Disposition
	Reason      Reason // ReasonNone: no attempt follows
}

// Classifier decides an answer's disposition, like go-retryablehttp's
// CheckRetry: a provider's rules are one function. [Policy.Dispose] holds
// every classifier to the invariants it documents.
type Classifier func(Answer) Verdict

// Dispose returns the verdict on one attempt; it is the only place that
// decides whether an attempt is final, retried, of unknown outcome or never
// sent. An attempt that got no response is decided here: never sent (dial,
// TLS handshake, the caller's body unreadable) or unknown (a timeout or a
// broken connection after sending). An answer gets Policy.Classify's
// verdict, or [Policy.DefaultClassify]'s when Classify is nil, held to these
// invariants whatever the classifier says:
//   - a 429 to a protected request is never final: it is retried;
//   - a 5xx other than 503 to a protected request is Unknown (retried if the
//     classifier wants it retried): a 504, or a 524 from a CDN, may hide an
//     executed payment; a 503 that is not retried is Unknown too;
//   - only a protected request's answer is ever stored, and only a 2xx or a
//     4xx other than 401, 403, 408, 415, 429 and 431 (statuses after which
//     the provider may not have acted, or acted only on our credentials or
//     the request's headers): any other "final" answer is passed on instead.
func (p Policy) Dispose(a Answer) Verdict {
	if a.Err != nil {
		return disposeError(a.Mode, a.Err)
	}
	classify := p.Classify
	if classify == nil {
		classify = p.DefaultClassify
	}
	v := classify(a)
	if v.Disposition == NotSent { // an answer came: the provider saw the request
		v.Disposition = Retry
	}
	retried := v.Disposition == Retry || (v.Disposition == Unknown && v.Reason != ReasonNone)
	switch {
	case a.Mode == Protected && a.Status == http.StatusTooManyRequests:
		return Verdict{Retry, ReasonStatus}
	case a.Mode == Protected && a.Status >= 500 && (!retried || a.Status != http.StatusServiceUnavailable):
		v.Disposition = Unknown
	case v.Disposition == Final && (a.Mode != Protected || !storable(a.Status)):
		v.Disposition = PassOn
	}
	switch {
	case v.Disposition == Final || v.Disposition == PassOn:
		v.Reason = ReasonNone
	case retried && v.Reason == ReasonNone:
		v.Reason = ReasonStatus
	case !retried:
		v.Reason = ReasonNone
	}
	return v
}

// disposeError decides an attempt that got no response. Once mode never
// resends; a body the caller could not deliver cannot be resent either.
func disposeError(m Mode, err error) Verdict {
	var v Verdict
	switch {
	case errors.Is(err, ErrRequestBody):
		return Verdict{NotSent, ReasonNone}
	case neverSent(err):
		v = Verdict{NotSent, ReasonNotSent}
	case isTimeout(err):
		v = Verdict{Unknown, ReasonTimeout}
	default:
		v = Verdict{Unknown, ReasonNetwork}
	}
	if m == Once {
		v.Reason = ReasonNone
	}
	return v
}

// storable reports a status whose answer can be the operation's result.
// 415 and 431 refuse a request for its headers (Content-Type,
// Content-Encoding, their size) before it is read; headers are not part of
// the fingerprint, so, stored, such an answer would be replayed to the
// app's corrected retry of the order for the whole TTL.
func storable(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout, http.StatusTooManyRequests,
		http.StatusUnsupportedMediaType, http.StatusRequestHeaderFieldsTooLarge:
		return false
	}
	return status >= 200 && status < 300 || status >= 400 && status < 500
}

// DefaultClassify is the classification idemproxy ships with:
//   - unprotected safe requests (Safe): a 5xx is retried; nothing else;
//   - unprotected other requests (Once): nothing is retried;
//   - protected requests: a body whose operation status is "needs_review"
//     or "failed" is final (a needs_review is resolved by an event, and a
//     failed operation needs a new key, which is the app's decision); a 4xx
//     refused-attempt code (nonce_reused) is retried freshly signed; a 4xx
//     idempotency_conflict (conflictCodes) is unknown, not retried; a status
//     in Policy.Statuses is retried, and so is a 4xx whose business code is
//     in Policy.Codes, as Unknown when the code says another request with
//     the key is in progress (it may be executing it); anything else is
//     final.
//
// The operation status is read at "status" and "data.status", the business
// code at "error.code", else "code" (string values only).
func (p Policy) DefaultClassify(a Answer) Verdict {
	switch a.Mode {
	case Safe:
		if a.Status >= 500 {
			return Verdict{Retry, ReasonStatus}
		}
		return Verdict{PassOn, ReasonNone}
	case Once:
		return Verdict{PassOn, ReasonNone}
	}
	if a.Status < 400 {
		return Verdict{Final, ReasonNone}
	}
	facts := parseBody(a.Body)
	switch {
	case facts.final():
		return Verdict{Final, ReasonNone}
	case a.Status < 500 && refusedCodes[facts.code]:
		return Verdict{Retry, ReasonRefused}
	case a.Status < 500 && conflictCodes[facts.code]:
		return Verdict{Unknown, ReasonNone} // not retried: a resend gets the same answer
	case p.Statuses[a.Status]:
		return Verdict{Retry, ReasonStatus}
	case a.Status < 500 && facts.code != "" && p.Codes[facts.code] && strings.Contains(facts.code, "in_progress"):
		return Verdict{Unknown, ReasonCode}
	case a.Status < 500 && facts.code != "" && p.Codes[facts.code]:
		return Verdict{Retry, ReasonCode}
	}
	return Verdict{Final, ReasonNone}
}
