package cache

import (
	"bytes"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// benchWriters is the number of concurrent writers in BenchmarkBeginComplete.
const benchWriters = 64

// BenchmarkBeginComplete measures one idempotent operation's store writes
// (Begin, then Complete with a 512-byte body, on a fresh key) from 64
// concurrent writers. One op is both writes; ops/s is operations per
// second. durable and nondurable use a real directory and differ only in
// SyncWrites; inmemory is the ceiling without any file I/O.
func BenchmarkBeginComplete(b *testing.B) {
	cases := []struct {
		name string
		opts Options
	}{
		{"durable", Options{SyncWrites: true}},
		{"nondurable", Options{SyncWrites: false}},
		{"inmemory", Options{InMemory: true}},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			opts := bc.opts
			opts.Dir, opts.GCInterval, opts.MinFreeBytes = b.TempDir(), -1, -1
			s, err := Open(opts)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			runBeginComplete(b, s)
		})
	}
}

func runBeginComplete(b *testing.B, s *Store) {
	resp := store.Response{
		Status: 200,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   bytes.Repeat([]byte("a"), 512),
	}
	fp := bytes.Repeat([]byte{1}, 32)
	var seq atomic.Uint64
	var syncs atomic.Int64
	if s.group != nil {
		inner := s.group.sync
		s.group.sync = func(ts uint64) error { syncs.Add(1); return inner(ts) }
	}
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((benchWriters + procs - 1) / procs)
	b.ReportAllocs()
	b.ResetTimer()
	var mu sync.Mutex
	var lat []time.Duration
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		defer func() {
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
		for pb.Next() {
			start := time.Now()
			id := store.ID{Tenant: "bench", Key: strconv.FormatUint(seq.Add(1), 10)}
			if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: fp}, "owner", time.Minute); err != nil {
				b.Error(err)
				return
			}
			if err := s.Complete(ctx, id, "owner", resp, time.Time{}); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(start))
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	if len(lat) > 0 {
		// The slowest operations show whether a writer is held up by rounds
		// it does not need (a leader that keeps leading).
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*999/1000].Microseconds())/1000, "p99.9-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	}
	if s.group != nil {
		// Each op makes two durable writes; below 2 the writes share fsyncs.
		b.ReportMetric(float64(syncs.Load())/float64(b.N), "syncs/op")
	}
}
