package main

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestShutdownGraceAnswersRunning: an operation the provider still holds
// when the shutdown grace is about to run out, and a repeat waiting for it,
// are answered before the process exits, not cut off without an answer: the
// operation's client gets 504 upstream_unavailable with its key (its
// outcome is unknown: retry with the same key), the repeat 409
// idempotency_in_progress with Retry-After. The process exits 1 (the grace
// ran out), and the app's retry after the restart resumes the operation
// with the same key: the provider executes it once (on Badger; on
// PostgreSQL the answers are checked, the record waiting for its lease).
func TestShutdownGraceAnswersRunning(t *testing.T) {
	for _, st := range []string{"badger", "postgres"} {
		t.Run(st, func(t *testing.T) { shutdownGraceAnswersRunning(t, st) })
	}
}

func shutdownGraceAnswersRunning(t *testing.T, st string) {
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer prov.Release()
	dir := filepath.Join(t.TempDir(), "data")
	const grace = 2 * time.Second
	extra := []string{"IDEMPROXY_SHUTDOWN_GRACE=" + grace.String(), "IDEMPROXY_INFLIGHT_WAIT=1m"}
	env := baseEnv(up.URL, dir, extra...)
	if st == "postgres" {
		env = sharedEnv(up.URL, pgtest.Database(t), extra...)
	}
	p := launch(t, launchSpec{env: env})
	const order = `{"order_id":"runs-past-the-grace","amount":"4.00"}`
	running := goSend("POST", "http://"+p.proxy+"/v1/payments", order)
	key := <-prov.entered
	repeat := goSend("POST", "http://"+p.proxy+"/v1/payments", order)
	waitStoreGets(t, p.admin, 1) // the repeat found the key in flight (it reads its record)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(grace + exitMargin):
		t.Fatalf("still running %s after SIGTERM:\n%s", grace+exitMargin, p.text())
	}
	if p.err == nil {
		t.Errorf("exit 0, want 1: the grace ran out with an operation running\n%s", p.text())
	}
	if r := <-running; r.err != nil || r.status != http.StatusGatewayTimeout || r.header.Get("Idempotency-Key") != key ||
		!strings.Contains(r.body, `"upstream_unavailable"`) || !strings.Contains(r.body, key) || !strings.Contains(r.body, "retry with the same Idempotency-Key") {
		t.Errorf("the running operation's client at the end of the grace = %+v; want 504 upstream_unavailable with its key %s", r, key)
	}
	if r := <-repeat; r.err != nil || r.status != http.StatusConflict || r.header.Get("Retry-After") == "" ||
		!strings.Contains(r.body, `"idempotency_in_progress"`) {
		t.Errorf("the repeat waiting for it at the end of the grace = %+v; want 409 idempotency_in_progress with Retry-After", r)
	}

	if st == "postgres" {
		return
	}
	prov.Release() // the provider executes it after all
	q := launch(t, launchSpec{env: baseEnv(up.URL, dir)})
	if r := send(t, "POST", "http://"+q.proxy+"/v1/payments", order); r.status != http.StatusCreated || r.header.Get("Idempotency-Key") != key {
		t.Errorf("the app's retry after the restart = %d %s, want 201 under the same key", r.status, r.body)
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs[key] != 1 || len(prov.seen) != 1 {
		t.Errorf("executions %d of %d keys seen, want one execution of the one key", prov.execs[key], len(prov.seen))
	}
}

// waitStoreGets polls the metrics until n record reads have returned.
func waitStoreGets(t *testing.T, admin string, n int) {
	t.Helper()
	const series = `idemproxy_store_operation_duration_seconds_count{op="get"}`
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if scrape(t, "http://"+admin+"/metrics")[series] >= float64(n) {
			return
		}
	}
	t.Fatalf("fewer than %d record reads returned within a minute", n)
}
