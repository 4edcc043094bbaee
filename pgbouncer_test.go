package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestPgBouncerReplicas: two replicas of the real binary on one database
// through one PgBouncer in session mode. An order through a is held by the
// provider; the same order through b waits for it and replays a's answer;
// the provider executes it once. A new order through b is replayed by a.
// Before, PgBouncer refused every connection (unsupported startup
// parameter: synchronous_commit) and no replica ever became ready.
func TestPgBouncerReplicas(t *testing.T) {
	dbURL := pgtest.Database(t)
	b := pgtest.StartPgBouncer(t, pgtest.Shared(t), pgtest.PgBouncerOptions{PoolMode: "session"})
	prov := newHeldProvider(4)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer prov.Release()
	env := sharedEnv(up.URL, b.Via(dbURL), "IDEMPROXY_INFLIGHT_WAIT=1m")
	ra, rb := launch(t, launchSpec{env: env}), launch(t, launchSpec{env: env})
	waitReady(t, "start behind PgBouncer", ra, rb)

	order := `{"order_id":"pgb-1","amount":"7.00"}`
	first := goSend("POST", "http://"+ra.proxy+"/v1/payments", order)
	key := <-prov.entered
	second := goSend("POST", "http://"+rb.proxy+"/v1/payments", order)
	time.Sleep(500 * time.Millisecond) // b finds the order in flight and waits
	prov.Release()
	fa, fb := <-first, <-second
	if fa.err != nil || fb.err != nil {
		t.Fatal(fa.err, fb.err)
	}
	if fa.status != http.StatusCreated || fa.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("on a: %d %s replayed=%q, want 201 executed", fa.status, fa.body, fa.header.Get("Idempotent-Replayed"))
	}
	if fb.status != http.StatusCreated || fb.body != fa.body || fb.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("on b after waiting: %d %s replayed=%q, want a's answer %s replayed", fb.status, fb.body,
			fb.header.Get("Idempotent-Replayed"), fa.body)
	}

	other := `{"order_id":"pgb-2","amount":"3.00"}`
	fresh := send(t, "POST", "http://"+rb.proxy+"/v1/payments", other)
	replay := send(t, "POST", "http://"+ra.proxy+"/v1/payments", other)
	if fresh.status != http.StatusCreated || replay.status != http.StatusCreated || replay.body != fresh.body ||
		replay.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("new order on b: %d %s; again on a: %d %s replayed=%q; want a to replay b's answer",
			fresh.status, fresh.body, replay.status, replay.body, replay.header.Get("Idempotent-Replayed"))
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs[key] != 1 || prov.seen[key] != 1 || len(prov.execs) != 2 {
		t.Fatalf("provider requests %v, executions %v; want one request under %q and one for the second order", prov.seen, prov.execs, key)
	}
}

// TestPgBouncerTransactionModeStops: behind PgBouncer in transaction mode,
// the binary stops at start, saying why and what to change. Before, with
// its settings in ignore_startup_parameters, it served, its records written
// without synchronous_commit on whenever the server's default was off.
func TestPgBouncerTransactionModeStops(t *testing.T) {
	dbURL := pgtest.Database(t)
	b := pgtest.StartPgBouncer(t, pgtest.Shared(t), pgtest.PgBouncerOptions{PoolMode: "transaction",
		IgnoreStartupParameters: []string{"synchronous_commit", "plan_cache_mode", "lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"}})
	out := startStopsAs(t, binPath, nil, 1, sharedEnv("http://127.0.0.1:1", b.Via(dbURL)))
	for _, want := range []string{"IDEMPROXY_STORE_URL", "transaction or statement mode", "pool_mode = session"} {
		if !strings.Contains(out, want) {
			t.Errorf("start behind PgBouncer in transaction mode: output lacks %q:\n%s", want, out)
		}
	}
}
