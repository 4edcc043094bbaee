package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// TestResumeKeepsUpstreamKeyAcrossKeySecrets: two replicas with client
// identities whose IDEMPROXY_KEY_SECRET differs (a rolling change of the
// secret, or one replica set up by hand). Replica a sends a payment; the
// provider executes it and answers 504, so a keeps it as unknown. The app's
// retry reaches replica b, which binds the app's key to another upstream
// key: it must resume the operation under the key a sent it with, and the
// provider answers with the payment it made. Before, b sent its own binding,
// and the provider executed the payment a second time.
func TestResumeKeepsUpstreamKeyAcrossKeySecrets(t *testing.T) {
	url := pgtest.Database(t)
	g := newGatewayProvider(t, sandbox.Config{})
	g.lose = 1 // a's attempt executes, then 504
	up := httptest.NewServer(g)
	defer up.Close()
	const token = "shop-token-0123456789"
	env := func(secret string) []string {
		return sharedEnv(up.URL, url, "IDEMPROXY_CLIENT_TOKENS=shop="+token, "IDEMPROXY_KEY_SECRET="+secret,
			"IDEMPROXY_RETRY_MAX_ATTEMPTS=1")
	}
	a := launch(t, launchSpec{env: env("secret-of-a-0123456789")})
	b := launch(t, launchSpec{env: env("secret-of-b-0123456789")})
	order := `{"order_id":"rotated-1","amount":"10.00","currency":"EUR"}`

	first := send(t, "POST", "http://"+a.proxy+"/payments", order, "Idemproxy-Client-Token", token)
	if first.status != http.StatusBadGateway || !strings.Contains(first.body, `"upstream_unavailable"`) {
		t.Fatalf("through a: %d %s, want 502 upstream_unavailable (the provider executed it and answered 504)", first.status, first.body)
	}
	retry := send(t, "POST", "http://"+b.proxy+"/payments", order, "Idemproxy-Client-Token", token)
	led := g.sb.Ledger()
	g.mu.Lock()
	posts := g.posts
	g.mu.Unlock()
	if retry.status != http.StatusCreated || led.Executions != 1 || len(posts) != 1 {
		t.Fatalf("retry through b: %d %s; the provider executed the payment %d times, POSTs per upstream key %v; "+
			"want 201 from one execution, both POSTs under a's key\n%s", retry.status, retry.body, led.Executions, posts, b.text())
	}
	if !strings.Contains(b.text(), "IDEMPROXY_KEY_SECRET differs") {
		t.Errorf("b resumed under a's upstream key without a warning:\n%s", b.text())
	}
}

// TestReplicasWithOtherKeySettingsAreTold: two replicas of one provider on
// one database whose IDEMPROXY_KEY_SOURCES differ (a rolling change, or one
// replica set up by hand) give an order with both fields two keys: the
// provider executed it twice when its retry went to the other replica.
// Both must say so in an error naming the variables, within heartbeats;
// before, neither said anything.
func TestReplicasWithOtherKeySettingsAreTold(t *testing.T) {
	url := pgtest.Database(t)
	up := httptest.NewServer(newDedupProvider())
	defer up.Close()
	a := launch(t, launchSpec{env: sharedEnv(up.URL, url, "IDEMPROXY_KEY_SOURCES=json:order_id")})
	b := launch(t, launchSpec{env: sharedEnv(up.URL, url, "IDEMPROXY_KEY_SOURCES=json:invoice,json:order_id")})
	const told = "derive keys with other settings"
	for _, p := range []*opsProc{a, b} {
		if line := p.waitLine(t, told); !strings.Contains(line, "IDEMPROXY_KEY_SOURCES") || !strings.Contains(line, `"level":"ERROR"`) {
			t.Errorf("the warning does not name IDEMPROXY_KEY_SOURCES as an error: %s", line)
		}
	}
}

// TestRefusedResumeStaysUnknown: replica a sends a payment, which the
// provider executes and answers 504 (a keeps it as unknown); the app's retry
// reaches replica b, whose signing secret is wrong (a rotation half done),
// and the provider refuses b's attempts with 401. The app gets the 401, but
// the operation may still have run: its record must stay unknown, with its
// first send, for the next retry's status probe and key-retention check.
// Before, b released the key and deleted the record, so that the next
// retry was a first send with nothing known of the operation.
func TestRefusedResumeStaysUnknown(t *testing.T) {
	url := pgtest.Database(t)
	g := newGatewayProvider(t, sandbox.Config{Secret: []byte(sandboxSecret)})
	g.lose = 1 // a's attempt executes, then 504
	up := httptest.NewServer(g)
	defer up.Close()
	env := func(secret string) []string {
		return sharedEnv(up.URL, url, "IDEMPROXY_PRESET=payments", "IDEMPROXY_SIGN_SECRET="+secret, "IDEMPROXY_RETRY_MAX_ATTEMPTS=1")
	}
	a := launch(t, launchSpec{env: env(sandboxSecret)})
	b := launch(t, launchSpec{env: env("not-the-provider-secret")})
	order := `{"order_id":"refused-1","amount":"10.00","currency":"EUR"}`

	first := send(t, "POST", "http://"+a.proxy+"/payments", order)
	key := first.header.Get("Idempotency-Key")
	if first.status != http.StatusBadGateway || key == "" {
		t.Fatalf("through a: %d %s, want 502 (the provider executed it and answered 504)", first.status, first.body)
	}
	refused := send(t, "POST", "http://"+b.proxy+"/payments", order)
	if refused.status != http.StatusUnauthorized {
		t.Fatalf("retry through b (wrong secret): %d %s, want the provider's 401 passed on", refused.status, refused.body)
	}
	rec := send(t, "GET", "http://"+a.admin+"/admin/v1/records/"+key, "")
	if rec.status != http.StatusOK || !strings.Contains(rec.body, `"state":"unknown"`) || strings.Contains(rec.body, `"first_sent_at":null`) {
		t.Fatalf("record after b's refused resume: %d %s; want it still unknown, with its first send\n%s", rec.status, rec.body, b.text())
	}
	if led := g.sb.Ledger(); led.Executions != 1 {
		t.Fatalf("the provider executed the payment %d times, want once", led.Executions)
	}
}

// TestDeploymentsOfOtherProvidersAreTold: two deployments on one database in
// front of different providers (cards and payouts) share records, which are
// kept by tenant and key only: an order sent through both with one key gets
// the other provider's answer and never reaches the second provider. Each
// must say so in an error naming the other provider, within heartbeats;
// before, neither said anything.
func TestDeploymentsOfOtherProvidersAreTold(t *testing.T) {
	url := pgtest.Database(t)
	cards := httptest.NewServer(newDedupProvider())
	defer cards.Close()
	payouts := httptest.NewServer(newDedupProvider())
	defer payouts.Close()
	a := launch(t, launchSpec{env: sharedEnv(cards.URL, url)})
	b := launch(t, launchSpec{env: sharedEnv(payouts.URL, url)})
	const told = "replicas in front of other providers use this database"
	for _, c := range []struct {
		p     *opsProc
		other string
	}{{a, payouts.URL}, {b, cards.URL}} {
		line := c.p.waitLine(t, told)
		for _, want := range []string{`"level":"ERROR"`, `"providers":["` + c.other + `"]`, "its own database",
			"same provider under a new URL"} {
			if !strings.Contains(line, want) {
				t.Errorf("the error does not say %s: %s", want, line)
			}
		}
	}
}
