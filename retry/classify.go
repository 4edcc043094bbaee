package retry

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"syscall"

	"github.com/idemproxy/idemproxy/store"
)

// Reason says why an attempt is followed by another one. ReasonNone marks an
// attempt whose result is final.
type Reason string

// The reasons for a retry, by kind of failure (as caddy's reverse proxy
// decides: a dial error means the upstream never saw the request; an error
// after the connection was made means it may have).
const (
	ReasonNone    Reason = ""         // final result: no retry
	ReasonNotSent Reason = "not_sent" // dial failed: the upstream never saw the request
	ReasonTimeout Reason = "timeout"  // sent, no complete answer in time: outcome unknown
	ReasonNetwork Reason = "network"  // sent, connection broke (reset, EOF): outcome unknown
	ReasonStatus  Reason = "status"   // retriable HTTP status
	ReasonCode    Reason = "code"     // 4xx with a retriable business code
	ReasonRefused Reason = "refused"  // the provider refused this attempt before acting on it; resent freshly signed
)

// refusedCodes are business codes by which a provider says it refused the
// attempt itself before acting on anything, so the answer says nothing about
// the operation and must never be stored as its result. The payments
// provider answers 409 nonce_reused to a request resent whole ("the nonce is
// single-use; renew the signature"): a new attempt through the signer below
// gets a new nonce. The cards provider wants a new signature ("new time") on
// every retry and refuses one it has seen (401 signature_reused in the
// sandbox): the signer never sends a signature twice itself, but one made in
// the same second by a process that died, or by another replica, for the
// same request can still be refused, and a new attempt is signed anew.
var refusedCodes = map[string]bool{"nonce_reused": true, "signature_reused": true}

// conflictCodes are business codes by which a provider says it already has
// an operation under the key, sent with another body. idemproxy sends a key
// with one request only (same fingerprint), so the operation is this order's:
// its first attempt, whose outcome idemproxy did not learn, and the answer is
// to a resend whose bytes differ from the first (JSON members in another
// order, another multipart boundary, gzip bytes of another time), which the
// payments provider ("one unchanged request body") refuses. It says nothing
// of how the operation ended, so it is never stored as its result: the
// answer is passed on and the operation stays unknown, to be resolved by the
// next retry (the status probe, or the first bytes again) or an operator,
// never renewed to a new key as a failure would be.
var conflictCodes = map[string]bool{"idempotency_conflict": true}

// conflictAnswer reports a 4xx whose business code is one of conflictCodes.
func conflictAnswer(status int, body []byte) bool {
	return status >= 400 && status < 500 && conflictCodes[parseBody(body).code]
}

// neverSent reports a failure before any request byte left, so a resend
// cannot duplicate anything: a failure to connect, which *http.Transport
// returns as a *net.OpError with Op "dial" (or "proxyconnect" when the proxy
// in between failed) — refused, unreachable, no file descriptor (EMFILE) —
// and a TLS handshake the client gave up: the server's certificate did not
// verify, or the server did not answer in TLS at all. The request is written
// only after the handshake succeeded. So is an attempt the wire reports
// ended before it had a connection (ErrNoConnection): a dial, or a wait for
// a pooled connection, that its deadline cut.
func neverSent(err error) bool {
	var (
		op  *net.OpError
		cve *tls.CertificateVerificationError
		rhe tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &op) && (op.Op == "dial" || op.Op == "proxyconnect"):
		return true
	case errors.As(err, &cve):
		return true
	case errors.As(err, &rhe) && rhe.Conn != nil: // only "first record does not look like a TLS handshake"
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, ErrNoConnection)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// bodyFacts is what a JSON response body says about retrying.
type bodyFacts struct {
	statuses []string // operation status at "status" and "data.status"
	code     string   // business code at "error.code", else at "code"
}

// final reports an operation status that must never be retried.
func (f bodyFacts) final() bool {
	for _, s := range f.statuses {
		if s == "needs_review" || s == "failed" {
			return true
		}
	}
	return false
}

// NeedsReview reports a response body whose operation status is
// "needs_review": final, never retried, and for a person to resolve (the
// cards provider reports the outcome by an event). It is store.NeedsReview,
// the one definition the stores keep such an answer by.
func NeedsReview(body []byte) bool { return store.NeedsReview(body) }

// Failed reports a response body whose operation status is "failed": final,
// and only a new key (a person's decision) can try the operation again.
func Failed(body []byte) bool {
	for _, s := range parseBody(body).statuses {
		if s == "failed" {
			return true
		}
	}
	return false
}

// parseBody extracts bodyFacts from a JSON object; anything else (HTML from a
// gateway, an empty body) has no facts. Fields of unexpected types are
// ignored rather than failing the whole parse.
func parseBody(b []byte) bodyFacts {
	var f bodyFacts
	top := object(b)
	if top == nil {
		return f
	}
	if s, ok := str(top["status"]); ok {
		f.statuses = append(f.statuses, s)
	}
	if s, ok := str(object(top["data"])["status"]); ok {
		f.statuses = append(f.statuses, s)
	}
	if s, ok := str(object(top["error"])["code"]); ok {
		f.code = s
	} else if s, ok := str(top["code"]); ok {
		f.code = s // payouts: {"code":"payout.funds_maturing",...} variants
	}
	return f
}

func object(b []byte) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	if len(b) == 0 || json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

func str(b json.RawMessage) (string, bool) {
	var s string
	if len(b) == 0 || b[0] != '"' || json.Unmarshal(b, &s) != nil {
		return "", false
	}
	return s, true
}

// pausesProvider reports a response whose Retry-After speaks for the whole
// provider (rate limit, maintenance), not only for this request. A
// Retry-After on, say, 409 idempotency_in_progress concerns one key: it sets
// this request's wait but pauses nobody else.
func pausesProvider(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}
