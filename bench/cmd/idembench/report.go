package main

import (
	"fmt"
	"slices"
	"strings"
)

// cell is the closed-loop figures of one target, method and concurrency,
// as medians over the rounds (peak RSS: the maximum; failures: the sum).
type cell struct {
	label, method, id       string
	conns, rounds           int
	rps, p50, p99, p999     float64
	cpu, upCPU, genCPU, rss float64
	failed                  int64
	replayed, ok            int64
	mismatch                bool
	rpsAll                  []float64
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cells groups the closed-loop phases in run order.
func cells(phases []*phaseResult) []*cell {
	var order []*cell
	byKey := map[string][]*phaseResult{}
	for _, p := range phases {
		if p.Mode != "closed" {
			continue
		}
		k := fmt.Sprintf("%s|%s|%d", p.Label, p.Method, p.Conns)
		if byKey[k] == nil {
			order = append(order, &cell{label: p.Label, method: p.Method, id: p.Target, conns: p.Conns})
		}
		byKey[k] = append(byKey[k], p)
	}
	for _, c := range order {
		ps := byKey[fmt.Sprintf("%s|%s|%d", c.label, c.method, c.conns)]
		pick := func(f func(*phaseResult) float64) float64 {
			v := make([]float64, len(ps))
			for i, p := range ps {
				v[i] = f(p)
			}
			return median(v)
		}
		c.rounds = len(ps)
		c.rps = pick(func(p *phaseResult) float64 { return p.RPS })
		c.p50 = pick(func(p *phaseResult) float64 { return p.P50ms })
		c.p99 = pick(func(p *phaseResult) float64 { return p.P99ms })
		c.p999 = pick(func(p *phaseResult) float64 { return p.P999ms })
		c.cpu = pick(func(p *phaseResult) float64 { return p.ProxyCPUPer10k })
		c.upCPU = pick(func(p *phaseResult) float64 { return p.UpCPUPer10k })
		c.genCPU = pick(func(p *phaseResult) float64 { return p.GenCPUPer10k })
		for _, p := range ps {
			c.rss = max(c.rss, p.PeakRSSMiB)
			c.failed += p.Failed
			c.replayed += p.Replayed
			c.ok += p.OK
			c.mismatch = c.mismatch || p.ReplayMismatch
			c.rpsAll = append(c.rpsAll, p.RPS)
		}
	}
	return order
}

func find(cs []*cell, id, method string, conns int) *cell {
	for _, c := range cs {
		if c.id == id && c.method == method && c.conns == conns {
			return c
		}
	}
	return nil
}

func renderMarkdown(o *options, rep *report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## idembench run %s\n\n", rep.Started.Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "Machine: %s; after: %s. Took %s.\n\n", rep.Machine, rep.Machine.LoadAfter, rep.Took)
	cs := cells(rep.Phases)
	if len(cs) > 0 {
		renderClosed(&b, o, cs)
		renderRatios(&b, o, cs)
	}
	renderRate(&b, rep.Phases)
	if rep.Prefill != nil {
		fmt.Fprintf(&b, "F prefill: %d operations stored at %.0f req/s (64 connections) before the replays.\n\n", rep.Prefill.OK, rep.Prefill.RPS)
	}
	if rep.EDataDir != nil {
		fmt.Fprintf(&b, "E data directory at the end: %s.\n\n", rep.EDataDir)
	}
	if rep.Memory != nil {
		renderMemory(&b, rep.Memory)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "Note: %s\n\n", n)
	}
	return b.String()
}

func renderClosed(b *strings.Builder, o *options, cs []*cell) {
	fmt.Fprintf(b, "### Closed loop (%s warm-up + %s measured per phase, median of %d rounds)\n\n", o.warmup, o.duration, o.rounds)
	b.WriteString("| target | method | conns | req/s | p50 ms | p99 ms | p99.9 ms | proxy CPU s/10k | upstream CPU s/10k | generator CPU s/10k | proxy peak RSS MiB | failed | replayed |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range cs {
		cpu, rss := fmt.Sprintf("%.2f", c.cpu), fmt.Sprintf("%.0f", c.rss)
		if c.id == "A" {
			cpu, rss = "—", "—"
		}
		rep := fmt.Sprintf("%d", c.replayed)
		if c.mismatch {
			rep += " (MISMATCH)"
		}
		fmt.Fprintf(b, "| %s | %s | %d | %.0f | %.3f | %.3f | %.3f | %s | %.2f | %.2f | %s | %d | %s |\n",
			c.label, c.method, c.conns, c.rps, c.p50, c.p99, c.p999, cpu, c.upCPU, c.genCPU, rss, c.failed, rep)
	}
	b.WriteString("\n")
}

// renderRatios prints the headline: idemproxy's throughput over the plain Go
// proxy's, against the targets.
func renderRatios(b *strings.Builder, o *options, cs []*cell) {
	type ratio struct {
		name, id, method string
		base             string // "" is B
		want             float64
		at               int // 0: every concurrency
		what             string
	}
	rs := []ratio{
		{"D/B", "D", "GET", "", 0.9, 0, "pass-through GET vs plain Go proxy GET"},
		{"F/B", "F", "POST", "", 1.0, 0, "replay vs plain Go proxy POST"},
		{"E/B", "E", "POST", "", 0.5, 64, "new durable key vs plain Go proxy POST"},
		{"P1/B", "P1", "POST", "", 0.5, 64, "new key on PostgreSQL, 1 replica, vs plain Go proxy POST"},
		{"P3/B", "P3", "POST", "", 0.5, 64, "new key on PostgreSQL, 3 replicas, vs plain Go proxy POST"},
		{"B3/B", "B3", "POST", "", 0, 0, "3 plain Go proxies, load spread as for P3, vs one: what 3 processes cost on these cores"},
		{"P3/B3", "P3", "POST", "B3", 0, 0, "new key on PostgreSQL, 3 replicas, vs 3 plain Go proxies, for scale"},
		{"C/B", "C", "POST", "", 0, 0, "nginx vs plain Go proxy (POST), for scale"},
	}
	b.WriteString("### Headline: throughput ratios (req/s over B's, same method, same concurrency)\n\n")
	b.WriteString("| ratio | what |")
	for _, c := range o.conns {
		fmt.Fprintf(b, " conns %d |", c)
	}
	b.WriteString(" target |\n|---|---|")
	for range o.conns {
		b.WriteString("---:|")
	}
	b.WriteString("---|\n")
	for _, r := range rs {
		if r.base == "" {
			r.base = "B"
		}
		ran := func(id string) bool { return slices.ContainsFunc(cs, func(c *cell) bool { return c.id == id }) }
		if len(r.id) > 1 && !ran(r.id) || r.base != "B" && !ran(r.base) {
			continue // P1, P3 and B3 run only when asked for
		}
		fmt.Fprintf(b, "| %s | %s |", r.name, r.what)
		verdict := ""
		for _, n := range o.conns {
			x, base := find(cs, r.id, r.method, n), find(cs, r.base, r.method, n)
			if x == nil || base == nil || base.rps == 0 {
				b.WriteString(" — |")
				continue
			}
			v := x.rps / base.rps
			fmt.Fprintf(b, " %.2f |", v)
			if r.want > 0 && (r.at == 0 || r.at == n) {
				if v >= r.want {
					verdict += fmt.Sprintf(" met at %d;", n)
				} else {
					verdict += fmt.Sprintf(" MISSED at %d;", n)
				}
			}
		}
		switch {
		case r.want > 0 && verdict == "":
			fmt.Fprintf(b, " ≥ %.1f: not measured in this run |\n", r.want)
		case r.want > 0:
			at := "every concurrency"
			if r.at != 0 {
				at = fmt.Sprintf("%d connections", r.at)
			}
			fmt.Fprintf(b, " ≥ %.1f at %s:%s |\n", r.want, at, strings.TrimSuffix(verdict, ";"))
		default:
			b.WriteString(" — |\n")
		}
	}
	b.WriteString("\n")
}

func renderRate(b *strings.Builder, phases []*phaseResult) {
	var rate []*phaseResult
	for _, p := range phases {
		if p.Mode == "rate" {
			rate = append(rate, p)
		}
	}
	if len(rate) == 0 {
		return
	}
	base := map[string]*phaseResult{}
	for _, p := range rate {
		if p.Target == "A" {
			base[p.Method] = p
		}
	}
	fmt.Fprintf(b, "### Fixed rate (%.0f req/s over %d connections; latency from the scheduled send time)\n\n", rate[0].Rate, rate[0].Conns)
	b.WriteString("| target | method | achieved req/s | p50 ms | p99 ms | p99.9 ms | added p50 ms | added p99 ms | added p99.9 ms | proxy CPU s/10k | failed |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range rate {
		added := "— | — | —"
		if a := base[p.Method]; a != nil && p.Target != "A" {
			added = fmt.Sprintf("%+.3f | %+.3f | %+.3f", p.P50ms-a.P50ms, p.P99ms-a.P99ms, p.P999ms-a.P999ms)
		}
		cpu := fmt.Sprintf("%.2f", p.ProxyCPUPer10k)
		if p.Target == "A" {
			cpu = "—"
		}
		fmt.Fprintf(b, "| %s | %s | %.0f | %.3f | %.3f | %.3f | %s | %s | %d |\n",
			p.Label, p.Method, p.RPS, p.P50ms, p.P99ms, p.P999ms, added, cpu, p.Failed)
	}
	b.WriteString("\n")
}

func renderMemory(b *strings.Builder, m *memoryResult) {
	b.WriteString("### Memory run\n\n")
	fmt.Fprintf(b, "%d records stored through idemproxy's front door (protected POSTs with new keys, durable, %d connections) in %.0f s (%.0f req/s, %d failed), IDEMPROXY_RECORD_TTL=%s.\n\n",
		m.FillOK, m.Conns, m.FillSeconds, m.FillRPS, m.FillFailed, m.TTL)
	if m.LiveAfterFill < m.FillOK {
		fmt.Fprintf(b, "The fill took longer than the TTL: about %d records were still live at the after-fill measurement (the rest had expired but were still stored).\n\n", m.LiveAfterFill)
	}
	b.WriteString("| when | idemproxy RSS MiB | anon MiB | file MiB | data dir on disk MiB | apparent MiB | sst MiB | vlog MiB | mem (WAL) MiB | of 1000 old operations, replayed |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	row := func(when string, rss float64, split rssSplit, d dirSize, replays int64) {
		fmt.Fprintf(b, "| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %d |\n", when, rss, split.AnonMiB, split.FileMiB,
			mib(d.Allocated), mib(d.Apparent), mib(d.ByExt[".sst"]), mib(d.ByExt[".vlog"]), mib(d.ByExt[".mem"]), replays)
	}
	row("after the fill", m.RSSAfterFillMiB, m.AfterFill, m.DirAfterFill, m.ReplaysAfterFill)
	row(fmt.Sprintf("%.0f s later: TTL expired, GC ran", m.WaitedSeconds), m.RSSAfterExpiryMiB, m.AfterExpiry, m.DirAfterExpiry, m.ReplaysAfterTTL)
	fmt.Fprintf(b, "\nPeak RSS (VmHWM) over the whole run: %.1f MiB; highest 5-second sample during the fill: %.1f MiB.\n\n", m.PeakRSSMiB, m.MaxSampledMiB)
}
