package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
)

func defaultPolicy() Policy {
	st, err := ParseStatuses("429,500,502,503,504")
	if err != nil {
		panic(err)
	}
	return Policy{
		Statuses: st,
		Codes:    ParseCodes("idempotency.in_progress,idempotency_in_progress,payout.funds_maturing,payout.frozen"),
	}
}

func TestDispose(t *testing.T) {
	p := defaultPolicy()
	var (
		final  = Verdict{Final, ReasonNone}
		passOn = Verdict{PassOn, ReasonNone}
		status = Verdict{Retry, ReasonStatus}
		code   = Verdict{Retry, ReasonCode}
	)
	tests := []struct {
		name   string
		mode   Mode
		status int
		body   string
		want   Verdict
	}{
		{"2xx final", Protected, 200, `{"id":"c1","status":"processing"}`, final},
		{"201 final", Protected, 201, ``, final},
		{"503 retried", Protected, 503, `<html>maintenance</html>`, status},
		{"429 retried, no code in body", Protected, 429, `{"state":1,"message":"rate limit exceeded"}`, status},
		{"429 retried even when the body says failed", Protected, 429, `{"status":"failed"}`, status},
		{"501 not in Statuses: passed on, not stored", Protected, 501, ``, passOn},
		{"302 passed on", Protected, 302, ``, passOn},
		{"401 passed on", Protected, 401, `{"error":{"code":"bad_signature"}}`, passOn},
		{"403 passed on", Protected, 403, ``, passOn},
		{"408 passed on", Protected, 408, ``, passOn},
		{"409 funds_maturing", Protected, 409, `{"error":{"code":"payout.funds_maturing","message":"wait"}}`, code},
		{"409 in_progress", Protected, 409, `{"error":{"code":"idempotency.in_progress"}}`, code},
		{"409 frozen at top-level code", Protected, 409, `{"code":"payout.frozen"}`, code},
		{"409 insufficient_funds final", Protected, 409, `{"error":{"code":"payout.insufficient_funds"}}`, final},
		{"409 idempotency_conflict final", Protected, 409, `{"error":{"code":"idempotency_conflict"}}`, final},
		{"409 nonce_reused: refused before acting, resent", Protected, 409, `{"error":{"code":"nonce_reused"}}`, Verdict{Retry, ReasonRefused}},
		{"nonce_reused at top-level code", Protected, 409, `{"code":"nonce_reused"}`, Verdict{Retry, ReasonRefused}},
		{"once: nonce_reused passed on", Once, 409, `{"error":{"code":"nonce_reused"}}`, passOn},
		{"code must be a string", Protected, 409, `{"code":409,"error":"payout.frozen"}`, final},
		{"error.code wins over code", Protected, 409, `{"code":"payout.frozen","error":{"code":"payout.insufficient_funds"}}`, final},
		{"code in a 5xx outside Statuses is ignored", Protected, 501, `{"code":"payout.frozen"}`, passOn},
		{"4xx not JSON", Protected, 409, `conflict`, final},
		{"needs_review on 503 is not retried, not stored", Protected, 503, `{"id":"c1","status":"needs_review"}`, passOn},
		{"failed on 500 is not retried, not stored", Protected, 500, `{"id":"c1","status":"failed"}`, passOn},
		{"data.status needs_review on 502", Protected, 502, `{"data":{"status":"needs_review"}}`, passOn},
		{"failed beats a retriable code", Protected, 409, `{"status":"failed","error":{"code":"payout.frozen"}}`, final},
		{"numeric status is not an operation status", Protected, 500, `{"status":500,"error":"Internal Server Error"}`, status},
		{"other operation status retried", Protected, 503, `{"status":"processing"}`, status},
		{"safe: 5xx retried", Safe, 501, ``, status},
		{"safe: 5xx retried whatever the body", Safe, 503, `{"status":"needs_review"}`, status},
		{"safe: 200 passed on, never stored", Safe, 200, ``, passOn},
		{"safe: 429 passed on", Safe, 429, ``, passOn},
		{"safe: retriable code passed on", Safe, 409, `{"error":{"code":"payout.frozen"}}`, passOn},
		{"once: 503 passed on", Once, 503, ``, passOn},
		{"once: retriable code passed on", Once, 409, `{"error":{"code":"payout.frozen"}}`, passOn},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.Dispose(Answer{Mode: tt.mode, Status: tt.status, Body: []byte(tt.body)}); got != tt.want {
				t.Errorf("Dispose(%v, %d, %s) = %+v, want %+v", tt.mode, tt.status, tt.body, got, tt.want)
			}
		})
	}
}

// Dispose holds every classifier to its invariants: a 429 is never final even
// when 429 is not in Statuses or a custom classifier says so, and nothing is
// stored for a status or mode that must not be.
func TestDisposeInvariants(t *testing.T) {
	no429, err := ParseStatuses("500,502,503,504")
	if err != nil {
		t.Fatal(err)
	}
	if got := (Policy{Statuses: no429}).Dispose(Answer{Mode: Protected, Status: 429}); got.Disposition != Retry {
		t.Errorf("429 without 429 in Statuses: %+v, want Retry", got)
	}
	alwaysFinal := Policy{Classify: func(Answer) Verdict { return Verdict{Disposition: Final} }}
	for _, tt := range []struct {
		mode   Mode
		status int
		want   Disposition
	}{
		{Protected, 429, Retry}, {Protected, 503, PassOn}, {Protected, 401, PassOn}, {Protected, 403, PassOn},
		{Protected, 408, PassOn}, {Protected, 302, PassOn}, {Protected, 201, Final}, {Protected, 422, Final},
		{Safe, 200, PassOn}, {Once, 201, PassOn},
	} {
		if got := alwaysFinal.Dispose(Answer{Mode: tt.mode, Status: tt.status}); got.Disposition != tt.want {
			t.Errorf("a classifier saying Final for %v %d: %v, want %v", tt.mode, tt.status, got.Disposition, tt.want)
		}
	}
	bare := Policy{Classify: func(Answer) Verdict { return Verdict{Disposition: Retry} }}
	if got := bare.Dispose(Answer{Mode: Protected, Status: 500}); got != (Verdict{Retry, ReasonStatus}) {
		t.Errorf("Retry without a reason: %+v, want a reason", got)
	}
}

func TestErrorReason(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	tests := []struct {
		name        string
		mode        Mode
		err         error
		want        Reason
		wantTimeout bool
	}{
		{"dial refused", Protected, refused, ReasonNotSent, false},
		{"dial timeout", Protected, &net.OpError{Op: "dial", Err: context.DeadlineExceeded}, ReasonNotSent, true},
		{"proxy connect", Safe, &net.OpError{Op: "proxyconnect", Err: io.EOF}, ReasonNotSent, false},
		{"reset after write", Protected, &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, ReasonNetwork, false},
		{"EOF", Protected, io.EOF, ReasonNetwork, false},
		{"unexpected EOF in body", Safe, io.ErrUnexpectedEOF, ReasonNetwork, false},
		{"attempt timeout", Protected, fmt.Errorf("read body: %w", context.DeadlineExceeded), ReasonTimeout, true},
		{"net timeout", Protected, &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, ReasonTimeout, true},
		{"once never retries", Once, refused, ReasonNone, false},
		{"once still reports a timeout", Once, context.DeadlineExceeded, ReasonNone, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, timeout := errorReason(tt.mode, tt.err)
			if got != tt.want || timeout != tt.wantTimeout {
				t.Errorf("errorReason(%v) = %q, %v; want %q, %v", tt.err, got, timeout, tt.want, tt.wantTimeout)
			}
		})
	}
}

func TestModeString(t *testing.T) {
	if m := (Call{}).Mode; m != Once {
		t.Errorf("default mode = %v, want once", m)
	}
	if s := Protected.String() + Safe.String() + Once.String(); s != "protectedsafeonce" {
		t.Errorf("String() = %q", s)
	}
}

func TestExhaustedErrorText(t *testing.T) {
	e := &ExhaustedError{Method: "POST", Path: "/v1/payout", Attempts: 3, LastStatus: 503}
	if got, want := e.Error(), "retry: POST /v1/payout: no final answer after 3 attempts: last status 503"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e = &ExhaustedError{Method: "GET", Path: "/x", Attempts: 1, Timeout: true, Err: context.DeadlineExceeded}
	if got, want := e.Error(), "retry: GET /x: no final answer after 1 attempt: context deadline exceeded"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, context.DeadlineExceeded) {
		t.Error("ExhaustedError does not unwrap to its Err")
	}
}
