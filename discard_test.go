package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/store"
)

// TestDiscardUnreadableRecord: an unknown operation's record becomes
// unreadable (on the embedded store its format version byte is one no build
// wrote; on PostgreSQL its header column is no longer JSON). The app's
// retry is refused 503 store_unavailable with nothing sent, and the record
// never expires, so without a way to remove it the key was refused for
// ever. The operator, having settled the operation with the provider, runs
// `idemproxy records discard KEY` (on PostgreSQL on the other replica): it
// is removed and logged at WARN with who, the key and what was known of it,
// the unknown gauge no longer counts it, and the app's next request is sent
// again under the same key. A readable record is refused 409
// discard_refused and left as it is; a missing one is 404.
func TestDiscardUnreadableRecord(t *testing.T) { onStores(t, testDiscardUnreadableRecord) }

func testDiscardUnreadableRecord(t *testing.T, shared bool) {
	c := startCards(t, shared)
	if r := c.post(t, "F-ok", "10"); r.status != http.StatusOK {
		t.Fatalf("POST F-ok = %d %s", r.status, r.body)
	}
	r := c.post(t, "F-unknown", "10")
	if r.status != http.StatusBadGateway {
		t.Fatalf("POST F-unknown = %d %s, want 502", r.status, r.body)
	}
	key := r.header.Get("Idempotency-Key")
	o := c.admin(t, "GET", "/admin/v1/orders?method=POST&path=/cards&value=F-ok", "")
	var ord struct{ Key string }
	if json.Unmarshal([]byte(o.body), &ord) != nil || ord.Key == "" {
		t.Fatalf("order F-ok = %d %s", o.status, o.body)
	}
	okKey := ord.Key

	if shared {
		ctx := context.Background()
		db, err := pgx.Connect(ctx, c.db)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close(ctx)
		tag, err := db.Exec(ctx, `UPDATE idemproxy_records SET header = convert_to('not json', 'UTF8') WHERE key = $1`, []byte(key))
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("damaging F-unknown's row: %v, %d rows", err, tag.RowsAffected())
		}
	} else {
		if err := c.p.terminate(t); err != nil {
			t.Fatalf("stop: %v\n%s", err, c.p.text())
		}
		damageOne(t, c.dir, store.Unknown)
		c.p = launch(t, launchSpec{env: c.env})
		c.adm = c.p
	}
	if r := c.post(t, "F-unknown", "10"); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, `"store_unavailable"`) {
		t.Fatalf("retry of F-unknown with its record unreadable = %d %s, want 503 store_unavailable", r.status, r.body)
	}
	if n := c.unknownPosts.Load(); n != 1 {
		t.Fatalf("the gateway saw %d requests for F-unknown, want 1: the refused retry sent nothing", n)
	}
	if m := scrape(t, "http://"+c.adm.admin+"/metrics"); m["idemproxy_operations_unknown"] != 1 {
		t.Fatalf("idemproxy_operations_unknown = %v before the discard, want 1", m["idemproxy_operations_unknown"])
	}

	// Refused for a readable record, whatever its state; 404 for none.
	if r := c.admin(t, "POST", "/admin/v1/records/discard", `{"key":"`+okKey+`"}`); r.status != http.StatusConflict ||
		!strings.Contains(r.body, `"discard_refused"`) {
		t.Fatalf("discard of F-ok's readable record = %d %s, want 409 discard_refused", r.status, r.body)
	}
	if r := c.post(t, "F-ok", "10"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("F-ok after the refused discard = %d %s, want its answer replayed", r.status, r.body)
	}
	if r := c.admin(t, "POST", "/admin/v1/records/discard", `{"key":"no-such-key"}`); r.status != http.StatusNotFound {
		t.Fatalf("discard of no record = %d %s, want 404", r.status, r.body)
	}
	if out, code := c.cli(t, "records", "discard", okKey); code != 1 || !strings.Contains(out, "discard_refused") {
		t.Fatalf("idemproxy records discard of a readable record = %d %s, want exit 1 discard_refused", code, out)
	}

	out, code := c.cli(t, "records", "discard", key)
	if code != 0 || !strings.Contains(out, "discarded") || !strings.Contains(out, key) || !strings.Contains(out, "stored state unknown") {
		t.Fatalf("idemproxy records discard = %d %s, want exit 0 saying it was discarded", code, out)
	}
	line := c.adm.waitLine(t, `"msg":"admin: record whose value could not be read discarded`)
	for _, want := range []string{`"level":"WARN"`, `"who":"127.0.0.1:`, `"key":"` + key + `"`, `"client":"default"`,
		`"stored_state":"unknown"`, `"store_key":"`, `"reason":"`} {
		if !strings.Contains(line, want) {
			t.Errorf("discard log line %s lacks %s", line, want)
		}
	}
	if r := c.admin(t, "GET", "/admin/v1/records/"+key, ""); r.status != http.StatusNotFound {
		t.Fatalf("record after the discard = %d %s, want 404", r.status, r.body)
	}
	if m := scrape(t, "http://"+c.adm.admin+"/metrics"); m["idemproxy_operations_unknown"] != 0 {
		t.Errorf("idemproxy_operations_unknown = %v after the discard, want 0", m["idemproxy_operations_unknown"])
	}
	if out, code := c.cli(t, "records", "discard", key); code != 1 || !strings.Contains(out, "not_found") {
		t.Fatalf("second discard = %d %s, want exit 1 not_found", code, out)
	}

	// The app's next request is sent again, under the same key (the
	// gateway answers it 504 again: it is unknown once more, readable).
	r = c.post(t, "F-unknown", "10")
	if r.status != http.StatusBadGateway || r.header.Get("Idempotency-Key") != key {
		t.Fatalf("retry after the discard = %d %s key %s, want 502 under %s: sent again", r.status, r.body, r.header.Get("Idempotency-Key"), key)
	}
	if n := c.unknownPosts.Load(); n != 2 {
		t.Fatalf("the gateway saw %d requests for F-unknown, want 2: the retry after the discard was sent", n)
	}
	if r := c.admin(t, "GET", "/admin/v1/records/"+key, ""); r.status != http.StatusOK || !strings.Contains(r.body, `"state":"unknown"`) {
		t.Fatalf("record after the retry = %d %s, want a readable unknown record", r.status, r.body)
	}
}
