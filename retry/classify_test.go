package retry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
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

// TestDispose is the table of every disposition Dispose gives, for answers
// and for attempts that got none.
func TestDispose(t *testing.T) {
	p := defaultPolicy()
	var (
		final   = Verdict{Final, ReasonNone}
		passOn  = Verdict{PassOn, ReasonNone}
		status  = Verdict{Retry, ReasonStatus}
		code    = Verdict{Retry, ReasonCode}
		unknown = Verdict{Unknown, ReasonNone} // passed on, kept as unknown
		lost    = Verdict{Unknown, ReasonStatus}
		notSent = Verdict{NotSent, ReasonNotSent}
	)
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	emfile := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	untrusted := &url.Error{Op: "Post", URL: "https://x/", Err: &tls.CertificateVerificationError{Err: errors.New("x509: unknown authority")}}
	notTLS := tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake", Conn: &net.TCPConn{}}
	slowClient := fmt.Errorf("retry: POST /v1/payout: %w: %w", ErrRequestBody, errors.New("i/o timeout reading the client's body"))
	tests := []struct {
		name   string
		mode   Mode
		status int
		body   string
		err    error
		want   Verdict
	}{
		{"2xx final", Protected, 200, `{"id":"c1","status":"processing"}`, nil, final},
		{"201 final", Protected, 201, ``, nil, final},
		{"503 retried: maintenance, nothing done", Protected, 503, `<html>maintenance</html>`, nil, status},
		{"429 retried, no code in body", Protected, 429, `{"state":1,"message":"rate limit exceeded"}`, nil, status},
		{"429 retried even when the body says failed", Protected, 429, `{"status":"failed"}`, nil, status},
		{"500 retried, outcome unknown", Protected, 500, `{"status":500,"error":"Internal Server Error"}`, nil, lost},
		{"504 retried, outcome unknown", Protected, 504, `<html>gateway timeout</html>`, nil, lost},
		{"501 not in Statuses: unknown, passed on", Protected, 501, ``, nil, unknown},
		{"code in a 5xx outside Statuses is ignored", Protected, 501, `{"code":"payout.frozen"}`, nil, unknown},
		{"needs_review on 503: not retried, unknown", Protected, 503, `{"id":"c1","status":"needs_review"}`, nil, unknown},
		{"failed on 500: not retried, unknown", Protected, 500, `{"id":"c1","status":"failed"}`, nil, unknown},
		{"data.status needs_review on 502", Protected, 502, `{"data":{"status":"needs_review"}}`, nil, unknown},
		{"other operation status on 503 retried", Protected, 503, `{"status":"processing"}`, nil, status},
		{"302 passed on", Protected, 302, ``, nil, passOn},
		{"401 passed on", Protected, 401, `{"error":{"code":"bad_signature"}}`, nil, passOn},
		{"403 passed on", Protected, 403, ``, nil, passOn},
		{"408 passed on", Protected, 408, ``, nil, passOn},
		{"409 funds_maturing", Protected, 409, `{"error":{"code":"payout.funds_maturing","message":"wait"}}`, nil, code},
		{"409 in_progress: retried, may be executing", Protected, 409, `{"error":{"code":"idempotency.in_progress"}}`, nil, Verdict{Unknown, ReasonCode}},
		{"409 frozen at top-level code", Protected, 409, `{"code":"payout.frozen"}`, nil, code},
		{"409 insufficient_funds final", Protected, 409, `{"error":{"code":"payout.insufficient_funds"}}`, nil, final},
		// The provider has an operation under the key, sent with other bytes
		// (a resend of an unknown one): not its result, not retried.
		{"409 idempotency_conflict: unknown, passed on", Protected, 409, `{"error":{"code":"idempotency_conflict"}}`, nil, unknown},
		{"idempotency_conflict at top-level code", Protected, 422, `{"code":"idempotency_conflict"}`, nil, unknown},
		{"once: idempotency_conflict passed on", Once, 409, `{"error":{"code":"idempotency_conflict"}}`, nil, passOn},
		{"409 nonce_reused: refused before acting, resent", Protected, 409, `{"error":{"code":"nonce_reused"}}`, nil, Verdict{Retry, ReasonRefused}},
		{"nonce_reused at top-level code", Protected, 409, `{"code":"nonce_reused"}`, nil, Verdict{Retry, ReasonRefused}},
		{"401 signature_reused: refused before acting, resent", Protected, 401, `{"error":{"code":"signature_reused"}}`, nil, Verdict{Retry, ReasonRefused}},
		{"code must be a string", Protected, 409, `{"code":409,"error":"payout.frozen"}`, nil, final},
		{"error.code wins over code", Protected, 409, `{"code":"payout.frozen","error":{"code":"payout.insufficient_funds"}}`, nil, final},
		{"4xx not JSON", Protected, 409, `conflict`, nil, final},
		{"failed beats a retriable code", Protected, 409, `{"status":"failed","error":{"code":"payout.frozen"}}`, nil, final},
		{"safe: 5xx retried", Safe, 501, ``, nil, status},
		{"safe: 5xx retried whatever the body", Safe, 503, `{"status":"needs_review"}`, nil, status},
		{"safe: 200 passed on, never stored", Safe, 200, ``, nil, passOn},
		{"safe: 429 passed on", Safe, 429, ``, nil, passOn},
		{"safe: retriable code passed on", Safe, 409, `{"error":{"code":"payout.frozen"}}`, nil, passOn},
		{"once: 503 passed on", Once, 503, ``, nil, passOn},
		{"once: retriable code passed on", Once, 409, `{"error":{"code":"payout.frozen"}}`, nil, passOn},
		{"once: nonce_reused passed on", Once, 409, `{"error":{"code":"nonce_reused"}}`, nil, passOn},
		// Attempts that got no answer.
		{"dial refused: not sent", Protected, 0, ``, refused, notSent},
		{"dial EMFILE: not sent", Protected, 0, ``, emfile, notSent},
		{"dial timeout: not sent", Protected, 0, ``, &net.OpError{Op: "dial", Err: context.DeadlineExceeded}, notSent},
		{"proxy connect: not sent", Safe, 0, ``, &net.OpError{Op: "proxyconnect", Err: io.EOF}, notSent},
		{"certificate does not verify: not sent", Protected, 0, ``, untrusted, notSent},
		{"server does not speak TLS: not sent", Protected, 0, ``, notTLS, notSent},
		{"slow client body: not sent, not resent", Protected, 0, ``, slowClient, Verdict{NotSent, ReasonNone}},
		{"reset after write: unknown", Protected, 0, ``, &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, Verdict{Unknown, ReasonNetwork}},
		{"EOF: unknown", Protected, 0, ``, io.EOF, Verdict{Unknown, ReasonNetwork}},
		{"unexpected EOF in body", Safe, 0, ``, io.ErrUnexpectedEOF, Verdict{Unknown, ReasonNetwork}},
		{"attempt timeout: unknown", Protected, 0, ``, fmt.Errorf("read body: %w", context.DeadlineExceeded), Verdict{Unknown, ReasonTimeout}},
		{"net timeout: unknown", Protected, 0, ``, &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, Verdict{Unknown, ReasonTimeout}},
		{"once: dial refused not resent", Once, 0, ``, refused, Verdict{NotSent, ReasonNone}},
		{"once: timeout not resent", Once, 0, ``, context.DeadlineExceeded, Verdict{Unknown, ReasonNone}},
	}
	seen := map[Disposition]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.Dispose(Answer{Mode: tt.mode, Status: tt.status, Body: []byte(tt.body), Err: tt.err})
			if got != tt.want {
				t.Errorf("Dispose(%v, %d, %s, %v) = %+v, want %+v", tt.mode, tt.status, tt.body, tt.err, got, tt.want)
			}
			seen[got.Disposition] = true
		})
	}
	for _, d := range []Disposition{Retry, Final, PassOn, Unknown, NotSent} {
		if !seen[d] {
			t.Errorf("no case gives %v", d)
		}
	}
}

// Dispose holds every classifier to its invariants: a 429 is never final even
// when 429 is not in Statuses or a custom classifier says so, a protected 5xx
// is unknown unless it is a retried 503, and nothing is stored for a status or
// mode that must not be.
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
		{Protected, 429, Retry}, {Protected, 503, Unknown}, {Protected, 500, Unknown}, {Protected, 401, PassOn},
		{Protected, 403, PassOn}, {Protected, 408, PassOn}, {Protected, 415, PassOn}, {Protected, 431, PassOn},
		{Protected, 302, PassOn}, {Protected, 201, Final},
		{Protected, 422, Final}, {Safe, 200, PassOn}, {Once, 201, PassOn}, {Safe, 500, PassOn},
	} {
		got := alwaysFinal.Dispose(Answer{Mode: tt.mode, Status: tt.status})
		if got.Disposition != tt.want || (got.Reason != ReasonNone) != (tt.want == Retry) {
			t.Errorf("a classifier saying Final for %v %d: %+v, want %v (retried only if retry)", tt.mode, tt.status, got, tt.want)
		}
	}
	bare := Policy{Classify: func(Answer) Verdict { return Verdict{Disposition: Retry} }}
	for status, want := range map[int]Verdict{503: {Retry, ReasonStatus}, 500: {Unknown, ReasonStatus}, 409: {Retry, ReasonStatus}} {
		if got := bare.Dispose(Answer{Mode: Protected, Status: status}); got != want {
			t.Errorf("Retry without a reason on %d: %+v, want %+v", status, got, want)
		}
	}
	notSent := Policy{Classify: func(Answer) Verdict { return Verdict{NotSent, ReasonNotSent} }}
	if got := notSent.Dispose(Answer{Mode: Protected, Status: 409}); got.Disposition != Retry {
		t.Errorf("an answer classified as never sent: %+v, want Retry (the provider saw it)", got)
	}
	never := Policy{Classify: func(Answer) Verdict { t.Error("the classifier saw an attempt without an answer"); return Verdict{} }}
	never.Dispose(Answer{Mode: Protected, Err: io.EOF})
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
