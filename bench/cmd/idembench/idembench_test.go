package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

func TestRequestsParseAsHTTP(t *testing.T) {
	tests := []struct {
		name      string
		raw       []byte
		wantOrder string
	}{
		{"get", buildGet(nil, 7), ""},
		{"new post", buildNewPost("o-run-")(nil, 12345), "o-run-12345"},
		{"replay post wraps", buildReplayPost("r-run-", 10)(nil, 23), "r-run-3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(tc.raw)))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(req.Body)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(body)) != req.ContentLength && req.ContentLength > 0 {
				t.Fatalf("Content-Length %d, body %d bytes", req.ContentLength, len(body))
			}
			if tc.wantOrder == "" {
				if req.Method != http.MethodGet || len(body) != 0 {
					t.Fatalf("got %s with %d body bytes, want a bodiless GET", req.Method, len(body))
				}
				return
			}
			var v struct {
				OrderID string `json:"order_id"`
			}
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatalf("body is not JSON: %v: %s", err, body)
			}
			if v.OrderID != tc.wantOrder {
				t.Errorf("order_id = %q, want %q", v.OrderID, tc.wantOrder)
			}
		})
	}
}

func TestTrimLogKeepsWholeLastLines(t *testing.T) {
	path := t.TempDir() + "/x.log"
	var log []byte
	for i := range 2000 {
		log = fmt.Appendf(log, "line %04d\n", i)
	}
	if err := os.WriteFile(path, log, 0o644); err != nil {
		t.Fatal(err)
	}
	trimLog(path, 16000) // 20000 bytes: within the 4096-byte slack, left alone
	if got, _ := os.ReadFile(path); !bytes.Equal(got, log) {
		t.Fatalf("a log within the slack was changed")
	}
	trimLog(path, 1000)
	got, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")
	if !strings.HasPrefix(lines[0], "[idembench: ") || lines[len(lines)-1] != "line 1999" || lines[1] != "line 1901" {
		t.Fatalf("trimmed log starts %q, %q and ends %q", lines[0], lines[1], lines[len(lines)-1])
	}
	trimLog(path, 1000)
	if again, _ := os.ReadFile(path); !bytes.Equal(again, got) {
		t.Errorf("trimming twice changed the log again")
	}
}

func TestAfterExpiryAndGC(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		fillEnd time.Duration // after start
		ttl, gc time.Duration
		want    time.Duration // after start
	}{
		{"tick after expiry", 4 * time.Minute, 5 * time.Minute, 5 * time.Minute, 10 * time.Minute},
		{"expiry exactly before a tick", 2 * time.Minute, 3*time.Minute - time.Second, 5 * time.Minute, 5 * time.Minute},
		{"no GC loop", time.Minute, time.Minute, 0, 2*time.Minute + time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := afterExpiryAndGC(start, start.Add(tc.fillEnd), tc.ttl, tc.gc)
			if want := start.Add(tc.want); !got.Equal(want) {
				t.Errorf("got %s after start, want %s", got.Sub(start), tc.want)
			}
		})
	}
}

func TestCellsTakeMedians(t *testing.T) {
	phases := []*phaseResult{
		{Target: "B", Label: "B", Method: "GET", Mode: "closed", Conns: 16, RPS: 100, P99ms: 3, PeakRSSMiB: 10, Failed: 1},
		{Target: "B", Label: "B", Method: "GET", Mode: "closed", Conns: 16, RPS: 300, P99ms: 1, PeakRSSMiB: 12},
		{Target: "B", Label: "B", Method: "GET", Mode: "closed", Conns: 16, RPS: 200, P99ms: 2, PeakRSSMiB: 11},
		{Target: "B", Label: "B", Method: "GET", Mode: "rate", Conns: 16, RPS: 1000},
	}
	cs := cells(phases)
	if len(cs) != 1 {
		t.Fatalf("%d cells, want 1 (rate phases are not cells)", len(cs))
	}
	c := cs[0]
	if c.rps != 200 || c.p99 != 2 || c.rss != 12 || c.failed != 1 || c.rounds != 3 {
		t.Errorf("cell = %+v, want median rps 200, p99 2, max rss 12, 1 failed, 3 rounds", *c)
	}
}

func TestRatiosRenderVerdicts(t *testing.T) {
	o := &options{conns: []int{16, 64}}
	var cs []*cell
	for _, n := range []int{16, 64} {
		cs = append(cs,
			&cell{id: "B", method: "GET", conns: n, rps: 1000},
			&cell{id: "D", method: "GET", conns: n, rps: 950},
			&cell{id: "B", method: "POST", conns: n, rps: 1000},
			&cell{id: "E", method: "POST", conns: n, rps: 400})
	}
	var b strings.Builder
	renderRatios(&b, o, cs)
	out := b.String()
	for _, want := range []string{"| D/B |", "0.95", "met at 16; met at 64", "MISSED at 64", "not measured in this run"} {
		if !strings.Contains(out, want) {
			t.Errorf("ratios table lacks %q:\n%s", want, out)
		}
	}
}

func TestRatiosOfSeveralProcesses(t *testing.T) {
	o := &options{conns: []int{64}}
	cs := []*cell{
		{id: "B", method: "POST", conns: 64, rps: 1000},
		{id: "B3", method: "POST", conns: 64, rps: 800},
		{id: "P3", method: "POST", conns: 64, rps: 400},
	}
	var b strings.Builder
	renderRatios(&b, o, cs)
	out := b.String()
	for _, want := range []string{"| P3/B | new key on PostgreSQL, 3 replicas, vs plain Go proxy POST | 0.40 |",
		"| B3/B |", "| 0.80 |", "| P3/B3 |", "| 0.50 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("ratios table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "P1/B") {
		t.Errorf("ratios table has P1/B, which did not run:\n%s", out)
	}

	// Without B3, its rows are left out, not shown as unmeasured.
	b.Reset()
	renderRatios(&b, o, cs[:1:1])
	if out := b.String(); strings.Contains(out, "B3") {
		t.Errorf("ratios table has B3's rows without B3:\n%s", out)
	}
}
