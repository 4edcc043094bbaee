package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/ratelimit"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// TestClassify: every error on the request path gets its status, code and
// the request's outcome from the one mapping, wrapped or not.
func TestClassify(t *testing.T) {
	exhausted := &retry.ExhaustedError{Method: "POST", Path: "/p", Attempts: 3}
	timedOut := &retry.ExhaustedError{Method: "POST", Path: "/p", Attempts: 2, Timeout: true}
	notSent := &retry.ExhaustedError{Method: "POST", Path: "/p", Attempts: 4, NotSent: true}
	shutdown := &retry.ExhaustedError{Method: "POST", Path: "/p", NotSent: true, Err: ratelimit.ErrClosed}
	for _, c := range []struct {
		name     string
		err      error
		status   int
		code     string
		outcome  Outcome
		limit    string
		attempts int
	}{
		{"client gone", fmt.Errorf("read: %w", context.Canceled), 499, CodeClientClosed, OutcomeClientGone, "", 0},
		{"conflict", ErrConflict, http.StatusConflict, CodeConflict, OutcomeConflict, "", 0},
		{"in progress", busyError(0, ""), http.StatusConflict, CodeInProgress, OutcomeInProgress, "", 0},
		{"in progress, provider's dialect", busyError(http.StatusServiceUnavailable, "idempotency.in_progress"), http.StatusServiceUnavailable, "idempotency.in_progress", OutcomeInProgress, "", 0},
		{"store before sending", storeError{errors.New("disk full")}, http.StatusServiceUnavailable, CodeStoreUnavailable, OutcomeStoreError, "", 0},
		{"store after sending", ErrStoreAfterSend, http.StatusServiceUnavailable, CodeStoreUnavailable, OutcomeStoreError, "", 0},
		{"overloaded", ErrOverloaded, http.StatusServiceUnavailable, CodeOverloaded, OutcomeOverloaded, LimitRequests, 0},
		{"overloaded bytes", ErrOverloadedBytes, http.StatusServiceUnavailable, CodeOverloaded, OutcomeOverloaded, LimitBytes, 0},
		{"route rejected", ErrRouteRejected, http.StatusMethodNotAllowed, CodeMethodNotAllowed, OutcomeRejected, "", 0},
		{"unauthorized", ErrUnauthorized, http.StatusUnauthorized, CodeUnauthorized, OutcomeRejected, "", 0},
		{"key missing", ErrKeyMissing, http.StatusUnprocessableEntity, CodeKeyMissing, OutcomeRejected, "", 0},
		{"key invalid", fmt.Errorf("header: %w", idemkey.ErrInvalidKey), http.StatusBadRequest, CodeKeyInvalid, OutcomeRejected, "", 0},
		{"body too large", &http.MaxBytesError{Limit: 10}, http.StatusRequestEntityTooLarge, CodeBodyTooLarge, OutcomeRejected, "", 0},
		{"body unread", fmt.Errorf("%w: %w", retry.ErrRequestBody, errors.New("eof")), http.StatusBadRequest, CodeBadRequest, OutcomeRejected, "", 0},
		{"key expired", fmt.Errorf("resume: %w", retry.ErrKeyExpired), http.StatusConflict, CodeKeyExpired, OutcomeRejected, "", 0},
		{"exhausted", exhausted, http.StatusBadGateway, CodeUpstreamUnavailable, OutcomeUnavailable, "", 3},
		{"exhausted by a timeout", timedOut, http.StatusGatewayTimeout, CodeUpstreamUnavailable, OutcomeUnavailable, "", 2},
		{"never sent", notSent, http.StatusBadGateway, CodeUpstreamUnavailable, OutcomeUnavailable, "", 4},
		{"shutting down", shutdown, http.StatusServiceUnavailable, CodeUpstreamUnavailable, OutcomeUnavailable, "", 0},
		{"anything else", errors.New("reset by peer"), http.StatusBadGateway, CodeUpstreamUnavailable, OutcomeUnavailable, "", 0},
	} {
		a := classify(c.err)
		if a.Status != c.status || a.Code != c.code || a.Outcome != c.outcome || a.Limit != c.limit || a.Attempts != c.attempts || a.Message == "" {
			t.Errorf("%s: classify = %+v, want status %d code %s outcome %s limit %q attempts %d and a message",
				c.name, a, c.status, c.code, c.outcome, c.limit, c.attempts)
		}
	}
}

// TestSettle: a request's summary takes its outcome, status and attempts
// from its error's class, else from its answer.
func TestSettle(t *testing.T) {
	var s Summary
	s.settle(result{resp: store.Response{Status: 201}, report: retry.Report{Attempts: 2}}, nil)
	if s.Outcome != OutcomeForwarded || s.Status != 201 || s.Attempts != 2 || s.Replayed {
		t.Errorf("fresh answer: %+v, want forwarded 201 after 2 attempts", s)
	}
	s = Summary{}
	s.settle(result{resp: store.Response{Status: 200}, replayed: true}, nil)
	if s.Outcome != OutcomeReplayed || s.Status != 200 || s.Attempts != 0 || !s.Replayed {
		t.Errorf("replay: %+v, want replayed 200, no attempts", s)
	}
	s = Summary{}
	a := classify(ErrOverloadedBytes)
	s.settle(result{}, &a)
	if s.Outcome != OutcomeOverloaded || s.Status != http.StatusServiceUnavailable || s.Limit != LimitBytes {
		t.Errorf("overloaded: %+v, want overloaded 503 on the bytes limit", s)
	}
}
