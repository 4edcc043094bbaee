package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/bench/loadgen"
	"github.com/idemproxy/idemproxy/bench/workload"
)

// memoryResult is the memory run: a fresh idemproxy stores Records
// operations through its HTTP front door (protected POSTs with new keys,
// durable, exactly as E), then sits idle until every record's TTL has passed
// and the store's value-log GC has run at least once.
type memoryResult struct {
	Records       int         `json:"records"`
	Conns         int         `json:"conns"`
	TTL           string      `json:"ttl"`
	FillSeconds   float64     `json:"fill_seconds"`
	FillRPS       float64     `json:"fill_rps"`
	FillOK        int64       `json:"fill_ok"`
	FillFailed    int64       `json:"fill_failed"`
	Samples       []memSample `json:"samples"`
	MaxSampledMiB float64     `json:"max_sampled_rss_mib"`
	// After the fill, before any expiry.
	RSSAfterFillMiB float64  `json:"rss_after_fill_mib"`
	AfterFill       rssSplit `json:"rss_split_after_fill"`
	PeakRSSMiB      float64  `json:"peak_rss_mib"` // VmHWM since start
	DirAfterFill    dirSize  `json:"dir_after_fill"`
	// LiveAfterFill is how many records had not yet reached their TTL when
	// the after-fill figures were taken (all of them unless the fill took
	// longer than the TTL), from the progress samples.
	LiveAfterFill    int64 `json:"live_records_after_fill"`
	ReplaysAfterFill int64 `json:"replays_of_1000_after_fill"`
	// After TTL expiry and a GC tick.
	WaitedSeconds     float64  `json:"waited_seconds"`
	RSSAfterExpiryMiB float64  `json:"rss_after_expiry_mib"`
	AfterExpiry       rssSplit `json:"rss_split_after_expiry"`
	DirAfterExpiry    dirSize  `json:"dir_after_expiry"`
	ReplaysAfterTTL   int64    `json:"replays_of_1000_after_expiry"`
}

// rssSplit is a resident set split into anonymous memory (what an OOM kill
// is about) and file-backed pages (Badger's mapped files; reclaimable).
type rssSplit struct {
	AnonMiB float64 `json:"anon_mib"`
	FileMiB float64 `json:"file_mib"`
}

func splitOf(pids []int) rssSplit {
	return rssSplit{AnonMiB: float64(statusKB(pids, "RssAnon")) / 1024, FileMiB: float64(statusKB(pids, "RssFile")) / 1024}
}

// memSample is the RSS of the idemproxy process during the fill.
type memSample struct {
	Seconds float64 `json:"s"`
	Records int64   `json:"records"`
	RSSMiB  float64 `json:"rss_mib"`
	AnonMiB float64 `json:"anon_mib"`
}

func runMemory(ctx context.Context, o *options, up *proc, rep *report) (*memoryResult, error) {
	ttl := memoryTTL(o, rep)
	res := &memoryResult{Records: o.records, Conns: o.memConns, TTL: ttl.String()}
	dir := filepath.Join(o.out, "data-memory")
	// A short TTL must outlast the in-flight lease (budget + attempt timeout +
	// 10 s); the loopback upstream answers at once, so short retry limits do.
	env := append(slices.Clone(o.idemproxyEnv), "IDEMPROXY_RECORD_TTL="+ttl.String(),
		"IDEMPROXY_RETRY_BUDGET=5s", "IDEMPROXY_ATTEMPT_TIMEOUT=5s")
	p, err := startIdemproxy("idemproxy-memory", o.out, o.idemproxyBin, dir, up.addr, env...)
	if err != nil {
		return nil, err
	}
	defer p.stop(30 * time.Second)
	started := time.Now()
	fmt.Printf("memory: storing %d records (TTL %s, %d connections)\n", o.records, ttl, o.memConns)
	prefix := "m-" + o.runID + "-"
	if err := res.fill(ctx, p, prefix); err != nil {
		return res, err
	}
	fillEnd := time.Now()
	res.LiveAfterFill = res.live(started, fillEnd, ttl)
	res.RSSAfterFillMiB = float64(statusKB(p.pids(), "VmRSS")) / 1024
	res.AfterFill = splitOf(p.pids())
	res.PeakRSSMiB = float64(statusKB(p.pids(), "VmHWM")) / 1024
	res.DirAfterFill = sizeOf(dir)
	fmt.Printf("memory: after fill RSS %.1f MiB (peak %.1f), data dir %s\n", res.RSSAfterFillMiB, res.PeakRSSMiB, res.DirAfterFill)
	if res.ReplaysAfterFill, err = workload.CheckReplays(ctx, p.addr, prefix, o.records); err != nil {
		return res, err
	}
	until := afterExpiryAndGC(started, fillEnd, ttl, o.memGCInterval).Add(o.memSlack)
	fmt.Printf("memory: %d of %d re-sent operations replayed; idle until %s (TTL expiry, then a GC tick)\n",
		res.ReplaysAfterFill, workload.CheckKeys, until.Format(time.TimeOnly))
	if err := sleepOrDone(ctx, time.Until(until)); err != nil {
		return res, err
	}
	res.WaitedSeconds = time.Since(fillEnd).Seconds()
	res.RSSAfterExpiryMiB = float64(statusKB(p.pids(), "VmRSS")) / 1024
	res.AfterExpiry = splitOf(p.pids())
	res.DirAfterExpiry = sizeOf(dir)
	if res.ReplaysAfterTTL, err = workload.CheckReplays(ctx, p.addr, prefix, o.records); err != nil {
		return res, err
	}
	fmt.Printf("memory: after expiry RSS %.1f MiB, data dir %s; %d of %d old operations replayed\n",
		res.RSSAfterExpiryMiB, res.DirAfterExpiry, res.ReplaysAfterTTL, workload.CheckKeys)
	if !o.keepData {
		p.stop(30 * time.Second)
		os.RemoveAll(dir)
	}
	return res, nil
}

// memoryTTL is -mem-ttl, or a TTL longer than the fill is expected to take
// (from E's throughput at the highest concurrency of this run), so every
// record is still live when the fill ends.
func memoryTTL(o *options, rep *report) time.Duration {
	if o.memTTL > 0 {
		return o.memTTL
	}
	rps := 0.0
	top := slices.Max(o.conns)
	var all []float64
	for _, p := range rep.Phases {
		if p.Target == "E" && p.Mode == "closed" && p.Conns == top {
			all = append(all, p.RPS)
		}
	}
	if len(all) > 0 {
		rps = median(all)
	}
	if rps <= 0 {
		rps = 2000 // no E phase in this run: a conservative guess
	}
	fill := time.Duration(float64(o.records) / rps * float64(time.Second))
	// The fill slows down as the store grows (a 1e6-record fill ran at 78%
	// of E's rate on a 2-core machine), so 40% over the estimate, in whole
	// half-minutes: every record is still live at the end of the fill, and
	// if not the report says how many had expired. A longer TTL only makes
	// the idle wait for expiry longer.
	ttl := (fill*7/5 + time.Minute - 1).Truncate(30 * time.Second)
	fmt.Printf("memory: E stored %.0f req/s at %d connections, so the fill should take about %s; TTL %s\n",
		rps, top, fill.Round(time.Second), ttl)
	return ttl
}

// live counts the records written after at-ttl (still live at at): all but
// those stored before the first sample taken at or after that instant.
func (m *memoryResult) live(started, at time.Time, ttl time.Duration) int64 {
	cut := at.Add(-ttl).Sub(started).Seconds()
	if cut <= 0 {
		return m.FillOK
	}
	var expired int64
	for _, s := range m.Samples {
		if s.Seconds <= cut {
			expired = s.Records
		}
	}
	return m.FillOK - expired
}

// fill drives the new-key load until Records responses arrived, sampling the
// process's RSS every 5 s.
func (m *memoryResult) fill(ctx context.Context, p *proc, prefix string) error {
	var n atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				s := memSample{Seconds: time.Since(start).Seconds(), Records: n.Load(),
					RSSMiB: float64(statusKB(p.pids(), "VmRSS")) / 1024, AnonMiB: float64(statusKB(p.pids(), "RssAnon")) / 1024}
				m.Samples = append(m.Samples, s)
				m.MaxSampledMiB = max(m.MaxSampledMiB, s.RSSMiB)
				if len(m.Samples)%6 == 0 {
					fmt.Printf("memory: %6.0fs %8d records, RSS %.1f MiB (anon %.1f)\n", s.Seconds, s.Records, s.RSSMiB, s.AnonMiB)
				}
			}
		}
	}()
	res, err := loadgen.Run(ctx, loadgen.Config{
		Addr: p.addr, Conns: m.Conns, Total: int64(m.Records),
		Build: buildNewPost(prefix), Responses: &n,
	})
	close(stop)
	<-done
	if err != nil {
		return err
	}
	m.FillSeconds, m.FillRPS, m.FillOK, m.FillFailed = res.Elapsed.Seconds(), res.RPS(), res.OK, res.Failed()
	if res.Replayed != 0 {
		return fmt.Errorf("memory fill: %d responses were replays, want none", res.Replayed)
	}
	return nil
}

// afterExpiryAndGC is the first GC tick (every gcEvery since the process
// started) at or after every record written by fillEnd has expired.
func afterExpiryAndGC(started, fillEnd time.Time, ttl, gcEvery time.Duration) time.Time {
	// Badger keeps expiry in whole seconds: allow one more.
	expired := fillEnd.Add(ttl + time.Second)
	if gcEvery <= 0 {
		return expired
	}
	ticks := (expired.Sub(started) + gcEvery - 1) / gcEvery
	return started.Add(ticks * gcEvery)
}
