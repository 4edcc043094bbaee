package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// A replica started while the database is down has had no heartbeat, so it
// does not know its share of IDEMPROXY_RATE_LIMIT: its attempts wait for the
// database instead of pacing alone (ratelimit.Gate.SetReplicas). Its WARN
// line says so. It said "this replica paces alone with its share of the rate
// limit" while the unprotected GET below waited out its retry budget and
// nothing reached the provider: an operator reading it looked for traffic
// that was not there, and not for the waiting requests that were.
func TestThrottleLogBeforeFirstHeartbeat(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	if err := c.Stop(false); err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	defer up.Close()
	p := launch(t, launchSpec{env: sharedEnv(up.URL, url, "IDEMPROXY_RATE_LIMIT=10", "IDEMPROXY_RETRY_BUDGET=3s")})
	r := send(t, http.MethodGet, "http://"+p.proxy+"/v1/balance", "")
	if r.status < 500 {
		t.Errorf("GET with the database down since the start: %d %s, want an error once its budget ends", r.status, r.body)
	}
	if n := seen.Load(); n != 0 {
		t.Errorf("the provider saw %d requests from a replica that does not know its share, want none", n)
	}
	line := p.waitLine(t, "provider throttle in the database unreachable")
	if strings.Contains(line, "paces alone") || !strings.Contains(line, "wait for the database") {
		t.Errorf("the WARN line says %s\nwant that the attempts wait for the database, not that the replica paces alone", line)
	}
}
