package main

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

func TestCgroupMemoryLimit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v2 := write("memory.max", "268435456\n")
	v2max := write("memory.max.unlimited", "max\n")
	v1 := write("limit_in_bytes", "536870912\n")
	v1none := write("limit_in_bytes.none", "9223372036854771712\n")
	bad := write("garbage", "lots\n")
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name  string
		files []string
		want  int64
	}{
		{"v2 limit", []string{v2, v1}, 256 << 20},
		{"v2 max", []string{v2max, v1}, 0},
		{"v1 limit", []string{missing, v1}, 512 << 20},
		{"v1 unlimited", []string{missing, v1none}, 0},
		{"garbage", []string{bad}, 0},
		{"no cgroup", []string{missing}, 0},
	} {
		if got, _ := cgroupMemoryLimit(tc.files); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestSetMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	f := filepath.Join(t.TempDir(), "memory.max")
	if err := os.WriteFile(f, []byte("268435456\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)

	setMemoryLimit([]string{"GOMEMLIMIT=64MiB"}, []string{f}, log)
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("with GOMEMLIMIT set the limit changed to %d", got)
	}
	setMemoryLimit(nil, []string{f}, log)
	// 40% of 256 MiB, rounded down to the byte: 102.4 MiB.
	if got := debug.SetMemoryLimit(-1); got != 107374182 {
		t.Fatalf("limit %d, want 107374182, 40%% of the container's 256 MiB", got)
	}
	setMemoryLimit(nil, []string{filepath.Join(t.TempDir(), "none")}, log)
	if got := debug.SetMemoryLimit(-1); got != defaultGoMemoryLimit {
		t.Fatalf("outside a container: limit %d, want the default %d", got, defaultGoMemoryLimit)
	}
}

func TestSetGCPercent(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	log := slog.New(slog.DiscardHandler)

	setGCPercent(nil, false, log)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("embedded store: GOGC %d, want Go's default 100 kept", got)
	}
	setGCPercent([]string{"GOGC=150"}, true, log)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("shared store with GOGC set: GOGC changed to %d", got)
	}
	setGCPercent([]string{"GOMEMLIMIT=64MiB"}, true, log)
	if got := debug.SetGCPercent(100); got != sharedStoreGCPercent {
		t.Fatalf("shared store without GOGC: GOGC %d, want %d", got, sharedStoreGCPercent)
	}
}

// TestGCPercentByStore runs the binary: on PostgreSQL its collector runs at
// GOGC=400 unless GOGC is set; on the embedded store at Go's default. Read
// from the binary's own metrics (go_gc_gogc_percent).
func TestGCPercentByStore(t *testing.T) {
	up := httptest.NewServer(http.NotFoundHandler())
	defer up.Close()
	// gogc returns the collector's GOGC as /metrics reports it, and
	// whether the start log says that idemproxy set it (the operator's only
	// sign that the process runs with another GOGC than Go's default).
	gogc := func(env ...string) (float64, bool) {
		t.Helper()
		p := startBinary(t, append([]string{"IDEMPROXY_UPSTREAM_URL=" + up.URL}, env...)...)
		v, ok := scrape(t, "http://"+p.admin+"/metrics")["go_gc_gogc_percent"]
		if !ok {
			t.Fatal("no go_gc_gogc_percent in /metrics")
		}
		logged := false
		for _, line := range strings.Split(p.logText(), "\n") {
			var e struct {
				Level string
				GOGC  *int `json:"gogc"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.GOGC != nil {
				if e.Level != "INFO" || *e.GOGC != int(v) {
					t.Errorf("start log line %s: want level INFO and gogc %v", line, v)
				}
				logged = true
			}
		}
		return v, logged
	}
	if got, logged := gogc("IDEMPROXY_DATA_DIR=" + t.TempDir()); got != 100 || logged {
		t.Errorf("embedded store: GOGC %v (logged as set: %v), want 100, not logged", got, logged)
	}
	db := pgtest.Database(t)
	if got, logged := gogc("IDEMPROXY_STORE_URL=" + db); got != sharedStoreGCPercent || !logged {
		t.Errorf("PostgreSQL: GOGC %v (logged as set: %v), want %d, logged", got, logged, sharedStoreGCPercent)
	}
	if got, logged := gogc("IDEMPROXY_STORE_URL="+db, "GOGC=150"); got != 150 || logged {
		t.Errorf("PostgreSQL with GOGC=150: GOGC %v (logged as set: %v), want 150, not logged", got, logged)
	}
}
