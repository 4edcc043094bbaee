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

// The errors of docs/contract.md's table, plus the request-shape errors the table leaves open.
var (
	ErrKeyMissing  = &Error{http.StatusUnprocessableEntity, "idempotency_key_missing", "protected request has no Idempotency-Key and none of the configured key sources (IDEMPROXY_KEY_SOURCES, e.g. order_id in the JSON body) is present"}
	ErrKeyInvalid  = &Error{http.StatusBadRequest, "idempotency_key_invalid", "Idempotency-Key must be 1-255 printable ASCII characters (bare or an RFC 8941 string)"}
	ErrConflict    = &Error{http.StatusConflict, "idempotency_conflict", "Idempotency-Key was already used for a different request"}
	ErrInProgress  = &Error{http.StatusConflict, "idempotency_in_progress", "a request with this Idempotency-Key is still in flight; retry later with the same key"}
	ErrBodyTooLong = &Error{http.StatusRequestEntityTooLarge, "body_too_large", "request body exceeds the configured limit"}
	ErrStore       = &Error{http.StatusServiceUnavailable, "store_unavailable", "the idempotency record store cannot be written; nothing was sent upstream"}
	// ErrStoreAfterSend is store_unavailable after the upstream answered: the
	// operation may have been executed, so the app must retry with the same key.
	ErrStoreAfterSend = &Error{http.StatusServiceUnavailable, "store_unavailable", "the upstream answered but the answer could not be stored; the operation may have been executed: retry with the same Idempotency-Key"}
	ErrBadRequest     = &Error{http.StatusBadRequest, "bad_request", "request cannot be proxied"}
	ErrMethod         = &Error{http.StatusMethodNotAllowed, "method_not_allowed", "CONNECT, TRACE and TRACK are not proxied"}
	ErrMethodCase     = &Error{http.StatusBadRequest, "bad_request", "the method must be in upper case (POST, not post)"}
	ErrMethodOverride = &Error{http.StatusBadRequest, "bad_request", "method override headers (X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override) are not forwarded; send the method itself"}
	ErrTrailers       = &Error{http.StatusBadRequest, "bad_request", "request trailers are not forwarded; send every header before the body"}
	ErrDotSegment     = &Error{http.StatusBadRequest, "bad_request", "the path has a dot-segment (. or .., plain or percent-encoded); send the resolved path"}
	// ErrBodyUnread: the client's body did not arrive in full (too slow, or
	// the connection broke); nothing was sent.
	ErrBodyUnread = &Error{http.StatusBadRequest, "bad_request", "request body could not be read in full; nothing was sent upstream"}
	// ErrRouteRejected answers a request an IDEMPROXY_ROUTES reject rule matches.
	ErrRouteRejected = &Error{http.StatusMethodNotAllowed, "method_not_allowed", "this method and path are refused by the proxy's route table; nothing was sent"}
	ErrUpgrade       = &Error{http.StatusBadRequest, "upgrade_not_supported", "protocol upgrades are not proxied"}
	ErrClientGone    = &Error{499, "client_closed_request", "client closed the request"}
	// ErrKeyExpired: the outcome is unknown and the provider may have
	// forgotten the key, so a resend could execute the operation twice.
	ErrKeyExpired = &Error{http.StatusConflict, "idempotency_key_expired", "the outcome of this operation is unknown and it was first sent longer ago than the provider keeps idempotency keys; nothing was sent: an operator must resolve it"}
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

// errorBody is the contract's error shape; Key and Attempts are filled for
// upstream_unavailable so the app can retry with the same key.
type errorBody struct {
	Error struct {
		Code     string `json:"code"`
		Message  string `json:"message"`
		Key      string `json:"idempotency_key,omitempty"`
		Attempts int    `json:"attempts,omitempty"`
	} `json:"error"`
}

// classify maps any error on the request path to what the client is told. It is the
// only place where errors become HTTP statuses and the contract's codes.
func classify(err error) (status int, code, msg string, attempts int) {
	var (
		pe  *Error
		ex  *retry.ExhaustedError
		mbe *http.MaxBytesError
		se  storeError
	)
	switch {
	case errors.Is(err, context.Canceled):
		return ErrClientGone.Status, ErrClientGone.Code, ErrClientGone.Message, 0
	case errors.As(err, &pe):
		return pe.Status, pe.Code, pe.Message, 0
	case errors.As(err, &mbe):
		return ErrBodyTooLong.Status, ErrBodyTooLong.Code, ErrBodyTooLong.Message, 0
	case errors.Is(err, idemkey.ErrInvalidKey):
		return ErrKeyInvalid.Status, ErrKeyInvalid.Code, ErrKeyInvalid.Message, 0
	case errors.As(err, &se):
		return ErrStore.Status, ErrStore.Code, ErrStore.Message, 0
	case errors.Is(err, retry.ErrKeyExpired):
		return ErrKeyExpired.Status, ErrKeyExpired.Code, ErrKeyExpired.Message, 0
	case errors.Is(err, retry.ErrRequestBody):
		return ErrBodyUnread.Status, ErrBodyUnread.Code, ErrBodyUnread.Message, 0
	case errors.As(err, &ex) && ex.NotSent && errors.Is(err, ratelimit.ErrClosed):
		return http.StatusServiceUnavailable, "upstream_unavailable", "idemproxy is shutting down; nothing was sent", 0
	case errors.As(err, &ex) && ex.NotSent:
		return http.StatusBadGateway, "upstream_unavailable", "upstream could not be reached; nothing was sent", ex.Attempts
	case errors.As(err, &ex):
		status = http.StatusBadGateway
		if ex.Timeout {
			status = http.StatusGatewayTimeout
		}
		return status, "upstream_unavailable", "upstream did not give a final answer; the outcome may be unknown", ex.Attempts
	default:
		return http.StatusBadGateway, "upstream_unavailable", "upstream request failed; the outcome may be unknown", 0
	}
}

// writeError answers err in the contract's JSON shape. key is the idempotency key in use
// ("" when none was established yet).
func writeError(w http.ResponseWriter, err error, key string) {
	status, code, msg, attempts := classify(err)
	var body errorBody
	body.Error.Code, body.Error.Message = code, msg
	if code == "upstream_unavailable" || err == ErrStoreAfterSend {
		body.Error.Key, body.Error.Attempts = key, attempts
	}
	if code == "upstream_unavailable" && key != "" { // an unprotected request has no key to retry with
		body.Error.Message += ": retry with the same Idempotency-Key"
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if attempts > 0 {
		h.Set(AttemptsHeader, strconv.Itoa(attempts))
	}
	if errors.As(err, new(busy)) || status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	b, _ := json.Marshal(body)
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
