package proxy_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/syncbuf"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// TestLeaseRenewedWhileAttemptsRun holds the provider's answer for longer
// than the lease: the lease is renewed meanwhile, so at a moment past the
// first lease's end the record is still in flight under a live lease, and no
// other replica could take it over.
func TestLeaseRenewedWhileAttemptsRun(t *testing.T) {
	const lease = 3 * time.Second
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.Lease = lease })
	e.prov.hold = make(chan struct{})
	e.prov.entered = make(chan string, 1)
	first := e.goSend("POST", "/v1/payments", order)
	id := store.ID{Tenant: proxy.DefaultTenant, Key: <-e.prov.entered}
	start, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for time.Now().Before(start.LeaseUntil.Add(100 * time.Millisecond)) {
		time.Sleep(50 * time.Millisecond)
	}
	rec, err := e.store.Get(context.Background(), id)
	if err != nil || rec.State != store.InFlight || !rec.LeaseUntil.After(time.Now()) || rec.Owner != start.Owner {
		t.Fatalf("past the first lease's end: %+v, %v; want the same owner under a renewed lease", rec, err)
	}
	close(e.prov.hold)
	if a := <-first; a.err != nil || a.status != http.StatusCreated {
		t.Fatalf("answer %d %s %v, want 201", a.status, a.body, a.err)
	}
}

// TestLostLeaseStopsTheOperation takes the record away from its owner while
// the provider holds the attempt (as a takeover by another replica would):
// the next renewal finds it lost, the operation stops, and the app is told
// the key is in progress elsewhere instead of getting an answer this replica
// may no longer store.
func TestLostLeaseStopsTheOperation(t *testing.T) {
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.Lease = 300 * time.Millisecond })
	e.prov.hold = make(chan struct{})
	defer close(e.prov.hold)
	e.prov.entered = make(chan string, 1)
	first := e.goSend("POST", "/v1/payments", order)
	id := store.ID{Tenant: proxy.DefaultTenant, Key: <-e.prov.entered}
	rec, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Abandon(context.Background(), id, rec.Owner); err != nil {
		t.Fatal(err)
	}
	a := <-first
	if a.err != nil || a.status != http.StatusConflict || errorCode(t, a.answer) != "idempotency_in_progress" {
		t.Fatalf("answer after the lease was lost: %d %s %v, want 409 idempotency_in_progress", a.status, a.body, a.err)
	}
}

// TestLostLeaseLogsTheAttemptsMade: a replica whose lease was taken over
// while its attempt ran (it stalled, another replica resumed the key) made
// that attempt: the provider may have acted on it. Its request log said
// attempts 0, as for a request that sent nothing, and no line said what had
// become of the operation. The request's summary (the request log and the
// metrics) counts the attempt, and a WARN line names the key, the attempts
// made and that the replica that took the key over resumes it with the
// same key, this one storing nothing.
func TestLostLeaseLogsTheAttemptsMade(t *testing.T) {
	var logs syncbuf.Buffer
	done := make(chan proxy.Summary, 1)
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.Lease = 300 * time.Millisecond
		o.OnDone = func(s proxy.Summary) { done <- s }
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	e.prov.hold = make(chan struct{})
	defer close(e.prov.hold)
	e.prov.entered = make(chan string, 1)
	first := e.goSend("POST", "/v1/payments", order)
	id := store.ID{Tenant: proxy.DefaultTenant, Key: <-e.prov.entered}
	rec, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Abandon(context.Background(), id, rec.Owner); err != nil {
		t.Fatal(err)
	}
	if a := <-first; a.err != nil || a.status != http.StatusConflict {
		t.Fatalf("answer after the lease was lost: %d %s %v, want 409", a.status, a.body, a.err)
	}
	if s := <-done; s.Attempts != 1 {
		t.Errorf("summary: outcome %s attempts %d, want the 1 attempt made", s.Outcome, s.Attempts)
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l struct {
			Level, Msg, Key, Reason string
			Attempts                *int
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Key != id.Key || l.Attempts == nil {
			continue
		}
		if l.Level == "WARN" && *l.Attempts == 1 && strings.Contains(l.Msg, "lease") && strings.Contains(l.Msg, "same key") &&
			strings.Contains(l.Reason, "took the key over") {
			found = true
		}
	}
	if !found {
		t.Errorf("no WARN line naming the key, 1 attempt, the lost lease, that another replica took it over and the resume with the same key:\n%s", logs.String())
	}
}

// renewFails is a real store whose lease renewals never reach it.
type renewFails struct{ proxy.Store }

func (renewFails) Renew(context.Context, store.ID, string, time.Duration) error {
	return store.ErrUnavailable
}

// TestLeaseRanOutLogsWhy: no renewal reached the store for a whole lease
// (the replica cut off from its database) while the provider held the
// attempt: the attempt is cut and the request answered in progress, as for
// a lease taken over, but nobody has taken the key over yet. The line
// saying the lease was lost must say so, not that another replica took it.
func TestLeaseRanOutLogsWhy(t *testing.T) {
	var logs syncbuf.Buffer
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.Lease = 300 * time.Millisecond
		o.Store = renewFails{o.Store}
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	e.prov.hold = make(chan struct{})
	defer close(e.prov.hold)
	e.prov.entered = make(chan string, 1)
	first := e.goSend("POST", "/v1/payments", order)
	key := <-e.prov.entered
	if a := <-first; a.err != nil || a.status != http.StatusConflict {
		t.Fatalf("answer after the lease ran out: %d %s %v, want 409", a.status, a.body, a.err)
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l struct{ Msg, Key, Reason string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Key == key && strings.Contains(l.Msg, "lease lost mid-operation") {
			found = true
			if !strings.Contains(l.Reason, "ran out") || strings.Contains(l.Reason, "took the key over") {
				t.Errorf("lost lease logged with reason %q, want that it ran out with no renewal reaching the store", l.Reason)
			}
		}
	}
	if !found {
		t.Errorf("no 'lease lost mid-operation' line for the key:\n%s", logs.String())
	}
}
