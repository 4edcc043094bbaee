// Package metrics holds idemproxy's Prometheus collectors. They live on a
// registry of their own, not the client library's global one, so that every
// Metrics starts from zero (tests, several handlers in one process) and
// /metrics shows exactly what idemproxy registered: its own series plus the Go
// runtime and process collectors.
//
// The series are fed by three hooks: [Metrics.Request] from proxy.Options.OnDone
// (one call per client request), [Metrics.Attempt] from
// retry.Transport.OnAttempt (one call per upstream attempt), and the
// [InstrumentedStore] that wraps the record store.
package metrics

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

const namespace = "idemproxy"

// Bucket bounds, in seconds unless stated. The request buckets reach the
// default retry budget (2m); the attempt buckets the default attempt timeout
// (30s); the store buckets start below one fsync.
var (
	requestBuckets  = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
	attemptBuckets  = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	waitBuckets     = []float64{.001, .01, .1, .5, 1, 5, 10, 30, 60}
	storeBuckets    = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}
	attemptsBuckets = []float64{1, 2, 3, 4, 5, 6, 8, 10}
)

// Metrics is idemproxy's set of collectors. Create it with [New]; its methods
// are safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	requests         *prometheus.CounterVec
	requestSeconds   *prometheus.HistogramVec
	requestsInFlight prometheus.Gauge
	overloaded       *prometheus.CounterVec

	attempts       *prometheus.CounterVec
	retries        *prometheus.CounterVec
	attemptsPerReq *prometheus.HistogramVec
	attemptSeconds *prometheus.HistogramVec
	gateWait       prometheus.Histogram
	pauses         *prometheus.CounterVec
	pauseSeconds   prometheus.Counter

	storeSeconds *prometheus.HistogramVec
	storeErrors  *prometheus.CounterVec
	operations   prometheus.Gauge
	stored       prometheus.Counter
	released     prometheus.Counter
	needsReview  prometheus.Counter
	// unknownStale is set when this process parks or resumes an unknown
	// operation, so that the next scrape reads the store again.
	unknownStale atomic.Bool
	probes       *prometheus.CounterVec

	// The children of the vectors every request feeds (see children).
	requestsBy       *children[prometheus.Counter]  // method, outcome
	requestSecondsBy *children[prometheus.Observer] // outcome
	attemptsBy       *children[prometheus.Counter]  // mode, result
	attemptSecondsBy *children[prometheus.Observer] // mode
	attemptsPerReqBy *children[prometheus.Observer] // mode
	storeSecondsBy   *children[prometheus.Observer] // op
}

// New creates the collectors and registers them, with the Go runtime and
// process collectors and idemproxy_build_info{version}, on a new registry.
func New(version string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.newRequestMetrics()
	m.newUpstreamMetrics()
	m.newStoreMetrics()
	m.requestsBy = newChildren(m.requests.WithLabelValues, 2)
	m.requestSecondsBy = newChildren(m.requestSeconds.WithLabelValues, 1)
	m.attemptsBy = newChildren(m.attempts.WithLabelValues, 2)
	m.attemptSecondsBy = newChildren(m.attemptSeconds.WithLabelValues, 1)
	m.attemptsPerReqBy = newChildren(m.attemptsPerReq.WithLabelValues, 1)
	m.storeSecondsBy = newChildren(m.storeSeconds.WithLabelValues, 1)
	m.initCounters()
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help:        "Always 1; the labels say which build runs.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	info.Set(1)
	m.reg.MustRegister(info,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *Metrics) newRequestMetrics() {
	m.requests = m.counterVec("requests_total",
		"Client requests answered, by method (GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, other) and outcome (forwarded, replayed, conflict, in_progress, rejected, upstream_unavailable, store_unavailable, client_gone, overloaded).",
		"method", "outcome")
	m.requestSeconds = m.histogramVec("request_duration_seconds",
		"End-to-end time from receiving a client request to its answer, by outcome.",
		requestBuckets, "outcome")
	m.requestsInFlight = m.gauge("requests_in_flight", "Client requests being served now.")
	m.overloaded = m.counterVec("overload_refusals_total",
		"Requests refused 503 overloaded, nothing sent, by the bound that refused them (requests: IDEMPROXY_MAX_INFLIGHT, bytes: IDEMPROXY_MAX_INFLIGHT_BYTES).",
		"limit")
}

func (m *Metrics) newUpstreamMetrics() {
	m.attempts = m.counterVec("upstream_attempts_total",
		"Upstream attempts sent, by mode (protected, safe, once) and result (2xx..5xx, or error when no response came).",
		"mode", "result")
	m.retries = m.counterVec("upstream_retries_total",
		"Upstream attempts followed by another attempt, by reason (not_sent, timeout, network, status, code; refused: the provider refused the attempt before acting on it, such as 409 nonce_reused).",
		"reason")
	m.attemptsPerReq = m.histogramVec("upstream_attempts_per_request",
		"Attempts an upstream attempt sequence made before its result was final or it gave up, by mode.",
		attemptsBuckets, "mode")
	m.attemptSeconds = m.histogramVec("upstream_attempt_duration_seconds",
		"Time of one upstream attempt, from sending to the end of the response body, by mode.",
		attemptBuckets, "mode")
	m.gateWait = m.histogram("ratelimit_wait_seconds",
		"Time an attempt waited at the outbound rate limit and Retry-After pause before leaving.",
		waitBuckets)
	m.pauses = m.counterVec("retry_after_pauses_total",
		"429/503 responses whose Retry-After paused all outbound attempts, by status.",
		"status")
	m.pauseSeconds = m.counter("retry_after_pause_seconds_total",
		"Sum of the provider-wide pauses set by Retry-After (overlapping pauses are each counted).")
}

func (m *Metrics) newStoreMetrics() {
	m.storeSeconds = m.histogramVec("store_operation_duration_seconds",
		"Time of record store operations (begin, complete, abandon, get, renew, park, ping; the operators' list, supersede, resolve, reviewed, discard), fsync included.",
		storeBuckets, "op")
	m.storeErrors = m.counterVec("store_errors_total",
		"Record store operations that failed, by op and kind (not_owner, no_space, too_large, closed, unavailable: the store unreachable or not answering in time, a timeout included; canceled: the caller went away; other).",
		"op", "kind")
	m.operations = m.gauge("operations_in_flight",
		"Protected upstream operations holding an in-flight record: claimed and not yet stored or released.")
	m.stored = m.counter("records_stored_total", "Final responses stored for replay.")
	m.released = m.counter("inflight_released_total",
		"In-flight records left by a process that ended mid-operation (a crash): found at start on Badger (released as unknown, or, when they cannot be, kept in flight and counted again by each start that finds them: a disk below the free-space reserve, a value that cannot be read) or, on PostgreSQL, parked as unknown by a sweep once their lease is a minute over.")
	m.needsReview = m.counter("records_needs_review_total",
		"Final answers stored whose operation status is needs_review: never retried, for a person to resolve.")
	m.probes = m.counterVec("status_probes_total",
		"Status probes sent before re-sending an operation whose outcome is unknown, by result (found, not_found, other, unfilled).",
		"result")
}

// The label values of the counters the README's alerts watch, each exported
// at 0 from the start (initCounters).
var (
	requestMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions, "other"} // methodLabel's values
	requestOutcomes = []proxy.Outcome{proxy.OutcomeForwarded, proxy.OutcomeReplayed, proxy.OutcomeConflict,
		proxy.OutcomeInProgress, proxy.OutcomeRejected, proxy.OutcomeUnavailable, proxy.OutcomeStoreError,
		proxy.OutcomeClientGone, proxy.OutcomeOverloaded}
	retryReasons = []retry.Reason{retry.ReasonNotSent, retry.ReasonTimeout, retry.ReasonNetwork,
		retry.ReasonStatus, retry.ReasonCode, retry.ReasonRefused}
	probeResults = []retry.ProbeResult{retry.ProbeFound, retry.ProbeNotFound, retry.ProbeOther, retry.ProbeUnfilled}
	// storeOps are the operations InstrumentedStore times and counts.
	storeOps = []string{"begin", "complete", "abandon", "get", "renew", "park", "ping",
		"list", "supersede", "resolve", "reviewed", "discard"}
)

// initCounters exports every series of the labelled counters the README's
// alerts watch at 0 from the start. A series made only by its first event
// appears at 1, and Prometheus's increase() and rate() see no increase in a
// series' first sample: `increase(idemproxy_retry_after_pauses_total[15m]) >
// 0` stayed silent on a provider's first pause, and a first store error, a
// first overload or a first client that left went unalerted the same way.
func (m *Metrics) initCounters() {
	for _, method := range requestMethods {
		for _, outcome := range requestOutcomes {
			m.requests.WithLabelValues(method, string(outcome))
		}
	}
	for _, limit := range []string{proxy.LimitRequests, proxy.LimitBytes} {
		m.overloaded.WithLabelValues(limit)
	}
	for _, reason := range retryReasons {
		m.retries.WithLabelValues(string(reason))
	}
	for _, status := range []string{"429", "503"} { // the statuses whose Retry-After pauses
		m.pauses.WithLabelValues(status)
	}
	for _, result := range probeResults {
		m.probes.WithLabelValues(string(result))
	}
	for _, op := range storeOps {
		for _, kind := range storeErrorKinds {
			m.storeErrors.WithLabelValues(op, kind)
		}
	}
}

// unknownWait bounds how long a scrape waits for the store's count of
// unknown records (UnknownOperations).
const unknownWait = 2 * time.Second

// UnknownOperations exports idemproxy_operations_unknown and
// idemproxy_unknown_oldest_seconds from scan, which reads the store: how many
// records are in state unknown and when the oldest was first sent. Every
// replica sharing a store reports the same figures. A scan is reused for
// 30 s, or four times as long as the last one took (a Badger store of
// millions of records is walked in tens of seconds), so that scrapes do not
// walk a large store over and over, unless this process parked or resumed
// an unknown operation since. The scan bounds itself (a shared store's call
// timeout): a bound here cut the walk of a large Badger store every time,
// and the gauges then said 0 for ever.
//
// A scrape waits at most unknownWait for a scan, and otherwise reports the
// figures of the last scan that ended; the scan goes on and its figures
// serve the next scrape. Waiting for it whole (once
// per gauge) made a scrape on a hung database take twice the store's call
// timeout, 10 s by default: as long as Prometheus's default scrape timeout,
// so that the scrape failed as a whole, and with it
// idemproxy_store_errors_total{kind="unavailable"}, the very series that
// says the database hangs.
func (m *Metrics) UnknownOperations(scan func(ctx context.Context) (n int, oldest time.Time, err error), now func() time.Time) {
	var mu sync.Mutex
	var at, oldest time.Time
	var n int
	var took time.Duration    // how long the last scan that ended took
	var running chan struct{} // closed when the scan under way ends; nil when none is
	var until time.Time       // how long scrapes wait for it
	read := func() (int, time.Time) {
		mu.Lock()
		if t := now(); running == nil && (at.IsZero() || t.Sub(at) >= max(30*time.Second, 4*took) || m.unknownStale.Swap(false)) {
			done := make(chan struct{})
			running, until = done, time.Now().Add(unknownWait)
			go func() {
				defer close(done)
				c, o, err := scan(context.Background())
				mu.Lock()
				defer mu.Unlock()
				took = now().Sub(t)
				if err == nil {
					n, oldest, at = c, o, t
				}
				running = nil
			}()
		}
		wait, left := running, time.Until(until)
		mu.Unlock()
		if wait != nil && left > 0 {
			timer := time.NewTimer(left)
			select {
			case <-wait:
			case <-timer.C:
			}
			timer.Stop()
		}
		mu.Lock()
		defer mu.Unlock()
		return n, oldest
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "operations_unknown",
		Help: "Records in state unknown: the provider may have acted and no final answer came; each waits for the app's next request (or a person). Read from the store at most every 30 s, or every four times as long as a read takes on a large store."},
		func() float64 { c, _ := read(); return float64(c) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "unknown_oldest_seconds",
		Help: "Age of the oldest operation in state unknown, from its first send; 0 when there is none."},
		func() float64 {
			c, o := read()
			if c == 0 || o.IsZero() {
				return 0
			}
			return now().Sub(o).Seconds()
		}))
}

// Probe records one status probe; it is retry.Transport.OnProbe.
func (m *Metrics) Probe(p retry.ProbeInfo) {
	m.probes.WithLabelValues(string(p.Result)).Inc()
}

// Handler serves the registry in the Prometheus text format (/metrics).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry returns the registry the collectors are on, for reading them in
// tests or registering more.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Request records one answered client request; it is proxy.Options.OnDone's
// metrics half.
func (m *Metrics) Request(s proxy.Summary) {
	outcome := string(s.Outcome)
	if outcome == "" {
		outcome = "unknown"
	}
	m.requestsBy.get(methodLabel(s.Method), outcome).Inc()
	m.requestSecondsBy.get(outcome, "").Observe(s.Duration.Seconds())
	if s.Outcome == proxy.OutcomeOverloaded {
		m.overloaded.WithLabelValues(s.Limit).Inc()
	}
}

// RequestStarted counts a client request in flight until the returned func is
// called.
func (m *Metrics) RequestStarted() (done func()) {
	m.requestsInFlight.Inc()
	return m.requestsInFlight.Dec
}

// Attempt records one decided upstream attempt; it is
// retry.Transport.OnAttempt.
func (m *Metrics) Attempt(a retry.AttemptInfo) {
	mode := a.Mode.String()
	m.attemptsBy.get(mode, attemptResult(a)).Inc()
	m.attemptSecondsBy.get(mode, "").Observe(a.Duration.Seconds())
	m.gateWait.Observe(a.GateWait.Seconds())
	if a.Reason != retry.ReasonNone && !a.Last {
		m.retries.WithLabelValues(string(a.Reason)).Inc()
	}
	if a.Last {
		m.attemptsPerReqBy.get(mode, "").Observe(float64(a.Attempt))
	}
	if a.Paused > 0 {
		m.pauses.WithLabelValues(strconv.Itoa(a.Status)).Inc()
		m.pauseSeconds.Add(a.Paused.Seconds())
	}
}

// Released records n in-flight records of a dead process found: at start by
// the embedded store (released as unknown, or kept in flight when they
// cannot be rewritten), parked as unknown by a sweep on PostgreSQL.
func (m *Metrics) Released(n int) { m.released.Add(float64(n)) }

// StoreSize exports the store's on-disk size as
// idemproxy_store_size_bytes{part="lsm"|"vlog"}, read at every scrape from
// size (for example (*cache.Store).Size).
func (m *Metrics) StoreSize(size func() (lsm, vlog int64)) {
	for i, part := range []string{"lsm", "vlog"} {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "store_size_bytes",
			Help:        "On-disk size of the record store, as Badger last measured it (about once a minute).",
			ConstLabels: prometheus.Labels{"part": part},
		}, func() float64 {
			lsm, vlog := size()
			return float64([]int64{lsm, vlog}[i])
		}))
	}
}

// StorePageOuts exports passes (for example (*cache.Store).PageOuts) as
// idemproxy_store_pageouts_total, read at every scrape.
func (m *Metrics) StorePageOuts(passes func() uint64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "store_pageouts_total",
		Help: "Times the store handed the resident pages of its table files back to the kernel (docs/design/memory.md)."},
		func() float64 { return float64(passes()) }))
}

// ClientConnections exports the client connection bound: limit, the
// connections open now (open) and those closed while idle to admit a new
// client at the bound (closedIdle, a running total).
func (m *Metrics) ClientConnections(limit int, open, closedIdle func() int64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "client_connections",
		Help: "Client connections open now on the proxy port."}, func() float64 { return float64(open()) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "client_connections_limit",
		Help: "Client connections allowed at once, derived from ulimit -n (see README, Sizing limits)."}, func() float64 { return float64(limit) }))
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "client_connections_closed_idle_total",
		Help: "Idle keep-alive client connections closed at the connection limit to admit a new client."}, func() float64 { return float64(closedIdle()) }))
}

// methodLabel bounds the method label: any other method becomes "other".
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return method
	}
	return "other"
}

// attemptResult is the status class of the attempt's response, or "error"
// when none came.
func attemptResult(a retry.AttemptInfo) string {
	if a.Err != nil || a.Status < 100 {
		return "error"
	}
	if c := a.Status / 100; c < len(statusClasses) {
		return statusClasses[c] // no string built per attempt
	}
	return strconv.Itoa(a.Status/100) + "xx"
}

// statusClasses are the usual results of attemptResult, by status / 100.
var statusClasses = [...]string{1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}

func (m *Metrics) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	m.reg.MustRegister(c)
	return c
}

func (m *Metrics) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	m.reg.MustRegister(c)
	return c
}

func (m *Metrics) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
	m.reg.MustRegister(g)
	return g
}

func (m *Metrics) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets})
	m.reg.MustRegister(h)
	return h
}

func (m *Metrics) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, labels)
	m.reg.MustRegister(h)
	return h
}
