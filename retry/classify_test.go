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

func TestResponseReason(t *testing.T) {
	p := defaultPolicy()
	tests := []struct {
		name   string
		mode   Mode
		status int
		body   string
		want   Reason
	}{
		{"2xx final", Protected, 200, `{"id":"c1","status":"processing"}`, ReasonNone},
		{"503 retried", Protected, 503, `<html>maintenance</html>`, ReasonStatus},
		{"429 retried, no code in body", Protected, 429, `{"state":1,"message":"rate limit exceeded"}`, ReasonStatus},
		{"501 not in Statuses", Protected, 501, ``, ReasonNone},
		{"409 funds_maturing", Protected, 409, `{"error":{"code":"payout.funds_maturing","message":"wait"}}`, ReasonCode},
		{"409 in_progress", Protected, 409, `{"error":{"code":"idempotency.in_progress"}}`, ReasonCode},
		{"409 frozen at top-level code", Protected, 409, `{"code":"payout.frozen"}`, ReasonCode},
		{"409 insufficient_funds final", Protected, 409, `{"error":{"code":"payout.insufficient_funds"}}`, ReasonNone},
		{"409 idempotency_conflict final", Protected, 409, `{"error":{"code":"idempotency_conflict"}}`, ReasonNone},
		{"409 nonce_reused: refused before acting, resent", Protected, 409, `{"error":{"code":"nonce_reused"}}`, ReasonRefused},
		{"nonce_reused at top-level code", Protected, 409, `{"code":"nonce_reused"}`, ReasonRefused},
		{"once: nonce_reused passed on", Once, 409, `{"error":{"code":"nonce_reused"}}`, ReasonNone},
		{"code must be a string", Protected, 409, `{"code":409,"error":"payout.frozen"}`, ReasonNone},
		{"error.code wins over code", Protected, 409, `{"code":"payout.frozen","error":{"code":"payout.insufficient_funds"}}`, ReasonNone},
		{"code in a 5xx outside Statuses is ignored", Protected, 501, `{"code":"payout.frozen"}`, ReasonNone},
		{"4xx not JSON", Protected, 409, `conflict`, ReasonNone},
		{"needs_review on 503 is final", Protected, 503, `{"id":"c1","status":"needs_review"}`, ReasonNone},
		{"failed on 500 is final", Protected, 500, `{"id":"c1","status":"failed"}`, ReasonNone},
		{"data.status needs_review on 502 is final", Protected, 502, `{"data":{"status":"needs_review"}}`, ReasonNone},
		{"failed beats a retriable code", Protected, 409, `{"status":"failed","error":{"code":"payout.frozen"}}`, ReasonNone},
		{"numeric status is not an operation status", Protected, 500, `{"status":500,"error":"Internal Server Error"}`, ReasonStatus},
		{"other operation status retried", Protected, 503, `{"status":"processing"}`, ReasonStatus},
		{"safe: 5xx retried", Safe, 501, ``, ReasonStatus},
		{"safe: 429 final", Safe, 429, ``, ReasonNone},
		{"safe: retriable code final", Safe, 409, `{"error":{"code":"payout.frozen"}}`, ReasonNone},
		{"safe: needs_review on 503 final", Safe, 503, `{"status":"needs_review"}`, ReasonNone},
		{"once: 503 final", Once, 503, ``, ReasonNone},
		{"once: retriable code final", Once, 409, `{"error":{"code":"payout.frozen"}}`, ReasonNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := responseReason(tt.mode, p, tt.status, []byte(tt.body)); got != tt.want {
				t.Errorf("responseReason(%v, %d, %s) = %q, want %q", tt.mode, tt.status, tt.body, got, tt.want)
			}
		})
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

func TestModeFrom(t *testing.T) {
	if m := ModeFrom(context.Background()); m != Once {
		t.Errorf("default mode = %v, want once", m)
	}
	for _, m := range []Mode{Once, Safe, Protected} {
		if got := ModeFrom(WithMode(context.Background(), m)); got != m {
			t.Errorf("ModeFrom(WithMode(%v)) = %v", m, got)
		}
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
