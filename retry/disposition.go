package retry

import "net/http"

// Disposition is what becomes of one upstream answer. It is decided in one
// place, [Policy.Dispose], for the attempt loop (another attempt or not) and
// for the proxy (store or not), so the two can never disagree.
type Disposition int

const (
	// Retry: the answer says nothing final about the operation (429, a
	// retriable status or business code, a refused attempt). Another attempt
	// with the same key follows while attempts and budget last; it is never
	// stored.
	Retry Disposition = iota
	// Final: the operation's answer. It is stored and replayed to repeats.
	Final
	// PassOn: the answer goes to the app as it is, but is not kept: the key
	// is released and the app's next request resumes with it. Answers to
	// unprotected requests, and statuses that do not show the provider
	// acted (401, 403, 408, 1xx, 3xx, 5xx not retried).
	PassOn
)

// String returns the disposition's name, for logs.
func (d Disposition) String() string {
	switch d {
	case Final:
		return "final"
	case PassOn:
		return "pass_on"
	default:
		return "retry"
	}
}

// Answer is what a classifier sees of one attempt's response.
type Answer struct {
	Mode   Mode
	Status int
	Header http.Header
	// Body is the whole body for protected requests; nil for unprotected
	// ones, whose answers are streamed and decided on the status alone.
	Body []byte
}

// Verdict is an answer's disposition and, for Retry, why.
type Verdict struct {
	Disposition Disposition
	Reason      Reason // ReasonNone unless Disposition is Retry
}

// Classifier decides an answer's disposition, like go-retryablehttp's
// CheckRetry: a provider's rules are one function. [Policy.Dispose] holds
// every classifier to the invariants it documents.
type Classifier func(Answer) Verdict

// Dispose returns the verdict on a: Policy.Classify's, or
// [Policy.DefaultClassify]'s when Classify is nil, held to these invariants
// whatever the classifier says:
//   - a 429 to a protected request is never final: it is retried;
//   - only a protected request's answer is ever stored, and only a 2xx or a
//     4xx other than 401, 403, 408 and 429 (statuses after which the
//     provider may not have acted, or acted only on our credentials): any
//     other "final" answer is passed on instead.
func (p Policy) Dispose(a Answer) Verdict {
	classify := p.Classify
	if classify == nil {
		classify = p.DefaultClassify
	}
	v := classify(a)
	switch {
	case a.Mode == Protected && a.Status == http.StatusTooManyRequests:
		return Verdict{Retry, ReasonStatus}
	case v.Disposition == Retry && v.Reason == ReasonNone:
		v.Reason = ReasonStatus
	case v.Disposition == Final && (a.Mode != Protected || !storable(a.Status)):
		v.Disposition = PassOn
	}
	if v.Disposition != Retry {
		v.Reason = ReasonNone
	}
	return v
}

// storable reports a status whose answer can be the operation's result.
func storable(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout, http.StatusTooManyRequests:
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
//     refused-attempt code (nonce_reused) is retried freshly signed; a status
//     in Policy.Statuses is retried, and so is a 4xx whose business code is
//     in Policy.Codes; anything else is final.
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
	case p.Statuses[a.Status]:
		return Verdict{Retry, ReasonStatus}
	case a.Status < 500 && facts.code != "" && p.Codes[facts.code]:
		return Verdict{Retry, ReasonCode}
	}
	return Verdict{Final, ReasonNone}
}
