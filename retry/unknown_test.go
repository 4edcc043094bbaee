package retry

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/probe"
)

// probes records what Transport.OnProbe reported.
type probes struct {
	mu  sync.Mutex
	got []ProbeResult
}

func (p *probes) record(i ProbeInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, i.Result)
}

func (p *probes) results() []ProbeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

// withProbe gives h's Transport the status probe tmpl against p, through
// the real template package, and returns the recorder of its results.
func withProbe(t *testing.T, h *harness, p *provider, tmpl string) *probes {
	t.Helper()
	pt, err := probe.Parse(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	base, err := url.Parse(p.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	rec := &probes{}
	h.tr.Prober = &probe.Lookup{Template: pt, Base: base, NotFoundCodes: []string{"payout.not_found"}}
	h.tr.OnProbe = rec.record
	return rec
}

// requestLines returns "METHOD /path" of every arrival.
func requestLines(p *provider) []string {
	var out []string
	for _, a := range p.Arrivals() {
		out = append(out, a.method+" "+a.path)
	}
	return out
}

const (
	probeGET   = "GET /v1/payout/op-7"
	resendPOST = "POST /v1/payout"
	found      = `{"id":"op-7","status":"succeeded"}`
	// notFoundBody is the payouts provider's answer for an operation it does
	// not have ("404 payout.not_found: not created, may be created").
	notFoundBody = `{"error":{"code":"payout.not_found","message":"no payout"}}`
)

// TestProbeSaysNotExecutedOnlyOnTheProvidersWord: an operation whose outcome
// is unknown, first sent longer than the provider keeps keys ago, is re-sent
// only when the probe's answer is the provider's documented "no such
// operation" (404 payout.not_found). A gateway's or load balancer's 404 (an
// HTML page, a route it does not know), a 404 with another code or none,
// said "did not happen" before: the operation was re-sent under a key the
// provider may have forgotten, a second payout if it had run. And a 2xx is
// the result only when it is about this operation: a gateway's 200 page, or
// another order's object, was stored as its answer, replayed for ever, while
// it may never have run.
func TestProbeSaysNotExecutedOnlyOnTheProvidersWord(t *testing.T) {
	cases := []struct {
		name   string
		answer step
		result ProbeResult
		lines  []string // the provider saw
	}{
		{"404 payout.not_found: re-sent", respond(404, notFoundBody), ProbeNotFound, []string{probeGET, resendPOST}},
		{"404 code payout.not_found at the top: re-sent", respond(404, `{"code":"payout.not_found"}`), ProbeNotFound, []string{probeGET, resendPOST}},
		{"gateway's HTML 404: unknown", htmlAnswer(404, "<html><body><h1>404 Not Found</h1><hr>nginx</body></html>"), ProbeOther, []string{probeGET}},
		{"gateway's plain 404: unknown", htmlAnswer(404, "404 page not found\n"), ProbeOther, []string{probeGET}},
		{"gateway's JSON 404 without a code: unknown", respond(404, `{"message":"no Route matched with those values"}`), ProbeOther, []string{probeGET}},
		{"404 with another code: unknown", respond(404, `{"error":{"code":"merchant.not_found"}}`), ProbeOther, []string{probeGET}},
		{"empty 404: unknown", respond(404, ``), ProbeOther, []string{probeGET}},
		{"200 about the order: found", respond(200, `{"id":"op-7","order_id":"payout-1","amount":"25.00","status":"succeeded"}`), ProbeFound, []string{probeGET}},
		{"200 without the order's members: found", respond(200, found), ProbeFound, []string{probeGET}},
		{"gateway's HTML 200: unknown", htmlAnswer(200, "<html><body>Please sign in</body></html>"), ProbeOther, []string{probeGET}},
		{"empty 200: unknown", respond(200, ``), ProbeOther, []string{probeGET}},
		{"200 for another order: unknown", respond(200, `{"id":"op-9","order_id":"payout-2","amount":"25","status":"succeeded"}`), ProbeOther, []string{probeGET}},
		{"200 for another amount: unknown", respond(200, `{"id":"op-7","order_id":"payout-1","amount":"250","status":"succeeded"}`), ProbeOther, []string{probeGET}},
		{"200 data for another currency: unknown", respond(200, `{"data":{"id":"op-7","currency":"USDC","status":"succeeded"}}`), ProbeOther, []string{probeGET}},
		{"302 to a login page: unknown", respond(302, ``, "Location", "/login"), ProbeOther, []string{probeGET}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, c.answer, process)
			h := newHarness(t, testPolicy())
			h.tr.KeyRetention = 48 * time.Hour
			rec := withProbe(t, h, p, "GET /v1/payout/{resp.id}")
			resume := &Resume{FirstSentAt: h.clock.Now().Add(-49 * time.Hour), LastBody: []byte(`{"id":"op-7"}`)}
			resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected, Resume: resume})
			switch c.result {
			case ProbeOther:
				var ex *ExhaustedError
				if !errors.Is(err, ErrKeyExpired) || !errors.As(err, &ex) || !ex.Unknown || rep.Disposition != Unknown {
					t.Fatalf("Do = %v, %v (disposition %v); want the operation still unknown, refused (ErrKeyExpired)", resp, err, rep.Disposition)
				}
			case ProbeFound:
				body := readFinal(t, resp, err, 200, rep.Attempts)
				if resp.Header.Get(ReconciledHeader) != "true" || rep.Disposition != Final || rep.Attempts != 0 {
					t.Errorf("found: %s reconciled %q disposition %v attempts %d; want the probe's answer, reconciled, final, no attempt",
						body, resp.Header.Get(ReconciledHeader), rep.Disposition, rep.Attempts)
				}
			case ProbeNotFound:
				readFinal(t, resp, err, 200, rep.Attempts)
				if !rep.SentAnew {
					t.Errorf("not found: SentAnew false, want the re-send reported as a first send")
				}
			}
			if got := rec.results(); !slices.Equal(got, []ProbeResult{c.result}) {
				t.Errorf("probe results %v, want [%s]", got, c.result)
			}
			if got := requestLines(p); !slices.Equal(got, c.lines) {
				t.Errorf("provider saw %q, want %q", got, c.lines)
			}
		})
	}
}

// Without IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES a 404 means the operation
// did not happen, as the contract says, and it is re-sent as a first send
// past the key retention too; but a page (a gateway's or load balancer's
// HTML 404 for a route it does not know) is not the provider speaking: the
// operation stays unknown and is refused past the retention.
func TestProbeNotFoundWithoutCodes(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer step
		result ProbeResult
		lines  []string
	}{
		{"JSON 404: re-sent", respond(404, `{"error":{"code":"payment_not_found"}}`), ProbeNotFound, []string{probeGET, resendPOST}},
		{"empty 404: re-sent", respond(404, ``), ProbeNotFound, []string{probeGET, resendPOST}},
		{"gateway's HTML 404: unknown", htmlAnswer(404, "<html><body><h1>404 Not Found</h1><hr>nginx</body></html>"), ProbeOther, []string{probeGET}},
		{"gateway's HTML 404 after white space: unknown", htmlAnswer(404, "\r\n  <!DOCTYPE html><html><title>Not Found</title></html>"), ProbeOther, []string{probeGET}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, c.answer, process)
			h := newHarness(t, testPolicy())
			h.tr.KeyRetention = 48 * time.Hour
			rec := withProbe(t, h, p, "GET /v1/payout/{resp.id}")
			h.tr.Prober.(*probe.Lookup).NotFoundCodes = nil
			resume := &Resume{FirstSentAt: h.clock.Now().Add(-49 * time.Hour), LastBody: []byte(`{"id":"op-7"}`)}
			resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected, Resume: resume})
			if c.result == ProbeNotFound {
				readFinal(t, resp, err, 200, rep.Attempts)
				if !rep.SentAnew {
					t.Errorf("not found: SentAnew false, want the re-send reported as a first send")
				}
			} else {
				var ex *ExhaustedError
				if !errors.Is(err, ErrKeyExpired) || !errors.As(err, &ex) || !ex.Unknown || rep.Disposition != Unknown {
					t.Fatalf("Do = %v, %v (disposition %v); want the operation still unknown, refused (ErrKeyExpired)", resp, err, rep.Disposition)
				}
			}
			if got := rec.results(); !slices.Equal(got, []ProbeResult{c.result}) {
				t.Errorf("probe results %v, want [%s]", got, c.result)
			}
			if got := requestLines(p); !slices.Equal(got, c.lines) {
				t.Errorf("provider saw %q, want %q", got, c.lines)
			}
		})
	}
}

// htmlAnswer answers status with a text/html body, as a gateway does.
func htmlAnswer(status int, body string) step {
	return func(_ *provider, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// TestProbeBeforeResend: a request resuming an operation whose outcome is
// unknown first sends the status probe, filled from the earlier answer: 2xx
// is the result (marked reconciled, nothing re-sent); 404 means it did not
// happen, so it is re-sent with the same key as a first send; any other
// answer, or a probe that cannot be built, re-sends with the same key and
// the outcome stays unknown.
func TestProbeBeforeResend(t *testing.T) {
	earlier := `{"error":{"code":"gateway_timeout"},"id":"op-7"}`
	type want struct {
		status     int // 0: the sequence ends with an *ExhaustedError
		reconciled bool
		unknown    bool // the ExhaustedError's Unknown
		lines      []string
		results    []ProbeResult
	}
	cases := []struct {
		name     string
		lastBody string
		steps    []step
		want     want
	}{
		{"2xx: the probe's answer is the result", earlier,
			[]step{respond(200, found)},
			want{status: 200, reconciled: true, lines: []string{probeGET}, results: []ProbeResult{ProbeFound}}},
		{"404 payout.not_found: re-sent with the same key", earlier,
			[]step{respond(404, notFoundBody), process},
			want{status: 200, lines: []string{probeGET, resendPOST}, results: []ProbeResult{ProbeNotFound}}},
		{"404 payout.not_found then a 503: the operation did not happen, no longer unknown", earlier,
			[]step{respond(404, notFoundBody), respond(503, ``)},
			want{unknown: false, lines: []string{probeGET, resendPOST}, results: []ProbeResult{ProbeNotFound}}},
		{"500: re-sent, outcome still unknown", earlier,
			[]step{respond(500, ``), respond(503, ``)},
			want{unknown: true, lines: []string{probeGET, resendPOST}, results: []ProbeResult{ProbeOther}}},
		{"409 other code: re-sent", earlier,
			[]step{respond(409, `{"error":{"code":"conflict"}}`), process},
			want{status: 200, lines: []string{probeGET, resendPOST}, results: []ProbeResult{ProbeOther}}},
		{"dropped probe: re-sent, outcome still unknown", earlier,
			[]step{resetBeforeProcessing, respond(503, ``)},
			want{unknown: true, lines: []string{probeGET, resendPOST}, results: []ProbeResult{ProbeOther}}},
		{"no earlier answer to fill {resp.id}: re-sent without a probe", "",
			[]step{process},
			want{status: 200, lines: []string{resendPOST}, results: []ProbeResult{ProbeUnfilled}}},
		{"earlier answer without the member: re-sent without a probe", `{"error":{"code":"gateway_timeout"}}`,
			[]step{respond(503, ``)},
			want{unknown: true, lines: []string{resendPOST}, results: []ProbeResult{ProbeUnfilled}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, c.steps...)
			pol := testPolicy()
			pol.MaxAttempts = 1
			h := newHarness(t, pol)
			rec := withProbe(t, h, p, "GET /v1/payout/{resp.id}")
			sent := h.clock.Now().Add(-time.Minute)
			var last []byte
			if c.lastBody != "" {
				last = []byte(c.lastBody)
			}
			resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected, Resume: &Resume{FirstSentAt: sent, LastBody: last}})
			if c.want.status != 0 {
				body := readFinal(t, resp, err, c.want.status, rep.Attempts)
				if got := resp.Header.Get(ReconciledHeader) == "true"; got != c.want.reconciled {
					t.Errorf("%s = %v, want %v", ReconciledHeader, got, c.want.reconciled)
				}
				if c.want.reconciled && string(body) != found {
					t.Errorf("reconciled body %s, want the probe's %s", body, found)
				}
				if rep.Disposition != Final {
					t.Errorf("disposition %v, want final", rep.Disposition)
				}
			} else {
				var ex *ExhaustedError
				if !errors.As(err, &ex) {
					t.Fatalf("Do = %v, %v; want an *ExhaustedError", resp, err)
				}
				// After a 404 the operation did not happen: its first send is
				// the re-send (the fake clock stands still), and the Report
				// says so; else the resumed operation's.
				anew := slices.Contains(c.want.results, ProbeNotFound)
				wantSent := sent
				if anew {
					wantSent = h.clock.Now()
				}
				// After a 404 the answer the probe was filled from is not
				// reported: it names nothing the provider has.
				if anew && (rep.LastBody != nil || ex.LastBody != nil) {
					t.Errorf("last body %q (error's %q) after a 404, want none", rep.LastBody, ex.LastBody)
				}
				if ex.Unknown != c.want.unknown || !ex.FirstSentAt.Equal(wantSent) || !rep.FirstSentAt.Equal(wantSent) || rep.SentAnew != anew {
					t.Errorf("ExhaustedError: Unknown %v, FirstSentAt %v; Report: FirstSentAt %v, SentAnew %v; want %v, %v, %v, %v",
						ex.Unknown, ex.FirstSentAt, rep.FirstSentAt, rep.SentAnew, c.want.unknown, wantSent, wantSent, anew)
				}
			}
			if got := requestLines(p); !slices.Equal(got, c.want.lines) {
				t.Errorf("provider saw %q, want %q", got, c.want.lines)
			}
			for _, a := range p.Arrivals() {
				if a.method == http.MethodPost && (a.key != testKey || string(a.body) != string(testBody)) {
					t.Errorf("re-send with key %q body %s, want the same key and body", a.key, a.body)
				}
				if a.method == http.MethodGet && (a.key != "" || len(a.body) != 0 || a.nonce == "") {
					t.Errorf("probe with key %q body %q nonce %q: want an unkeyed, bodiless, signed lookup", a.key, a.body, a.nonce)
				}
			}
			if got := rec.results(); !slices.Equal(got, c.want.results) {
				t.Errorf("probe results %v, want %v", got, c.want.results)
			}
		})
	}
}

// TestKeyRetentionGuard: an operation whose outcome is unknown, first sent
// longer ago than the provider keeps keys, is never re-sent blindly: without
// a probe, or when the probe says neither "found" nor "not found", nothing
// is sent and the sequence ends with ErrKeyExpired (which the proxy answers
// 409 idempotency_key_expired).
func TestKeyRetentionGuard(t *testing.T) {
	const retention = 48 * time.Hour
	cases := []struct {
		name    string
		age     time.Duration // since the first send
		probe   bool
		steps   []step
		expired bool // ends with ErrKeyExpired
		lines   []string
	}{
		{"expired, no probe: refused, nothing sent", 49 * time.Hour, false, nil, true, nil},
		{"expired, probe fails: refused, only the probe sent", 49 * time.Hour, true,
			[]step{respond(500, ``)}, true, []string{probeGET}},
		{"expired, probe finds it: its answer", 49 * time.Hour, true,
			[]step{respond(200, found)}, false, []string{probeGET}},
		{"expired, probe says it did not happen: re-sent", 49 * time.Hour, true,
			[]step{respond(404, notFoundBody), process}, false, []string{probeGET, resendPOST}},
		// The re-send after the 404 is the first the provider saw, so the
		// retention counts from it: lost too, the operation is re-sent
		// again when the next probe fails, not refused.
		{"expired, probe says it did not happen, its re-send lost: re-sent again", 49 * time.Hour, true,
			[]step{respond(404, notFoundBody), respond(504, `{"id":"op-7"}`), respond(500, ``), process}, false,
			[]string{probeGET, resendPOST, probeGET, resendPOST}},
		{"within retention, no probe: re-sent", 47 * time.Hour, false,
			[]step{process}, false, []string{resendPOST}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, c.steps...)
			h := newHarness(t, testPolicy())
			h.tr.KeyRetention = retention
			if c.probe {
				withProbe(t, h, p, "GET /v1/payout/{resp.id}")
			}
			resume := &Resume{FirstSentAt: h.clock.Now().Add(-c.age), LastBody: []byte(`{"id":"op-7"}`)}
			resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected, Resume: resume})
			if c.expired {
				var ex *ExhaustedError
				if !errors.Is(err, ErrKeyExpired) || !errors.As(err, &ex) || !ex.Unknown || rep.Disposition != Unknown {
					t.Fatalf("Do = %v, %v (disposition %v); want an unknown *ExhaustedError wrapping ErrKeyExpired", resp, err, rep.Disposition)
				}
				if ex.Attempts != 0 || !strings.Contains(err.Error(), "provider keeps keys 48h0m0s") {
					t.Errorf("ExhaustedError %v with %d attempts; want 0 attempts and the retention named", err, ex.Attempts)
				}
			} else {
				readFinal(t, resp, err, 200, rep.Attempts)
			}
			if got := requestLines(p); !slices.Equal(got, c.lines) {
				t.Errorf("provider saw %q, want %q", got, c.lines)
			}
			if p.Executed() > 1 {
				t.Errorf("provider executed %d operations", p.Executed())
			}
		})
	}
}

// TestLastAnswerKeptAcrossDrop: within one sequence, a dropped connection
// after a 504 that named the operation gives no new answer, so the next
// probe is still filled from the 504; and the sequence that gives up reports
// that body, for the record to keep.
func TestLastAnswerKeptAcrossDrop(t *testing.T) {
	named := `{"error":{"code":"gateway_timeout"},"id":"op-7"}`
	t.Run("probe after the drop", func(t *testing.T) {
		p := newProvider(t, respond(504, named), respond(500, ``), resetAfterProcessing, respond(200, found))
		h := newHarness(t, testPolicy())
		rec := withProbe(t, h, p, "GET /v1/payout/{resp.id}")
		resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected})
		body := readFinal(t, resp, err, 200, rep.Attempts)
		if resp.Header.Get(ReconciledHeader) != "true" || string(body) != found || rep.Attempts != 2 {
			t.Errorf("answer %s (reconciled %q) after %d attempts, want the probe's after 2",
				body, resp.Header.Get(ReconciledHeader), rep.Attempts)
		}
		want := []string{resendPOST, probeGET, resendPOST, probeGET}
		if got := requestLines(p); !slices.Equal(got, want) {
			t.Errorf("provider saw %q, want %q", got, want)
		}
		if got := rec.results(); !slices.Equal(got, []ProbeResult{ProbeOther, ProbeFound}) {
			t.Errorf("probe results %v, want [other found]", got)
		}
	})
	t.Run("given up", func(t *testing.T) {
		p := newProvider(t, respond(504, named), resetAfterProcessing)
		pol := testPolicy()
		pol.MaxAttempts = 2
		h := newHarness(t, pol)
		_, _, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected})
		var ex *ExhaustedError
		if !errors.As(err, &ex) || !ex.Unknown || string(ex.LastBody) != named {
			t.Fatalf("Do = %v; want an unknown *ExhaustedError carrying the 504's body %s", err, named)
		}
	})
}

// TestPassedOnAnswerAfterUnknownStaysUnknown: an answer that is passed on
// (401, 403: the provider refused this attempt, on our credentials) says
// nothing of an earlier attempt the provider may have acted on, nor of the
// sequence a resume continues: the Report must keep the outcome Unknown, so
// that the proxy keeps the record unknown (first send, status probe, key
// retention) rather than releasing the key as if nothing had happened.
// Before, such a sequence reported PassOn and its record was deleted.
func TestPassedOnAnswerAfterUnknownStaysUnknown(t *testing.T) {
	unauthorized := respond(401, `{"error":{"code":"invalid_signature"}}`)
	cases := []struct {
		name   string
		resume bool
		steps  []step
		want   Disposition
	}{
		{"504 then 401", false, []step{respond(504, `{"error":{"code":"gateway_timeout"}}`), unauthorized}, Unknown},
		{"resumed, 403", true, []step{respond(403, `{"error":{"code":"forbidden"}}`)}, Unknown},
		{"401 alone", false, []step{unauthorized}, PassOn},
		{"429 then 401", false, []step{respond(429, `{}`, "Retry-After", "1"), unauthorized}, PassOn},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, c.steps...)
			h := newHarness(t, testPolicy())
			call := Call{Mode: Protected}
			if c.resume {
				call.Resume = &Resume{FirstSentAt: h.clock.Now().Add(-time.Minute)}
			}
			resp, rep, err := h.tr.Do(post(t, p.srv.URL), call)
			last := 401
			if c.resume {
				last = 403
			}
			readFinal(t, resp, err, last, len(c.steps))
			if rep.Disposition != c.want {
				t.Errorf("disposition %v, want %v", rep.Disposition, c.want)
			}
			if c.want == Unknown && rep.FirstSentAt.IsZero() {
				t.Error("an unknown outcome without its first send")
			}
		})
	}
}

// TestProbeRetryAfterPausesProvider: a status probe answered 429 (or 503)
// with Retry-After says the provider wants no traffic for that long. Its
// answer is "other", so the operation is re-sent with the same key, but
// only once the pause has passed, and the pause holds the provider's
// other requests too (the Gate), as any attempt's Retry-After does.
func TestProbeRetryAfterPausesProvider(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			p := newProvider(t, respond(status, `{"state":1,"message":"rate limit exceeded"}`, "Retry-After", "7"), process)
			pol := testPolicy()
			pol.MaxAttempts = 1
			h := newHarness(t, pol)
			rec := withProbe(t, h, p, "GET /v1/payout/{resp.id}")
			start := h.clock.Now()
			resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected,
				Resume: &Resume{FirstSentAt: start.Add(-time.Minute), LastBody: []byte(`{"id":"op-7"}`)}})
			readFinal(t, resp, err, 200, rep.Attempts)
			if got := rec.results(); !slices.Equal(got, []ProbeResult{ProbeOther}) {
				t.Errorf("probe results %v, want [other]", got)
			}
			if got := requestLines(p); !slices.Equal(got, []string{probeGET, resendPOST}) {
				t.Errorf("provider saw %q, want %q", got, []string{probeGET, resendPOST})
			}
			if until := h.gate.PausedUntil(); until.Before(start.Add(7 * time.Second)) {
				t.Errorf("provider paused until %v, want at least 7 s after %v (the probe's Retry-After)", until, start)
			}
			if waited := h.clock.Now().Sub(start); waited < 7*time.Second {
				t.Errorf("re-sent %v after the probe's 429 Retry-After: 7, want at least 7 s", waited)
			}
		})
	}
}

// TestProviderCannotMarkReconciled: only the status probe's answer carries
// ReconciledHeader. A provider's (or a gateway's) own answer that comes
// with it has it removed: kept, the app and the operator's view (reconciled)
// would take the operation's own answer for one settled by a probe, and a
// record whose answer could not be stored would drop the last ambiguous
// answer the probe needs.
func TestProviderCannotMarkReconciled(t *testing.T) {
	p := newProvider(t, respond(201, `{"id":"op-7"}`, ReconciledHeader, "true"))
	h := newHarness(t, testPolicy())
	resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected})
	readFinal(t, resp, err, 201, rep.Attempts)
	if got := resp.Header.Values(ReconciledHeader); len(got) != 0 {
		t.Fatalf("the provider's own answer carries %s: %q, want none", ReconciledHeader, got)
	}
}

// TestHeadProbeAnswerLength: a HEAD probe's 2xx answer becomes the result
// with no body, and says so: its Content-Length, that of the body a GET
// would get, is not kept. Kept, the proxy wrote it with the empty body, and
// the app's answer (and every replay of it) ended short of its declared
// length: curl "transfer closed with outstanding read data remaining", a client waiting
// for the rest until its timeout.
func TestHeadProbeAnswerLength(t *testing.T) {
	p := newProvider(t, respond(200, found))
	pol := testPolicy()
	pol.MaxAttempts = 1
	h := newHarness(t, pol)
	rec := withProbe(t, h, p, "HEAD /v1/payout/{resp.id}")
	resume := &Resume{FirstSentAt: h.clock.Now().Add(-time.Minute), LastBody: []byte(`{"error":{"code":"gateway_timeout"},"id":"op-7"}`)}
	resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected, Resume: resume})
	body := readFinal(t, resp, err, 200, rep.Attempts)
	if got := rec.results(); !slices.Equal(got, []ProbeResult{ProbeFound}) {
		t.Fatalf("probe results %v, want found", got)
	}
	if got := requestLines(p); !slices.Equal(got, []string{"HEAD /v1/payout/op-7"}) {
		t.Fatalf("provider saw %v, want the HEAD probe only", got)
	}
	if resp.Header.Get(ReconciledHeader) != "true" || len(body) != 0 {
		t.Fatalf("answer %v %q, want reconciled with no body", resp.Header, body)
	}
	if cl := resp.Header.Get("Content-Length"); cl != "" && cl != "0" {
		t.Fatalf("answer with no body has Content-Length: %s", cl)
	}
}

// TestConflictKeepsTheNamedAnswer: the provider's idempotency_conflict to a
// resend (after a status probe that settled nothing) names nothing of the
// operation, so the sequence reports the earlier answer that did (a 504
// with the operation's id), for the record to keep: the next request's
// probe is filled from it. Before, the conflict's body replaced it, and
// every later probe could not be built ({resp.id} missing) and fell back
// to re-sending.
func TestConflictKeepsTheNamedAnswer(t *testing.T) {
	named := `{"error":{"code":"gateway_timeout"},"id":"op-7"}`
	p := newProvider(t, respond(503, ``), respond(409, `{"error":{"code":"idempotency_conflict"}}`))
	h := newHarness(t, testPolicy())
	rec := withProbe(t, h, p, "GET /v1/payout/{resp.id}")
	resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected,
		Resume: &Resume{FirstSentAt: h.clock.Now().Add(-time.Minute), LastBody: []byte(named)}})
	readFinal(t, resp, err, 409, 1)
	if rep.Disposition != Unknown || string(rep.LastBody) != named {
		t.Errorf("disposition %v, last body %s; want unknown, %s", rep.Disposition, rep.LastBody, named)
	}
	if got, want := requestLines(p), []string{probeGET, resendPOST}; !slices.Equal(got, want) {
		t.Errorf("provider saw %q, want %q", got, want)
	}
	if got := rec.results(); !slices.Equal(got, []ProbeResult{ProbeOther}) {
		t.Errorf("probe results %v, want [other]", got)
	}
}
