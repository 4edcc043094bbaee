package retry

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/ratelimit"
)

const ms = time.Millisecond

func TestTransportRetriesThenSucceeds(t *testing.T) {
	maturing := `{"error":{"code":"payout.funds_maturing","message":"funds are maturing"}}`
	tests := []struct {
		name         string
		steps        []step
		wantAttempts int
		wantSleeps   []time.Duration
		wantReasons  []Reason
		wantReplayed bool // the first attempt executed; the provider replayed it
	}{
		{"500", []step{respond(500, `{"error":{"code":"internal"}}`)}, 2, []time.Duration{50 * ms}, []Reason{ReasonStatus, ReasonNone}, false},
		{"502 from a gateway", []step{respond(502, `<html>bad gateway</html>`)}, 2, []time.Duration{50 * ms}, []Reason{ReasonStatus, ReasonNone}, false},
		{"503", []step{respond(503, ``)}, 2, []time.Duration{50 * ms}, []Reason{ReasonStatus, ReasonNone}, false},
		{"504", []step{respond(504, ``)}, 2, []time.Duration{50 * ms}, []Reason{ReasonStatus, ReasonNone}, false},
		{"backoff doubles", []step{respond(500, ``), respond(503, ``), respond(502, ``)}, 4,
			[]time.Duration{50 * ms, 100 * ms, 200 * ms}, []Reason{ReasonStatus, ReasonStatus, ReasonStatus, ReasonNone}, false},
		{"reset before processing", []step{resetBeforeProcessing}, 2, []time.Duration{50 * ms}, []Reason{ReasonNetwork, ReasonNone}, false},
		{"reset after processing", []step{resetAfterProcessing}, 2, []time.Duration{50 * ms}, []Reason{ReasonNetwork, ReasonNone}, true},
		{"409 payout.funds_maturing", []step{respond(409, maturing)}, 2, []time.Duration{50 * ms}, []Reason{ReasonCode, ReasonNone}, false},
		{"409 idempotency.in_progress", []step{respond(409, `{"error":{"code":"idempotency.in_progress"}}`)}, 2, []time.Duration{50 * ms}, []Reason{ReasonCode, ReasonNone}, false},
		{"409 payout.frozen at top-level code", []step{respond(409, `{"code":"payout.frozen"}`)}, 2, []time.Duration{50 * ms}, []Reason{ReasonCode, ReasonNone}, false},
		{"mixed failures", []step{resetAfterProcessing, respond(409, maturing), respond(503, ``)}, 4,
			[]time.Duration{50 * ms, 100 * ms, 200 * ms}, []Reason{ReasonNetwork, ReasonCode, ReasonStatus, ReasonNone}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProvider(t, tt.steps...)
			h := newHarness(t, testPolicy())
			resp, err := send(t, h.tr, post(t, p.srv.URL), Protected)
			body := readFinal(t, resp, err, 200, tt.wantAttempts)
			if want := `{"id":"op-1","status":"processing"}`; string(body) != want {
				t.Errorf("body %s, want %s", body, want)
			}
			if got := resp.Header.Get("Idempotent-Replayed") == "true"; got != tt.wantReplayed {
				t.Errorf("Idempotent-Replayed = %v, want %v", got, tt.wantReplayed)
			}
			assertSameRequest(t, p, tt.wantAttempts, testBody)
			if n := p.Executed(); n != 1 {
				t.Errorf("provider executed the payout %d times, want 1", n)
			}
			if s := h.clock.Sleeps(); !slices.Equal(s, tt.wantSleeps) {
				t.Errorf("sleeps %v, want %v", s, tt.wantSleeps)
			}
			if r := h.reasons(); !slices.Equal(r, tt.wantReasons) {
				t.Errorf("reasons %q, want %q", r, tt.wantReasons)
			}
		})
	}
}

func TestTransportRetryAfter(t *testing.T) {
	tests := []struct {
		name       string
		policy     func(*Policy)
		first      func(start time.Time) step
		wantSleeps []time.Duration
		wantPause  time.Duration // after start; 0 = no pause set
	}{
		{"429 delay-seconds", nil, func(time.Time) step {
			return respond(429, `{"state":1,"message":"rate limit exceeded"}`, "Retry-After", "2")
		}, []time.Duration{2 * time.Second}, 2 * time.Second},
		{"429 HTTP-date", nil, func(start time.Time) step {
			return respond(429, ``, "Retry-After", start.Add(7*time.Second).UTC().Format(http.TimeFormat))
		}, []time.Duration{7 * time.Second}, 7 * time.Second},
		{"429 capped by MaxDelay", nil, func(time.Time) step {
			return respond(429, ``, "Retry-After", "60")
		}, []time.Duration{10 * time.Second}, 10 * time.Second},
		{"429 HTTP-date capped by MaxDelay", nil, func(start time.Time) step {
			return respond(429, ``, "Retry-After", start.Add(time.Hour).UTC().Format(http.TimeFormat))
		}, []time.Duration{10 * time.Second}, 10 * time.Second},
		{"503 maintenance with Retry-After", nil, func(time.Time) step {
			return respond(503, `{"error":{"code":"maintenance"}}`, "Retry-After", "5")
		}, []time.Duration{5 * time.Second}, 5 * time.Second},
		// A wait of zero would let every attempt go within milliseconds:
		// a past date or a 0 falls back to the backoff (50 ms with Rand 0.5).
		{"date in the past: backoff", nil, func(start time.Time) step {
			return respond(429, ``, "Retry-After", start.Add(-time.Hour).UTC().Format(http.TimeFormat))
		}, []time.Duration{50 * ms}, 0},
		{"zero: backoff", nil, func(time.Time) step {
			return respond(503, ``, "Retry-After", "0")
		}, []time.Duration{50 * ms}, 0},
		{"fraction: rounded up to whole seconds", nil, func(time.Time) step {
			return respond(429, ``, "Retry-After", "1.5")
		}, []time.Duration{2 * time.Second}, 2 * time.Second},
		{"invalid Retry-After: backoff", nil, func(time.Time) step {
			return respond(429, ``, "Retry-After", "soon")
		}, []time.Duration{50 * ms}, 0},
		{"409 in_progress: waits, pauses nobody else", nil, func(time.Time) step {
			return respond(409, `{"error":{"code":"idempotency_in_progress"}}`, "Retry-After", "3")
		}, []time.Duration{3 * time.Second}, 0},
		{"500 with Retry-After: waits, pauses nobody else", nil, func(time.Time) step {
			return respond(500, ``, "Retry-After", "4")
		}, []time.Duration{4 * time.Second}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, testPolicy())
			start := h.clock.Now()
			p := newProvider(t, tt.first(start))
			resp, err := send(t, h.tr, post(t, p.srv.URL), Protected)
			readFinal(t, resp, err, 200, 2)
			assertSameRequest(t, p, 2, testBody)
			if s := h.clock.Sleeps(); !slices.Equal(s, tt.wantSleeps) {
				t.Errorf("sleeps %v, want %v", s, tt.wantSleeps)
			}
			paused := h.gate.PausedUntil()
			switch {
			case tt.wantPause == 0 && !paused.IsZero():
				t.Errorf("gate paused until +%v, want no pause", paused.Sub(start))
			case tt.wantPause != 0 && !paused.Equal(start.Add(tt.wantPause)):
				t.Errorf("gate paused until +%v, want +%v", paused.Sub(start), tt.wantPause)
			}
		})
	}
}

func TestTransportFinalAnswers(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
	}{
		{"409 payout.insufficient_funds", 409, `{"error":{"code":"payout.insufficient_funds"}}`},
		{"409 other code", 409, `{"error":{"code":"payout.duplicate_order"}}`},
		{"422 key missing", 422, `{"error":{"code":"validation_error"}}`},
		{"400 card_not_active", 400, `{"error":{"code":"card_not_active"}}`},
		{"200 needs_review", 200, `{"id":"c1","kind":"issue","status":"needs_review"}`},
		{"503 needs_review", 503, `{"id":"c1","status":"needs_review"}`},
		{"500 failed", 500, `{"id":"c1","status":"failed"}`},
		{"502 data.status needs_review", 502, `{"data":{"id":"c1","status":"needs_review"}}`},
		{"409 retriable code but operation failed", 409, `{"status":"failed","error":{"code":"payout.frozen"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProvider(t, respond(tt.status, tt.body))
			h := newHarness(t, testPolicy())
			resp, err := send(t, h.tr, post(t, p.srv.URL), Protected)
			body := readFinal(t, resp, err, tt.status, 1)
			if string(body) != tt.body {
				t.Errorf("body %s, want %s", body, tt.body)
			}
			assertSameRequest(t, p, 1, testBody)
			if s := h.clock.Sleeps(); len(s) != 0 {
				t.Errorf("slept %v before a final answer", s)
			}
		})
	}
}

// A listener opened and closed at once gives a guaranteed "connection
// refused": the upstream never saw anything, but each retry still waits at
// least half the backoff ceiling (equal jitter), so the attempts cannot all
// be spent within the milliseconds a refused dial takes.
func TestTransportConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	pol := testPolicy()
	pol.MaxAttempts = 3
	h := newHarness(t, pol)
	resp, err := send(t, h.tr, post(t, "http://"+addr), Protected)
	ex := wantExhausted(t, resp, err, 3, false, 0)
	if !errors.Is(ex, syscall.ECONNREFUSED) {
		t.Errorf("error %v does not unwrap to ECONNREFUSED", ex)
	}
	// Rand 0.5: ceiling/2 + 0.5·ceiling/2, ceilings 100 ms and 200 ms.
	if s := h.clock.Sleeps(); !slices.Equal(s, []time.Duration{75 * ms, 150 * ms}) {
		t.Errorf("slept %v between never-sent attempts, want [75ms 150ms]", s)
	}
	if r := h.reasons(); !slices.Equal(r, []Reason{ReasonNotSent, ReasonNotSent, ReasonNotSent}) {
		t.Errorf("reasons %q, want not_sent ×3", r)
	}
}

// A response slower than the attempt timeout (a real 1 s; the handler is
// blocked until the test ends). The second attempt must finish within the
// same timeout: 50 ms was too short on a loaded machine.
func TestTransportAttemptTimeout(t *testing.T) {
	tests := []struct {
		name         string
		step         step
		wantReplayed bool
	}{
		{"no response", hang, false},
		{"slow body", slowBody, true}, // the payout ran; the second attempt gets the replay
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProvider(t, tt.step)
			pol := testPolicy()
			pol.AttemptTimeout = time.Second
			h := newHarness(t, pol)
			resp, err := send(t, h.tr, post(t, p.srv.URL), Protected)
			readFinal(t, resp, err, 200, 2)
			if got := resp.Header.Get("Idempotent-Replayed") == "true"; got != tt.wantReplayed {
				t.Errorf("Idempotent-Replayed = %v, want %v", got, tt.wantReplayed)
			}
			assertSameRequest(t, p, 2, testBody)
			if n := p.Executed(); n != 1 {
				t.Errorf("executed %d times, want 1", n)
			}
			if r := h.reasons(); !slices.Equal(r, []Reason{ReasonTimeout, ReasonNone}) {
				t.Errorf("reasons %q, want timeout then final", r)
			}
			if s := h.clock.Sleeps(); !slices.Equal(s, []time.Duration{50 * ms}) {
				t.Errorf("sleeps %v, want the backoff after a timeout", s)
			}
		})
	}
}

func TestTransportExhausted(t *testing.T) {
	always := func(s step, n int) []step { return slices.Repeat([]step{s}, n) }
	tests := []struct {
		name         string
		steps        []step
		setup        func(h *harness, p *Policy)
		wantAttempts int
		wantTimeout  bool
		wantStatus   int
		wantSleeps   int
		wantErr      error // errors.Is target, if any
	}{
		{"attempts spent on 503", always(respond(503, ``), 4), nil, 4, false, 503, 3, nil},
		{"attempts spent on a retriable code", always(respond(409, `{"error":{"code":"payout.frozen"}}`), 4), nil, 4, false, 409, 3, nil},
		{"every attempt times out", always(hang, 3), func(_ *harness, p *Policy) {
			p.MaxAttempts, p.AttemptTimeout = 3, 50*ms
		}, 3, true, 0, 2, context.DeadlineExceeded},
		{"last failure decides the flag", append(always(hang, 1), respond(502, ``)), func(_ *harness, p *Policy) {
			// A real second: the 502 attempt must answer within it, and
			// 50 ms was too short on a loaded machine.
			p.MaxAttempts, p.AttemptTimeout = 2, time.Second
		}, 2, false, 502, 1, nil},
		{"budget ends the sequence", always(respond(503, ``), 10), func(h *harness, p *Policy) {
			// Waits of ~25 min in a 1 h budget: attempts at 0, ~25, ~50 min; the
			// next wait would end at ~75 min.
			p.MaxAttempts, p.BaseDelay, p.MaxDelay = 10, 25*time.Minute, 25*time.Minute
			h.tr.Rand = func() float64 { return 0.999 }
		}, 3, false, 503, 2, ErrBudget},
		{"a wait past the budget is not slept", always(respond(429, ``, "Retry-After", "7200"), 1), func(_ *harness, p *Policy) {
			p.MaxDelay = 3 * time.Hour
		}, 1, false, 429, 0, ErrBudget},
		{"provider paused past the budget: nothing sent", nil, func(h *harness, _ *Policy) {
			h.gate.PauseUntil(h.clock.Now().Add(2 * time.Hour))
		}, 0, true, 0, 0, ratelimit.ErrDeadline},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProvider(t, tt.steps...)
			h := newHarness(t, testPolicy())
			if tt.setup != nil {
				tt.setup(h, &h.tr.Policy)
			}
			resp, err := send(t, h.tr, post(t, p.srv.URL), Protected)
			ex := wantExhausted(t, resp, err, tt.wantAttempts, tt.wantTimeout, tt.wantStatus)
			if tt.wantErr != nil && !errors.Is(ex, tt.wantErr) {
				t.Errorf("error %v does not unwrap to %v", ex, tt.wantErr)
			}
			assertSameRequest(t, p, tt.wantAttempts, testBody)
			if s := h.clock.Sleeps(); len(s) != tt.wantSleeps {
				t.Errorf("sleeps %v, want %d", s, tt.wantSleeps)
			}
			if infos := h.Infos(); len(infos) > 0 && !infos[len(infos)-1].Last {
				t.Error("the last AttemptInfo is not marked Last")
			}
		})
	}
}

// An unprotected request's waits are bounded by the budget as a protected
// one's are (its context is not: that would cut a streamed answer). Its
// wait at the Gate once had no deadline at all: with the provider paused
// past the budget, it waited out the whole pause (or, on a replica whose
// shared rate limit waits for the database, until the database came back),
// the app's request hanging far past IDEMPROXY_RETRY_BUDGET.
func TestTransportStreamGateWaitWithinBudget(t *testing.T) {
	for _, mode := range []Mode{Safe, Once} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newProvider(t)
			h := newHarness(t, testPolicy())
			h.gate.PauseUntil(h.clock.Now().Add(2 * time.Hour))
			req, err := http.NewRequest(http.MethodGet, p.srv.URL+"/v1/payout", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := send(t, h.tr, req, mode)
			if resp != nil {
				resp.Body.Close()
				t.Fatalf("got a %d response after waiting %v, want an ExhaustedError within the 1h budget", resp.StatusCode, h.clock.Sleeps())
			}
			var ex *ExhaustedError
			if !errors.As(err, &ex) || ex.Attempts != 0 || !errors.Is(err, ratelimit.ErrDeadline) {
				t.Errorf("error %v, want an ExhaustedError with no attempt, wrapping ratelimit.ErrDeadline", err)
			}
			if n := len(p.Arrivals()); n != 0 {
				t.Errorf("%d requests reached the provider, want none", n)
			}
			if s := h.clock.Sleeps(); len(s) != 0 {
				t.Errorf("slept %v, want no sleep into a pause that outlasts the budget", s)
			}
		})
	}
}

// wantExhausted checks that RoundTrip gave up with an ExhaustedError (and no
// response: a retriable answer must never pass as final) whose text names
// the method, the path and the attempts but not the query.
func wantExhausted(t *testing.T, resp *http.Response, err error, attempts int, timeout bool, status int) *ExhaustedError {
	t.Helper()
	if resp != nil {
		resp.Body.Close()
		t.Fatalf("got a %d response, want an ExhaustedError", resp.StatusCode)
	}
	var ex *ExhaustedError
	if !errors.As(err, &ex) {
		t.Fatalf("error %v (%T), want *ExhaustedError", err, err)
	}
	if ex.Attempts != attempts || ex.Timeout != timeout || ex.LastStatus != status {
		t.Errorf("ExhaustedError{Attempts %d, Timeout %v, LastStatus %d}, want {%d, %v, %d}",
			ex.Attempts, ex.Timeout, ex.LastStatus, attempts, timeout, status)
	}
	msg := ex.Error()
	if !strings.Contains(msg, "POST /v1/payout") || !strings.Contains(msg, "after "+strconv.Itoa(attempts)+" attempt") {
		t.Errorf("error text %q lacks method, path or attempts", msg)
	}
	if strings.Contains(msg, "s3cr3t") || strings.Contains(msg, "token") {
		t.Errorf("error text %q leaks the query", msg)
	}
	return ex
}

func TestTransportModes(t *testing.T) {
	type outcome struct {
		attempts  int
		status    int // 0 = ExhaustedError
		exhausted bool
	}
	scenarios := []struct {
		name  string
		first step
	}{
		{"500", respond(500, ``)},
		{"reset", resetBeforeProcessing},
		{"429", respond(429, `{"state":1,"message":"rate limit exceeded"}`)},
		{"409 payout.frozen", respond(409, `{"error":{"code":"payout.frozen"}}`)},
	}
	want := map[Mode][]outcome{
		Protected: {{2, 200, false}, {2, 200, false}, {2, 200, false}, {2, 200, false}},
		Safe:      {{2, 200, false}, {2, 200, false}, {1, 429, false}, {1, 409, false}},
		Once:      {{1, 500, false}, {1, 0, true}, {1, 429, false}, {1, 409, false}},
	}
	for _, mode := range []Mode{Protected, Safe, Once} {
		for i, sc := range scenarios {
			t.Run(mode.String()+"/"+sc.name, func(t *testing.T) {
				w := want[mode][i]
				p := newProvider(t, sc.first)
				h := newHarness(t, testPolicy())
				resp, err := send(t, h.tr, post(t, p.srv.URL), mode)
				if w.exhausted {
					var ex *ExhaustedError
					if !errors.As(err, &ex) || ex.Attempts != w.attempts {
						t.Fatalf("got %v, %v; want ExhaustedError after %d attempts", resp, err, w.attempts)
					}
				} else {
					readFinal(t, resp, err, w.status, w.attempts)
				}
				assertSameRequest(t, p, w.attempts, testBody)
			})
		}
	}
}

func TestTransportCallerCanceled(t *testing.T) {
	p := newProvider(t, respond(503, ``))
	h := newHarness(t, testPolicy())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.tr.OnAttempt = func(AttemptInfo) { cancel() } // the caller leaves during the first wait
	req := post(t, p.srv.URL).WithContext(ctx)
	resp, err := send(t, h.tr, req, Protected)
	if resp != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, %v; want context.Canceled", resp, err)
	}
	var ex *ExhaustedError
	if errors.As(err, &ex) {
		t.Errorf("a caller that left is not an exhausted budget: %v", err)
	}
	assertSameRequest(t, p, 1, testBody)
}

func TestTransportResponseTooLarge(t *testing.T) {
	p := newProvider(t, respond(200, strings.Repeat("x", 100)))
	h := newHarness(t, testPolicy())
	h.tr.MaxResponseBytes = 64
	resp, err := send(t, h.tr, post(t, p.srv.URL), Protected)
	if resp != nil || !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("got %v, %v; want ErrResponseTooLarge", resp, err)
	}
	assertSameRequest(t, p, 1, testBody)
}

// closeRecorder is a one-shot request body (no GetBody) that records Close.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

func TestTransportBuffersBodyOnce(t *testing.T) {
	p := newProvider(t, respond(500, ``), respond(502, ``))
	h := newHarness(t, testPolicy())
	req := post(t, p.srv.URL)
	body := &closeRecorder{Reader: bytes.NewReader(testBody)}
	req.Body, req.GetBody, req.ContentLength = body, nil, -1
	resp, err := send(t, h.tr, req, Protected)
	readFinal(t, resp, err, 200, 3)
	assertSameRequest(t, p, 3, testBody)
	if !body.closed {
		t.Error("the caller's request body was not closed")
	}
}

func TestTransportAttemptInfo(t *testing.T) {
	p := newProvider(t, respond(503, ``))
	h := newHarness(t, testPolicy())
	h.tr.Gate = ratelimit.New(2, 1) // pacing: the second attempt waits for a token
	h.tr.Gate.Now, h.tr.Gate.Sleep = h.clock.Now, h.clock.Sleep
	resp, err := send(t, h.tr, post(t, p.srv.URL), Protected)
	readFinal(t, resp, err, 200, 2)
	infos := h.Infos()
	if len(infos) != 2 {
		t.Fatalf("%d infos, want 2", len(infos))
	}
	first, second := infos[0], infos[1]
	first.Duration, second.Duration = 0, 0 // real time, not asserted
	wantFirst := AttemptInfo{Method: "POST", Path: "/v1/payout", Mode: Protected, Attempt: 1, Status: 503, Reason: ReasonStatus, Wait: 50 * ms}
	// The backoff took 50 ms of the 500 ms the token needs.
	wantSecond := AttemptInfo{Method: "POST", Path: "/v1/payout", Mode: Protected, Attempt: 2, GateWait: 450 * ms, Status: 200, Last: true}
	if first != wantFirst {
		t.Errorf("first info %+v, want %+v", first, wantFirst)
	}
	if second != wantSecond {
		t.Errorf("second info %+v, want %+v", second, wantSecond)
	}
}

func TestTransportDefaults(t *testing.T) {
	p := newProvider(t)
	tr := &Transport{} // Next nil = OneShot over http.DefaultTransport; real clock; mode Once
	req, _ := http.NewRequest(http.MethodGet, p.srv.URL+"/v1/payout/info", nil)
	req.Header.Set("Idempotency-Key", testKey)
	resp, err := send(t, tr, req, Once)
	readFinal(t, resp, err, 200, 1)
	if n := len(p.Arrivals()); n != 1 {
		t.Errorf("provider saw %d requests, want 1", n)
	}
	if resp.Request != req {
		t.Error("response.Request is not the caller's request")
	}
	if resp.ContentLength != int64(len(`{"id":"op-1","status":"processing"}`)) {
		t.Errorf("ContentLength %d does not match the body in memory", resp.ContentLength)
	}
}

// N concurrent requests queued behind one 429 wait out its Retry-After
// together: the provider sees no request inside the pause. Real clock; the
// assertion compares arrival instants with the recorded pause end, not
// elapsed durations.
func TestConcurrentRequestsWaitOutPause(t *testing.T) {
	p := newProvider(t, respond(429, `{"state":1,"message":"rate limit exceeded"}`, "Retry-After", "1"))
	gate := ratelimit.New(0, 1)
	paused := make(chan struct{})
	var once sync.Once
	pol := testPolicy()
	pol.MaxDelay = 5 * time.Second
	tr := &Transport{
		Next:   &signer{next: OneShot{Next: p.srv.Client().Transport}},
		Policy: pol,
		Gate:   gate,
		OnAttempt: func(i AttemptInfo) {
			if i.Status == http.StatusTooManyRequests {
				once.Do(func() { close(paused) })
			}
		},
	}
	const n = 6
	var wg sync.WaitGroup
	errs := make(chan error, n+1)
	reqs := make([]*http.Request, n+1)
	for i := range reqs {
		reqs[i] = post(t, p.srv.URL)
	}
	send := func(req *http.Request) {
		resp, err := send(t, tr, req, Protected)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != 200 {
				err = errors.New("status " + resp.Status)
			}
		}
		errs <- err
	}
	wg.Go(func() { send(reqs[0]) })
	<-paused
	pauseEnd := gate.PausedUntil()
	for _, req := range reqs[1:] {
		wg.Go(func() { send(req) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	arrivals := p.Arrivals()
	if len(arrivals) != n+2 {
		t.Fatalf("provider saw %d requests, want %d", len(arrivals), n+2)
	}
	for i, a := range arrivals[1:] {
		if a.at.Before(pauseEnd) {
			t.Errorf("request %d arrived %v before the pause ended", i+2, pauseEnd.Sub(a.at))
		}
	}
}

// Shutdown (the Gate's Close) ends the wait before the next attempt: after
// Close no attempt leaves the Gate, so a sequence waiting out a provider's
// Retry-After or a backoff ends at once, with what it knows, instead of
// holding its client's answer until the shutdown grace runs out.
func TestTransportWaitEndsAtShutdown(t *testing.T) {
	tests := []struct {
		name        string
		first       step
		wantUnknown bool
	}{
		{"429 Retry-After: nothing done", respond(429, `{"state":1,"message":"rate limit exceeded"}`, "Retry-After", "60"), false},
		{"504: the provider may have acted", respond(504, `{"error":{"code":"gateway_timeout"}}`), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProvider(t, tt.first)
			gate := ratelimit.New(0, 1)
			waiting := make(chan struct{})
			interrupted := false
			pol := testPolicy()
			pol.MaxDelay = time.Minute
			tr := &Transport{
				Next:   &signer{next: OneShot{Next: p.srv.Client().Transport}},
				Policy: pol,
				Gate:   gate,
				// A wait that ends only when its context does; the timer
				// only keeps a regression from hanging the test.
				Sleep: func(ctx context.Context, d time.Duration) error {
					close(waiting)
					select {
					case <-ctx.Done():
						interrupted = true
						return ctx.Err()
					case <-time.After(10 * time.Second):
						return nil
					}
				},
			}
			type result struct {
				rep Report
				err error
			}
			done := make(chan result, 1)
			go func() {
				resp, rep, err := tr.Do(post(t, p.srv.URL), Call{Mode: Protected})
				if resp != nil {
					resp.Body.Close()
				}
				done <- result{rep, err}
			}()
			select {
			case <-waiting:
			case r := <-done:
				t.Fatalf("Do returned before waiting for its next attempt: %v", r.err)
			}
			gate.Close()
			r := <-done
			if !interrupted {
				t.Error("the wait before the next attempt went on after the Gate closed")
			}
			var ex *ExhaustedError
			if !errors.As(r.err, &ex) || !errors.Is(r.err, ratelimit.ErrClosed) || ex.NotSent || ex.Attempts != 1 {
				t.Fatalf("Do = %v, want an *ExhaustedError after 1 sent attempt wrapping ratelimit.ErrClosed", r.err)
			}
			if ex.Unknown != tt.wantUnknown || (r.rep.Disposition == Unknown) != tt.wantUnknown {
				t.Errorf("Unknown = %v, disposition %v; want unknown %v", ex.Unknown, r.rep.Disposition, tt.wantUnknown)
			}
			if n := len(p.Arrivals()); n != 1 {
				t.Errorf("provider saw %d attempts, want 1", n)
			}
		})
	}
}

// An unprotected attempt whose answer's header does not come within the
// attempt timeout is a timeout, as for a protected one: retried as such when
// safe, and the sequence ends with an ExhaustedError saying so (the proxy's
// 504 upstream_unavailable). The attempt's context was once canceled by the
// timer, and the error it left read as the caller having gone away: the app,
// still waiting, was answered 499 client_closed_request.
func TestTransportStreamAttemptTimeout(t *testing.T) {
	for _, mode := range []Mode{Safe, Once} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newProvider(t, hang, hang)
			pol := testPolicy()
			pol.MaxAttempts, pol.AttemptTimeout = 2, 100*ms
			h := newHarness(t, pol)
			req, err := http.NewRequest(http.MethodGet, p.srv.URL+"/v1/payouts", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", testKey)
			resp, _, err := h.tr.Do(req, Call{Mode: mode})
			if resp != nil {
				resp.Body.Close()
				t.Fatalf("got a %d response, want an ExhaustedError", resp.StatusCode)
			}
			want := 2
			if mode == Once {
				want = 1
			}
			var ex *ExhaustedError
			if !errors.As(err, &ex) || ex.Attempts != want || !ex.Timeout {
				t.Fatalf("error %v (%#v), want an ExhaustedError after %d attempts with Timeout", err, ex, want)
			}
			if errors.Is(err, context.Canceled) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v: want context.DeadlineExceeded, not context.Canceled (which reads as the caller gone)", err)
			}
			if mode == Safe {
				if r := h.reasons(); !slices.Equal(r, []Reason{ReasonTimeout, ReasonTimeout}) {
					t.Errorf("reasons %q, want timeout ×2", r)
				}
			}
		})
	}
}
