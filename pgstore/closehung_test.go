package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestCloseWithDatabaseHung: Close on a database that does not answer (every
// process of the cluster stopped with SIGSTOP: connections stay open and
// nothing answers) returns within the call timeout, with the pool at
// pool_max_conns=4, the throttle listening on one of its connections and its
// heartbeat, the sweep, the ANALYZE check and a read waiting on the
// database; the read ends too. Close took 15 s and more: the background
// loops' statements ran out their call timeout, and pgx waits up to 15 s per
// cancelled statement for a cancel request that the hung server never
// answers, which the pool's Close waited for.
func TestCloseWithDatabaseHung(t *testing.T) {
	c, dbURL := pgtest.Own(t, pgtest.Options{})
	const timeout = 5 * time.Second
	s, err := Open(context.Background(), Options{URL: withQuery(t, dbURL, "pool_max_conns", "4"), CallTimeout: timeout,
		SweepInterval: 10 * time.Millisecond, AnalyzeInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.Throttle(ThrottleOptions{Name: "https://provider.test", Heartbeat: 10 * time.Millisecond})
	waitListening(t, s, 1)
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer c.Thaw()
	read := make(chan error, 1)
	go func() {
		_, err := s.Get(context.Background(), store.ID{Tenant: "t", Key: "hung"})
		read <- err
	}()
	// The read, the heartbeat and the loops reach the hung database.
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
		t.Logf("closed in %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(timeout):
		t.Fatalf("Close still waiting %v after it was called on a hung database (call timeout %v)", timeout, timeout)
	}
	select {
	case err := <-read:
		if err == nil {
			t.Error("a read on the hung database succeeded")
		}
	case <-time.After(timeout):
		t.Fatal("a read on the hung database still waiting after Close")
	}
}

// TestCloseByWithDatabaseHung: CloseBy on a hung database (as above) returns
// by its deadline when that is nearer than closeWait, the throttle's last
// heartbeat statement and the loops' included: the connections are cut when
// three quarters of the time are gone. It is what the process's shutdown
// leaves for the store's close within the grace; Close waited closeWait
// (a second) whatever the time left, and the process exited a second after
// its grace.
func TestCloseByWithDatabaseHung(t *testing.T) {
	c, dbURL := pgtest.Own(t, pgtest.Options{})
	s, err := Open(context.Background(), Options{URL: withQuery(t, dbURL, "pool_max_conns", "4"), CallTimeout: 5 * time.Second,
		SweepInterval: 10 * time.Millisecond, AnalyzeInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.Throttle(ThrottleOptions{Name: "https://provider.test", Heartbeat: 10 * time.Millisecond})
	waitListening(t, s, 1)
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer c.Thaw()
	read := make(chan error, 1)
	go func() {
		_, err := s.Get(context.Background(), store.ID{Tenant: "t", Key: "hung"})
		read <- err
	}()
	time.Sleep(200 * time.Millisecond) // the read, the heartbeat and the loops reach the hung database
	const left = 300 * time.Millisecond
	start := time.Now()
	s.CloseBy(start.Add(left))
	took := time.Since(start)
	t.Logf("closed in %v", took.Round(time.Millisecond))
	if took > left {
		t.Errorf("CloseBy returned %v after it was called on a hung database, want by its deadline %v later", took.Round(time.Millisecond), left)
	}
	select {
	case err := <-read:
		if err == nil {
			t.Error("a read on the hung database succeeded")
		}
	case <-time.After(time.Second):
		t.Fatal("a read on the hung database still waiting a second after CloseBy")
	}
}
