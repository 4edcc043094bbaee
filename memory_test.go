package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var memoryRecords = flag.Int("memory.records", 100_000, "records BenchmarkMemory stores")

// BenchmarkMemory measures the memory of the real binary holding many stored
// records, over loopback with the default store settings. It runs once whatever
// b.N is; run it alone, it takes minutes:
//
//	go test -run '^$' -bench Memory -benchtime 1x -memory.records 100000 .
//
// It reports the resident set after storing (rss-MiB: anonymous + file-backed
// pages; anon-MiB: the part the kernel cannot drop; file-MiB: mapped file
// pages), the peaks while storing (hwm-MiB for the whole resident set;
// peak-rss/anon/file-MiB sampled every 50 ms) and the medians of those samples
// over the last 40% of the fill, the
// Go heap in use and what the Go runtime holds from the OS (go-sys-MiB), the
// store's page-out passes per second of the fill (pageouts/s), then the resident set of a fresh process on the same directory
// after replaying 10,000 of the records. MEMORY_EXTRA_ENV adds variables to the
// binary's environment (e.g. GOMEMLIMIT=64MiB) to compare settings.
func BenchmarkMemory(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		// About the size of a real payment object.
		fmt.Fprintf(w, `{"id":"pay_%s","object":"payment","status":"succeeded","amount":"125.00","currency":"EUR","created":1767225600,"metadata":{"shop":"legacy-app","channel":"web"}}`,
			r.Header.Get("Idempotency-Key"))
	}))
	defer up.Close()
	env := baseEnv(up.URL, b.TempDir(), strings.Fields(os.Getenv("MEMORY_EXTRA_ENV"))...)
	p := launch(b, launchSpec{env: env})
	b.ResetTimer()
	stop := sampleMemory(p)
	start := time.Now()
	post(b, p, *memoryRecords, 32)
	fill := time.Since(start)
	samples := stop()
	b.StopTimer()
	m := memoryOf(b, p)
	for _, k := range []string{"rss", "anon", "file", "hwm"} {
		b.ReportMetric(m[k], k+"-MiB")
	}
	reportSamples(b, samples)
	series := scrape(b, "http://"+p.admin+"/metrics")
	b.ReportMetric(series["go_memstats_heap_inuse_bytes"]/(1<<20), "heap-MiB")
	b.ReportMetric(series["go_memstats_sys_bytes"]/(1<<20), "go-sys-MiB")
	b.ReportMetric(series["idemproxy_records_stored_total"], "records")
	b.ReportMetric(series["idemproxy_store_pageouts_total"]/fill.Seconds(), "pageouts/s")
	if err := p.terminate(b); err != nil {
		b.Fatal(err)
	}

	p2 := launch(b, launchSpec{env: env})
	post(b, p2, min(10_000, *memoryRecords), 32)
	m2 := memoryOf(b, p2)
	b.ReportMetric(m2["rss"], "restart-rss-MiB")
	b.ReportMetric(m2["anon"], "restart-anon-MiB")
	series = scrape(b, "http://"+p2.admin+"/metrics")
	if got := series[`idemproxy_requests_total{method="POST",outcome="replayed"}`]; got != float64(min(10_000, *memoryRecords)) {
		b.Errorf("replays after restart = %v", got)
	}
}

// post sends n distinct protected POSTs (order 0..n-1) from workers clients.
func post(b testing.TB, p *opsProc, n, workers int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				body := fmt.Sprintf(`{"order_id":"order-%08d","amount":"125.00","currency":"EUR"}`, i)
				resp, err := client.Post("http://"+p.proxy+"/v1/payments", "application/json", strings.NewReader(body))
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d requests failed", f, n)
	}
}

// sampleMemory samples the process's resident memory (/proc/PID/status) every
// 50 ms until the returned func is called, which returns the samples.
func sampleMemory(p *opsProc) (stop func() []map[string]float64) {
	quit, done := make(chan struct{}), make(chan []map[string]float64)
	go func() {
		var samples []map[string]float64
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if m, err := readMemory(p); err == nil { // it fails once the process exits
				samples = append(samples, m)
			}
			select {
			case <-tick.C:
			case <-quit:
				done <- samples
				return
			}
		}
	}()
	return func() []map[string]float64 { close(quit); return <-done }
}

// reportSamples reports the peak of each of rss, anon and file over samples,
// and their medians over the last 40% (the store at 60% to 100% of its size).
func reportSamples(b *testing.B, samples []map[string]float64) {
	for _, k := range []string{"rss", "anon", "file"} {
		var all []float64
		for _, m := range samples {
			all = append(all, m[k])
		}
		if len(all) == 0 {
			return
		}
		b.ReportMetric(slices.Max(all), "peak-"+k+"-MiB")
		tail := slices.Clone(all[len(all)*6/10:])
		slices.Sort(tail)
		b.ReportMetric(tail[len(tail)/2], "median-"+k+"-MiB")
	}
}

// memoryOf reads the process's memory from /proc, in MiB.
func memoryOf(b testing.TB, p *opsProc) map[string]float64 {
	m, err := readMemory(p)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func readMemory(p *opsProc) (map[string]float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return nil, err
	}
	fields := map[string]string{"VmRSS": "rss", "RssAnon": "anon", "VmHWM": "hwm", "RssFile": "file"}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		name, rest, _ := strings.Cut(line, ":")
		if k, ok := fields[name]; ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			out[k] = kb / 1024
		}
	}
	return out, nil
}

// containerMemory is the container memory limit the README recommends.
const containerMemory = 256 << 20

// TestMemoryUnderOverload runs the real binary as a 256 MiB container would
// (GOMEMLIMIT goMemoryShare of it, as memlimit.go sets from the cgroup limit) and
// sends 400 concurrent orders of about 1 MiB to a provider that holds them:
// the resident set must stay under the container limit, and the orders past
// the in-flight bounds must get 503 overloaded with Retry-After, with nothing
// sent upstream and their keys free for the next try.
func TestMemoryUnderOverload(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 400 MiB over loopback")
	}
	const (
		n        = 400
		bodySize = 1<<20 - 512 // under the default IDEMPROXY_MAX_BODY_BYTES
	)
	up := newGatedUpstream("mem-")
	srv := httptest.NewServer(up)
	defer srv.Close()
	defer up.Release() // before srv.Close, which waits for held requests
	p := launch(t, launchSpec{env: baseEnv(srv.URL, t.TempDir(), "GOMEMLIMIT="+strconv.FormatInt(containerGoLimit(containerMemory), 10))})

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}, Timeout: 2 * time.Minute}
	pad := strings.Repeat("x", bodySize-64)
	order := func(i int) string { return fmt.Sprintf(`{"order_id":"mem-%d","amount":"1.00","note":%q}`, i, pad) }
	// The bodies are made before the clients start, so that the clients
	// send at once rather than after quoting a megabyte each.
	bodies := make([]string, n)
	for i := range n {
		bodies[i] = order(i)
	}
	type answer struct {
		status     int
		code       string
		retryAfter string
	}
	answers := make([]answer, n)
	var answered atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			defer answered.Add(1)
			resp, err := client.Post("http://"+p.proxy+"/v1/payments", "application/json", strings.NewReader(bodies[i]))
			if err != nil {
				answers[i] = answer{code: err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers[i] = answer{resp.StatusCode, fdCode(string(b)), resp.Header.Get("Retry-After")}
		})
	}
	// Every order is either held at the provider or answered: the peak is
	// now, with the most bodies held.
	for answered.Load()+up.held.Load() < n {
		select {
		case <-p.done:
			t.Fatalf("idemproxy exited: %v\n%s", p.err, p.text())
		case <-time.After(20 * time.Millisecond):
		}
	}
	peak := memoryOf(t, p)
	up.Release()
	wg.Wait()

	held := int(up.held.Load())
	var refused []int
	for i, a := range answers {
		switch {
		case a.status == http.StatusCreated:
		case a.status == http.StatusServiceUnavailable && a.code == "overloaded" && a.retryAfter != "":
			refused = append(refused, i)
		default:
			t.Errorf("order %d: %d %q Retry-After %q; want 201, or 503 overloaded with Retry-After", i, a.status, a.code, a.retryAfter)
		}
	}
	t.Logf("peak RSS %.0f MiB (anon %.0f MiB) under a %d MiB container; %d orders held at the provider, %d refused overloaded",
		peak["hwm"], peak["anon"], containerMemory>>20, held, len(refused))
	if peak["hwm"] >= containerMemory>>20 {
		t.Errorf("peak RSS %.0f MiB, over the %d MiB container limit", peak["hwm"], containerMemory>>20)
	}
	if len(refused) == 0 || held == 0 {
		t.Fatalf("%d held, %d refused: the bound was not reached or nothing passed", held, len(refused))
	}
	up.mu.Lock()
	for _, i := range refused {
		if c := up.orders[fmt.Sprintf("mem-%d", i)]; c != 0 {
			t.Errorf("refused order %d reached the provider %d times", i, c)
		}
	}
	up.mu.Unlock()
	// The refused keys are free: their next try executes.
	for _, i := range refused[:min(len(refused), 20)] {
		resp, err := client.Post("http://"+p.proxy+"/v1/payments", "application/json", strings.NewReader(order(i)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("refused order %d, next try: %d, want 201", i, resp.StatusCode)
		}
	}
}
