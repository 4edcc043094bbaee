//go:build linux

package cache

import (
	"cmp"
	"crypto/rand"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

var diskTTL = flag.Duration("disk.ttl", 10*time.Second, "record TTL of BenchmarkDiskSteadyState")

// BenchmarkDiskSteadyState writes records at a constant rate for three TTLs
// and reports the data directory's allocated size after one TTL and after
// three (under constant load it should plateau: ratio-3ttl ≤ 1.5), then stops
// writing and reports the size once the store has given the space of the
// expired records back (idle-MiB) and how long after the last expiry that
// took. It also logs the size every tenth of a TTL and reports the lowest
// and highest of those during the third TTL (low/high-3rd-ttl-MiB), since
// compactions make the size a saw-tooth and size-3ttl-MiB is one point of
// it. It runs once whatever b.N is (about 4 TTLs of wall time):
//
//	go test -run '^$' -bench DiskSteadyState -benchtime 1x ./cache/ -disk.ttl 20s
func BenchmarkDiskSteadyState(b *testing.B) {
	ttl := *diskTTL
	const (
		rate  = 1000 // records per second
		bodyN = 1000 // bytes of incompressible body per record
	)
	dir := b.TempDir()
	s, err := Open(Options{Dir: dir, TTL: ttl, MemTableSize: 1 << 20, SyncWrites: false,
		ReclaimInterval: time.Second, MinFreeBytes: -1,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	body := make([]byte, bodyN)
	rand.Read(body)
	start := time.Now()
	tick := time.NewTicker(time.Second / 100)
	defer tick.Stop()
	var n int
	var at1, at3 int64
	var series []string   // size every tenth of a TTL, logged: the saw-tooth of compactions
	var low3, high3 int64 // range of those sizes during the third TTL
	nextSample := ttl / 10
	for elapsed := time.Duration(0); elapsed < 3*ttl; elapsed = time.Since(start) {
		<-tick.C
		for target := int(time.Since(start).Seconds() * rate); n < target; n++ {
			id := store.ID{Key: fmt.Sprint("k", n)}
			if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fpA}, "o", time.Minute); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
				b.Fatal(err)
			}
		}
		if at1 == 0 && elapsed >= ttl {
			at1 = allocatedBytes(b, dir)
		}
		if elapsed >= nextSample {
			size := allocatedBytes(b, dir)
			series = append(series, fmt.Sprintf("%.0fs %.1f", elapsed.Seconds(), mebi(size)))
			if elapsed >= 2*ttl {
				low3, high3 = min(cmp.Or(low3, size), size), max(high3, size)
			}
			nextSample += ttl / 10
		}
	}
	at3 = allocatedBytes(b, dir)
	b.Logf("MiB allocated while writing: %s", strings.Join(series, ", "))
	b.ReportMetric(mebi(low3), "low-3rd-ttl-MiB")
	b.ReportMetric(mebi(high3), "high-3rd-ttl-MiB")
	lastWrite := time.Now()
	b.ReportMetric(mebi(at1), "size-1ttl-MiB")
	b.ReportMetric(mebi(at3), "size-3ttl-MiB")
	b.ReportMetric(float64(at3)/float64(at1), "ratio-3ttl")
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "records/s")

	// Idle: wait (bounded) for the reclaim after the last record expired.
	expired := lastWrite.Add(ttl + time.Second)
	deadline := expired.Add(ttl)
	idle := at3
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		if idle = allocatedBytes(b, dir); idle < at3/10 && time.Now().After(expired) {
			break
		}
	}
	b.ReportMetric(mebi(idle), "idle-MiB")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if idle < at3/10 {
			break // given back: nothing to explain
		}
		if fi, err := e.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blocks > 0 {
				b.Logf("left after idle: %s %d KiB", e.Name(), st.Blocks/2)
			}
		}
	}
	b.ReportMetric(max(time.Since(expired), 0).Seconds(), "reclaimed-after-expiry-s")
}

func mebi(n int64) float64 { return float64(n) / (1 << 20) }

// allocatedBytes is what du reports for dir: Badger's files are sparse.
func allocatedBytes(b *testing.B, dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}
