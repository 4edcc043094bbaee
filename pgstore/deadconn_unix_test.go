//go:build unix

package pgstore

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// TestPeekDoesNotWaitForPendingRead: the check before the pool hands out an
// idle connection (serverSpoke) must return at once even when a read is
// pending on the connection in another goroutine (pgconn's background
// reader can leave one). It peeked under RawConn.Read, which waits for the
// connection's read lock, held by that read until the server sends
// something: pgxpool's Acquire then hung, whatever its context said (a
// store test's read blocked until the test binary's 10 min timeout).
func TestPeekDoesNotWaitForPendingRead(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	server := <-accepted
	defer server.Close()
	reading := make(chan struct{})
	go func() {
		close(reading)
		c.Read(make([]byte, 1)) // pending until the server writes
	}()
	<-reading
	time.Sleep(50 * time.Millisecond) // the read is blocked now
	peeked := make(chan bool, 1)
	go func() { peeked <- peekPending(c.(syscall.Conn)) }()
	select {
	case p := <-peeked:
		if p {
			t.Fatal("peek found data on a connection the server has not written to")
		}
	case <-time.After(2 * time.Second):
		server.Write([]byte{'x'}) // let the read, and the peek, end
		<-peeked
		t.Fatal("peek still waiting 2 s for another goroutine's pending read")
	}
	server.Write([]byte{'x'})
}
