package chaos

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
)

// Histogram counts orders (or answers) per value, e.g. tries per order.
type Histogram map[int]int

// Quantile is the smallest value at or below which a share q (0..1] of the
// counts lie; 0 for an empty histogram.
func (h Histogram) Quantile(q float64) int {
	total := 0
	for _, n := range h {
		total += n
	}
	seen := 0
	for _, v := range slices.Sorted(maps.Keys(h)) {
		seen += h[v]
		if float64(seen) >= q*float64(total) {
			return v
		}
	}
	return 0
}

// String lists every value with its count, then p50, p90, p99 and max.
func (h Histogram) String() string {
	if len(h) == 0 {
		return "(none)"
	}
	var b strings.Builder
	for _, v := range slices.Sorted(maps.Keys(h)) {
		fmt.Fprintf(&b, "%d:%d ", v, h[v])
	}
	fmt.Fprintf(&b, "| p50 %d p90 %d p99 %d max %d", h.Quantile(0.5), h.Quantile(0.9), h.Quantile(0.99), h.Quantile(1))
	return b.String()
}

// Report is a finished run: its settings, what happened to the proxy, and
// the verdict.
type Report struct {
	Verdict
	// Provider, Workers and MaxTries are the run's settings.
	Provider          string
	Workers, MaxTries int
	// Kills counts the SIGKILLs the proxy received; Restarts the durations
	// from each kill to the restarted proxy listening again.
	Kills    int
	Restarts []time.Duration
	// Released counts the in-flight records the restarted proxies released:
	// operations a kill cut short, resumed by the client's next request.
	Released int
	// Probes counts the status probes sent (IDEMPROXY_STATUS_PROBE), by
	// result; those "found" are re-sends the probe saved. Empty without one.
	Probes map[string]int
	// StoreRestarts counts the restarts of the shared database.
	StoreRestarts int
	// Duration is the client's time, first request to last answer.
	Duration time.Duration
}

// WriteTo prints the report for people: the must-be-zero counts first, then
// what the run went through.
func (r *Report) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos run: provider %s, %d orders, %d client workers, %d SIGKILLs (restart %s), %s\n",
		r.Provider, r.Orders, r.Workers, r.Kills, restartSummary(r.Restarts), r.Duration.Round(100*time.Millisecond))
	verdict := "PASS"
	if len(r.Failures()) > 0 {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "in-flight operations cut by SIGKILL and released at restart: %d\n", r.Released)
	if len(r.Probes) > 0 {
		fmt.Fprintf(&b, "status probes: %s; re-sends the probe saved: %d\n", countList(r.Probes), r.Probes["found"])
	}
	if r.StoreRestarts > 0 {
		fmt.Fprintf(&b, "restarts of the shared database: %d\n", r.StoreRestarts)
	}
	fmt.Fprintf(&b, "verdict: %s (each count below must be 0)\n", verdict)
	for _, c := range r.mustBeZero() {
		fmt.Fprintf(&b, "  %-46s %d\n", c.name, c.n)
	}
	fmt.Fprintf(&b, "orders: %d succeeded, %d gave up after %d tries; ledger executions %d\n",
		r.Succeeded, r.GaveUp, r.MaxTries, r.Executions)
	fmt.Fprintf(&b, "client requests by outcome: %s\n", countList(r.Requests))
	fmt.Fprintf(&b, "client requests per order:        %s\n", r.ClientTries)
	fmt.Fprintf(&b, "upstream requests per order:      %s\n", r.UpstreamRequests)
	fmt.Fprintf(&b, "Idemproxy-Attempts on 2xx answers: %s\n", r.ProxyAttempts)
	faulted := 0
	for _, n := range r.Faults {
		faulted += n
	}
	fmt.Fprintf(&b, "upstream: %d requests, %d faulted (%s): %s\n", r.UpstreamTotal, faulted,
		percent(faulted, r.UpstreamTotal), faultList(r.Faults))
	fmt.Fprintf(&b, "provider: %d replays of stored operations, %d own-limit 429s, %d requests without order_id\n",
		r.ProviderReplays, r.Throttled, r.Unattributed)
	fmt.Fprintf(&b, "most client requests for one order: %s\n", r.Longest)
	for _, e := range r.Examples {
		fmt.Fprintf(&b, "  violation: %s\n", e)
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

// String is WriteTo into a string.
func (r *Report) String() string {
	var b strings.Builder
	_, _ = r.WriteTo(&b) // a strings.Builder does not fail
	return b.String()
}

func restartSummary(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	return fmt.Sprintf("max %s", slices.Max(d).Round(time.Millisecond))
}

// countList prints a map of counts, largest first.
func countList(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// faultList prints the fault counts in the sandbox's order of kinds.
func faultList(m map[sandbox.FaultKind]int) string {
	kinds := []sandbox.FaultKind{sandbox.FaultDropBefore, sandbox.FaultDropAfter, sandbox.FaultSlow,
		sandbox.FaultTimeout504, sandbox.FaultStatus5xx, sandbox.FaultRateLimited, sandbox.FaultMaintenance}
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func percent(n, of int) string {
	if of == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}
