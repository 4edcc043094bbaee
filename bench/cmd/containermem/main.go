// Command containermem runs the idemproxy image in a memory-limited Docker
// container, with its defaults and no GOMEMLIMIT (idemproxy sets its own soft
// limit from the cgroup's, memlimit.go), stores -records new operations
// through its HTTP port and reports the container's memory while it does:
// the process's resident set split into anonymous and file-backed pages, the
// cgroup's usage and its anon/file split (peaks, medians over the last 40%
// of the fill, end), and whether the kernel OOM-killed it. Everything is on
// loopback (--network host, 127.0.0.1). BENCHMARKS.md, "Reproduce":
//
//	bench/run.sh container-memory
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/bench/loadgen"
	"github.com/idemproxy/idemproxy/bench/workload"
)

type options struct {
	image, memory, upstreamBin, out string
	records, conns                  int
	every, timeout                  time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.image, "image", "idemproxy:bench", "idemproxy image to run")
	flag.StringVar(&o.memory, "memory", "256m", "container memory limit (docker run --memory; swap off)")
	flag.StringVar(&o.upstreamBin, "upstream-bin", "", "bench/cmd/upstream binary (required)")
	flag.StringVar(&o.out, "out", "", "results directory (required): results.json, container.log")
	flag.IntVar(&o.records, "records", 1_000_000, "operations to store")
	flag.IntVar(&o.conns, "conns", 64, "client connections")
	flag.DurationVar(&o.every, "every", 200*time.Millisecond, "sampling period")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Minute, "bound of the whole run")
	flag.Parse()
	if o.upstreamBin == "" || o.out == "" {
		fmt.Fprintln(os.Stderr, "containermem: -upstream-bin and -out are required")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "containermem:", err)
		os.Exit(1)
	}
}

// result is results.json.
type result struct {
	Image, Memory         string
	Records, Conns        int
	FillSeconds, FillRPS  float64
	Failed, Replayed      int64 // of the fill; of the 1,000 re-sent operations after it
	Samples               []sample
	Peak, Median, End     sample
	CgroupPeakMiB         float64 // the cgroup's own high-water mark
	OOMKilled             bool
	RestartCount, OOMKill int // docker's; the cgroup's oom_kill count
	Status                string
	MemoryLimitLog        string // idemproxy's line about the Go soft limit
}

// sample is one reading, in MiB (Records: responses so far).
type sample struct {
	Seconds               float64
	Records               int64
	RSS, Anon, File       float64 // the idemproxy process (/proc/PID/status)
	Usage, CgAnon, CgFile float64 // the cgroup: usage, anon, page cache
	CgMapped, ProcessHWM  float64
}

func run(ctx context.Context, o options) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	upAddr, stopUp, err := startUpstream(o.upstreamBin)
	if err != nil {
		return err
	}
	defer stopUp()
	listen, admin := freeAddr(), freeAddr()
	name := fmt.Sprintf("idemproxy-containermem-%d", time.Now().Unix())
	args := []string{"run", "-d", "--name", name, "--network", "host",
		"--memory", o.memory, "--memory-swap", o.memory, "--restart", "on-failure",
		"--log-opt", "max-size=20m", "--log-opt", "max-file=2",
		"--mount", "type=volume,dst=/data",
		"-e", "IDEMPROXY_UPSTREAM_URL=http://" + upAddr,
		"-e", "IDEMPROXY_LISTEN_ADDR=" + listen, "-e", "IDEMPROXY_ADMIN_ADDR=" + admin,
		o.image}
	if out, err := exec.Command("docker", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("docker run: %v: %s", err, out)
	}
	defer func() {
		logs, _ := exec.Command("docker", "logs", "--tail", "2000", name).CombinedOutput()
		os.WriteFile(filepath.Join(o.out, "container.log"), logs, 0o644)
		exec.Command("docker", "rm", "-f", "-v", name).Run()
	}()
	if err := waitReady(ctx, "http://"+admin+"/readyz"); err != nil {
		return err
	}
	pid, err := strconv.Atoi(inspect(name, "{{.State.Pid}}"))
	if err != nil {
		return fmt.Errorf("container pid: %w", err)
	}
	cg, err := cgroupOf(pid)
	if err != nil {
		return err
	}
	res := &result{Image: o.image, Memory: o.memory, Records: o.records, Conns: o.conns}
	// Read now: the request log rotates the container's log during the fill.
	logs, _ := exec.Command("docker", "logs", name).CombinedOutput()
	for line := range strings.Lines(string(logs)) {
		if strings.Contains(line, "Go memory limit") {
			res.MemoryLimitLog = strings.TrimSpace(line)
			break
		}
	}
	fmt.Printf("containermem: %s (pid %d, cgroup %s), storing %d records over %d connections\n", name, pid, cg.dir, o.records, o.conns)

	var n atomic.Int64
	start := time.Now()
	stop := sampleEvery(o.every, func() sample {
		s := cg.read(pid)
		s.Seconds, s.Records = time.Since(start).Seconds(), n.Load()
		return s
	})
	prefix := fmt.Sprintf("c-%d-", time.Now().UnixNano())
	fill, err := loadgen.Run(ctx, loadgen.Config{Addr: listen, Conns: o.conns, Total: int64(o.records),
		Build: func(dst []byte, seq uint64) []byte { return workload.AppendPost(dst, prefix, seq) }, Responses: &n})
	res.Samples = stop()
	if err != nil {
		return err
	}
	res.FillSeconds, res.FillRPS, res.Failed = fill.Elapsed.Seconds(), fill.RPS(), fill.Failed()
	if res.Replayed, err = workload.CheckReplays(ctx, listen, prefix, o.records); err != nil {
		return err
	}
	res.summarize()
	res.CgroupPeakMiB = cg.peak()
	res.OOMKill = cg.oomKills()
	res.OOMKilled = inspect(name, "{{.State.OOMKilled}}") == "true"
	res.RestartCount, _ = strconv.Atoi(inspect(name, "{{.RestartCount}}"))
	res.Status = inspect(name, "{{.State.Status}}")
	raw, _ := json.MarshalIndent(res, "", " ")
	if err := os.WriteFile(filepath.Join(o.out, "results.json"), raw, 0o644); err != nil {
		return err
	}
	fmt.Print(res.markdown())
	if res.Failed > 0 || res.OOMKilled || res.OOMKill > 0 || res.RestartCount > 0 {
		return errors.New("the container failed requests or was OOM-killed or restarted")
	}
	return nil
}

// summarize sets Peak (of each field), Median (over the last 40% of the
// samples: the store at 60-100% of its size) and End.
func (r *result) summarize() {
	if len(r.Samples) == 0 {
		return
	}
	r.End = r.Samples[len(r.Samples)-1]
	tail := r.Samples[len(r.Samples)*6/10:]
	for _, f := range fields {
		var all, last []float64
		for i := range r.Samples {
			all = append(all, *f.of(&r.Samples[i]))
		}
		for i := range tail {
			last = append(last, *f.of(&tail[i]))
		}
		slices.Sort(last)
		*f.of(&r.Peak) = slices.Max(all)
		*f.of(&r.Median) = last[len(last)/2]
	}
}

var fields = []struct {
	name string
	of   func(*sample) *float64
}{
	{"process RSS", func(s *sample) *float64 { return &s.RSS }},
	{"process anon (RssAnon)", func(s *sample) *float64 { return &s.Anon }},
	{"process file (RssFile)", func(s *sample) *float64 { return &s.File }},
	{"cgroup usage (memory.current / usage_in_bytes)", func(s *sample) *float64 { return &s.Usage }},
	{"cgroup anon (memory.stat anon / rss)", func(s *sample) *float64 { return &s.CgAnon }},
	{"cgroup file (memory.stat file / cache)", func(s *sample) *float64 { return &s.CgFile }},
	{"cgroup file mapped (file_mapped / mapped_file)", func(s *sample) *float64 { return &s.CgMapped }},
}

func (r *result) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d records in %.0f s (%.0f req/s), %d failed; %d of %d re-sent replayed\n\n", r.Records, r.FillSeconds, r.FillRPS, r.Failed, r.Replayed, workload.CheckKeys)
	b.WriteString("| MiB | peak | median (60-100%) | end |\n|---|---:|---:|---:|\n")
	for _, f := range fields {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f |\n", f.name, *f.of(&r.Peak), *f.of(&r.Median), *f.of(&r.End))
	}
	fmt.Fprintf(&b, "\nprocess VmHWM %.0f MiB; cgroup high-water mark %.0f MiB (limit %s)\n", r.End.ProcessHWM, r.CgroupPeakMiB, r.Memory)
	fmt.Fprintf(&b, "OOMKilled %v, cgroup oom_kill %d, restarts %d, status %s\n%s\n", r.OOMKilled, r.OOMKill, r.RestartCount, r.Status, r.MemoryLimitLog)
	return b.String()
}

// sampleEvery calls read every period until the returned func is called,
// which returns the samples.
func sampleEvery(period time.Duration, read func() sample) (stop func() []sample) {
	quit, done := make(chan struct{}), make(chan []sample)
	go func() {
		var all []sample
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			all = append(all, read())
			select {
			case <-t.C:
			case <-quit:
				done <- append(all, read())
				return
			}
		}
	}()
	return func() []sample { close(quit); return <-done }
}

// cgroup is the container's memory cgroup, v1 or v2.
type cgroup struct {
	dir string
	v2  bool
}

// cgroupOf finds pid's memory cgroup from /proc/PID/cgroup.
func cgroupOf(pid int) (cgroup, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return cgroup{}, err
	}
	for line := range strings.Lines(string(raw)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "memory") {
			return cgroup{dir: "/sys/fs/cgroup/memory" + parts[2]}, nil
		}
		if parts[0] == "0" && parts[1] == "" {
			if _, err := os.Stat("/sys/fs/cgroup" + parts[2] + "/memory.current"); err == nil {
				return cgroup{dir: "/sys/fs/cgroup" + parts[2], v2: true}, nil
			}
		}
	}
	return cgroup{}, fmt.Errorf("no memory cgroup for pid %d in %q", pid, raw)
}

func (c cgroup) read(pid int) sample {
	var s sample
	st := keyValues(fmt.Sprintf("/proc/%d/status", pid), ":")
	kib := func(k string) float64 {
		v, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(st[k]), " kB"), 64)
		return v / 1024
	}
	s.RSS, s.Anon, s.File, s.ProcessHWM = kib("VmRSS"), kib("RssAnon"), kib("RssFile"), kib("VmHWM")
	stat := keyValues(filepath.Join(c.dir, "memory.stat"), " ")
	mib := func(k string) float64 { v, _ := strconv.ParseFloat(stat[k], 64); return v / (1 << 20) }
	if c.v2 {
		s.Usage = fileMiB(filepath.Join(c.dir, "memory.current"))
		s.CgAnon, s.CgFile, s.CgMapped = mib("anon"), mib("file"), mib("file_mapped")
	} else {
		s.Usage = fileMiB(filepath.Join(c.dir, "memory.usage_in_bytes"))
		s.CgAnon, s.CgFile, s.CgMapped = mib("rss"), mib("cache"), mib("mapped_file")
	}
	return s
}

// peak is the cgroup's high-water mark of usage (v2: memory.peak, Linux 5.19).
func (c cgroup) peak() float64 {
	if c.v2 {
		return fileMiB(filepath.Join(c.dir, "memory.peak"))
	}
	return fileMiB(filepath.Join(c.dir, "memory.max_usage_in_bytes"))
}

// oomKills is the cgroup's count of OOM kills.
func (c cgroup) oomKills() int {
	file, sep := "memory.oom_control", " "
	if c.v2 {
		file = "memory.events"
	}
	n, _ := strconv.Atoi(keyValues(filepath.Join(c.dir, file), sep)["oom_kill"])
	return n
}

func keyValues(path, sep string) map[string]string {
	m := map[string]string{}
	raw, err := os.ReadFile(path)
	if err != nil {
		return m
	}
	for line := range strings.Lines(string(raw)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), sep); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func fileMiB(path string) float64 {
	raw, _ := os.ReadFile(path)
	v, _ := strconv.ParseFloat(strings.TrimSpace(string(raw)), 64)
	return v / (1 << 20)
}

func inspect(name, format string) string {
	out, _ := exec.Command("docker", "inspect", "-f", format, name).Output()
	return strings.TrimSpace(string(out))
}

// startUpstream runs the benchmark's upstream on loopback and returns its
// address (the first line it prints).
func startUpstream(bin string) (string, func(), error) {
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("upstream: %w", err)
	}
	return strings.TrimSpace(addr), stop, nil
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitReady polls url until it answers 200, for at most a minute.
func waitReady(ctx context.Context, url string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready after a minute", url)
}
