// Command idembench is idemproxy's side-by-side benchmark (BENCHMARKS.md). On
// loopback it starts a minimal upstream and, in front of it, a plain Go
// reverse proxy, nginx (when installed) and the real idemproxy binary, then
// drives every target with the same load generator (bench/loadgen):
//
//	A  direct to the upstream          B  plain httputil.ReverseProxy
//	C  nginx proxy_pass, keep-alive    D  idemproxy, unprotected GET
//	E  idemproxy, protected POST, a new key every request, durable records
//	F  idemproxy, protected POST replays of stored keys
//	P  idemproxy on PostgreSQL, protected POST, a new key every request:
//	   1 replica, and 3 replicas sharing one database (-pg-replicas), on a
//	   throwaway cluster with fsync on (pgstore/pgtest); with B, a row of as
//	   many plain proxies as each P row of several replicas (B3), the load
//	   spread the same way
//
// at fixed concurrency (closed loop) and at a fixed rate, measuring req/s,
// latency percentiles, CPU per 10k requests and peak RSS of the target
// process; and optionally a memory run that stores a million records. Use
// bench/run.sh, which builds the binaries first.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// options are the command-line flags.
type options struct {
	bin, out, nginx       string
	conns                 []int
	warmup, duration      time.Duration
	settle                time.Duration
	rounds                int
	rate                  float64
	rateConns             int
	rateDuration          time.Duration
	replayKeys            int
	throughput            bool
	memory                bool
	records               int
	memConns              int
	memTTL, memGCInterval time.Duration
	memSlack              time.Duration
	keepData              bool
	idemproxyEnv          []string
	targets               string
	onlyTargets           map[string]bool
	runID                 string
	upstreamBin, plainBin string
	idemproxyBin          string
	pgReplicas            []int
	pgConf                []string
	pgCPUs                []int
}

func parseFlags() (*options, error) {
	o := &options{}
	var conns, env, pgReplicas, pgConf, pgCPUs string
	flag.StringVar(&o.bin, "bin", "", "directory holding the built idemproxy, upstream and plainproxy binaries (required)")
	flag.StringVar(&o.out, "out", "", "results directory (required; logs, data directories, results.json, results.md)")
	flag.StringVar(&o.nginx, "nginx", "nginx", "nginx binary; empty or missing skips target C")
	flag.StringVar(&conns, "conns", "16,64", "closed-loop concurrency levels")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "warm-up before each measured window")
	flag.DurationVar(&o.duration, "duration", 6*time.Second, "measured window of each closed-loop phase")
	flag.DurationVar(&o.settle, "settle", time.Second, "pause between phases")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds of the closed-loop matrix; the table shows the median")
	flag.Float64Var(&o.rate, "rate", 1000, "fixed-rate mode: requests per second (0 skips it)")
	flag.IntVar(&o.rateConns, "rate-conns", 16, "fixed-rate mode: connections")
	flag.DurationVar(&o.rateDuration, "rate-duration", 6*time.Second, "fixed-rate mode: measured window")
	flag.IntVar(&o.replayKeys, "replay-keys", 20000, "F: operations stored before the replays")
	flag.BoolVar(&o.throughput, "throughput", true, "run the closed-loop matrix")
	flag.BoolVar(&o.memory, "memory", false, "run the memory run (records stored under load, then TTL expiry)")
	flag.IntVar(&o.records, "records", 1000000, "memory run: records to store")
	flag.IntVar(&o.memConns, "mem-conns", 64, "memory run: connections")
	flag.DurationVar(&o.memTTL, "mem-ttl", 0, "memory run: IDEMPROXY_RECORD_TTL; 0 = the fill time estimated from E at the highest concurrency, plus a margin")
	flag.DurationVar(&o.memGCInterval, "mem-gc-interval", 5*time.Minute, "memory run: the store's value-log GC interval (cache.Options.GCInterval; idemproxy uses the default, 5m)")
	flag.DurationVar(&o.memSlack, "mem-slack", 20*time.Second, "memory run: wait this long past the first GC tick after expiry")
	flag.BoolVar(&o.keepData, "keep-data", false, "keep idemproxy data directories after the run")
	flag.StringVar(&env, "idemproxy-env", "", "extra NAME=value settings for every idemproxy, comma-separated (e.g. IDEMPROXY_SIGN_SECRET=x)")
	flag.StringVar(&o.targets, "targets", "ABCDEF", "targets of the closed-loop and fixed-rate phases (P: PostgreSQL, not in the default)")
	flag.StringVar(&pgReplicas, "pg-replicas", "1,3", "P: replica counts, each a row (all replicas of a row share one database)")
	flag.StringVar(&pgCPUs, "pg-cpus", "", "P: CPUs (comma-separated numbers) the cluster's processes run on, as a database host of its own would; run idembench itself on the others (taskset)")
	flag.StringVar(&pgConf, "pg-conf", "", "P: more postgresql.conf lines for the cluster, comma-separated (e.g. 'commit_delay = 200')")
	flag.Parse()
	if o.bin == "" || o.out == "" {
		return nil, errors.New("-bin and -out are required")
	}
	var err error
	if o.out, err = filepath.Abs(o.out); err != nil {
		return nil, err
	}
	if o.bin, err = filepath.Abs(o.bin); err != nil {
		return nil, err
	}
	for _, c := range strings.Split(conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-conns: bad value %q", c)
		}
		o.conns = append(o.conns, n)
	}
	for _, c := range strings.Split(pgReplicas, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-pg-replicas: bad value %q", c)
		}
		o.pgReplicas = append(o.pgReplicas, n)
	}
	if env != "" {
		o.idemproxyEnv = strings.Split(env, ",")
	}
	for _, c := range strings.Split(pgCPUs, ",") {
		if c == "" {
			continue
		}
		n, err := strconv.Atoi(c)
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "idembench: -pg-cpus: %q is not a CPU number\n", c)
			os.Exit(2)
		}
		o.pgCPUs = append(o.pgCPUs, n)
	}
	if pgConf != "" {
		o.pgConf = strings.Split(pgConf, ",")
	}
	o.onlyTargets = map[string]bool{}
	for _, t := range o.targets {
		o.onlyTargets[string(t)] = true
	}
	o.runID = strconv.FormatInt(time.Now().UnixNano(), 36)
	o.upstreamBin = filepath.Join(o.bin, "upstream")
	o.plainBin = filepath.Join(o.bin, "plainproxy")
	o.idemproxyBin = filepath.Join(o.bin, "idemproxy")
	return o, nil
}

func main() {
	o, err := parseFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		os.Exit(1)
	}
}

// report is everything one run measured; results.json holds it.
type report struct {
	Machine   machine         `json:"machine"`
	Options   map[string]any  `json:"options"`
	Phases    []*phaseResult  `json:"phases"`
	Prefill   *phaseResult    `json:"prefill,omitempty"`
	EDataDir  *dirSize        `json:"e_data_dir,omitempty"`
	Memory    *memoryResult   `json:"memory,omitempty"`
	Started   time.Time       `json:"started"`
	Took      string          `json:"took"`
	Notes     []string        `json:"notes,omitempty"`
	targetSet map[string]bool // targets that ran
}

func run(ctx context.Context, o *options) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	rep := &report{Started: time.Now(), Machine: describeMachine(o), targetSet: map[string]bool{}}
	rep.Options = map[string]any{
		"conns": o.conns, "warmup": o.warmup.String(), "duration": o.duration.String(), "rounds": o.rounds,
		"rate": o.rate, "rate_conns": o.rateConns, "rate_duration": o.rateDuration.String(),
		"replay_keys": o.replayKeys, "records": o.records, "idemproxy_env": o.idemproxyEnv, "pg_replicas": o.pgReplicas, "pg_cpus": o.pgCPUs,
		"pg_conf": append(slices.Clone(pgServer), o.pgConf...),
	}
	fmt.Printf("idembench: results in %s\n%s\n", o.out, rep.Machine)
	up, err := start("upstream", o.out, o.upstreamBin, nil, nil, true)
	if err != nil {
		return err
	}
	defer up.stop(5 * time.Second)
	var runErr error
	if o.throughput || o.rate > 0 {
		runErr = runMatrix(ctx, o, up, rep)
	}
	if runErr == nil && o.memory {
		rep.Memory, runErr = runMemory(ctx, o, up, rep)
	}
	rep.Machine.LoadAfter = loadAvg()
	rep.Took = time.Since(rep.Started).Round(time.Second).String()
	if err := writeReport(o, rep); err != nil {
		return errors.Join(runErr, err)
	}
	return runErr
}

// targets holds the running processes of the closed-loop and rate phases.
type targets struct {
	up, plain, nginx, d, e, f *proc
	pg                        *pgtest.Cluster
	p                         map[int][]*proc // P's replicas, by replica count
	// plains are B's counterpart of P's rows of several replicas: that many
	// plain Go proxies (plain first), the load spread the same way, so
	// that P3's figures can be read next to what three processes of any
	// proxy cost on the same cores (by count, for counts above 1).
	plains map[int][]*proc
}

func (t *targets) stopAll() {
	for _, p := range []*proc{t.plain, t.nginx, t.d, t.e, t.f} {
		p.stop(30 * time.Second)
	}
	for _, ps := range t.p {
		for _, p := range ps {
			p.stop(30 * time.Second)
		}
	}
	for _, ps := range t.plains {
		for _, p := range ps[1:] { // the first is plain, stopped above
			p.stop(30 * time.Second)
		}
	}
	t.p, t.plains = nil, nil
	if t.pg != nil {
		t.pg.Remove()
		t.pg = nil
	}
}

func startTargets(o *options, up *proc, rep *report) (*targets, error) {
	t := &targets{up: up}
	var err error
	if t.plain, err = start("plainproxy", o.out, o.plainBin, []string{"-upstream", "http://" + up.addr}, nil, true); err != nil {
		return t, err
	}
	if o.onlyTargets["P"] && o.onlyTargets["B"] {
		t.plains = map[int][]*proc{}
		for _, n := range o.pgReplicas {
			if n < 2 {
				continue
			}
			t.plains[n] = []*proc{t.plain}
			for i := 1; i < n; i++ {
				p, err := start(fmt.Sprintf("plainproxy-B%d-%d", n, i+1), o.out, o.plainBin, []string{"-upstream", "http://" + up.addr}, nil, true)
				if err != nil {
					return t, err
				}
				t.plains[n] = append(t.plains[n], p)
			}
		}
	}
	if o.onlyTargets["C"] {
		t.nginx, err = startNginx(o.nginx, filepath.Join(o.out, "nginx"), o.out, up.addr)
		if err != nil {
			return t, err
		}
		if t.nginx == nil {
			rep.Notes = append(rep.Notes, "nginx not installed: target C skipped")
		}
	}
	for _, x := range []struct {
		id  string
		dst **proc
	}{{"D", &t.d}, {"E", &t.e}, {"F", &t.f}} {
		if !o.onlyTargets[x.id] {
			continue
		}
		dir := filepath.Join(o.out, "data-"+x.id)
		if *x.dst, err = startIdemproxy("idemproxy-"+x.id, o.out, o.idemproxyBin, dir, up.addr, o.idemproxyEnv...); err != nil {
			return t, err
		}
	}
	if o.onlyTargets["P"] {
		err = startPostgres(o, t)
	}
	return t, err
}

// pgServer is how P's cluster is set up beyond pgtest's defaults: as a
// production server would be, with memory for the WAL and the pages written,
// and no checkpoint forced by the WAL's volume during a run. fsync and
// synchronous_commit stay on: records are durable, as E's are.
var pgServer = []string{
	"shared_buffers = 256MB",
	"wal_buffers = 16MB",
	"max_wal_size = 4GB",
	"checkpoint_timeout = 15min",
}

// startPostgres starts a throwaway PostgreSQL cluster with fsync on (see
// pgServer) and, for each replica count, that many idemproxy processes
// sharing a database of their own.
func startPostgres(o *options, t *targets) error {
	c, err := pgtest.Start(pgtest.Options{Fsync: true, MaxConnections: 100 + 40*sum(o.pgReplicas),
		Settings: append(slices.Clone(pgServer), o.pgConf...)})
	if err != nil {
		return fmt.Errorf("P: PostgreSQL: %w (%s)", err, pgtest.Install)
	}
	t.pg, t.p = c, map[int][]*proc{}
	if len(o.pgCPUs) > 0 {
		// The postmaster's children inherit its CPUs: backends started later
		// run there too.
		if err := pinProcesses(c, o.pgCPUs); err != nil {
			return fmt.Errorf("P: -pg-cpus: %w", err)
		}
	}
	for _, n := range o.pgReplicas {
		url, err := c.NewDatabase(context.Background())
		if err != nil {
			return fmt.Errorf("P: %w", err)
		}
		for i := range n {
			name := fmt.Sprintf("idemproxy-P%d-%d", n, i+1)
			env := append([]string{"IDEMPROXY_STORE_URL=" + url}, o.idemproxyEnv...)
			p, err := startIdemproxy(name, o.out, o.idemproxyBin, filepath.Join(o.out, "data-"+name), t.up.addr, env...)
			if err != nil {
				return err
			}
			t.p[n] = append(t.p[n], p)
		}
	}
	return nil
}

func sum(v []int) (n int) {
	for _, x := range v {
		n += x
	}
	return n
}

// runMatrix runs the closed-loop rounds and the fixed-rate phases.
func runMatrix(ctx context.Context, o *options, up *proc, rep *report) error {
	t, err := startTargets(o, up, rep)
	defer t.stopAll()
	if err != nil {
		return err
	}
	m := &matrix{o: o, t: t, rep: rep}
	if t.f != nil {
		if err := m.prefill(ctx); err != nil {
			return err
		}
	}
	if o.throughput {
		if err := m.closedLoop(ctx); err != nil {
			return err
		}
	}
	if o.rate > 0 {
		if err := m.fixedRate(ctx); err != nil {
			return err
		}
	}
	if t.e != nil {
		ds := sizeOf(filepath.Join(o.out, "data-E"))
		rep.EDataDir = &ds
	}
	if !o.keepData {
		t.stopAll()
		for _, id := range []string{"D", "E", "F"} {
			os.RemoveAll(filepath.Join(o.out, "data-"+id))
		}
	}
	return nil
}

func writeReport(o *options, rep *report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "results.json"), b, 0o644); err != nil {
		return err
	}
	md := renderMarkdown(o, rep)
	fmt.Println()
	fmt.Print(md)
	return os.WriteFile(filepath.Join(o.out, "results.md"), []byte(md), 0o644)
}
