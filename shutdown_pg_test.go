package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestShutdownParksWhatTheDrainCouldNotStore: replica a runs a payment (the
// provider holds it) when the database stops; a gets SIGTERM, and the
// provider then answers. a can neither store the answer nor park the
// operation as unknown (the database is down), so the park waits to be
// redone; the database is back within the shutdown grace. a must park the
// record before it closes the store, keeping what it knew: the first send
// and the provider's answer, for the status probe and the retention check of
// the app's retry. Before, a closed the store as soon as the drain ended,
// dropping the park: the record stayed in flight under a's claim, until
// another replica's sweep would park it a minute after its lease, with the
// claim time as its first send and no last answer.
func TestShutdownParksWhatTheDrainCouldNotStore(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer prov.Release()
	a := launch(t, launchSpec{env: sharedEnv(up.URL, url, "IDEMPROXY_SHUTDOWN_GRACE=30s")})
	waitReady(t, "start", a)
	reply := goSend("POST", "http://"+a.proxy+"/v1/payments", `{"order_id":"drained-1","amount":"3.00"}`)
	key := <-prov.entered
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.waitLine(t, `"msg":"shutting down`)
	prov.Release() // the provider executes it; its answer cannot be stored
	a.waitLine(t, "keeping an operation whose outcome is unknown failed")
	if r := <-reply; r.err != nil || r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "may have been executed") {
		t.Errorf("the app's answer = %+v, want 503 store_unavailable saying the operation may have been executed", r)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-time.After(30*time.Second + exitMargin):
		t.Fatalf("a still runs %s after the database is back (grace 30 s):\n%s", 30*time.Second+exitMargin, a.text())
	}
	if a.err != nil {
		t.Errorf("a exited with %v, want 0: the park was done within the grace\n%s", a.err, a.text())
	}

	b := launch(t, launchSpec{env: sharedEnv(up.URL, url)})
	rec := send(t, "GET", "http://"+b.admin+"/admin/v1/records/"+key+"?body=1", "")
	t.Logf("record after a stopped: %s", rec.body)
	if rec.status != http.StatusOK || !strings.Contains(rec.body, `"state":"unknown"`) ||
		strings.Contains(rec.body, `"first_sent_at":null`) || !strings.Contains(rec.body, "could not be stored") ||
		!strings.Contains(rec.body, "pay_"+key[:8]) {
		t.Errorf("record after a stopped = %d %s; want it unknown, with its first send, the error and the provider's answer\n%s",
			rec.status, rec.body, a.text())
	}
}

// TestSecondSIGTERMOnPostgresSaysTheLeaseResumes: a second SIGTERM during
// the drain of a replica on PostgreSQL ends it at once, as on Badger, but
// its operation in flight is not "released at the next start" (the WARN
// line said so on both stores): its record stays in flight under the dead
// replica's lease, and the app's retry on another replica resumes it with
// the same key once the lease is over. The line now says that, and the
// retry does it: one execution at the provider, the answer to the app.
func TestSecondSIGTERMOnPostgresSaysTheLeaseResumes(t *testing.T) {
	url := pgtest.Database(t)
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer prov.Release()
	env := sharedEnv(up.URL, url, "IDEMPROXY_SHUTDOWN_GRACE=2m", "IDEMPROXY_STORE_LEASE=2s", "IDEMPROXY_INFLIGHT_WAIT=1m")
	a := launch(t, launchSpec{env: env})
	body := `{"order_id":"twice-pg-1","amount":"10.00"}`
	goSend("POST", "http://"+a.proxy+"/v1/payments", body)
	key := <-prov.entered

	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.waitLine(t, "proxy listener closed")
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-time.After(time.Minute):
		t.Fatalf("still draining a minute after the second SIGTERM:\n%s", a.text())
	}
	line := a.waitLine(t, "second signal during the drain")
	if strings.Contains(line, "next start") || !strings.Contains(line, "lease") {
		t.Errorf("the WARN line on PostgreSQL says what Badger does, not that the lease ends it:\n%s", line)
	}
	prov.Release() // the provider executes the cut attempt; nobody gets its answer

	b := launch(t, launchSpec{env: env})
	r := send(t, "POST", "http://"+b.proxy+"/v1/payments", body)
	if r.status != http.StatusCreated || !strings.Contains(r.body, "pay_"+key[:8]) {
		t.Errorf("the retry on b = %d %s, want the provider's answer under the same key\n%s", r.status, r.body, b.text())
	}
	prov.mu.Lock()
	execs, seen := prov.execs[key], prov.seen[key]
	prov.mu.Unlock()
	if execs != 1 || seen != 2 {
		t.Errorf("the key reached the provider %d times and was executed %d times, want 2 and 1", seen, execs)
	}
}
