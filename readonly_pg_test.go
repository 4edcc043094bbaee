package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestRepeatsOnReadOnlyDatabase: two replicas; the database turns read-only
// (a failover to a standby, or default_transaction_read_only set by a
// managed service) after one payment was answered and while another is at
// the provider. The stored answers still read, so on the other replica the
// repeat of the answered payment gets its answer replayed byte for byte and
// the same order with another body 409 idempotency_conflict; a repeat of
// the payment in flight waits for it and gets 409 idempotency_in_progress
// with Retry-After; a new order gets 503 store_unavailable; nothing of these
// reaches the provider. Before, all of them got 503 "the idempotency record
// store cannot be written; nothing was sent upstream", the repeat of the
// payment in flight included, though its operation was running: an app
// that takes a 503 for a failed payment had the answered one failed too.
func TestRepeatsOnReadOnlyDatabase(t *testing.T) {
	_, url := pgtest.Own(t, pgtest.Options{})
	var mu sync.Mutex
	seen := map[string]int{}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		if strings.Contains(string(b), "held") {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%s"}`, r.Header.Get("Idempotency-Key")[:8])
	}))
	defer up.Close()
	defer close(release)
	total := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, v := range seen {
			n += v
		}
		return n
	}
	env := sharedEnv(up.URL, url, "IDEMPROXY_INFLIGHT_WAIT=1s")
	a := launch(t, launchSpec{env: env})
	b := launch(t, launchSpec{env: env})

	paid := `{"order_id":"ro-paid","amount":"10.00"}`
	first := send(t, "POST", "http://"+a.proxy+"/v1/payments", paid)
	if first.status != http.StatusCreated {
		t.Fatalf("first payment: %d %s", first.status, first.body)
	}
	held := `{"order_id":"ro-held","amount":"5.00"}`
	heldAnswer := goSend("POST", "http://"+a.proxy+"/v1/payments", held)
	<-entered

	ctx := context.Background()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{`SET default_transaction_read_only = off`,
		`ALTER SYSTEM SET default_transaction_read_only = on`, `SELECT pg_reload_conf()`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		admin.Exec(ctx, `ALTER SYSTEM SET default_transaction_read_only = off`)
		admin.Exec(ctx, `SELECT pg_reload_conf()`)
	}()
	for deadline := time.Now().Add(30 * time.Second); getStatus(t, "http://"+b.admin+"/readyz") != http.StatusServiceUnavailable; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("/readyz still 200 30 s after the database turned read-only")
		}
	}
	before := total()

	r := send(t, "POST", "http://"+b.proxy+"/v1/payments", paid)
	if r.status != http.StatusCreated || r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("repeat of the answered payment on a read-only database = %d %s replayed=%q, want the replay of 201 %s",
			r.status, r.body, r.header.Get("Idempotent-Replayed"), first.body)
	}
	r = send(t, "POST", "http://"+b.proxy+"/v1/payments", `{"order_id":"ro-paid","amount":"99.00"}`)
	if r.status != http.StatusConflict || !strings.Contains(r.body, `"idempotency_conflict"`) {
		t.Errorf("the answered order with another body on a read-only database = %d %s, want 409 idempotency_conflict", r.status, r.body)
	}
	r = send(t, "POST", "http://"+b.proxy+"/v1/payments", held)
	if r.status != http.StatusConflict || !strings.Contains(r.body, `"idempotency_in_progress"`) || r.header.Get("Retry-After") == "" {
		t.Errorf("repeat of the payment in flight on a read-only database = %d %s Retry-After=%q, want 409 idempotency_in_progress with Retry-After",
			r.status, r.body, r.header.Get("Retry-After"))
	}
	r = send(t, "POST", "http://"+b.proxy+"/v1/payments", `{"order_id":"ro-new","amount":"1.00"}`)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, `"store_unavailable"`) {
		t.Errorf("new order on a read-only database = %d %s, want 503 store_unavailable", r.status, r.body)
	}
	if n := total() - before; n != 0 {
		t.Errorf("%d requests reached the provider on a read-only database, want none", n)
	}
	release <- struct{}{} // the held payment is answered; its answer cannot be stored
	if h := <-heldAnswer; h.err != nil || h.status != http.StatusServiceUnavailable {
		t.Errorf("the held payment's answer with the database read-only = %d %s %v, want 503 (it may have run)", h.status, h.body, h.err)
	}
}
