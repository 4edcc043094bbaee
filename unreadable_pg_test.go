package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/sandbox"
)

// TestUnreadableRecordsOnPostgres: two replicas share a PostgreSQL
// database holding an unknown operation (the gateway answered 504), a final
// answer that needs review and a success; then the rows of the first two
// are damaged by SQL (their header column no longer JSON), and a third
// unknown operation's row is moved to a state no version wrote yet (4),
// as a newer version might. As on the embedded store, the other replica's
// operator must still see every record: the unknown listing answers 200
// with both unknown ones as unreadable (stored state unknown, and state(4)),
// with the reason, the needs_review listing the damaged final one;
// idemproxy_operations_unknown counts both (with a warning); reading one,
// resolving it, marking it reviewed or renewing its order answers 500
// record_unreadable and changes nothing. The app's retry of the damaged
// unknown operation gets 503 store_unavailable with nothing sent. Before,
// both listings answered 503 store_unavailable, the gauge stayed at 0, the
// newer state's record was listed nowhere, the retry took the damaged
// record over and sent the operation again, and a resolve deleted it.
func TestUnreadableRecordsOnPostgres(t *testing.T) {
	c := startCards(t, true)
	if r := c.post(t, "F-ok", "10"); r.status != http.StatusOK {
		t.Fatalf("POST F-ok = %d %s", r.status, r.body)
	}
	for _, order := range []string{"F-unknown", "F-unknown-newer"} {
		if r := c.post(t, order, "10"); r.status != http.StatusBadGateway {
			t.Fatalf("POST %s = %d %s, want 502", order, r.status, r.body)
		}
	}
	if r := c.post(t, "F-review", sandbox.AmountNeedsReview); !strings.Contains(r.body, `"needs_review"`) {
		t.Fatalf("POST F-review = %d %s, want needs_review", r.status, r.body)
	}
	key := map[string]string{}
	for _, order := range []string{"F-unknown", "F-unknown-newer", "F-review"} {
		o := c.admin(t, "GET", "/admin/v1/orders?method=POST&path=/cards&value="+order, "")
		var ord struct{ Key string }
		if json.Unmarshal([]byte(o.body), &ord) != nil || ord.Key == "" {
			t.Fatalf("order %s = %d %s", order, o.status, o.body)
		}
		key[order] = ord.Key
	}

	ctx := context.Background()
	db, err := pgx.Connect(ctx, c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	for order, set := range map[string]string{
		"F-unknown":       `header = convert_to('not json', 'UTF8')`,
		"F-review":        `header = convert_to('not json', 'UTF8')`,
		"F-unknown-newer": `state = 4`,
	} {
		tag, err := db.Exec(ctx, `UPDATE idemproxy_records SET `+set+` WHERE key = $1`, []byte(key[order]))
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("damaging %s: %v, %d rows", order, err, tag.RowsAffected())
		}
	}

	// The operator, on the replica that has not scanned the store yet.
	l := c.admin(t, "GET", "/admin/v1/records?state=unknown", "")
	if l.status != http.StatusOK ||
		!strings.Contains(l.body, `{"key":"`+key["F-unknown"]+`","client":"default","state":"unreadable","stored_state":"unknown","store_key":"`) ||
		!strings.Contains(l.body, `{"key":"`+key["F-unknown-newer"]+`","client":"default","state":"unreadable","stored_state":"state(4)","store_key":"`) ||
		!strings.Contains(l.body, "holds an answer's header") || !strings.Contains(l.body, "state 4 is not one this version knows") {
		t.Errorf("unknown list = %d %s, want 200 showing both unknown records as unreadable, with the reasons", l.status, l.body)
	}
	t.Logf("unknown list: %s", l.body)
	l = c.admin(t, "GET", "/admin/v1/records?state=needs_review", "")
	if l.status != http.StatusOK || !strings.Contains(l.body, `{"key":"`+key["F-review"]+`","client":"default","state":"unreadable","stored_state":"final"`) {
		t.Errorf("needs_review list = %d %s, want 200 showing the damaged final record as unreadable", l.status, l.body)
	}
	if l := c.admin(t, "GET", "/admin/v1/records?state=in_flight", ""); l.status != http.StatusOK {
		t.Errorf("in_flight list = %d %s, want 200", l.status, l.body)
	}
	if out, code := c.cli(t, "records", "list", "--state", "unknown"); code != 0 ||
		!strings.Contains(out, key["F-unknown"]) || !strings.Contains(out, "unreadable (unknown)") {
		t.Errorf("idemproxy records list --state unknown = %d\n%s\nwant %s shown as unreadable (unknown)", code, out, key["F-unknown"])
	}
	if m := scrape(t, "http://"+c.adm.admin+"/metrics"); m["idemproxy_operations_unknown"] != 2 {
		t.Errorf("idemproxy_operations_unknown = %v, want 2: both unreadable unknown records counted", m["idemproxy_operations_unknown"])
	} else if w := c.adm.waitLine(t, "counted in idemproxy_operations_unknown"); !strings.Contains(w, key["F-unknown"]) {
		t.Errorf("gauge warning = %s, want it to name %s", w, key["F-unknown"])
	}

	unreadable := func(what string, r reply) {
		t.Helper()
		if r.status != http.StatusInternalServerError || !strings.Contains(r.body, `"code":"record_unreadable"`) {
			t.Errorf("%s = %d %s, want 500 record_unreadable", what, r.status, r.body)
		}
	}
	unreadable("read of F-unknown's record", c.admin(t, "GET", "/admin/v1/records/"+key["F-unknown"], ""))
	unreadable("read of F-unknown-newer's record", c.admin(t, "GET", "/admin/v1/records/"+key["F-unknown-newer"], ""))
	unreadable("resolve of F-unknown", c.admin(t, "POST", "/admin/v1/records/resolve",
		`{"key":"`+key["F-unknown"]+`","outcome":"not_executed"}`))
	unreadable("resolve of F-unknown-newer", c.admin(t, "POST", "/admin/v1/records/resolve",
		`{"key":"`+key["F-unknown-newer"]+`","outcome":"executed","status":201,"body":{"id":"x"}}`))
	unreadable("reviewed of F-review", c.admin(t, "POST", "/admin/v1/records/reviewed", `{"key":"`+key["F-review"]+`"}`))
	unreadable("renew of F-review", c.renew(t, "F-review"))

	// The app's retries: refused, nothing sent.
	for _, order := range []string{"F-unknown", "F-unknown-newer"} {
		if r := c.post(t, order, "10"); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, `"store_unavailable"`) {
			t.Errorf("retry of %s = %d %s, want 503 store_unavailable", order, r.status, r.body)
		}
	}
	if n := c.unknownPosts.Load(); n != 2 {
		t.Errorf("the gateway saw %d requests for the F-unknown orders, want 2: the retries were sent", n)
	}
	if r := c.post(t, "F-review", sandbox.AmountNeedsReview); r.status != http.StatusServiceUnavailable {
		t.Errorf("retry of F-review = %d %s, want 503 store_unavailable", r.status, r.body)
	}
	if n := c.sb.Ledger().ByOrder["F-review"]; n != 1 {
		t.Errorf("F-review executed %d times, want 1", n)
	}
	// Nothing the calls above refused changed the records.
	l = c.admin(t, "GET", "/admin/v1/records?state=unknown", "")
	if strings.Count(l.body, `"state":"unreadable"`) != 2 {
		t.Errorf("unknown list at the end = %d %s, want both records still there, unreadable", l.status, l.body)
	}
}
