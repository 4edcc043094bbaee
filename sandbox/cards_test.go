package sandbox

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Written from the cards provider's documented behaviour.

func TestCardsKeyRequired(t *testing.T) {
	_, ts := start(t, Config{Provider: ProviderCards})
	issued := send(t, ts, "POST", "/cards", `{"amount":"50"}`, keyed("k-issue"))
	cardID := issued.field("card_id")
	// Without the header where it is required, the request fails the schema check (422).
	for _, path := range []string{"/cards", "/cards/" + cardID + "/topup", "/cards/" + cardID + "/close"} {
		t.Run(path, func(t *testing.T) {
			r := send(t, ts, "POST", path, `{"amount":"10"}`, nil)
			if r.status != http.StatusUnprocessableEntity || r.code() != "schema_validation_failed" {
				t.Fatalf("POST %s without key = %d %s, want 422 schema_validation_failed", path, r.status, r.body)
			}
		})
	}
}

// TestCardsRepeatReturnsOriginal: a repeat with the same key returns the
// original operation, even if the new request's body differs.
func TestCardsRepeatReturnsOriginal(t *testing.T) {
	s, ts := start(t, Config{Provider: ProviderCards})
	body := `{"tariff_id":"t-1","holder_external_id":"cust-1","amount":"50"}`
	first := send(t, ts, "POST", "/cards", body, keyed("k-1"))
	if first.status != http.StatusOK {
		t.Fatalf("issue = %d %s", first.status, first.body)
	}
	// The provider's example: issue, processing, 57.0464 held for 50 net.
	for field, want := range map[string]string{"kind": "issue", "status": "processing", "hold_amount": "57.0464",
		"net_amount": "50", "created_at": "2026-10-07T09:13:02Z"} {
		if got := first.field(field); got != want {
			t.Errorf("%s = %q, want %q", field, got, want)
		}
	}
	repeats := []struct {
		name, path, body string
	}{
		{"same body", "/cards", body},
		{"another body", "/cards", `{"tariff_id":"t-2","amount":"999"}`},
		{"another endpoint", "/cards/" + first.field("card_id") + "/topup", `{"amount":"5"}`},
	}
	for _, rp := range repeats {
		t.Run(rp.name, func(t *testing.T) {
			r := send(t, ts, "POST", rp.path, rp.body, keyed("k-1"))
			if r.status != first.status || !bytes.Equal(r.body, first.body) {
				t.Fatalf("repeat = %d %s, want the original %s", r.status, r.body, first.body)
			}
		})
	}
	if l := s.Ledger(); l.Executions != 1 || l.Replays != 3 || l.ByKey["k-1"] != 1 {
		t.Fatalf("ledger = %+v, want 1 execution and 3 replays", l)
	}
}

func TestCardsLifecycle(t *testing.T) {
	s, ts := start(t, Config{Provider: ProviderCards})
	card := send(t, ts, "POST", "/cards", `{"amount":"50"}`, keyed("k-issue")).field("card_id")
	steps := []struct {
		name, path, key, body string
		status                int
		kindOrCode            string
	}{
		{"topup", "/cards/" + card + "/topup", "k-topup", `{"amount":"10.5"}`, 200, "topup"},
		{"topup of unknown card", "/cards/nope/topup", "k-x", `{"amount":"1"}`, 404, "card_not_found"},
		{"topup with bad amount", "/cards/" + card + "/topup", "k-y", `{"amount":"-3"}`, 422, "schema_validation_failed"},
		{"close", "/cards/" + card + "/close", "k-close", ``, 200, "close"},
		// A 4xx with a business code (card_not_active, ...) is not repeated as is.
		{"topup of closed card", "/cards/" + card + "/topup", "k-late", `{"amount":"1"}`, 409, "card_not_active"},
		{"close again", "/cards/" + card + "/close", "k-close-2", `{}`, 409, "card_not_active"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			r := send(t, ts, "POST", st.path, st.body, keyed(st.key))
			got := r.code()
			if r.status == http.StatusOK {
				got = r.field("kind")
			}
			if r.status != st.status || got != st.kindOrCode {
				t.Fatalf("= %d %s, want %d %s", r.status, r.body, st.status, st.kindOrCode)
			}
		})
	}
	view := send(t, ts, "GET", "/cards/"+card, "", nil)
	if view.field("status") != "closed" || view.field("balance") != "60.5" {
		t.Errorf("GET card = %s, want closed with balance 60.5", view.body)
	}
	if l := s.Ledger(); l.Executions != 3 || l.Replays != 0 {
		t.Errorf("ledger = %+v, want issue, topup and close only", l)
	}
}

// TestCardholdersDedupByExternalID: the endpoint is idempotent by external_id.
func TestCardholdersDedupByExternalID(t *testing.T) {
	s, ts := start(t, Config{Provider: ProviderCards})
	a := send(t, ts, "POST", "/cardholders", `{"external_id":"cust-1","name":"Ann"}`, nil)
	b := send(t, ts, "POST", "/cardholders", `{"external_id":"cust-1","name":"Ann"}`, keyed("some-key"))
	c := send(t, ts, "POST", "/cardholders", `{"external_id":"cust-2"}`, nil)
	missing := send(t, ts, "POST", "/cardholders", `{"name":"nobody"}`, nil)
	if a.field("id") == "" || a.field("id") != b.field("id") || c.field("id") == a.field("id") {
		t.Errorf("holder ids = %q, %q, %q; want the first two equal, the third new", a.field("id"), b.field("id"), c.field("id"))
	}
	if missing.status != http.StatusUnprocessableEntity {
		t.Errorf("no external_id = %d, want 422", missing.status)
	}
	if l := s.Ledger(); l.Executions != 2 || l.Replays != 1 {
		t.Errorf("ledger = %+v, want 2 executions and 1 replay", l)
	}
}

// TestCardsConcurrentRepeatWaits holds the first issue in ExecuteHook; a
// repeat with the same key must end with the same operation, not a second.
func TestCardsConcurrentRepeatWaits(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	s, ts := start(t, Config{Provider: ProviderCards, ExecuteHook: func(Operation) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	}})
	results, errs := make([]result, 2), make([]error, 2)
	var wg sync.WaitGroup
	for i := range results {
		if i == 1 {
			<-entered // the first is executing
		}
		wg.Go(func() {
			results[i], errs[i] = trySend(context.Background(), ts, "POST", "/cards", `{"amount":"50"}`, keyed("k-1"))
		})
	}
	close(release)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("requests failed: %v, %v", errs[0], errs[1])
	}
	if !bytes.Equal(results[0].body, results[1].body) || results[0].status != http.StatusOK {
		t.Errorf("concurrent repeats = %s and %s, want one operation", results[0].body, results[1].body)
	}
	if l := s.Ledger(); l.Executions != 1 {
		t.Errorf("executions = %d, want 1", l.Executions)
	}
}

// TestCardsSignature: with a secret, each retry is signed anew (a new
// time); a stale, wrong or already used signature is refused before
// anything runs.
func TestCardsSignature(t *testing.T) {
	clk := newClock()
	s, ts := start(t, Config{Provider: ProviderCards, Secret: testSecret, Now: clk.Now})
	body := `{"amount":"50"}`
	signed := func(at time.Time, key string) http.Header {
		h := timestampAuth("POST", "/cards", body, at)
		h.Set("Idempotency-Key", key)
		return h
	}
	bad := signed(t0, "k-1")
	bad.Set("X-Signature", hmacHex([]byte("wrong"), "x"))
	tests := []struct {
		name   string
		header http.Header
		status int
		code   string
	}{
		{"stale timestamp", signed(t0.Add(-301*time.Second), "k-1"), 401, "timestamp_out_of_window"},
		{"wrong signature", bad, 401, "invalid_signature"},
		{"fresh signature", signed(t0, "k-1"), 200, ""},
		{"the same signature again (a retry in the same second)", signed(t0, "k-1"), 401, "signature_reused"},
		{"the same signature under another key", signed(t0, "k-2"), 401, "signature_reused"},
		{"retry re-signed later", signed(t0.Add(2*time.Minute), "k-1"), 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "retry re-signed later" {
				clk.Advance(2 * time.Minute)
			}
			r := send(t, ts, "POST", "/cards", body, tt.header)
			if r.status != tt.status || r.code() != tt.code {
				t.Fatalf("= %d %s, want %d %q", r.status, r.body, tt.status, tt.code)
			}
		})
	}
	if l := s.Ledger(); l.Executions != 1 || l.Replays != 1 {
		t.Errorf("ledger = %+v, want 1 execution and 1 replay", l)
	}
}

// TestCardsOperationStatuses: the provider's "failed: repeat with a new key"
// and "needs_review: do not repeat", produced by the magic amounts.
func TestCardsOperationStatuses(t *testing.T) {
	s, ts := start(t, Config{Provider: ProviderCards})
	failed := send(t, ts, "POST", "/cards", `{"amount":"`+AmountFailed+`0"}`, keyed("k-failed"))
	if failed.status != http.StatusOK || failed.field("status") != "failed" || failed.field("card_id") != "" {
		t.Fatalf("failed issue = %d %s, want a failed operation and no card", failed.status, failed.body)
	}
	// A repeat with a failed operation's key returns the same failed operation.
	if again := send(t, ts, "POST", "/cards", `{"amount":"50"}`, keyed("k-failed")); !bytes.Equal(again.body, failed.body) {
		t.Errorf("repeat of a failed key = %s, want the same failed operation", again.body)
	}
	// To try again, generate a new key.
	ok := send(t, ts, "POST", "/cards", `{"amount":"50"}`, keyed("k-new"))
	card := ok.field("card_id")
	if ok.field("status") != "processing" || card == "" {
		t.Fatalf("new key = %s", ok.body)
	}
	review := send(t, ts, "POST", "/cards/"+card+"/topup", `{"amount":"`+AmountNeedsReview+`"}`, keyed("k-review"))
	if review.status != http.StatusOK || review.field("status") != "needs_review" {
		t.Fatalf("needs_review top-up = %d %s", review.status, review.body)
	}
	// It may have gone through: the sandbox carries it out.
	if view := send(t, ts, "GET", "/cards/"+card, "", nil); view.field("balance") != "116.66" {
		t.Errorf("card after a needs_review top-up = %s, want balance 116.66", view.body)
	}
	failedTopup := send(t, ts, "POST", "/cards/"+card+"/topup", `{"amount":"`+AmountFailed+`"}`, keyed("k-ft"))
	if failedTopup.field("status") != "failed" {
		t.Errorf("failed top-up = %s", failedTopup.body)
	}
	if view := send(t, ts, "GET", "/cards/"+card, "", nil); view.field("balance") != "116.66" {
		t.Errorf("a failed top-up moved money: %s", view.body)
	}
	if l := s.Ledger(); l.Executions != 4 || l.Replays != 1 {
		t.Errorf("ledger = %d executions, %d replays; want 4 and 1", l.Executions, l.Replays)
	}
}

// TestCardsBalanceExhausted: a 4xx with a business code (balance_exhausted, ...)
// is not repeated as is: fix the cause. No reserve was created.
func TestCardsBalanceExhausted(t *testing.T) {
	s, ts := start(t, Config{Provider: ProviderCards, Balance: 100})
	card := send(t, ts, "POST", "/cards", `{"amount":"50"}`, keyed("k-issue")).field("card_id") // holds 57.0464
	for range 2 {                                                                               // nothing is reserved or remembered: the same answer again
		r := send(t, ts, "POST", "/cards/"+card+"/topup", `{"amount":"40"}`, keyed("k-big")) // would hold 45.64
		if r.status != http.StatusConflict || r.code() != "balance_exhausted" {
			t.Fatalf("top-up over the balance = %d %s, want 409 balance_exhausted", r.status, r.body)
		}
	}
	if r := send(t, ts, "POST", "/cards/"+card+"/topup", `{"amount":"30"}`, keyed("k-small")); r.status != http.StatusOK {
		t.Errorf("top-up within the balance = %d %s", r.status, r.body) // holds 34.23, leaving 8.73
	}
	if r := send(t, ts, "POST", "/cards", `{"amount":"10"}`, keyed("k-issue-2")); r.code() != "balance_exhausted" {
		t.Errorf("issue over what is left = %d %s, want balance_exhausted", r.status, r.body)
	}
	if l := s.Ledger(); l.Executions != 2 {
		t.Errorf("ledger = %d executions, want 2 (refusals are not executions)", l.Executions)
	}
}
