package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestReadyzOnHungDatabaseCountsUnavailable: with the database hung (every
// process of the cluster stopped with SIGSTOP) and no traffic, /readyz
// answers 503 once its 2 s bound runs out, and /metrics counts the ping as
// idemproxy_store_errors_total{kind="unavailable",op="ping"}, so that an
// alert on kind="unavailable" fires for a hung database too; a scrape
// answers within 5 s, well inside Prometheus's default scrape timeout of
// 10 s. A probe whose client goes away before the bound is still counted
// canceled. Before, the readiness probe's own deadline was counted
// canceled, as if its caller had left; and a scrape waited for the count of
// unknown records from the hung store, twice the call timeout (10 s), so
// that Prometheus's would fail, and this test's wait for the canceled
// probe sampled the counter only once, just as its client left, before the
// server had counted it (it failed so under load).
func TestReadyzOnHungDatabaseCountsUnavailable(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	up := httptest.NewServer(newDedupProvider())
	defer up.Close()
	p := launch(t, launchSpec{env: sharedEnv(up.URL, url)})
	waitReady(t, "start", p)

	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer c.Thaw()
	start := time.Now()
	if s := getStatus(t, "http://"+p.admin+"/readyz"); s != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the database hung = %d, want 503", s)
	}
	took := time.Since(start)
	if took < 2*time.Second || took > 4*time.Second {
		t.Errorf("/readyz with the database hung answered after %v, want its 2 s bound", took.Round(time.Millisecond))
	}
	const unavailable, canceled = `idemproxy_store_errors_total{kind="unavailable",op="ping"}`,
		`idemproxy_store_errors_total{kind="canceled",op="ping"}`
	start = time.Now()
	m := scrape(t, "http://"+p.admin+"/metrics")
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("/metrics with the database hung answered after %v, want within 5 s (Prometheus's default scrape timeout is 10 s)", took.Round(time.Millisecond))
	}
	if m[unavailable] != 1 || m[canceled] != 0 {
		t.Fatalf("after one /readyz on the hung database: %s = %v, %s = %v; want 1 and 0",
			unavailable, m[unavailable], canceled, m[canceled])
	}

	// A probe whose client leaves after 1 s, well inside the 2 s bound: the
	// caller went away. (With 300 ms, a loaded machine sometimes had the
	// client leave before the admin server had read the request, so that no
	// probe ran at all.)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("/readyz answered %d before the client left, with the database hung", resp.StatusCode)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m = scrape(t, "http://"+p.admin+"/metrics")
		if m[canceled] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a /readyz whose client left: %s = %v, want 1", canceled, m[canceled])
		}
	}
	if m[unavailable] != 1 {
		t.Errorf("a /readyz whose client left: %s = %v, want it still 1", unavailable, m[unavailable])
	}
}

// TestRepeatWaitingWhenDatabaseDrops: while replica a runs an order (the
// provider holds it), the same order on replica b waits for it; the
// database then stops. b answers 503 store_unavailable, and neither its
// answer nor its log says the key was left free or that nothing was sent
// upstream: the operation is in flight on a. The answer says nothing was
// sent by this request and to retry with the same key. Before, b answered
// "nothing was sent upstream" and logged "key left free".
func TestRepeatWaitingWhenDatabaseDrops(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	prov := newHeldProvider(2)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer prov.Release()
	env := sharedEnv(up.URL, url, "IDEMPROXY_INFLIGHT_WAIT=1m")
	a := launch(t, launchSpec{env: env})
	b := launch(t, launchSpec{env: env})
	order := `{"order_id":"waiting-1","amount":"3.00"}`

	ra := goSend("POST", "http://"+a.proxy+"/v1/payments", order)
	key := <-prov.entered
	rb := goSend("POST", "http://"+b.proxy+"/v1/payments", order)
	// b finds the key in flight and polls it.
	time.Sleep(500 * time.Millisecond)
	select {
	case r := <-rb:
		t.Fatalf("b answered before the database stopped: %+v", r)
	default:
	}
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	var got sentReply
	select {
	case got = <-rb:
	case <-time.After(30 * time.Second):
		t.Fatalf("b still waiting 30 s after the database stopped:\n%s", b.text())
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal([]byte(got.reply.body), &e); err != nil || got.reply.status != http.StatusServiceUnavailable || e.Error.Code != "store_unavailable" {
		t.Fatalf("b with the database stopped: %d %s, want 503 store_unavailable", got.reply.status, got.reply.body)
	}
	if got.reply.header.Get("Idempotency-Key") != key {
		t.Errorf("b's answer carries key %q, want %q", got.reply.header.Get("Idempotency-Key"), key)
	}
	msg := e.Error.Message
	if strings.Contains(msg, "nothing was sent upstream") || !strings.Contains(msg, "nothing was sent by this request") ||
		!strings.Contains(msg, "may be running or done") || !strings.Contains(msg, "retry with the same Idempotency-Key") {
		t.Errorf("b's message %q: want it to say nothing was sent by this request, that the key's operation may be running or done, and to retry with the same key; not that nothing was sent upstream", msg)
	}
	if log := b.text(); strings.Contains(log, "key left free") || !strings.Contains(log, "nothing sent by this request") {
		t.Errorf("b's log says the key was left free, or not that nothing was sent by this request:\n%s", log)
	}

	prov.Release()
	if r := <-ra; r.err != nil {
		t.Fatal(r.err)
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.seen[key] != 1 || len(prov.seen) != 1 {
		t.Errorf("provider saw %v, want one request, from a", prov.seen)
	}
}
