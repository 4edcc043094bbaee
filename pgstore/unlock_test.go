package pgstore

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestOpenWithDatabaseHungAtUnlock: the database stops answering just after
// the schema is in place, when the schema's advisory lock is released (a
// relay holds every message from the unlock on). Open returns within the
// call timeout and a little more, with the schema in place, and Close after
// it: the lock goes with the session. The unlock had no deadline (it must
// run when Open's context has ended), so Open waited for ever, as did Close
// for a store whose schema came in the background.
func TestOpenWithDatabaseHungAtUnlock(t *testing.T) {
	u, err := url.Parse(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	w := relay(t, u.Host)
	w.holdAt = "pg_advisory_unlock"
	defer w.release()
	u.Host = w.l.Addr().String()
	const timeout = time.Second
	type opened struct {
		s   *Store
		err error
	}
	done := make(chan opened, 1)
	go func() {
		s, err := Open(context.Background(), Options{URL: u.String(), CallTimeout: timeout})
		done <- opened{s, err}
	}()
	var o opened
	select {
	case o = <-done:
	case <-time.After(10 * timeout):
		t.Fatalf("Open still waiting %v after it began, with the database hung at the unlock (call timeout %v)", 10*timeout, timeout)
	}
	if o.err != nil {
		t.Fatal(o.err)
	}
	if !o.s.Migrated() {
		t.Error("the schema was put in place, but the store says it is not")
	}
	closed := make(chan struct{})
	go func() { o.s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * timeout):
		t.Fatal("Close still waiting with the database hung")
	}
}
