package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
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
		{"store while waiting for the key in flight elsewhere", storeErrorWaiting{errors.New("connection refused")}, http.StatusServiceUnavailable, CodeStoreUnavailable, OutcomeStoreError, "", 0},
		{"store after sending", ErrStoreAfterSend, http.StatusServiceUnavailable, CodeStoreUnavailable, OutcomeStoreError, "", 0},
		{"store after sending, with attempts", storeAfterSend{2}, http.StatusServiceUnavailable, CodeStoreUnavailable, OutcomeStoreError, "", 2},
		{"overloaded", ErrOverloaded, http.StatusServiceUnavailable, CodeOverloaded, OutcomeOverloaded, LimitRequests, 0},
		{"overloaded bytes", ErrOverloadedBytes, http.StatusServiceUnavailable, CodeOverloaded, OutcomeOverloaded, LimitBytes, 0},
		{"route rejected", ErrRouteRejected, http.StatusMethodNotAllowed, CodeMethodNotAllowed, OutcomeRejected, "", 0},
		{"unauthorized", ErrUnauthorized, http.StatusUnauthorized, CodeUnauthorized, OutcomeRejected, "", 0},
		{"key missing", ErrKeyMissing, http.StatusUnprocessableEntity, CodeKeyMissing, OutcomeRejected, "", 0},
		{"key invalid", fmt.Errorf("header: %w", idemkey.ErrInvalidKey), http.StatusBadRequest, CodeBadRequest, OutcomeRejected, "", 0},
		{"body too large", &http.MaxBytesError{Limit: 10}, http.StatusRequestEntityTooLarge, CodeBodyTooLarge, OutcomeRejected, "", 0},
		{"body unread", fmt.Errorf("%w: %w", retry.ErrRequestBody, errors.New("eof")), http.StatusBadRequest, CodeBadRequest, OutcomeRejected, "", 0},
		{"key expired", fmt.Errorf("resume: %w", retry.ErrKeyExpired), http.StatusConflict, CodeKeyExpired, OutcomeRejected, "", 0},
		{"exhausted", exhausted, http.StatusBadGateway, CodeUpstreamUnavailable, OutcomeUnavailable, "", 3},
		{"exhausted by a timeout", timedOut, http.StatusGatewayTimeout, CodeUpstreamUnavailable, OutcomeUnavailable, "", 2},
		{"never sent", notSent, http.StatusBadGateway, CodeUpstreamUnavailable, OutcomeUnavailable, "", 4},
		{"shutting down", shutdown, http.StatusServiceUnavailable, CodeUpstreamUnavailable, OutcomeUnavailable, "", 0},
		{"answer too large for a record", answerTooLarge{fmt.Errorf("attempt 1: %w", retry.ErrResponseTooLarge), 1}, http.StatusBadGateway, CodeUpstreamUnavailable, OutcomeUnavailable, "", 1},
		{"anything else", errors.New("reset by peer"), http.StatusBadGateway, CodeUpstreamUnavailable, OutcomeUnavailable, "", 0},
	} {
		a := classify(c.err)
		if a.Status != c.status || a.Code != c.code || a.Outcome != c.outcome || a.Limit != c.limit || a.Attempts != c.attempts || a.Message == "" {
			t.Errorf("%s: classify = %+v, want status %d code %s outcome %s limit %q attempts %d and a message",
				c.name, a, c.status, c.code, c.outcome, c.limit, c.attempts)
		}
	}
}

// TestClassifyExhausted: a spent budget or a shutdown gets its status from
// the last failure and its message from what the provider may have done.
// Only a request never sent at all, in this sequence or an earlier one, gets
// the shutdown's 503; "nothing was sent" is said only of such requests, and
// "may be unknown" only when the record is kept unknown (or, without a
// shutdown, of any sent sequence but one whose every answer said the
// provider did not act: unprotected ones never say Unknown).
func TestClassifyExhausted(t *testing.T) {
	closed := fmt.Errorf("%w; last error: %w", ratelimit.ErrClosed, errors.New("i/o timeout"))
	for _, c := range []struct {
		name    string
		ex      retry.ExhaustedError
		status  int
		says    []string
		notSays []string
	}{
		{"budget spent on 429s", retry.ExhaustedError{Attempts: 3, LastStatus: 429},
			http.StatusBadGateway, []string{"did not give a final answer"}, []string{"nothing was sent", "shutting down"}},
		// Every attempt refused before the provider acted (409
		// nonce_reused, 429, a retried 503): the key is released, and the
		// message says so rather than that the outcome may be unknown.
		{"budget spent on refusals", retry.ExhaustedError{Attempts: 3, LastStatus: 409, NotActed: true},
			http.StatusBadGateway, []string{"acted on no attempt", "status 409", "not executed"}, []string{"unknown", "nothing was sent"}},
		{"shutdown after refusals", retry.ExhaustedError{Attempts: 1, LastStatus: 409, NotActed: true, Err: ratelimit.ErrClosed},
			http.StatusBadGateway, []string{"shutting down", "did not act"}, []string{"unknown", "nothing was sent"}},
		{"budget spent, last a timeout", retry.ExhaustedError{Attempts: 2, Timeout: true, Unknown: true},
			http.StatusGatewayTimeout, []string{"may be unknown"}, []string{"nothing was sent"}},
		{"unreachable", retry.ExhaustedError{Attempts: 2, NotSent: true},
			http.StatusBadGateway, []string{"could not be reached", "nothing was sent"}, []string{"unknown"}},
		// Held by the provider's Retry-After pause or the outbound rate
		// limit past the budget: nothing left, but the upstream was not
		// unreachable, and saying so sent operators after the network.
		{"held at the gate, never sent", retry.ExhaustedError{NotSent: true, Timeout: true, Err: fmt.Errorf("ratelimit: paused for 59s: %w", ratelimit.ErrDeadline)},
			http.StatusBadGateway, []string{"rate limit", "Retry-After", "nothing was sent"}, []string{"could not be reached", "unknown"}},
		{"unreachable, then held at the gate", retry.ExhaustedError{Attempts: 1, NotSent: true, Err: fmt.Errorf("ratelimit: wait 16m40s: %w", ratelimit.ErrDeadline)},
			http.StatusBadGateway, []string{"rate limit", "nothing was sent"}, []string{"could not be reached", "unknown"}},
		{"resumed unknown, held at the gate", retry.ExhaustedError{NotSent: true, Timeout: true, Unknown: true, Err: fmt.Errorf("ratelimit: paused for 59s: %w", ratelimit.ErrDeadline)},
			http.StatusBadGateway, []string{"rate limit", "may be unknown"}, []string{"could not be reached", "nothing was sent"}},
		{"resumed unknown, unreachable", retry.ExhaustedError{Attempts: 2, NotSent: true, Unknown: true},
			http.StatusBadGateway, []string{"could not be reached", "may be unknown"}, []string{"nothing was sent"}},
		{"shutdown, never sent", retry.ExhaustedError{NotSent: true, Timeout: true, Err: ratelimit.ErrClosed},
			http.StatusServiceUnavailable, []string{"shutting down", "nothing was sent"}, []string{"unknown"}},
		{"shutdown after a 429", retry.ExhaustedError{Attempts: 1, LastStatus: 429, Err: ratelimit.ErrClosed},
			http.StatusBadGateway, []string{"shutting down", "did not act"}, []string{"unknown", "nothing was sent"}},
		{"shutdown after a timeout", retry.ExhaustedError{Attempts: 1, Timeout: true, Unknown: true, Err: closed},
			http.StatusGatewayTimeout, []string{"shutting down", "may be unknown"}, []string{"nothing was sent"}},
		{"shutdown after a 500", retry.ExhaustedError{Attempts: 2, LastStatus: 500, Unknown: true, Err: ratelimit.ErrClosed},
			http.StatusBadGateway, []string{"shutting down", "may be unknown"}, []string{"nothing was sent"}},
		{"shutdown resuming an unknown one", retry.ExhaustedError{NotSent: true, Timeout: true, Unknown: true, Err: ratelimit.ErrClosed},
			http.StatusBadGateway, []string{"shutting down", "may be unknown"}, []string{"nothing was sent"}},
	} {
		c.ex.Method, c.ex.Path = "POST", "/p"
		a := classify(fmt.Errorf("proxy: %w", &c.ex))
		if a.Status != c.status || a.Code != CodeUpstreamUnavailable || a.Outcome != OutcomeUnavailable || a.Attempts != c.ex.Attempts {
			t.Errorf("%s: classify = %+v, want %d upstream_unavailable with %d attempts", c.name, a, c.status, c.ex.Attempts)
		}
		for _, s := range c.says {
			if !strings.Contains(a.Message, s) {
				t.Errorf("%s: message %q does not say %q", c.name, a.Message, s)
			}
		}
		for _, s := range c.notSays {
			if strings.Contains(a.Message, s) {
				t.Errorf("%s: message %q says %q", c.name, a.Message, s)
			}
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
