package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestShutdownRefusesAttemptWaitingForConnection: every provider connection
// the process may open (16 under ulimit -n 64) is busy with an operation the
// provider holds, and IDEMPROXY_MAX_INFLIGHT lets one more order in, whose
// attempt waits for one of those connections. SIGTERM arrives: that attempt
// was never sent, and nothing may leave after SIGTERM, so it gets the
// shutdown's 503 with its key at once (nothing was sent), its record is
// released, and the held operations still finish and are stored. Before,
// the waiting attempt took the first connection the held ones freed and was
// sent during the drain. On Badger and on PostgreSQL.
func TestShutdownRefusesAttemptWaitingForConnection(t *testing.T) {
	for _, st := range []string{"badger", "postgres"} {
		t.Run(st, func(t *testing.T) { shutdownWaitingForConnection(t, st) })
	}
}

func shutdownWaitingForConnection(t *testing.T, st string) {
	up := &heldUpstream{release: make(chan struct{}), seen: map[string]int{}}
	srv := httptest.NewServer(up)
	defer srv.Close()
	var once sync.Once
	release := func() { once.Do(func() { close(up.release) }) }
	defer release()
	extra := []string{"IDEMPROXY_MAX_INFLIGHT=40", "IDEMPROXY_SHUTDOWN_GRACE=2m"}
	var env []string
	if st == "postgres" {
		env = sharedEnv(srv.URL, pgtest.Database(t), extra...)
	} else {
		env = baseEnv(srv.URL, t.TempDir(), extra...)
	}
	// sh sets the soft and the hard limit, so the Go runtime cannot raise it.
	p := launch(t, launchSpec{bin: "/bin/sh", args: []string{"-c", "ulimit -n 64 && exec " + binPath}, env: env})
	var limits struct {
		Upstream int `json:"upstream_connections"`
	}
	if err := json.Unmarshal([]byte(p.waitLine(t, `"msg":"limits"`)), &limits); err != nil || limits.Upstream < 1 || limits.Upstream >= 40 {
		t.Fatalf("limits line: %+v %v, want between 1 and 39 provider connections\n%s", limits, err, p.text())
	}

	// One held operation per provider connection; their clients leave once
	// the provider has them, so that they hold no client connection.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	for i := range limits.Upstream {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+p.proxy+"/v1/payouts",
			strings.NewReader(fmt.Sprintf(`{"order_id":"held-%d","amount":"1.00"}`, i)))
		req.Header.Set("Content-Type", "application/json")
		go func() {
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	for deadline := time.Now().Add(time.Minute); up.entered.Load() < int64(limits.Upstream); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the provider holds %d operations after a minute, want %d:\n%s", up.entered.Load(), limits.Upstream, p.text())
		}
	}
	leave()

	waiting := goSend("POST", "http://"+p.proxy+"/v1/payouts", `{"order_id":"waits-for-a-connection","amount":"2.00"}`)
	waitInFlight(t, p.admin, limits.Upstream+1) // claimed: its attempt waits for a connection
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitLine(t, `"msg":"shutting down`)
	var r sentReply
	select {
	case r = <-waiting:
	case <-time.After(20 * time.Second): // bounds a broken binary only: the answer is due at once
		t.Errorf("the request waiting for a provider connection was not answered 20 s after SIGTERM; releasing the provider")
		release()
		r = <-waiting
	}
	release()
	key := ""
	if r.err == nil {
		key = r.header.Get("Idempotency-Key")
	}
	if r.err != nil || r.status != http.StatusServiceUnavailable || key == "" || r.header.Get("Retry-After") == "" ||
		!strings.Contains(r.body, "nothing was sent") {
		t.Errorf("request waiting for a provider connection at SIGTERM = %+v; want 503 with its key and Retry-After, nothing was sent", r)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("still running a minute after SIGTERM and the release:\n%s", p.text())
	}
	if p.err != nil {
		t.Errorf("exit: %v, want 0 (the held operations finished and were stored)\n%s", p.err, p.text())
	}
	up.mu.Lock()
	sent, seen := up.seen[key], len(up.seen)
	up.mu.Unlock()
	if sent != 0 || seen != limits.Upstream {
		t.Errorf("the provider saw the waiting order %d times and %d orders; want 0 and the %d held ones", sent, seen, limits.Upstream)
	}

	// Restarted on the same store: nothing is left in flight, the waiting
	// order's key is free and the held ones are stored.
	q := launch(t, launchSpec{env: env})
	if rec := send(t, "GET", "http://"+q.admin+"/admin/v1/records/"+key, ""); key != "" && rec.status != http.StatusNotFound {
		t.Errorf("record of the order refused at SIGTERM = %d %s, want 404: its key released", rec.status, rec.body)
	}
	if rec := send(t, "GET", "http://"+q.admin+"/admin/v1/records?state=in_flight", ""); !strings.Contains(rec.body, `"records":[]`) {
		t.Errorf("records in flight after a clean shutdown: %s", rec.body)
	}
	if rec := send(t, "POST", "http://"+q.proxy+"/v1/payouts", `{"order_id":"held-0","amount":"1.00"}`); rec.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a held order after the restart = %d %s, want its stored answer replayed", rec.status, rec.body)
	}
}
