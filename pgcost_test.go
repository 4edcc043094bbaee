package main

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestPostgresNewKeyStatements counts, in the server's statement log, what
// the real binary asks of PostgreSQL for protected requests with new keys:
// two statements each, the claim and the final answer, with no transaction
// around them, no read and no throttle statement. The only other statements
// allowed are the replica's heartbeat, which runs on its own clock.
func TestPostgresNewKeyStatements(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{Settings: []string{"log_statement = 'all'", "log_line_prefix = '@@ '"}})
	prov := newDedupProvider()
	up := httptest.NewServer(prov)
	defer up.Close()
	p := launch(t, launchSpec{env: sharedEnv(up.URL, url)})
	post := func(i int) {
		t.Helper()
		r := send(t, "POST", "http://"+p.proxy+"/v1/payments", fmt.Sprintf(`{"order_id":"cost-%d","amount":"1.00"}`, i))
		if r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("new key %d: %d %q replayed=%q, want a fresh 201", i, r.status, r.body, r.header.Get("Idempotent-Replayed"))
		}
	}
	post(0) // prepares the statements on a connection
	from := len(c.Log())
	const n = 10
	for i := 1; i <= n; i++ {
		post(i)
	}
	records, listens, sessions, others := 0, 0, 0, []string{}
	for _, entry := range strings.Split(c.Log()[from:], "\n@@ ") {
		if !strings.Contains(entry, "LOG:  execute ") && !strings.Contains(entry, "LOG:  statement: ") {
			continue
		}
		switch {
		case strings.Contains(entry, "idemproxy_records"):
			records++
		case strings.Contains(entry, "idemproxy_replicas"): // the heartbeat
		case strings.Contains(entry, "LISTEN idemproxy_throttle"),
			strings.Contains(entry, "SELECT") && strings.Contains(entry, "paused_until"):
			// The pause listener's start (LISTEN, then one read of the
			// pause), on its own connection: late on a loaded machine, but
			// once per connection, not per request.
			listens++
		case strings.Contains(entry, "DEALLOCATE ALL; SET "):
			// A new connection's session settings (synchronous_commit
			// and the timeouts), once per connection, not per request.
			sessions++
		default:
			others = append(others, entry)
		}
	}
	if listens > 2 {
		t.Errorf("%d new keys: %d pause listener statements, want at most one start (2)", n, listens)
	}
	if sessions > 4 {
		t.Errorf("%d new keys: %d new sessions' settings, want at most one per connection a replica uses at once (4)", n, sessions)
	}
	t.Logf("%d new keys: %d statements on records, %d others", n, records, len(others))
	if records != 2*n || len(others) > 0 {
		t.Fatalf("%d new keys: %d statements on records (want %d) and %d others (want none):\n%s",
			n, records, 2*n, len(others), strings.Join(others, "\n"))
	}
}
