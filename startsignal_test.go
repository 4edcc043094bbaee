package main

import (
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestSignalDuringStartWithDatabaseHung: SIGTERM (or SIGINT) while the
// start waits on PostgreSQL, its schema check queued behind the schema's
// advisory lock (held by another session, as by a replica upgrading it),
// and the database then hung (every process stopped with SIGSTOP). The
// process stops at once, nothing having been served: exit status 0, the
// line "stopped during the start". It ran 15 s past the signal (the
// schema's unlock, then pgx's cancel request to a server that never
// answers), past a 3 s grace, and exited 1 with 'pgstore: schema: context
// canceled', read as a database that refused.
func TestSignalDuringStartWithDatabaseHung(t *testing.T) {
	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) { signalDuringStart(t, sig) })
	}
}

func signalDuringStart(t *testing.T, sig os.Signal) {
	c, url := pgtest.Own(t, pgtest.Options{})
	up := httptest.NewServer(newDedupProvider())
	defer up.Close()
	holder, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	const schemaLock = 0x1de3_9a0c_5c4e_0001 // pgstore's
	if _, err := holder.Exec(context.Background(), "SELECT pg_advisory_lock($1)", int64(schemaLock)); err != nil {
		t.Fatal(err)
	}
	const grace = 3 * time.Second
	p := startProc(t, launchSpec{env: sharedEnv(up.URL, url, "IDEMPROXY_SHUTDOWN_GRACE="+grace.String())})
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
			t.Fatalf("the start not waiting for the schema's lock after 10 s:\n%s", p.text())
		}
	}
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer c.Thaw()
	start := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(grace + exitMargin):
		t.Fatalf("still running %v after %v during the start (grace %v):\n%s", time.Since(start).Round(time.Millisecond), sig, grace, p.text())
	}
	t.Logf("exited %v after %v: %v", time.Since(start).Round(time.Millisecond), sig, p.err)
	if p.err != nil || !strings.Contains(p.text(), "stopped during the start") || strings.Contains(p.text(), `"level":"ERROR"`) {
		t.Errorf("exit after %v during the start: %v, want status 0 and the line 'stopped during the start', no error:\n%s", sig, p.err, p.text())
	}
}
