package retry

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// ErrResponseTooLarge is returned (wrapped) when a response body exceeds
// [Transport.MaxResponseBytes]. It is not retried: the provider would send
// the same body again.
var ErrResponseTooLarge = errors.New("retry: response body too large")

// ErrRequestBody is wrapped when the caller's request body could not be read
// (the client was slow or went away): no attempt was made.
var ErrRequestBody = errors.New("retry: read request body")

// ErrNoConnection is wrapped, by the RoundTripper that writes to the network
// (upstream's wire), in the error of an attempt that ended before it had a
// connection to the upstream: the dial, or the wait for a pooled connection,
// cut short by the attempt's deadline. Nothing of the request was written,
// so the attempt counts as never sent, as a refused dial does.
var ErrNoConnection = errors.New("no connection to the upstream")

// ExhaustedError reports an attempt sequence that ended without a final
// answer: every attempt failed in a retriable way and the attempts, the
// budget or the time left for the next wait ran out. The outcome upstream
// may be unknown, so the proxy must not store anything as final and answers
// 502/504 upstream_unavailable; the client's next request resumes with the
// same key (docs/contract.md, What is final).
type ExhaustedError struct {
	Method string // request method
	Path   string // URL path only: no query, no host, nothing secret
	// Attempts is the number of attempts sent (0 when the budget ran out
	// before the first one could leave, e.g. behind a long provider pause).
	Attempts int
	// Timeout is true when the last failure was a timeout, or when no
	// attempt left before the budget ended; the proxy answers 504, else 502.
	Timeout bool
	// LastStatus is the status of the last response; 0 when the last
	// attempt got none.
	LastStatus int
	// NotSent is true when no attempt reached the upstream (every one failed
	// to connect, or none could leave): nothing can have happened there, so
	// the key may be released and the client told so.
	NotSent bool
	// Err is the last attempt's network error or the reason the sequence
	// stopped early (ErrBudget, ErrKeyExpired); nil when the last attempt
	// got a retriable response.
	Err error
	// Unknown is true when the provider may have acted on the operation: an
	// attempt timed out or broke after sending, or got a 5xx such as 504 (or
	// the sequence resumed such an operation). False means no attempt can
	// have executed it (dial errors, 429, 503, business refusals).
	Unknown bool
	// NotActed is true for a protected request some attempt of which
	// reached the provider, when every answer said the provider did not act
	// on the operation (429, a retried 503, a refused attempt such as 409
	// nonce_reused, a retriable business code) and no earlier sequence left
	// its outcome unknown: the operation was not executed, and its key is
	// released. False for an unprotected request, whose attempts are not
	// judged so.
	NotActed bool
	// FirstSentAt is when the operation first reached the provider (in this
	// sequence or the one it resumed); zero if it never did. By the store's
	// clock with [Call.Store], as Report.FirstSentAt.
	FirstSentAt time.Time
	// LastBody is the body of the last ambiguous answer; nil if none.
	LastBody []byte
}

// Error names the method, the path and the attempt count, and the last
// failure. It never contains the query, headers or body.
func (e *ExhaustedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "retry: %s %s: no final answer after %d attempt", e.Method, e.Path, e.Attempts)
	if e.Attempts != 1 {
		b.WriteByte('s')
	}
	if e.LastStatus != 0 {
		fmt.Fprintf(&b, ": last status %d", e.LastStatus)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Unwrap returns Err.
func (e *ExhaustedError) Unwrap() error { return e.Err }

// redact drops the URL a *url.Error carries (the query may hold secrets) and
// keeps the underlying error; other errors are returned as they are.
func redact(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}
