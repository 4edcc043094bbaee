package pgstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// wire relays connections to a PostgreSQL server and counts the messages
// clients send by type (the frontend protocol's first byte): 'S' (Sync) and
// 'Q' (simple Query) each end a round trip; 'P' (Parse) is a statement
// prepared.
type wire struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	sent   map[byte]int
}

func relay(t *testing.T, target string) *wire {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &wire{l: l, target: target, sent: map[byte]int{}}
	t.Cleanup(func() { l.Close() })
	go w.accept()
	return w
}

func (w *wire) accept() {
	for {
		c, err := w.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", w.target)
		if err != nil {
			c.Close()
			continue
		}
		go func() { io.Copy(c, s); c.Close() }()
		go func() { w.count(io.TeeReader(c, s)); s.Close() }()
	}
}

// count reads a client's side of a connection: the untyped startup message,
// then typed messages until the connection ends.
func (w *wire) count(r io.Reader) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return
	}
	if _, err := io.CopyN(io.Discard, r, int64(binary.BigEndian.Uint32(n[:]))-4); err != nil {
		return
	}
	var head [5]byte
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		w.mu.Lock()
		w.sent[head[0]]++
		w.mu.Unlock()
		if _, err := io.CopyN(io.Discard, r, int64(binary.BigEndian.Uint32(head[1:]))-4); err != nil {
			return
		}
	}
}

// take returns the counts since the last take and resets them.
func (w *wire) take() map[byte]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.sent
	w.sent = map[byte]int{}
	return m
}

// TestNewKeyRoundTrips counts what a new key costs on the wire: its claim
// (Begin) and its final answer (Complete) are one round trip each, with no
// transaction around them, no extra read and, once warm, no statement
// prepared again.
func TestNewKeyRoundTrips(t *testing.T) {
	ctx := context.Background()
	u, err := url.Parse(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	w := relay(t, u.Host)
	u.Host = w.l.Addr().String()
	s := open(t, u.String(), time.Hour)
	req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/v1/charges", UpstreamKey: "k"}
	resp := store.Response{Status: 200, Body: []byte(`{"id":"ch_1"}`)}
	op := func(i int) {
		t.Helper()
		id := store.ID{Tenant: "t", Key: "key-" + strconv.Itoa(i)}
		if _, created, err := s.Begin(ctx, id, req, "owner", time.Minute); err != nil || !created {
			t.Fatalf("Begin(%s) = created %v, %v", id.Key, created, err)
		}
		if err := s.Complete(ctx, id, "owner", resp); err != nil {
			t.Fatalf("Complete(%s): %v", id.Key, err)
		}
	}
	op(0) // prepares the statements on the connection
	w.take()
	const n = 20
	for i := 1; i <= n; i++ {
		op(i)
	}
	got := w.take()
	trips := got['S'] + got['Q']
	t.Logf("%d new keys: %d round trips (%d Sync, %d Query), %d Parse, messages %s", n, trips, got['S'], got['Q'], got['P'], show(got))
	if trips != 2*n || got['P'] != 0 {
		t.Errorf("%d new keys took %d round trips and %d statements prepared; want %d and 0", n, trips, got['P'], 2*n)
	}
}

func show(m map[byte]int) string {
	s := ""
	for _, c := range []byte("QPBDESCHXFd") {
		if m[c] > 0 {
			s += fmt.Sprintf(" %c=%d", c, m[c])
		}
	}
	return s
}

// BenchmarkNewKey is a protected request's store work on a new key: its claim
// and its final answer, from 16 goroutines per CPU, on a cluster of its own
// with fsync on, as a durable server runs. server-cpu-µs/op is the server's
// CPU per new key, wal-syncs/op its WAL flushes per new key (two commits:
// below 2 is group commit at work); -cpuprofile shows the client side's. More
// postgresql.conf lines, comma-separated, may come in IDEMPROXY_BENCH_PG
// (e.g. commit_delay = 100).
func BenchmarkNewKey(b *testing.B) {
	ctx := context.Background()
	var settings []string
	if v := os.Getenv("IDEMPROXY_BENCH_PG"); v != "" {
		settings = strings.Split(v, ",")
	}
	c, url := pgtest.Own(b, pgtest.Options{Fsync: true, Settings: settings})
	s, err := Open(ctx, Options{URL: url, TTL: time.Hour, SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	req := store.Request{Fingerprint: make([]byte, 32), Method: "POST", Path: "/v1/charges", UpstreamKey: "0123456789abcdef0123456789abcdef"}
	resp := store.Response{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 300)}
	var next sync.Mutex
	i := 0
	syncs := func() (n int64) {
		// Idle backends report their WAL statistics within a second.
		time.Sleep(1500 * time.Millisecond)
		if err := s.pool.QueryRow(ctx, `SELECT wal_sync FROM pg_stat_wal`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	syncsBefore := syncs()
	before := serverCPU(c)
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			next.Lock()
			i++
			id := store.ID{Tenant: "default", Key: "bench-" + strconv.Itoa(i)}
			next.Unlock()
			if _, created, err := s.Begin(ctx, id, req, "owner", time.Minute); err != nil || !created {
				b.Fatalf("Begin = created %v, %v", created, err)
			}
			if err := s.Complete(ctx, id, "owner", resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64((serverCPU(c)-before).Microseconds())/float64(b.N), "server-cpu-µs/op")
	b.ReportMetric(float64(syncs()-syncsBefore)/float64(b.N), "wal-syncs/op")
}

// serverCPU is the CPU time the cluster's processes have used so far, read
// from /proc (0 where it cannot be read).
func serverCPU(c *pgtest.Cluster) time.Duration {
	pids, _ := c.Pids()
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			ticks += u + s
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}
