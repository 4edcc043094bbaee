package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/idemproxy/idemproxy/bench/loadgen"
	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// target is one row of the tables: where the load goes, which process is
// "the proxy" whose CPU and memory are measured (nil for A), and the requests.
type target struct {
	id, label, method string
	addr              string
	proxy             *proc
	build             func([]byte, uint64) []byte
	wantReplays       bool // F: every 2xx must be a replay; others: none may be
	// replicas, for P and B's rows of several processes: every process of
	// the row (proxy is the first); the load is spread over them by
	// connection, and their CPU and, for P, the database's count as the
	// proxy's.
	replicas []*proc
	pg       *pgtest.Cluster
}

// phaseResult is one measured phase.
type phaseResult struct {
	Target   string  `json:"target"`
	Label    string  `json:"label"`
	Method   string  `json:"method"`
	Mode     string  `json:"mode"` // closed or rate
	Conns    int     `json:"conns"`
	Round    int     `json:"round"`
	Rate     float64 `json:"rate,omitempty"`
	Seconds  float64 `json:"seconds"`
	OK       int64   `json:"ok"`
	Failed   int64   `json:"failed"`
	Replayed int64   `json:"replayed"`
	RPS      float64 `json:"rps"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	P999ms   float64 `json:"p999_ms"`
	MaxMs    float64 `json:"max_ms"`
	// CPU seconds spent in the window by the proxy process tree, the
	// upstream and the load generator itself, and per 10k 2xx responses.
	ProxyCPU        float64          `json:"proxy_cpu_s"`
	UpstreamCPU     float64          `json:"upstream_cpu_s"`
	DBCPU           float64          `json:"db_cpu_s,omitempty"` // P: the part of ProxyCPU that is PostgreSQL's
	GenCPU          float64          `json:"generator_cpu_s"`
	ProxyCPUPer10k  float64          `json:"proxy_cpu_s_per_10k"`
	UpCPUPer10k     float64          `json:"upstream_cpu_s_per_10k"`
	DBCPUPer10k     float64          `json:"db_cpu_s_per_10k,omitempty"`
	GenCPUPer10k    float64          `json:"generator_cpu_s_per_10k"`
	PeakRSSMiB      float64          `json:"proxy_peak_rss_mib"`
	PeakIsPhase     bool             `json:"peak_rss_is_per_phase"` // false: since process start
	Statuses        map[int]int64    `json:"statuses"`
	Errors          map[string]int64 `json:"errors,omitempty"`
	ReplayMismatch  bool             `json:"replay_mismatch,omitempty"`
	LoadAvgAtFinish string           `json:"loadavg"`
}

// matrix runs phases against the running targets.
type matrix struct {
	o   *options
	t   *targets
	rep *report
	seq uint64 // next request sequence number; never reused within the run
}

func (m *matrix) newPrefix() string { return "o-" + m.o.runID + "-" }

func (m *matrix) replayPrefix() string { return "r-" + m.o.runID + "-" }

// rows returns the targets of the closed-loop matrix in run order: GETs, then
// POSTs, E last so that its store's background flushes and compactions
// trail into the pause rather than into another target's window.
func (m *matrix) rows() []target {
	t := m.t
	newPost := buildNewPost(m.newPrefix())
	all := []target{
		{id: "A", label: "A direct", method: "GET", addr: t.up.addr, build: buildGet},
		{id: "B", label: "B Go ReverseProxy", method: "GET", addr: t.plain.addr, proxy: t.plain, build: buildGet},
		{id: "C", label: "C nginx", method: "GET", proxy: t.nginx, build: buildGet},
		{id: "D", label: "D idemproxy GET", method: "GET", proxy: t.d, build: buildGet},
		{id: "A", label: "A direct", method: "POST", addr: t.up.addr, build: newPost},
		{id: "B", label: "B Go ReverseProxy", method: "POST", addr: t.plain.addr, proxy: t.plain, build: newPost},
	}
	for _, n := range m.o.pgReplicas {
		if ps := t.plains[n]; len(ps) > 0 {
			all = append(all, target{id: fmt.Sprintf("B%d", n), label: fmt.Sprintf("B Go ReverseProxy, %d processes", n),
				method: "POST", proxy: ps[0], replicas: ps, build: newPost})
		}
	}
	all = append(all, []target{
		{id: "C", label: "C nginx", method: "POST", proxy: t.nginx, build: newPost},
		{id: "F", label: "F idemproxy replay", method: "POST", proxy: t.f, build: buildReplayPost(m.replayPrefix(), uint64(m.o.replayKeys)), wantReplays: true},
		{id: "E", label: "E idemproxy new key", method: "POST", proxy: t.e, build: newPost},
	}...)
	for _, n := range m.o.pgReplicas {
		if ps := t.p[n]; len(ps) > 0 {
			all = append(all, target{id: fmt.Sprintf("P%d", n), label: fmt.Sprintf("P idemproxy PostgreSQL, %d replica(s)", n),
				method: "POST", proxy: ps[0], replicas: ps, pg: t.pg, build: newPost})
		}
	}
	var out []target
	for _, r := range all {
		if !m.o.onlyTargets[r.id[:1]] || (r.id != "A" && r.proxy == nil) {
			continue
		}
		if r.addr == "" {
			r.addr = r.proxy.addr
		}
		m.rep.targetSet[r.id] = true
		out = append(out, r)
	}
	return out
}

// prefill stores F's operations: every one is a new key here, so that the
// F phases afterwards only replay.
func (m *matrix) prefill(ctx context.Context) error {
	n := m.o.replayKeys
	fmt.Printf("F: storing %d operations to replay\n", n)
	res, err := loadgen.Run(ctx, loadgen.Config{
		Addr: m.t.f.addr, Conns: 64, Total: int64(n),
		Build: buildReplayPost(m.replayPrefix(), uint64(n)),
	})
	if err != nil {
		return err
	}
	if res.OK != int64(n) || res.Replayed != 0 {
		return fmt.Errorf("F prefill: %d ok, %d replayed, errors %v, statuses %v; want %d new", res.OK, res.Replayed, res.Errors, res.Statuses, n)
	}
	m.rep.Prefill = &phaseResult{Target: "F", Label: "F prefill", Mode: "total", Conns: 64, OK: res.OK, RPS: res.RPS(), Seconds: res.Elapsed.Seconds()}
	return nil
}

func (m *matrix) closedLoop(ctx context.Context) error {
	rows := m.rows()
	for round := 1; round <= m.o.rounds; round++ {
		for _, c := range m.o.conns {
			for _, t := range rows {
				pr, err := m.phase(ctx, t, c, 0, m.o.duration, round)
				if err != nil {
					return err
				}
				m.rep.Phases = append(m.rep.Phases, pr)
			}
		}
	}
	return nil
}

// fixedRate runs every target at the same request rate, so the latency
// idemproxy adds over A is read at equal load rather than at saturation.
func (m *matrix) fixedRate(ctx context.Context) error {
	for _, t := range m.rows() {
		if t.id == "B" && t.method == "GET" || t.id == "C" && t.method == "GET" {
			continue // the GET comparison that matters is D against A
		}
		pr, err := m.phase(ctx, t, m.o.rateConns, m.o.rate, m.o.rateDuration, 1)
		if err != nil {
			return err
		}
		m.rep.Phases = append(m.rep.Phases, pr)
	}
	return nil
}

// phase runs one load phase against t and samples the processes' CPU at the
// window's edges and their peak RSS over the phase.
func (m *matrix) phase(ctx context.Context, t target, conns int, rate float64, d time.Duration, round int) (*phaseResult, error) {
	if err := sleepOrDone(ctx, m.o.settle); err != nil {
		return nil, err
	}
	mode := "closed"
	if rate > 0 {
		mode = "rate"
	}
	var proxyPids, rssPids []int
	if t.proxy != nil {
		proxyPids = t.proxy.pids()
	}
	var addrs []string
	for i, p := range t.replicas {
		addrs = append(addrs, p.addr)
		if i > 0 {
			proxyPids = append(proxyPids, p.pids()...)
		}
	}
	rssPids = proxyPids
	upPids := m.t.up.pids()
	self := []int{os.Getpid()}
	peakExact := resetPeak(proxyPids)
	var dbPids []int
	var c0, c1 [4]float64
	sample := func() [4]float64 {
		return [4]float64{cpuSeconds(proxyPids), cpuSeconds(upPids), cpuSeconds(self), cpuSeconds(dbPids)}
	}
	res, err := loadgen.Run(ctx, loadgen.Config{
		Addr: t.addr, Addrs: addrs, Conns: conns, Warmup: m.o.warmup, Duration: d, Rate: rate,
		Build: t.build, FirstSeq: m.seq,
		Window: func(open bool) {
			if open {
				if t.pg != nil { // the backends exist by now: the warm-up opened the pools
					dbPids, _ = t.pg.Pids()
					proxyPids = append(slices.Clone(rssPids), dbPids...)
				}
				c0 = sample()
			} else {
				c1 = sample()
			}
		},
	})
	if err != nil {
		return nil, err
	}
	m.seq = res.NextSeq
	pr := &phaseResult{
		Target: t.id, Label: t.label, Method: t.method, Mode: mode, Conns: conns, Round: round, Rate: rate,
		Seconds: res.Elapsed.Seconds(), OK: res.OK, Failed: res.Failed(), Replayed: res.Replayed, RPS: res.RPS(),
		P50ms: ms(res.Percentile(0.5)), P99ms: ms(res.Percentile(0.99)), P999ms: ms(res.Percentile(0.999)),
		MaxMs:       ms(res.Percentile(1)),
		ProxyCPU:    c1[0] - c0[0],
		UpstreamCPU: c1[1] - c0[1],
		GenCPU:      c1[2] - c0[2],
		DBCPU:       c1[3] - c0[3],
		Statuses:    res.Statuses, Errors: res.Errors,
		PeakIsPhase:     peakExact,
		LoadAvgAtFinish: loadAvg(),
	}
	if len(proxyPids) > 0 {
		pr.PeakRSSMiB = float64(statusKB(rssPids, "VmHWM")) / 1024
	}
	if res.OK > 0 {
		per := 10000 / float64(res.OK)
		pr.ProxyCPUPer10k, pr.UpCPUPer10k, pr.GenCPUPer10k = pr.ProxyCPU*per, pr.UpstreamCPU*per, pr.GenCPU*per
		pr.DBCPUPer10k = pr.DBCPU * per
	}
	if t.wantReplays && res.Replayed != res.OK || !t.wantReplays && res.Replayed != 0 {
		pr.ReplayMismatch = true
	}
	db := ""
	if t.pg != nil {
		db = fmt.Sprintf(" (db %.2fs)", pr.DBCPUPer10k)
	}
	fmt.Printf("%-22s %-4s %-6s c=%-3d %9.0f req/s  p50 %7.3f  p99 %7.3f  p99.9 %7.3f ms  cpu/10k %.2fs%s  rss %.0f MiB  failed %d%s\n",
		t.label, t.method, mode, conns, pr.RPS, pr.P50ms, pr.P99ms, pr.P999ms, pr.ProxyCPUPer10k, db, pr.PeakRSSMiB, pr.Failed,
		map[bool]string{true: "  REPLAY MISMATCH", false: ""}[pr.ReplayMismatch])
	return pr, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func sleepOrDone(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
