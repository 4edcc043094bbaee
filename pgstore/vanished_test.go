package pgstore

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestVanishedTransactionFreesItsRow: an operator's change (Reviewed, here)
// locks the record's row (SELECT ... FOR UPDATE), and then the network
// between that replica and the database loses every packet without closing
// the connection (a relay holds the change's UPDATE and everything after
// it). The replica's call ends at its call timeout; the server, which never
// hears of it, kept the session idle in its transaction, holding the row,
// until its TCP keepalive gave up (hours by default): every claim of that
// key from any replica, a replay of its stored answer included, waited out
// its call timeout and failed (503 store_unavailable), and so did every
// other claim and final answer batched in the same statement. Sessions are
// now opened with idle_in_transaction_session_timeout at the call timeout:
// no gap inside idemproxy's own transactions is longer, since a call ends
// there, so the server ends such a session and frees the row.
func TestVanishedTransactionFreesItsRow(t *testing.T) {
	db := pgtest.Database(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	w := relay(t, u.Host)
	defer w.release()
	u.Host = w.l.Addr().String()
	const timeout = time.Second
	cut, err := Open(context.Background(), Options{URL: u.String(), CallTimeout: timeout, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	other := open(t, db, time.Hour) // another replica: call timeout 5 s

	ctx := context.Background()
	id := store.ID{Key: "vanished-1"}
	req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/v1/payments", UpstreamKey: "vanished-1"}
	if _, created, err := other.Begin(ctx, id, req, "owner-1", time.Minute); err != nil || !created {
		t.Fatal(created, err)
	}
	resp := store.Response{Status: http.StatusCreated, Body: []byte(`{"id":"pay_1","status":"needs_review"}`)}
	if err := other.Complete(ctx, id, "owner-1", resp, time.Time{}); err != nil {
		t.Fatal(err)
	}

	w.mu.Lock()
	w.holdAt = "reviewed = true" // the row is locked; the change never arrives
	w.mu.Unlock()
	if _, _, err := cut.Reviewed(ctx, id); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Reviewed with its connection lost mid-transaction = %v, want unavailable", err)
	}

	began := time.Now()
	rec, created, err := other.Begin(ctx, id, req, "owner-2", time.Minute)
	if err != nil || created || rec.State != store.Final || string(rec.Response.Body) != string(resp.Body) {
		t.Fatalf("the stored answer, from another replica after the lost transaction: created=%v state=%v err=%v after %v, want the final record",
			created, rec.State, err, time.Since(began).Round(time.Millisecond))
	}
}

// TestURLIdleInTransactionKept: an idle_in_transaction_session_timeout the
// URL gives is the session's as given; without one, the call timeout is.
func TestURLIdleInTransactionKept(t *testing.T) {
	base := "postgres://u@127.0.0.1:5432/db"
	for query, want := range map[string]string{"": "5000", "?idle_in_transaction_session_timeout=60s": "60s"} {
		_, set, err := poolConfig(withDefaults(Options{URL: base + query}))
		if err != nil {
			t.Fatal(err)
		}
		if got := set["idle_in_transaction_session_timeout"]; got != want {
			t.Errorf("URL %q: idle_in_transaction_session_timeout %q, want %q", query, got, want)
		}
	}
}
