package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
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
func TestReleaseOnFullDiskKeepsInFlight(t *testing.T) {
	mnt := smallDisk(t)
	const retention = time.Second
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var holdFirst sync.Once
	gw := newGatewayProvider(t, sandbox.Config{KeyRetention: retention, ExecuteHook: func(sandbox.Operation) {
		holdFirst.Do(func() { close(held); <-release })
	}})
	up := httptest.NewServer(gw)
	t.Cleanup(func() { once.Do(func() { close(release) }); up.Close() })
	// A lease of 14 s (budget + attempt timeout + 10 s); the retry waits it out.
	env := baseEnv(up.URL, filepath.Join(mnt, "data"), "IDEMPROXY_RETRY_MAX_ATTEMPTS=1",
		"IDEMPROXY_ATTEMPT_TIMEOUT=2s", "IDEMPROXY_RETRY_BUDGET=2s", "IDEMPROXY_INFLIGHT_WAIT=1m",
		"IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())
	p := launch(t, launchSpec{env: env})
	go trySend("POST", "http://"+p.proxy+"/payments", paymentBody)
	<-held // the payment is at the provider
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	once.Do(func() { close(release) }) // the provider executes it, its answer goes nowhere
	for deadline := time.Now().Add(10 * time.Second); gw.sb.Ledger().Executions != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox executed %d payments, want 1", gw.sb.Ledger().Executions)
		}
	}
	executed := time.Now()
	key, _ := onlyKey(t, mustPosts(gw))

	// Below the reserve (260 MiB), with room for the replay of the WAL.
	filler := filepath.Join(mnt, "filler")
	fill(t, filler)
	fi, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, fi.Size()-100<<20); err != nil {
		t.Fatal(err)
	}

	p = launch(t, launchSpec{env: env})
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

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, p.admin, http.StatusOK)
	time.Sleep(time.Until(executed.Add(retention + 100*time.Millisecond))) // the provider has forgotten the key
	r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if r.status != http.StatusConflict || !strings.Contains(r.body, `"idempotency_key_expired"`) {
		t.Errorf("retry once the space is back = %d %s, want 409 idempotency_key_expired with nothing sent", r.status, r.body)
	}
	if rec := send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+key, ""); !strings.Contains(rec.body, `"state":"unknown"`) ||
		strings.Contains(rec.body, `"first_sent_at":null`) {
		t.Errorf("record after the retry = %d %s, want it unknown with its first send", rec.status, rec.body)
	}
	if k, n := onlyKey(t, mustPosts(gw)); k != key || n != 1 || gw.sb.Ledger().Executions != 1 {
		t.Fatalf("provider saw %d POSTs under %s and executed %d payments, want 1 and 1", n, k, gw.sb.Ledger().Executions)
	}
}
