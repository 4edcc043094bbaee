package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// lookupProvider executes a payment on its first POST and then holds the
// answer until the test ends (the process sending it is killed meanwhile);
// GET /payments/by-order/{order_id} finds an executed payment (200) or not
// (404). It counts POSTs and lookups.
type lookupProvider struct {
	entered chan struct{} // closed when the first POST has executed
	release chan struct{} // closed at test end: the held answer goes nowhere

	mu       sync.Mutex
	executed map[string]bool // order_id → executed
	posts    int
	lookups  int
}

func (p *lookupProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if order, ok := strings.CutPrefix(r.URL.Path, "/payments/by-order/"); ok && r.Method == http.MethodGet {
		p.mu.Lock()
		p.lookups++
		found := p.executed[order]
		p.mu.Unlock()
		if !found {
			http.Error(w, `{"error":{"code":"not_found"}}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"order_id":%q,"status":"succeeded"}`, order)
		return
	}
	var in struct {
		OrderID string `json:"order_id"`
	}
	b, _ := io.ReadAll(r.Body)
	json.Unmarshal(b, &in)
	p.mu.Lock()
	p.posts++
	first := p.posts == 1
	p.executed[in.OrderID] = true
	p.mu.Unlock()
	if first {
		close(p.entered)
		<-p.release
		return
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":%q,"status":"succeeded","second":true}`, in.OrderID)
}

// checkSentNotBeforeCreated reads key's record from p's admin API and wants
// its first_sent_at set and not before its created_at.
func checkSentNotBeforeCreated(t *testing.T, p *opsProc, key string) {
	t.Helper()
	a := send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+url.PathEscape(key), "")
	var rec struct {
		CreatedAt   time.Time  `json:"created_at"`
		FirstSentAt *time.Time `json:"first_sent_at"`
	}
	if err := json.Unmarshal([]byte(a.body), &rec); a.status != http.StatusOK || err != nil {
		t.Fatalf("record %q = %d %s (%v)", key, a.status, a.body, err)
	}
	if rec.FirstSentAt == nil || rec.FirstSentAt.Before(rec.CreatedAt) {
		var off time.Duration
		if rec.FirstSentAt != nil {
			off = rec.FirstSentAt.Sub(rec.CreatedAt)
		}
		t.Errorf("record = %s: first_sent_at %v after created_at, want set and not before it", a.body, off)
	}
}

// An operation in flight when its process dies (SIGKILL, OOM) may have
// reached the provider: it is an operation whose outcome is unknown, listed
// as such, and its re-send is preceded by the status probe, on the restarted
// process (Badger) as on the replica that takes its key over (PostgreSQL).
// The probe finds the payment: its answer is the stored result, and the
// provider never sees the POST again.
func TestKilledMidAttemptIsUnknown(t *testing.T) {
	const body = `{"order_id":"crash-1","amount":"10.00"}`
	probe := "IDEMPROXY_STATUS_PROBE=GET /payments/by-order/{req.order_id}"
	cases := []struct {
		name   string
		launch func(t *testing.T, upstream string) (first func() *opsProc, second func() *opsProc)
	}{
		{"Badger, restarted", func(t *testing.T, upstream string) (func() *opsProc, func() *opsProc) {
			env := baseEnv(upstream, t.TempDir(), probe)
			return func() *opsProc { return launch(t, launchSpec{env: env}) },
				func() *opsProc { return launch(t, launchSpec{env: env}) }
		}},
		{"PostgreSQL, taken over", func(t *testing.T, upstream string) (func() *opsProc, func() *opsProc) {
			env := sharedEnv(upstream, pgtest.Database(t), probe, "IDEMPROXY_STORE_LEASE=2s", "IDEMPROXY_INFLIGHT_WAIT=1m")
			a, b := launch(t, launchSpec{env: env}), launch(t, launchSpec{env: env})
			return func() *opsProc { return a }, func() *opsProc { return b }
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prov := &lookupProvider{entered: make(chan struct{}), release: make(chan struct{}), executed: map[string]bool{}}
			up := httptest.NewServer(prov)
			defer up.Close()
			defer close(prov.release)
			first, second := c.launch(t, up.URL)
			a := first()
			go func() {
				if resp, err := http.Post("http://"+a.proxy+"/payments", "application/json", strings.NewReader(body)); err == nil {
					resp.Body.Close()
				}
			}()
			<-prov.entered // executed; the answer is held
			if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-a.done
			b := second()
			if c.name == "Badger, restarted" {
				list := send(t, "GET", "http://"+b.admin+"/admin/v1/records?state=unknown", "")
				if !strings.Contains(list.body, `"state":"unknown"`) || !strings.Contains(list.body, `"path":"/payments"`) {
					t.Fatalf("unknown records after the restart = %s, want the killed operation", list.body)
				}
			}
			r := send(t, "POST", "http://"+b.proxy+"/payments", body)
			if r.status != http.StatusOK || r.header.Get("Idemproxy-Reconciled") != "true" || !strings.Contains(r.body, `"crash-1"`) {
				t.Fatalf("the app's retry = %d %s (reconciled %q), want the payment the probe found\n%s",
					r.status, r.body, r.header.Get("Idemproxy-Reconciled"), b.text())
			}
			// The record as the operator reads it: never sent before it was
			// created. On PostgreSQL the takeover's first send (the claim
			// time, created_at) came back from the replica 6 ms earlier.
			checkSentNotBeforeCreated(t, b, r.header.Get("Idempotency-Key"))
			prov.mu.Lock()
			defer prov.mu.Unlock()
			if prov.posts != 1 || prov.lookups != 1 {
				t.Fatalf("provider saw %d POSTs and %d lookups, want 1 POST (never re-sent) and 1 lookup", prov.posts, prov.lookups)
			}
		})
	}
}
