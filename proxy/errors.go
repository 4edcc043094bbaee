package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/ratelimit"
	"github.com/idemproxy/idemproxy/retry"
)

// Error is an error idemproxy itself answers with. Its Message is written for the
// client: it never carries internal error text, secrets or upstream details.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// The contract's error codes (docs/contract.md), each written once: every
// answer idemproxy gives itself carries one of these, or the in-progress code
// configured in its place (Options.InProgressCode).
const (
	CodeKeyMissing          = "idempotency_key_missing"
	CodeKeyExpired          = "idempotency_key_expired"
	CodeConflict            = "idempotency_conflict"
	CodeInProgress          = "idempotency_in_progress"
	CodeBodyTooLarge        = "body_too_large"
	CodeStoreUnavailable    = "store_unavailable"
	CodeUpstreamUnavailable = "upstream_unavailable"
	CodeOverloaded          = "overloaded"
	CodeBadRequest          = "bad_request"
	CodeMethodNotAllowed    = "method_not_allowed"
	CodeUpgradeNotSupported = "upgrade_not_supported"
	CodeUnauthorized        = "unauthorized"
	CodeClientClosed        = "client_closed_request"
)

// The errors of docs/contract.md's table, plus the request-shape errors the table leaves open.
var (
	ErrKeyMissing = &Error{http.StatusUnprocessableEntity, CodeKeyMissing, "protected request has no Idempotency-Key, and none of the configured key sources (IDEMPROXY_KEY_SOURCES, e.g. order_id in the JSON body) gives one value: each is absent, empty, given twice with different values (also in another letter case, or in a form or query under a name PHP reads as it, such as order.id), present only in such a spelling, in a form body with a '%' that is not an escape, or in a JSON body that does not parse whole or is not in UTF-8"}
	// ErrKeyMissingSurrogate is ErrKeyMissing for a JSON key source whose
	// string has an escaped lone surrogate (idemkey.ReasonLoneSurrogate).
	ErrKeyMissingSurrogate = &Error{http.StatusUnprocessableEntity, CodeKeyMissing, `protected request has no Idempotency-Key, and its JSON key source (IDEMPROXY_KEY_SOURCES, e.g. order_id) is a string with an escaped lone surrogate, such as "s\ud800" (an id cut inside an emoji): Go reads U+FFFD in its place, JavaScript, Python and Java the surrogate, so idemproxy cannot know which order the provider reads. Send the id whole, or an Idempotency-Key; nothing was sent upstream`}
	// ErrKeyMissingFormSemicolon is ErrKeyMissing for a form body whose
	// key source field is joined to another field by ';'
	// (idemkey.ReasonFormSemicolon).
	ErrKeyMissingFormSemicolon = &Error{http.StatusUnprocessableEntity, CodeKeyMissing, `protected request has no Idempotency-Key, and its form body has a field with a ';' that names the key source's field (IDEMPROXY_KEY_SOURCES), such as order_id=A;amount=5 or amount=5;order_id=A: some servers split a form at ';' too and read order A, others read A;amount=5 or no order, so idemproxy cannot know which order the provider reads. Separate fields with '&' and send a ';' in a value as %3B, or send an Idempotency-Key; nothing was sent upstream`}
	// ErrKeyMissingQuerySemicolon is ErrKeyMissing for a query whose key
	// source parameter is joined to another by ';'
	// (idemkey.ReasonQuerySemicolon).
	ErrKeyMissingQuerySemicolon = &Error{http.StatusUnprocessableEntity, CodeKeyMissing, `protected request has no Idempotency-Key, and its query has a parameter with a ';' that names the key source's parameter (IDEMPROXY_KEY_SOURCES), such as ?order_id=1;x=2 or ?x=2;order_id=1: some servers split a query at ';' too and read order 1, others read 1;x=2, and Go's drop the parameter (as the forwarded query would), so idemproxy cannot know which order the provider reads. Separate parameters with '&' and send a ';' in a value as %3B, or send an Idempotency-Key; nothing was sent upstream`}
	// ErrKeyMissingEncoded is ErrKeyMissing for a body sent with a
	// Content-Encoding idemproxy does not decode (decodedBody): its key
	// sources cannot be read, and saying
	// that none is present would send the app's developer looking for a
	// field that is there.
	ErrKeyMissingEncoded = &Error{http.StatusUnprocessableEntity, CodeKeyMissing, "protected request has no Idempotency-Key and its body has a Content-Encoding idemproxy does not decode (only gzip and deflate, up to the body size limit once decoded), so its key sources (IDEMPROXY_KEY_SOURCES) cannot be read: send the body unencoded, gzip- or deflate-encoded, or with an Idempotency-Key"}
	// ErrKeyMissingSpelling is ErrKeyMissing for a path that matches a key
	// or fingerprint rule of IDEMPROXY_ROUTES only spelt otherwise
	// (keyedAsSpeltOtherwise), under every IDEMPROXY_MISSING_KEY.
	ErrKeyMissingSpelling = &Error{http.StatusUnprocessableEntity, CodeKeyMissing, "protected request has no Idempotency-Key, and its path matches a key or fingerprint rule of IDEMPROXY_ROUTES only spelt otherwise (a trailing or repeated slash, another letter case, an encoded slash, path parameters), so that rule gives it no key and none of the default key sources gives one: send the path as the rule writes it, or an Idempotency-Key; nothing was sent upstream"}
	// ErrKeyInvalid is bad_request, the contract's code for a request idemproxy
	// will not forward; the message says it is the Idempotency-Key.
	ErrKeyInvalid  = &Error{http.StatusBadRequest, CodeBadRequest, "Idempotency-Key must be one value of 1-255 printable ASCII characters (bare or an RFC 8941 string), sent once or repeated identically; nothing was sent upstream"}
	ErrConflict    = &Error{http.StatusConflict, CodeConflict, "Idempotency-Key was already used for a different request"}
	ErrInProgress  = &Error{http.StatusConflict, CodeInProgress, "a request with this Idempotency-Key is still in flight; retry later with the same key"}
	ErrBodyTooLong = &Error{http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "request body exceeds the configured limit"}
	ErrStore       = &Error{http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency record store cannot be written; nothing was sent upstream"}
	// ErrStoreWaiting is store_unavailable for a request that found its key
	// in flight for another request (on this replica or another) and lost
	// the store while waiting for it: it sent nothing, but the key is not
	// free, its operation may be running or done.
	ErrStoreWaiting = &Error{http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency record store cannot be written; nothing was sent by this request, but the operation for this Idempotency-Key was in flight for another request and may be running or done: retry with the same Idempotency-Key"}
	// ErrStoreAfterSend is store_unavailable after the upstream answered: the
	// operation may have been executed, so the app must retry with the same key.
	ErrStoreAfterSend = &Error{http.StatusServiceUnavailable, CodeStoreUnavailable, "the upstream answered but the answer could not be stored; the operation may have been executed: retry with the same Idempotency-Key"}
	ErrBadRequest     = &Error{http.StatusBadRequest, CodeBadRequest, "the request target is not a path: an absolute URI (http://host/path) or an authority, as an app sends to a forward proxy (HTTP_PROXY, http.proxyHost), or '*'. idemproxy is not a forward proxy: make it the app's base URL and send the path. Nothing was sent upstream"}
	ErrMethod         = &Error{http.StatusMethodNotAllowed, CodeMethodNotAllowed, "CONNECT, TRACE and TRACK are not proxied; a CONNECT comes from an app that uses idemproxy as a forward proxy (HTTPS_PROXY, https.proxyHost): idemproxy is not a forward proxy, make it the app's base URL instead. Nothing was sent upstream"}
	ErrMethodCase     = &Error{http.StatusBadRequest, CodeBadRequest, "the method must be in upper case (POST, not post)"}
	ErrMethodOverride = &Error{http.StatusBadRequest, CodeBadRequest, "method override headers (X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override) are not forwarded; send the method itself"}
	ErrTrailers       = &Error{http.StatusBadRequest, CodeBadRequest, "request trailers are not forwarded; send every header before the body"}
	ErrDotSegment     = &Error{http.StatusBadRequest, CodeBadRequest, "the path has a dot-segment (. or .., plain or percent-encoded); send the resolved path"}
	ErrFragment       = &Error{http.StatusBadRequest, CodeBadRequest, "the request target has a fragment (#...), which is not sent in HTTP requests; send the path and query alone. Nothing was sent upstream"}
	// ErrContentTypeTwice: Content-Type on two lines that differ (checkShape).
	ErrContentTypeTwice = &Error{http.StatusBadRequest, CodeBadRequest, "Content-Type was sent twice with different values: the provider may read the body by either, so idemproxy cannot tell which order it names; send one Content-Type. Nothing was sent upstream"}
	// ErrFraming answers a request marked by MarkAmbiguousFraming.
	ErrFraming = &Error{http.StatusBadRequest, CodeBadRequest, "the request's length is ambiguous (Transfer-Encoding with Content-Length, Transfer-Encoding on HTTP/1.0, or Content-Length twice); send one Content-Length or chunked alone. Nothing was sent upstream"}
	// ErrBodyUnread: the client's body did not arrive in full (too slow, or
	// the connection broke); nothing was sent.
	ErrBodyUnread = &Error{http.StatusBadRequest, CodeBadRequest, "request body could not be read in full; nothing was sent upstream"}
	// ErrDraining: the shutdown began while the client's body was still
	// arriving (Handler.CutBodyReads); nothing was claimed or sent.
	ErrDraining = &Error{http.StatusServiceUnavailable, CodeUpstreamUnavailable, "idemproxy is shutting down and the request body had not arrived in full; nothing was sent upstream: retry"}
	// ErrDrainingStreamed: the shutdown cut the body of an unprotected
	// request streamed upstream as it arrived (Handler.CutBodyReads); the
	// request upstream was aborted before its body ended.
	ErrDrainingStreamed = &Error{http.StatusServiceUnavailable, CodeUpstreamUnavailable, "idemproxy is shutting down and the request body had not arrived in full; the request streamed upstream was broken off before its body ended, so the upstream cannot act on it: retry"}
	// ErrShutdownRunning: the shutdown grace is running out and the
	// request's operation is still running upstream (Handler.AnswerRunning):
	// its outcome is unknown, and its record stays in flight for the app's
	// retry, with the same key.
	ErrShutdownRunning = &Error{http.StatusGatewayTimeout, CodeUpstreamUnavailable, "idemproxy is shutting down and the operation has not ended (still at the provider, or its answer not yet stored); its outcome is unknown"}
	// ErrShutdownNotSent: the shutdown grace is running out and the request
	// had not claimed its key yet (Handler.AnswerRunning): nothing was sent.
	ErrShutdownNotSent = &Error{http.StatusServiceUnavailable, CodeUpstreamUnavailable, "idemproxy is shutting down; nothing was sent"}
	// ErrRouteRejected answers a request an IDEMPROXY_ROUTES reject rule matches.
	ErrRouteRejected = &Error{http.StatusMethodNotAllowed, CodeMethodNotAllowed, "this method and path are refused by the proxy's route table; nothing was sent"}
	ErrUpgrade       = &Error{http.StatusBadRequest, CodeUpgradeNotSupported, "protocol upgrades are not proxied"}
	ErrClientGone    = &Error{499, CodeClientClosed, "client closed the request"}
	// ErrKeyExpired: the outcome is unknown and the provider may have
	// forgotten the key, so a resend could execute the operation twice.
	ErrKeyExpired = &Error{http.StatusConflict, CodeKeyExpired, "the outcome of this operation is unknown and it was first sent longer ago than the provider keeps idempotency keys; nothing was sent, and nothing will be for this key until an operator checks with the provider and runs: idemproxy records resolve KEY --outcome not_executed|executed (POST /admin/v1/records/resolve)"}
)

// busy is the answer while a key is in flight past the wait: ErrInProgress, or
// the status and code configured in its place (Options.InProgressStatus), always
// with Retry-After.
type busy struct{ e *Error }

func (b busy) Error() string { return b.e.Error() }
func (b busy) Unwrap() error { return b.e }

// busyError builds the in-progress answer; zero values keep ErrInProgress's.
func busyError(status int, code string) busy {
	e := *ErrInProgress
	if status != 0 {
		e.Status = status
	}
	if code != "" {
		e.Code = code
	}
	return busy{&e}
}

// storeError wraps a store failure so that the one mapping function answers 503 while
// the log keeps the cause.
type storeError struct{ err error }

func (e storeError) Error() string { return "record store: " + e.err.Error() }
func (e storeError) Unwrap() error { return e.err }

// storeErrorWaiting is a store failure of a request that waited for its key's
// operation in flight for another request: ErrStoreWaiting, the log keeping
// the cause.
type storeErrorWaiting struct{ err error }

func (e storeErrorWaiting) Error() string { return "record store: " + e.err.Error() }
func (e storeErrorWaiting) Unwrap() error { return e.err }

// leaseLost is the in-progress answer (busy) of a request whose lease
// another replica took over while its sequence ran, after attempts
// attempts: the request log and the metrics count them (the provider may
// have acted on them); the answer is the in-progress one, as for any
// request that found its key running elsewhere.
type leaseLost struct {
	busy
	attempts int
}

func (l leaseLost) Unwrap() error { return l.busy }

// storeAfterSend is ErrStoreAfterSend for a sequence that made attempts
// attempts: the answer, the request log and the metrics count them, since
// the operation may have run.
type storeAfterSend struct{ attempts int }

func (e storeAfterSend) Error() string { return ErrStoreAfterSend.Error() }
func (e storeAfterSend) Unwrap() error { return ErrStoreAfterSend }

// answerTooLarge is a protected sequence that ended on an answer too large
// for a record (retry.ErrResponseTooLarge) after attempts attempts: the
// provider answered, and may have acted, so the answer, the request log and
// the metrics count them, as for any upstream_unavailable.
type answerTooLarge struct {
	err      error
	attempts int
}

func (e answerTooLarge) Error() string { return e.err.Error() }
func (e answerTooLarge) Unwrap() error { return e.err }

// errorBody is the contract's error shape; Key and Attempts are filled for
// upstream_unavailable, and store_unavailable after sending, so the app can
// retry with the same key.
type errorBody struct {
	Error struct {
		Code     string `json:"code"`
		Message  string `json:"message"`
		Key      string `json:"idempotency_key,omitempty"`
		Attempts int    `json:"attempts,omitempty"`
	} `json:"error"`
}

// apiError is what becomes of an error on the request path: what the client is
// told (Status, Code, Message, Attempts) and what the request's Summary says
// (Outcome, Limit).
type apiError struct {
	Status   int
	Code     string
	Message  string
	Attempts int // upstream attempts made, for upstream_unavailable and store_unavailable after sending
	Outcome  Outcome
	Limit    string // for OutcomeOverloaded: LimitRequests or LimitBytes
}

// answer is the apiError of e, whose outcome is o.
func answer(e *Error, o Outcome) apiError {
	return apiError{Status: e.Status, Code: e.Code, Message: e.Message, Outcome: o}
}

// upstreamUnavailable is the apiError of a sequence that gave no final answer.
func upstreamUnavailable(status int, msg string, attempts int) apiError {
	return apiError{Status: status, Code: CodeUpstreamUnavailable, Message: msg, Attempts: attempts, Outcome: OutcomeUnavailable}
}

// classify maps any error on the request path to what the client is told and to
// the request's outcome. It is the only place where errors become HTTP statuses,
// the contract's codes and outcomes.
func classify(err error) apiError {
	var (
		b   busy
		pe  *Error
		ex  *retry.ExhaustedError
		mbe *http.MaxBytesError
		se  storeError
		sw  storeErrorWaiting
		sa  storeAfterSend
		tl  answerTooLarge
	)
	switch {
	case errors.Is(err, context.Canceled):
		return answer(ErrClientGone, OutcomeClientGone)
	case errors.As(err, &b):
		a := answer(b.e, OutcomeInProgress)
		var ll leaseLost
		if errors.As(err, &ll) {
			a.Attempts = ll.attempts
		}
		return a
	case errors.As(err, &sa):
		a := answer(ErrStoreAfterSend, OutcomeStoreError)
		a.Attempts = sa.attempts
		return a
	case errors.As(err, &pe):
		return classifyOwn(pe)
	case errors.As(err, &mbe):
		return answer(ErrBodyTooLong, OutcomeRejected)
	case errors.Is(err, idemkey.ErrInvalidKey):
		return answer(ErrKeyInvalid, OutcomeRejected)
	case errors.As(err, &sw):
		return answer(ErrStoreWaiting, OutcomeStoreError)
	case errors.As(err, &se):
		return answer(ErrStore, OutcomeStoreError)
	case errors.Is(err, retry.ErrKeyExpired):
		return answer(ErrKeyExpired, OutcomeRejected)
	case errors.Is(err, retry.ErrRequestBody):
		return answer(ErrBodyUnread, OutcomeRejected)
	case errors.As(err, &ex):
		return exhausted(ex, errors.Is(err, ratelimit.ErrClosed))
	case errors.As(err, &tl):
		return upstreamUnavailable(http.StatusBadGateway,
			"the upstream answered, but its answer is too large for idemproxy to keep; the operation may have run", tl.attempts)
	default:
		return upstreamUnavailable(http.StatusBadGateway, "upstream request failed; the outcome may be unknown", 0)
	}
}

// exhausted is the apiError of a sequence that ended without a final answer:
// its retry budget spent, or cut off by shutdown (closing: the Gate closed,
// so no further attempt could leave). Only an operation that never reached
// the provider, in this sequence or an earlier one, gets the shutdown's own
// 503: nothing can have happened, and the app's next try is a first send.
// One that did, or whose outcome an earlier sequence left unknown, gets the
// status the same failure gets when the budget runs out (502, 504 after a
// timeout), its message saying that the shutdown ended it.
func exhausted(ex *retry.ExhaustedError, closing bool) apiError {
	if closing && ex.NotSent && !ex.Unknown {
		return upstreamUnavailable(http.StatusServiceUnavailable, "idemproxy is shutting down; nothing was sent", ex.Attempts)
	}
	status := http.StatusBadGateway
	if ex.Timeout && !ex.NotSent {
		status = http.StatusGatewayTimeout
	}
	return upstreamUnavailable(status, exhaustedMessage(ex, closing), ex.Attempts)
}

// exhaustedMessage says why the sequence ended and what the provider may
// have done. "Nothing was sent" only when nothing was, in this sequence or an
// earlier one (a resumed operation is unknown whatever its re-send did).
// At shutdown the message follows the record: unknown (kept as such), else
// released since no attempt was acted on (429, 503, a retriable business
// code). Without a shutdown a sent sequence keeps "may be unknown" unless
// every answer said the provider did not act on it (NotActed: the key is
// released as at shutdown): an unprotected request's ExhaustedError never
// says Unknown, though its single attempt may have acted.
func exhaustedMessage(ex *retry.ExhaustedError, closing bool) string {
	why := "upstream did not give a final answer"
	switch {
	case closing:
		why = "idemproxy is shutting down before the next attempt"
	case ex.NotSent && errors.Is(ex.Err, ratelimit.ErrDeadline):
		// The last attempt never left: the provider's pause or the
		// outbound rate limit held it past the budget. The upstream was
		// not unreachable, and saying so sends operators after the network.
		why = "the request was held by the provider's Retry-After pause or the outbound rate limit past its retry budget"
	case ex.NotSent:
		why = "upstream could not be reached"
	case ex.NotActed:
		why = "upstream did not give a final answer and acted on no attempt"
		if ex.LastStatus != 0 {
			why += " (last status " + strconv.Itoa(ex.LastStatus) + ")"
		}
	}
	switch {
	case ex.Unknown:
		return why + "; the outcome may be unknown"
	case ex.NotSent:
		return why + "; nothing was sent"
	case closing:
		return why + "; the upstream did not act on it"
	case ex.NotActed:
		return why + "; the operation was not executed"
	}
	return why + "; the outcome may be unknown"
}

// classifyOwn is classify for the errors idemproxy answers with itself: a
// refusal unless the error says otherwise.
func classifyOwn(e *Error) apiError {
	switch e {
	case ErrConflict:
		return answer(e, OutcomeConflict)
	case ErrInProgress:
		return answer(e, OutcomeInProgress)
	case ErrStore, ErrStoreWaiting, ErrStoreAfterSend:
		return answer(e, OutcomeStoreError)
	case ErrClientGone:
		return answer(e, OutcomeClientGone)
	case ErrShutdownRunning, ErrShutdownNotSent:
		return answer(e, OutcomeUnavailable)
	case ErrOverloaded:
		a := answer(e, OutcomeOverloaded)
		a.Limit = LimitRequests
		return a
	case ErrOverloadedBytes:
		a := answer(e, OutcomeOverloaded)
		a.Limit = LimitBytes
		return a
	}
	return answer(e, OutcomeRejected)
}

// writeError answers err in the contract's JSON shape. key is the idempotency key in use
// ("" when none was established yet).
func writeError(w http.ResponseWriter, err error, key string) {
	writeClassified(w, err, classify(err), key)
}

// writeClassified answers err, whose class is a (classify).
func writeClassified(w http.ResponseWriter, err error, a apiError, key string) {
	var body errorBody
	body.Error.Code, body.Error.Message = a.Code, a.Message
	if a.Outcome == OutcomeUnavailable || errors.Is(err, ErrStoreAfterSend) {
		body.Error.Key, body.Error.Attempts = key, a.Attempts
	}
	if a.Outcome == OutcomeUnavailable && key != "" { // an unprotected request has no key to retry with
		body.Error.Message += ": retry with the same Idempotency-Key"
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if a.Attempts > 0 && a.Outcome != OutcomeInProgress { // a lost lease's attempts are the log's only
		h.Set(AttemptsHeader, strconv.Itoa(a.Attempts))
	}
	// The in-progress answer says 1 on purpose, whatever is known of the
	// operation in flight. Its answer can come at any moment, and a repeat
	// that arrives meanwhile is not refused: it waits (up to InflightWait)
	// and is replayed as soon as the answer is stored, so the sooner the
	// app is back, the sooner it has its answer. A known lease end (another
	// replica's record) is not when the operation ends: a live owner renews
	// its lease every third of it, so a Retry-After counted to it would hold
	// the app back past an answer already stored. Only a dead owner's lease
	// end matters, and a repeat arriving before it waits for it too and
	// takes the key over the moment it comes within its wait (README, The
	// "busy" answer).
	if a.Outcome == OutcomeInProgress || a.Status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	if a.Outcome == OutcomeOverloaded {
		// Past the bound the connection is closed after the answer (its body
		// drained first, drainRefused): a client that reused it for its next
		// try could race the server's close and see a reset instead of an
		// answer, and a refused client should not keep a descriptor.
		h.Set("Connection", "close")
	}
	b, _ := json.Marshal(body)
	w.WriteHeader(a.Status)
	w.Write(append(b, '\n'))
}
