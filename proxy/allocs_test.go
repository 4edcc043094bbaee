package proxy_test

import (
	"encoding/json"
	"flag"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
)

var updateAllocs = flag.Bool("update-allocs", false, "write the measured allocations to testdata/allocs.json")

// allocBudgetFile holds the allocations per request measured when the file
// was last updated, one set with the race detector and one without (it
// changes sync.Pool and so the counts).
const allocBudgetFile = "testdata/allocs.json"

// allocSlack is how far above the committed figure a path may go before the
// test fails; allocFloor how far below before the figure must be lowered, so
// that the committed numbers stay the real ones.
const (
	allocSlack = 1.10
	allocFloor = 0.80
)

// TestAllocationBudget guards the allocations per request of the three paths
// benchmarked against plain proxies (BENCHMARKS.md): D a GET passed through,
// E a protected POST with a new key (durable store), F a replay. After a
// change that moves them on purpose, run
//
//	go test ./proxy/ -run TestAllocationBudget -update-allocs
//
// (and again with -race) and commit testdata/allocs.json.
func TestAllocationBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a few thousand requests")
	}
	up := httptest.NewServer(http.HandlerFunc(benchUpstream))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	var seq atomic.Uint64
	h := idemproxy(t, target, true, nil)
	for i := range 100 { // the operations F replays
		serveOnce(t, h, benchPost(target.Host, "r-"+strconv.Itoa(i)), false)
	}
	paths := []struct {
		name   string
		next   func() *http.Request
		replay bool
	}{
		{"D-get", func() *http.Request { return benchGet(target.Host) }, false},
		{"E-new-durable", func() *http.Request { return benchPost(target.Host, "o-"+strconv.FormatUint(seq.Add(1), 10)) }, false},
		{"F-replay", func() *http.Request { return benchPost(target.Host, "r-"+strconv.FormatUint(seq.Add(1)%100, 10)) }, true},
	}
	got := map[string]int64{}
	for _, p := range paths {
		res := testing.Benchmark(func(b *testing.B) {
			b.ReportAllocs()
			for range 50 { // warm pools and connections
				serveOnce(b, h, p.next(), p.replay)
			}
			b.ResetTimer()
			for b.Loop() {
				serveOnce(b, h, p.next(), p.replay)
			}
		})
		if res.N == 0 {
			t.Fatalf("%s: benchmark did not run", p.name)
		}
		got[p.name] = res.AllocsPerOp()
		t.Logf("%s: %d allocs/request, %d B/request (%d requests)", p.name, res.AllocsPerOp(), res.AllocedBytesPerOp(), res.N)
	}

	mode := "norace"
	if raceEnabled {
		mode = "race"
	}
	all := map[string]map[string]int64{}
	if raw, err := os.ReadFile(allocBudgetFile); err == nil {
		if err := json.Unmarshal(raw, &all); err != nil {
			t.Fatalf("%s: %v", allocBudgetFile, err)
		}
	} else if !*updateAllocs {
		t.Fatal(err)
	}
	if *updateAllocs {
		all[mode] = got
		raw, _ := json.MarshalIndent(all, "", "  ")
		if err := os.WriteFile(allocBudgetFile, append(raw, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want := all[mode]
	for _, p := range paths {
		w, ok := want[p.name]
		if !ok {
			t.Fatalf("%s has no %s figure for %s; run with -update-allocs", allocBudgetFile, mode, p.name)
		}
		g := got[p.name]
		switch {
		case float64(g) > float64(w)*allocSlack:
			t.Errorf("%s: %d allocs/request, more than %.0f%% over the committed %d (%s)", p.name, g, (allocSlack-1)*100, w, mode)
		case float64(g) < float64(w)*allocFloor:
			t.Errorf("%s: %d allocs/request, well below the committed %d (%s): lower the committed figure (-update-allocs)", p.name, g, w, mode)
		}
	}
}
