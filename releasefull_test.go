package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReleaseOnFullDiskKeepsInFlight: idemproxy is killed while the
// provider executes a payment, and starts again on a disk below the store's
// free-space reserve (but with room for Badger to replay its log). The
// release at start cannot rewrite the record as unknown; it must keep it in
// flight, say so in the log, and serve. Once the space is back and the dead
// process's lease has run out, the app's retry takes the record over as an
// operation whose outcome is unknown, first sent when it was claimed: past
// the provider's key retention it gets 409 idempotency_key_expired and
// nothing is sent. Before, the release deleted the record, the retry was a
// first send, and the sandbox, past its retention, charged a second time.
// The record kept counts in idemproxy_inflight_released_total, which the
// crash alert watches; before, only released records did, and it stayed 0.
func TestReleaseOnFullDiskKeepsInFlight(t *testing.T) {
	mnt := smallDisk(t)
	const retention = time.Second
	gw, up, held, release := heldPayments(t, retention)
	// A lease of 14 s (budget + attempt timeout + 10 s); the retry waits it out.
	env := baseEnv(up.URL, filepath.Join(mnt, "data"), "IDEMPROXY_RETRY_MAX_ATTEMPTS=1",
		"IDEMPROXY_ATTEMPT_TIMEOUT=2s", "IDEMPROXY_RETRY_BUDGET=2s", "IDEMPROXY_INFLIGHT_WAIT=1m",
		"IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())
	key, executed := killedDuringPayment(t, env, gw, held, release)

	// Below the reserve (260 MiB), with room for the replay of the WAL.
	filler := fillLeaving(t, mnt, 100<<20)

	p := launch(t, launchSpec{env: env})
	for _, l := range strings.Split(p.text(), "\n") {
		if strings.Contains(l, "in-flight records") {
			t.Logf("start on the full disk: %s", l)
		}
	}
	if !strings.Contains(p.text(), "kept in flight") || !strings.Contains(p.text(), key) {
		t.Errorf("no log line names the record kept in flight on the full disk:\n%s", p.text())
	}
	if r := send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+key, ""); r.status != http.StatusOK ||
		!strings.Contains(r.body, `"state":"in_flight"`) {
		t.Errorf("record after a start on the full disk = %d %s, want it kept in flight", r.status, r.body)
	}
	// The crash alert is built on this counter: a record kept in flight is
	// a crash's as much as one released.
	if m := scrape(t, "http://"+p.admin+"/metrics"); m["idemproxy_inflight_released_total"] != 1 {
		t.Errorf("idemproxy_inflight_released_total after a start on the full disk = %v, want 1 (the record kept in flight)",
			m["idemproxy_inflight_released_total"])
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, p.admin, http.StatusOK)
	time.Sleep(time.Until(executed.Add(retention + 100*time.Millisecond))) // the provider has forgotten the key
	retryExpired(t, p, gw, key)
}
