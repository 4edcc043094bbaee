package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// value reads one series: a counter's or gauge's value, a histogram's sample
// count. It fails the test when the series does not exist.
func value(t *testing.T, m *Metrics, name string, labels ...string) float64 {
	t.Helper()
	v, ok := lookup(t, m, name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// sum reads a histogram's sample sum.
func sum(t *testing.T, m *Metrics, name string, labels ...string) float64 {
	t.Helper()
	mt := find(t, m, name, labels...)
	if mt == nil || mt.Histogram == nil {
		t.Fatalf("no histogram %s%v", name, labels)
	}
	return mt.Histogram.GetSampleSum()
}

func lookup(t *testing.T, m *Metrics, name string, labels ...string) (float64, bool) {
	t.Helper()
	mt := find(t, m, name, labels...)
	switch {
	case mt == nil:
		return 0, false
	case mt.Counter != nil:
		return mt.Counter.GetValue(), true
	case mt.Gauge != nil:
		return mt.Gauge.GetValue(), true
	case mt.Histogram != nil:
		return float64(mt.Histogram.GetSampleCount()), true
	}
	return 0, false
}

// find returns the series of family name whose labels include labels
// (name, value pairs).
func find(t *testing.T, m *Metrics, name string, labels ...string) *dto.Metric {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.Metric {
			if hasLabels(mt, labels) {
				return mt
			}
		}
	}
	return nil
}

func hasLabels(mt *dto.Metric, want []string) bool {
	have := map[string]string{}
	for _, lp := range mt.Label {
		have[lp.GetName()] = lp.GetValue()
	}
	for i := 0; i+1 < len(want); i += 2 {
		if have[want[i]] != want[i+1] {
			return false
		}
	}
	return true
}

func TestRequestCountsByMethodAndOutcome(t *testing.T) {
	m := New("test")
	sums := []proxy.Summary{
		{Method: "POST", Outcome: proxy.OutcomeForwarded, Duration: 100 * time.Millisecond},
		{Method: "POST", Outcome: proxy.OutcomeForwarded, Duration: 300 * time.Millisecond},
		{Method: "POST", Outcome: proxy.OutcomeReplayed, Duration: time.Millisecond},
		{Method: "POST", Outcome: proxy.OutcomeConflict},
		{Method: "GET", Outcome: proxy.OutcomeForwarded},
		{Method: "PROPFIND", Outcome: proxy.OutcomeForwarded},
		{Method: "POST"},
	}
	for _, s := range sums {
		m.Request(s)
	}
	cases := []struct {
		method, outcome string
		want            float64
	}{
		{"POST", "forwarded", 2},
		{"POST", "replayed", 1},
		{"POST", "conflict", 1},
		{"GET", "forwarded", 1},
		{"other", "forwarded", 1},
		{"POST", "unknown", 1},
	}
	for _, c := range cases {
		t.Run(c.method+"/"+c.outcome, func(t *testing.T) {
			if got := value(t, m, "idemproxy_requests_total", "method", c.method, "outcome", c.outcome); got != c.want {
				t.Errorf("requests_total = %v, want %v", got, c.want)
			}
		})
	}
	if got := value(t, m, "idemproxy_request_duration_seconds", "outcome", "forwarded"); got != 4 {
		t.Errorf("forwarded durations observed = %v, want 4", got)
	}
	if got := sum(t, m, "idemproxy_request_duration_seconds", "outcome", "forwarded"); got < 0.399 || got > 0.401 {
		t.Errorf("forwarded duration sum = %v, want 0.4", got)
	}
}

func TestOverloadRefusalsByLimit(t *testing.T) {
	m := New("test")
	m.Request(proxy.Summary{Method: "POST", Outcome: proxy.OutcomeOverloaded, Limit: proxy.LimitRequests})
	m.Request(proxy.Summary{Method: "POST", Outcome: proxy.OutcomeOverloaded, Limit: proxy.LimitBytes})
	m.Request(proxy.Summary{Method: "GET", Outcome: proxy.OutcomeOverloaded, Limit: proxy.LimitRequests})
	m.Request(proxy.Summary{Method: "POST", Outcome: proxy.OutcomeForwarded})
	for limit, want := range map[string]float64{"requests": 2, "bytes": 1} {
		if got := value(t, m, "idemproxy_overload_refusals_total", "limit", limit); got != want {
			t.Errorf("overload_refusals_total{limit=%q} = %v, want %v", limit, got, want)
		}
	}
	if got := value(t, m, "idemproxy_requests_total", "method", "POST", "outcome", "overloaded"); got != 2 {
		t.Errorf("requests_total{POST,overloaded} = %v, want 2", got)
	}
}

func TestRequestsInFlight(t *testing.T) {
	m := New("test")
	done1 := m.RequestStarted()
	done2 := m.RequestStarted()
	if got := value(t, m, "idemproxy_requests_in_flight"); got != 2 {
		t.Fatalf("in flight = %v, want 2", got)
	}
	done1()
	done2()
	if got := value(t, m, "idemproxy_requests_in_flight"); got != 0 {
		t.Errorf("in flight = %v, want 0", got)
	}
}

func TestAttemptSequence(t *testing.T) {
	m := New("test")
	// A protected request: 503, then 429 with Retry-After (a provider-wide pause),
	// then 201 after waiting 2 s at the gate. Then an unprotected POST whose only
	// attempt fails on the network.
	attempts := []retry.AttemptInfo{
		{Mode: retry.Protected, Attempt: 1, Status: 503, Reason: retry.ReasonStatus, Duration: 10 * time.Millisecond},
		{Mode: retry.Protected, Attempt: 2, Status: 429, Reason: retry.ReasonStatus, Paused: 60 * time.Second, Duration: 10 * time.Millisecond},
		{Mode: retry.Protected, Attempt: 3, Status: 201, Last: true, GateWait: 2 * time.Second, Duration: 10 * time.Millisecond},
		{Mode: retry.Once, Attempt: 1, Err: errors.New("read: connection reset"), Last: true},
	}
	for _, a := range attempts {
		m.Attempt(a)
	}
	cases := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"idemproxy_upstream_attempts_total", []string{"mode", "protected", "result", "5xx"}, 1},
		{"idemproxy_upstream_attempts_total", []string{"mode", "protected", "result", "4xx"}, 1},
		{"idemproxy_upstream_attempts_total", []string{"mode", "protected", "result", "2xx"}, 1},
		{"idemproxy_upstream_attempts_total", []string{"mode", "once", "result", "error"}, 1},
		{"idemproxy_upstream_retries_total", []string{"reason", "status"}, 2},
		{"idemproxy_upstream_attempts_per_request", []string{"mode", "protected"}, 1},
		{"idemproxy_upstream_attempts_per_request", []string{"mode", "once"}, 1},
		{"idemproxy_upstream_attempt_duration_seconds", []string{"mode", "protected"}, 3},
		{"idemproxy_ratelimit_wait_seconds", nil, 4},
		{"idemproxy_retry_after_pauses_total", []string{"status", "429"}, 1},
		{"idemproxy_retry_after_pause_seconds_total", nil, 60},
	}
	for _, c := range cases {
		t.Run(c.name+strings.Join(c.labels, ","), func(t *testing.T) {
			if got := value(t, m, c.name, c.labels...); got != c.want {
				t.Errorf("= %v, want %v", got, c.want)
			}
		})
	}
	if got := sum(t, m, "idemproxy_upstream_attempts_per_request", "mode", "protected"); got != 3 {
		t.Errorf("attempts of the protected sequence = %v, want 3", got)
	}
	if got := sum(t, m, "idemproxy_ratelimit_wait_seconds"); got != 2 {
		t.Errorf("gate wait sum = %v, want 2", got)
	}
}

// TestAttemptAllocatesNothing: Attempt runs once per upstream attempt, so
// its labels must not be built per call (the status class was an
// strconv.Itoa and a concatenation, one allocation per attempt).
func TestAttemptAllocatesNothing(t *testing.T) {
	m := New("test")
	a := retry.AttemptInfo{Mode: retry.Protected, Attempt: 1, Status: 201, Last: true, Duration: time.Millisecond}
	m.Attempt(a) // makes the series
	if n := testing.AllocsPerRun(100, func() { m.Attempt(a) }); n != 0 {
		t.Errorf("Attempt: %v allocations per call, want 0", n)
	}
}

func TestAttemptResult(t *testing.T) {
	for status, want := range map[int]string{0: "error", 99: "error", 100: "1xx", 204: "2xx", 302: "3xx", 499: "4xx", 503: "5xx", 599: "5xx", 600: "6xx", 999: "9xx"} {
		if got := attemptResult(retry.AttemptInfo{Status: status}); got != want {
			t.Errorf("attemptResult(status %d) = %q, want %q", status, got, want)
		}
	}
	if got := attemptResult(retry.AttemptInfo{Status: 200, Err: errors.New("cut")}); got != "error" {
		t.Errorf("attemptResult(200 with an error) = %q, want error", got)
	}
}

// stepClock advances by step at every reading.
type stepClock struct {
	t    time.Time
	step time.Duration
}

func (c *stepClock) now() time.Time { c.t = c.t.Add(c.step); return c.t }

func TestInstrumentedStore(t *testing.T) {
	db, err := cache.Open(cache.Options{Dir: t.TempDir(), SyncWrites: true, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	m := New("test")
	clock := &stepClock{t: time.Unix(1_700_000_000, 0), step: time.Millisecond}
	s := m.Store(db)
	s.Now = clock.now
	ctx := context.Background()
	a, b := store.ID{Tenant: "t", Key: "a"}, store.ID{Tenant: "t", Key: "b"}
	fp := []byte("fingerprint")

	steps := []struct {
		name          string
		do            func() error
		inFlight      float64
		stored        float64
		wantErr       bool
		errOp, errKnd string
	}{
		{"begin a", func() error { return created(s.Begin(ctx, a, store.Request{Fingerprint: fp}, "o1", time.Minute)) }, 1, 0, false, "", ""},
		{"begin a again", func() error { return notCreated(s.Begin(ctx, a, store.Request{Fingerprint: fp}, "o2", time.Minute)) }, 1, 0, false, "", ""},
		{"complete a by a stranger", func() error { return s.Complete(ctx, a, "o2", store.Response{Status: 201}, time.Time{}) }, 1, 0, true, "complete", "not_owner"},
		{"complete a", func() error { return s.Complete(ctx, a, "o1", store.Response{Status: 201}, time.Time{}) }, 0, 1, false, "", ""},
		{"get a", func() error { _, err := s.Get(ctx, a); return err }, 0, 1, false, "", ""},
		{"get missing", func() error { _, err := s.Get(ctx, b); return ignore(err, store.ErrNotFound) }, 0, 1, false, "", ""},
		{"begin b", func() error { return created(s.Begin(ctx, b, store.Request{Fingerprint: fp}, "o3", time.Minute)) }, 1, 1, false, "", ""},
		{"abandon b", func() error { return s.Abandon(ctx, b, "o3") }, 0, 1, false, "", ""},
		{"ping", func() error { return s.Ping(ctx) }, 0, 1, false, "", ""},
		{"ping closed", func() error { db.Close(); return s.Ping(ctx) }, 0, 1, true, "ping", "closed"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			err := st.do()
			if (err != nil) != st.wantErr {
				t.Fatalf("err = %v, want error %v", err, st.wantErr)
			}
			if got := value(t, m, "idemproxy_operations_in_flight"); got != st.inFlight {
				t.Errorf("operations in flight = %v, want %v", got, st.inFlight)
			}
			if got := value(t, m, "idemproxy_records_stored_total"); got != st.stored {
				t.Errorf("records stored = %v, want %v", got, st.stored)
			}
			if st.errOp != "" {
				if got := value(t, m, "idemproxy_store_errors_total", "op", st.errOp, "kind", st.errKnd); got != 1 {
					t.Errorf("store_errors_total{%s,%s} = %v, want 1", st.errOp, st.errKnd, got)
				}
			}
		})
	}
	// Every series exists from the start (initCounters): none of op get
	// may have counted.
	for _, kind := range storeErrorKinds {
		if v, _ := lookup(t, m, "idemproxy_store_errors_total", "op", "get", "kind", kind); v != 0 {
			t.Errorf("a missing record was counted as a store error (kind %s: %v)", kind, v)
		}
	}
	ops := []struct {
		op   string
		want float64
	}{{"begin", 3}, {"complete", 2}, {"abandon", 1}, {"get", 2}, {"ping", 2}}
	for _, o := range ops {
		if got := value(t, m, "idemproxy_store_operation_duration_seconds", "op", o.op); got != o.want {
			t.Errorf("%s timed %v times, want %v", o.op, got, o.want)
		}
		// The step clock is read twice per operation: 1 ms each.
		if got := sum(t, m, "idemproxy_store_operation_duration_seconds", "op", o.op); got < o.want*0.000999 || got > o.want*0.001001 {
			t.Errorf("%s total time %v s, want %v ms", o.op, got, o.want)
		}
	}
}

// A final answer stored through the instrumented store is scanned for
// needs_review once: the store (its expiry) and the metrics both read what
// the caller's WithReview found. The body is written over after the scan,
// which nothing else does, so that a second scan would find otherwise.
func TestInstrumentedStoreReadsTheReviewFound(t *testing.T) {
	db, err := cache.Open(cache.Options{Dir: t.TempDir(), TTL: time.Hour, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := New("test")
	s := m.Store(db)
	ctx := context.Background()
	id := store.ID{Tenant: "t", Key: "review"}
	if err := created(s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o1", time.Minute)); err != nil {
		t.Fatal(err)
	}
	resp := store.Response{Status: 200, Body: []byte(`{"status":"needs_review"}`)}.WithReview()
	copy(resp.Body, `{"status":"xxxxxxxxxxxx"}`)
	if err := s.Complete(ctx, id, "o1", resp, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := value(t, m, "idemproxy_records_needs_review_total"); got != 1 {
		t.Errorf("needs_review answers counted: %v, want 1 (the scan's)", got)
	}
	if rec, err := db.Get(ctx, id); err != nil || !rec.ExpiresAt.IsZero() {
		t.Errorf("record expires at %v (%v): the store did not keep it as the scan found", rec.ExpiresAt, err)
	}
}

func created(_ store.Record, created bool, err error) error {
	if err == nil && !created {
		return errors.New("record not created")
	}
	return err
}

func notCreated(_ store.Record, created bool, err error) error {
	if err == nil && created {
		return errors.New("record created twice")
	}
	return err
}

func ignore(err, want error) error {
	if errors.Is(err, want) {
		return nil
	}
	if err == nil {
		return errors.New("no error")
	}
	return err
}

func TestErrorKind(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{store.ErrNotOwner, "not_owner"},
		{errors.Join(errors.New("cache: complete"), store.ErrNoSpace), "no_space"},
		{store.ErrTooLarge, "too_large"},
		{store.ErrClosed, "closed"},
		{context.DeadlineExceeded, "unavailable"},
		{fmt.Errorf("pgstore: ping: %w", context.DeadlineExceeded), "unavailable"},
		{fmt.Errorf("pgstore: get: %w", context.Canceled), "canceled"},
		{errors.New("disk on fire"), "other"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			if got := errorKind(c.err); got != c.want {
				t.Errorf("errorKind(%v) = %q, want %q", c.err, got, c.want)
			}
		})
	}
}

func TestHandlerServesTextFormat(t *testing.T) {
	m := New("v1.2.3")
	m.Released(3)
	m.StoreSize(func() (int64, int64) { return 1000, 2000 })
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(b)
	for _, want := range []string{
		`idemproxy_build_info{goversion="go`,
		`version="v1.2.3"} 1`,
		"idemproxy_inflight_released_total 3",
		`idemproxy_store_size_bytes{part="lsm"} 1000`,
		`idemproxy_store_size_bytes{part="vlog"} 2000`,
		"go_goroutines ",
		"process_resident_memory_bytes ",
		"idemproxy_operations_in_flight 0",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// A fresh process exports every series of the labelled counters the README's
// alerts watch, at 0: a series made by its first event appears at 1, and
// increase() over it stays 0, so `increase(idemproxy_retry_after_pauses_total[15m])
// > 0` missed a provider's first pause, and the first store error, overload
// or client that left went unalerted the same way.
func TestAlertedCountersStartAtZero(t *testing.T) {
	fams, err := New("t").Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.Metric {
			var labels []string
			for _, lp := range mt.Label {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			series[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = mt.GetCounter().GetValue()
		}
	}
	var want []string
	for _, method := range requestMethods {
		for _, outcome := range requestOutcomes {
			want = append(want, "idemproxy_requests_total{method="+method+",outcome="+string(outcome)+"}")
		}
	}
	for _, op := range storeOps {
		for _, kind := range storeErrorKinds {
			want = append(want, "idemproxy_store_errors_total{kind="+kind+",op="+op+"}")
		}
	}
	want = append(want,
		"idemproxy_overload_refusals_total{limit=requests}", "idemproxy_overload_refusals_total{limit=bytes}",
		"idemproxy_retry_after_pauses_total{status=429}", "idemproxy_retry_after_pauses_total{status=503}",
		"idemproxy_upstream_retries_total{reason=timeout}", "idemproxy_upstream_retries_total{reason=network}",
		"idemproxy_upstream_retries_total{reason=not_sent}", "idemproxy_upstream_retries_total{reason=status}",
		"idemproxy_upstream_retries_total{reason=code}", "idemproxy_upstream_retries_total{reason=refused}",
		"idemproxy_status_probes_total{result=found}", "idemproxy_status_probes_total{result=not_found}",
		"idemproxy_status_probes_total{result=other}", "idemproxy_status_probes_total{result=unfilled}",
		"idemproxy_requests_total{method=POST,outcome=store_unavailable}",
		"idemproxy_requests_total{method=POST,outcome=client_gone}",
		"idemproxy_store_errors_total{kind=no_space,op=begin}",
	)
	for _, w := range want {
		if v, ok := series[w]; !ok || v != 0 {
			t.Errorf("a fresh process does not export %s at 0 (present %v, value %v)", w, ok, v)
		}
	}

	// The label values are every value the code gives: every op
	// InstrumentedStore names, every kind errorKind returns, every method
	// methodLabel keeps.
	src, err := os.ReadFile("store.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`s\.(?:fail|observe)\("([a-z_]+)"`).FindAllStringSubmatch(string(src), -1) {
		if !slices.Contains(storeOps, m[1]) {
			t.Errorf("InstrumentedStore names op %q, which storeOps lacks", m[1])
		}
	}
	for _, k := range errorKinds {
		if !slices.Contains(storeErrorKinds, k.kind) {
			t.Errorf("errorKind returns %q, which storeErrorKinds lacks", k.kind)
		}
	}
	for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND"} {
		if !slices.Contains(requestMethods, methodLabel(method)) {
			t.Errorf("methodLabel(%s) is %q, which requestMethods lacks", method, methodLabel(method))
		}
	}
}
