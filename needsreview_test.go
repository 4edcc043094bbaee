package main

// End-to-end test of a final answer that needs review: kept past
// IDEMPROXY_RECORD_TTL until an operator marks it reviewed, through the
// real binary in front of the cards sandbox, on both stores.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// TestNeedsReviewOutlivesRecordTTL: a needs_review answer is final, never
// retried, and listed for operators however long the review takes. Past
// the TTL it is still listed and the app's retry is a replay, with nothing
// sent (a provider that keeps keys for less time than the review would run
// the operation again), while an ordinary answer of the same age has
// expired. Once an operator marks it reviewed (records reviewed) it leaves
// the listing, is still replayed until a TTL from then, and is then
// forgotten like any final answer.
func TestNeedsReviewOutlivesRecordTTL(t *testing.T) { onStores(t, testNeedsReviewOutlivesRecordTTL) }

func testNeedsReviewOutlivesRecordTTL(t *testing.T, shared bool) {
	const ttl = 13 * time.Second // the shortest the lease below allows
	gw := newGatewayProvider(t, sandbox.Config{Provider: sandbox.ProviderCards})
	sb := gw.sb
	up := httptest.NewServer(gw)
	defer up.Close()
	sent := func(key string) int { return mustPosts(gw)[key] } // what reached the provider under key
	env := []string{"IDEMPROXY_RETRY_MAX_ATTEMPTS=1", "IDEMPROXY_RETRY_BUDGET=1s", "IDEMPROXY_ATTEMPT_TIMEOUT=1s",
		"IDEMPROXY_STORE_LEASE=2s", "IDEMPROXY_RECORD_TTL=" + ttl.String(), "IDEMPROXY_ADMIN_TOKEN=" + adminToken}
	c := &cardsSetup{sb: sb}
	if shared {
		c.p = launch(t, launchSpec{env: sharedEnv(up.URL, pgtest.Database(t), env...)})
	} else {
		c.p = launch(t, launchSpec{env: baseEnv(up.URL, t.TempDir(), env...)})
	}
	c.adm = c.p
	type record struct {
		State       string     `json:"state"`
		NeedsReview bool       `json:"needs_review"`
		Reviewed    bool       `json:"reviewed"`
		ExpiresAt   *time.Time `json:"expires_at"`
	}
	get := func(key string) (record, int) {
		t.Helper()
		r := c.admin(t, "GET", "/admin/v1/records/"+key, "")
		var rec record
		if r.status == http.StatusOK {
			if err := json.Unmarshal([]byte(r.body), &rec); err != nil {
				t.Fatalf("GET record %s = %s: %v", key, r.body, err)
			}
		}
		return rec, r.status
	}
	listed := func(key string) bool {
		t.Helper()
		r := c.admin(t, "GET", "/admin/v1/records?state=needs_review&limit=1000", "")
		if r.status != http.StatusOK {
			t.Fatalf("list needs_review = %d %s", r.status, r.body)
		}
		return strings.Contains(r.body, `"key":"`+key+`"`)
	}

	first := c.post(t, "F-review", sandbox.AmountNeedsReview)
	written := time.Now()
	if first.status != http.StatusOK || !strings.Contains(first.body, `"needs_review"`) {
		t.Fatalf("POST F-review = %d %s, want needs_review", first.status, first.body)
	}
	key := first.header.Get("Idempotency-Key")
	plain := c.post(t, "F-plain", "10")
	plainKey := plain.header.Get("Idempotency-Key")
	if plain.status != http.StatusOK || plainKey == "" || key == "" {
		t.Fatalf("POST F-plain = %d %s (key %q), F-review key %q", plain.status, plain.body, plainKey, key)
	}
	before, _ := get(key)
	t.Logf("needs_review record as stored: %+v", before)

	// Past the TTL, rounded up to the next second as stores may round it.
	time.Sleep(time.Until(written.Add(ttl + 1500*time.Millisecond)))
	if !listed(key) {
		t.Errorf("past the TTL, %s is not listed under needs_review", key)
	}
	again := c.post(t, "F-review", sandbox.AmountNeedsReview)
	if again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
		t.Errorf("retry of F-review past the TTL = %d %s (replayed %q), want the stored answer replayed",
			again.status, again.body, again.header.Get("Idempotent-Replayed"))
	}
	if n := sent(key); n != 1 {
		t.Errorf("the provider saw %d requests with key %s, want 1: the retry must not reach it", n, key)
	}
	if rec, status := get(key); status != http.StatusOK || rec.ExpiresAt != nil || !rec.NeedsReview || rec.Reviewed {
		t.Errorf("record past the TTL = %d %+v, want it final, needs_review, never expiring", status, rec)
	}
	if t.Failed() {
		t.FailNow()
	}
	// The TTL is in force: the ordinary answer of the same age expired, and
	// its retry went to the provider (which replays it by its key).
	if r := c.post(t, "F-plain", "10"); r.status != http.StatusOK || sent(plainKey) != 2 {
		t.Fatalf("retry of F-plain past the TTL = %d %s, provider saw %d requests; want it sent again (2)", r.status, r.body, sent(plainKey))
	}
	out, code := c.cli(t, "records", "list", "--state", "needs_review")
	if code != 0 || !strings.Contains(out, key) {
		t.Fatalf("idemproxy records list --state needs_review = %d\n%s\nwant %s listed", code, out, key)
	}

	// Refused in the contract's error shape: the ordinary answer needs no review.
	if r := c.admin(t, "POST", "/admin/v1/records/reviewed", `{"key":"`+plainKey+`"}`); r.status != http.StatusConflict ||
		r.header.Get("Content-Type") != "application/json" || !strings.Contains(r.body, `{"error":{"code":"review_refused","message":"`) {
		t.Fatalf("reviewed of an ordinary answer = %d %s, want 409 review_refused", r.status, r.body)
	}
	if out, code := c.cli(t, "records", "reviewed", plainKey); code != 1 || !strings.Contains(out, "review_refused") {
		t.Fatalf("idemproxy records reviewed %s (no review) = %d\n%s\nwant exit 1 with review_refused", plainKey, code, out)
	}

	// The provider's event settled it: the operator marks it reviewed.
	out, code = c.cli(t, "records", "reviewed", key)
	marked := time.Now()
	if code != 0 || !strings.Contains(out, "marked reviewed") {
		t.Fatalf("idemproxy records reviewed %s = %d\n%s", key, code, out)
	}
	if line := c.adm.waitLine(t, `"msg":"admin: answer that needed review marked reviewed`); !strings.Contains(line, `"key":"`+key+`"`) {
		t.Fatalf("the log line of the change does not name the key: %s", line)
	}
	if listed(key) {
		t.Fatalf("%s is still listed under needs_review after records reviewed", key)
	}
	rec, status := get(key)
	if status != http.StatusOK || !rec.Reviewed || !rec.NeedsReview || rec.ExpiresAt == nil ||
		rec.ExpiresAt.Before(marked.Add(ttl-2*time.Second)) || rec.ExpiresAt.After(marked.Add(ttl+2*time.Second)) {
		t.Fatalf("record after records reviewed = %d %+v, want it reviewed, expiring about %v from then", status, rec, ttl)
	}
	if r := c.post(t, "F-review", sandbox.AmountNeedsReview); r.header.Get("Idempotent-Replayed") != "true" || sent(key) != 1 {
		t.Fatalf("retry after records reviewed, before its TTL = %d %s, provider saw %d; want a replay, nothing sent",
			r.status, r.body, sent(key))
	}

	// A TTL later it is forgotten like any final answer: the next retry goes
	// to the provider, which answers it by the key it keeps.
	time.Sleep(time.Until(rec.ExpiresAt.Add(1500 * time.Millisecond)))
	if _, status := get(key); status != http.StatusNotFound {
		t.Fatalf("record a TTL after records reviewed = %d, want 404 (expired)", status)
	}
	if r := c.post(t, "F-review", sandbox.AmountNeedsReview); r.status != http.StatusOK || sent(key) != 2 ||
		r.header.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("retry a TTL after records reviewed = %d %s, provider saw %d; want it sent (2)", r.status, r.body, sent(key))
	}
	if n := sb.Ledger().ByOrder["F-review"]; n != 1 {
		t.Fatalf("F-review executed %d times, want 1", n)
	}
}
