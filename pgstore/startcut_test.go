package pgstore

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestStartCutMidStatementIsRetried: the database drops the connection
// after the start's session was set up, while its first statement is on its
// way (a restart's fast shutdown, a failover, a proxy between them going
// away): the client reads EOF, not a PostgreSQL error. Open took that for a
// refusal that no retry mends and failed, so a replica (re)started while
// the database restarted exited at start (a CI run of the three-replica
// chaos test lost a replica so). It now starts, not ready, and retries in
// the background: once the database answers, the store works.
func TestStartCutMidStatementIsRetried(t *testing.T) {
	u, err := url.Parse(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var cuts atomic.Int32
	target := u.Host
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go relayCutFirst(c, target, &cuts)
		}
	}()
	u.Host = l.Addr().String()
	s, err := Open(context.Background(), Options{URL: u.String(), CallTimeout: 2 * time.Second, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatalf("Open with its first statement's connection cut: %v; want a store that retries", err)
	}
	defer s.Close()
	if cuts.Load() != 2 {
		t.Fatal("the relay cut no connection: the test did not test anything")
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := s.Ping(context.Background())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store still not usable 20 s after the cut: %v", err)
		}
	}
}

// relayCutFirst relays c to target; the first connection it relays is
// closed, both ways, when the client writes for the second time: its first
// write is the startup message, its second the first statement (the
// cluster trusts local connections: no password message between them).
func relayCutFirst(c net.Conn, target string, cuts *atomic.Int32) {
	defer c.Close()
	srv, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer srv.Close()
	go io.Copy(c, srv)
	cut := cuts.CompareAndSwap(0, 1)
	buf := make([]byte, 64<<10)
	for writes := 1; ; writes++ {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if cut && writes == 2 {
			cuts.Store(2)
			return // both closed by the defers
		}
		if _, err := srv.Write(buf[:n]); err != nil {
			return
		}
	}
}
