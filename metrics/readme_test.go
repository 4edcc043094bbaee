package metrics

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/internal/readmetest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// updateREADME rewrites the README's generated metrics table:
//
//	go test ./metrics -run TestREADMEMetrics -update-readme
var updateREADME = flag.Bool("update-readme", false, "rewrite ../README.md's metrics table from the collectors")

const (
	readmePath     = "../README.md"
	metricsBegin   = "<!-- metrics:begin: generated from the collectors; go test ./metrics -run TestREADMEMetrics -update-readme -->"
	metricsEnd     = "<!-- metrics:end -->"
	opsEndMarker   = "<!-- ops:end -->"
	opsBeginMarker = "<!-- ops:begin"
)

// everySeries returns a Metrics on which every idemproxy_ series exists.
func everySeries(t *testing.T) *Metrics {
	t.Helper()
	m := New("readme")
	m.Request(proxy.Summary{Method: "POST", Outcome: proxy.OutcomeForwarded})
	m.Request(proxy.Summary{Method: "POST", Outcome: proxy.OutcomeOverloaded, Limit: proxy.LimitBytes})
	m.RequestStarted()()
	m.Attempt(retry.AttemptInfo{Mode: retry.Protected, Attempt: 1, Status: 429, Reason: retry.ReasonStatus, Paused: time.Second})
	m.Attempt(retry.AttemptInfo{Mode: retry.Protected, Attempt: 2, Status: 201, Last: true})
	m.Released(0)
	m.Probe(retry.ProbeInfo{Result: retry.ProbeFound})
	m.UnknownOperations(func(context.Context) (int, time.Time, error) { return 0, time.Time{}, nil }, time.Now)
	m.StoreSize(func() (int64, int64) { return 0, 0 })
	m.StorePageOuts(func() uint64 { return 0 })
	m.ClientConnections(1, func() int64 { return 0 }, func() int64 { return 0 })
	db, err := cache.Open(cache.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, ctx, id := m.Store(db), context.Background(), store.ID{Tenant: "t", Key: "k"}
	s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "owner", time.Minute)
	s.Complete(ctx, id, "stranger", store.Response{Status: 201}, time.Time{}) // a store error
	return m
}

// metricsTable renders the idemproxy_ families as the README's Markdown table.
func metricsTable(t *testing.T, m *Metrics) string {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("| metric | type | labels | meaning |\n|---|---|---|---|\n")
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), namespace+"_") {
			continue
		}
		var labels []string
		for _, mt := range f.Metric {
			for _, lp := range mt.Label {
				if !slices.Contains(labels, lp.GetName()) {
					labels = append(labels, lp.GetName())
				}
			}
		}
		slices.Sort(labels)
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", f.GetName(), typeName(f.GetType()),
			strings.Join(labels, ", "), strings.ReplaceAll(f.GetHelp(), "|", `\|`))
	}
	return b.String()
}

func typeName(t dto.MetricType) string { return strings.ToLower(t.String()) }

func TestREADMEMetrics(t *testing.T) {
	block := readmetest.Find(t, readmePath, opsBeginMarker, opsEndMarker, metricsBegin, metricsEnd)
	table := block.Text
	want := metricsTable(t, everySeries(t))
	if *updateREADME {
		block.Rewrite(t, want)
		return
	}
	for _, line := range strings.Split(want, "\n")[2:] {
		if line != "" && !strings.Contains(table, line) {
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
			t.Errorf("README's row of %s is missing or differs; want %s", name, line)
		}
	}
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "| `") && !strings.Contains(want, line+"\n") {
			t.Errorf("README lists a series the collectors do not have: %s", line)
		}
	}
	if table != "\n"+want && !t.Failed() {
		t.Error("README's metrics table is not as generated; run: go test ./metrics -run TestREADMEMetrics -update-readme")
	}
}
