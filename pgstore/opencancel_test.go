package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestOpenCancelledWithDatabaseHung: Open waits at start for the schema's
// advisory lock (another session holds it), the database then stops
// answering (every process stopped with SIGSTOP), and Open's context ends (the
// process got SIGTERM during its start). Open returns at once with the
// context's error, its connections cut. It waited 15 s and more: the
// unlock's bound, then the pool's close waiting for pgx's cancel request to
// a server that never answers; the process outlived its shutdown grace, and
// said 'context canceled' as if the database had refused.
func TestOpenCancelledWithDatabaseHung(t *testing.T) {
	c, dbURL := pgtest.Own(t, pgtest.Options{})
	holder, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	if _, err := holder.Exec(context.Background(), "SELECT pg_advisory_lock($1)", int64(schemaLock)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type opened struct {
		s   *Store
		err error
	}
	done := make(chan opened, 1)
	go func() {
		s, err := Open(ctx, Options{URL: dbURL, CallTimeout: 5 * time.Second})
		done <- opened{s, err}
	}()
	// Open's session waits for the lock.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		if err := holder.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Open's session not waiting for the schema's lock after 10 s")
		}
	}
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer c.Thaw()
	start := time.Now()
	cancel()
	var o opened
	select {
	case o = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Open still waiting 20 s after its context ended, the database hung")
	}
	took := time.Since(start)
	t.Logf("Open returned %v after its context ended: %v", took.Round(time.Millisecond), o.err)
	if o.s != nil {
		o.s.Close()
	}
	if !errors.Is(o.err, context.Canceled) {
		t.Errorf("Open's error = %v, want the context's (canceled)", o.err)
	}
	if took > 250*time.Millisecond {
		t.Errorf("Open returned %v after its context ended, the database hung; want at once (within 250 ms)", took.Round(time.Millisecond))
	}
}
