package proxy_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/internal/fakeclock"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// One order sent under spellings of its path that RFC 3986 (§6.2.2.1,
// §6.2.2.2) makes one resource, an unreserved character percent-encoded
// (/v1/p%61yments) or an escape in lower-case hex (/cards/a%2fb), gets one
// key, and so one execution: the provider decodes them all to the same
// endpoint. Before the fix each spelling derived its own key, and a provider
// (the sandboxes, any Go, nginx or servlet server) executed the order once
// per spelling. The fingerprint is still the path as sent, so a spelling
// other than the first is 409 idempotency_conflict under the first's key,
// nothing sent.
func TestEquivalentPathSpellingsAreOneOperation(t *testing.T) {
	e := newEnv(t)
	for _, group := range [][]string{
		{"/v1/payments", "/v1/p%61yments", "/%761/payments", "/v1/payment%73", "/v1/PAYMENTS"},
		{"/cards/a%2fb/topup", "/cards/a%2Fb/topup"},
		{"/cards/a~b_c-d.e/close", "/cards/a%7Eb_c-d.e/close", "/cards/a%7eb%5Fc%2Dd%2Ee/close"},
		{"/cards/%C3%A9/close", "/cards/%c3%a9/close"},
	} {
		body := `{"order_id":"spell-` + group[0] + `","amount":"1.00"}`
		first := e.do(t, "POST", group[0], body)
		if first.status != http.StatusCreated {
			t.Fatalf("%s: %d %s", group[0], first.status, first.body)
		}
		key := first.header.Get("Idempotency-Key")
		for _, path := range group[1:] {
			a := e.do(t, "POST", path, body)
			want := http.StatusConflict
			if path == "/v1/PAYMENTS" { // letter case outside escapes is another path
				want = http.StatusCreated
			}
			if a.status != want {
				t.Errorf("%s after %s: %d %s, want %d", path, group[0], a.status, a.body, want)
			}
			if got := a.header.Get("Idempotency-Key"); (got == key) != (want == http.StatusConflict) {
				t.Errorf("%s: key %s, %s's was %s", path, got, group[0], key)
			}
		}
	}
	if _, execs := e.prov.counts(); len(execs) != 5 {
		t.Errorf("the provider executed %d keys, want 5 (one per order, /v1/PAYMENTS its own): %v", len(execs), execs)
	}
}

// A record that an earlier version stored under the key of a path spelled
// as it came (/cards/a%7eb, before keys took the path in its normal form)
// is still the order's when the path comes spelled that way again: a final
// one is replayed, nothing sent, and an unknown one is resumed under its
// key. Without that, an order stored or left unknown before an upgrade
// would be sent again under its new key, a second execution.
func TestKeyOfAPathSpelledAsItCameIsKept(t *testing.T) {
	e := newEnv(t)
	sources, _ := idemkey.ParseSources("json:order_id,query:order_id")
	ctx := context.Background()
	// stored begins the order's record under the key of path as it came,
	// and returns that key.
	stored := func(path, body string) (store.ID, string) {
		kr := idemkey.Request{Method: "POST", Path: path, ContentType: "application/json", Body: []byte(body)}
		key, _, _ := idemkey.Derive(sources, kr)
		fp := idemkey.Fingerprint(kr)
		id := store.ID{Tenant: "default", Key: key}
		if _, _, err := e.store.Begin(ctx, id, store.Request{Fingerprint: fp[:], Method: "POST", Path: path, UpstreamKey: key}, "old", time.Minute); err != nil {
			t.Fatal(err)
		}
		return id, key
	}

	const final, finalBody = "/cards/a%7eb/close", `{"order_id":"legacy-1","amount":"1.00"}`
	id, key := stored(final, finalBody)
	resp := store.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"card_old"}`)}
	if err := e.store.Complete(ctx, id, "old", resp, time.Now()); err != nil {
		t.Fatal(err)
	}
	a := e.do(t, "POST", final, finalBody)
	if a.status != http.StatusCreated || string(a.body) != `{"id":"card_old"}` || a.header.Get("Idempotent-Replayed") != "true" || a.header.Get("Idempotency-Key") != key {
		t.Errorf("%s: %d %s key %s, want the answer stored under %s replayed", final, a.status, a.body, a.header.Get("Idempotency-Key"), key)
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("the provider saw %d requests for a stored order, want none", total)
	}

	const unknown, unknownBody = "/v1/p%61yments", `{"order_id":"legacy-2","amount":"1.00"}`
	id, key = stored(unknown, unknownBody)
	if err := e.store.Park(ctx, id, "old", store.Outcome{FirstSentAt: time.Now(), Attempts: 1, LastError: "timeout after send"}); err != nil {
		t.Fatal(err)
	}
	if a := e.do(t, "POST", unknown, unknownBody); a.status != http.StatusCreated || a.header.Get("Idempotency-Key") != key {
		t.Errorf("%s: %d %s key %s, want the unknown operation resumed under %s", unknown, a.status, a.body, a.header.Get("Idempotency-Key"), key)
	}
	if _, execs := e.prov.counts(); len(execs) != 1 || execs[key] != 1 {
		t.Errorf("the provider executed %v, want %s once", execs, key)
	}
}

// Under a fingerprint window rule, one top-up sent under two spellings of
// its path that are one resource (/cards/c1/topup, /cards/c%31/topup) is one
// operation: the second spelling is 409 idempotency_conflict under the
// first's key, nothing sent. Before the fix each spelling had its own
// fingerprint, so its own window and key, and the provider executed the
// top-up twice.
func TestFingerprintWindowPathSpellings(t *testing.T) {
	clk := fakeclock.New(time.Time{})
	clk.Set(periodStart(10 * time.Minute).Add(time.Minute))
	e := newRouteEnv(t, "POST /cards/*/topup=fingerprint:10m", clk, t.TempDir())
	const topup = `{"amount":"5.00"}`
	first := e.do(t, "POST", "/cards/c1/topup", topup)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	for _, path := range []string{"/cards/c%31/topup", "/cards/c1/t%6Fpup", "/%63ards/c1/topup"} {
		a := e.do(t, "POST", path, topup)
		if a.status != http.StatusConflict || a.header.Get("Idempotency-Key") != first.header.Get("Idempotency-Key") {
			t.Errorf("%s: %d %s key %s, want 409 under the first's key %s", path, a.status, a.body, a.header.Get("Idempotency-Key"), first.header.Get("Idempotency-Key"))
		}
	}
	if total, _ := e.prov.counts(); total != 1 {
		t.Errorf("the provider saw %d top-ups, want 1", total)
	}
}

// A top-up whose window an earlier version anchored under the fingerprint
// of its path as it came (/cards/c%31/topup), and whose outcome is unknown,
// is resumed under that operation's key by a retry spelled the same way,
// not sent again under a new one.
func TestFingerprintWindowOfAPathSpelledAsItCame(t *testing.T) {
	const window = 10 * time.Minute
	clk := fakeclock.New(time.Time{})
	clk.Set(periodStart(window).Add(time.Minute))
	e := newRouteEnv(t, "POST /cards/*/topup=fingerprint:10m", clk, t.TempDir())
	const path, topup = "/cards/c%31/topup", `{"amount":"7.00"}`
	ctx := context.Background()
	fp := idemkey.Fingerprint(idemkey.Request{Method: "POST", Path: path, ContentType: "application/json", Body: []byte(topup)})
	period := idemkey.WindowPeriod(clk.Now(), window)
	key := idemkey.WindowKey(fp, window, period, "")
	// The earlier version's anchor (its documented record: store.WindowAnchorPrefix,
	// the fingerprint, the window and the period) and its operation, unknown.
	anchor := store.ID{Tenant: "default", Key: fmt.Sprintf("%s%s/%d/%d", store.WindowAnchorPrefix, hex.EncodeToString(fp[:]), int64(window), period)}
	if _, _, err := e.store.Begin(ctx, anchor, store.Request{Fingerprint: fp[:], UpstreamKey: key}, "old", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Complete(ctx, anchor, "old", store.Response{Status: http.StatusNoContent}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	op := store.ID{Tenant: "default", Key: key}
	if _, _, err := e.store.Begin(ctx, op, store.Request{Fingerprint: fp[:], Method: "POST", Path: path, UpstreamKey: key}, "old", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Park(ctx, op, "old", store.Outcome{FirstSentAt: clk.Now(), Attempts: 1, LastError: "timeout after send"}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	if a := e.do(t, "POST", path, topup); a.status != http.StatusCreated || a.header.Get("Idempotency-Key") != key {
		t.Errorf("%s: %d %s key %s, want the unknown top-up resumed under %s", path, a.status, a.body, a.header.Get("Idempotency-Key"), key)
	}
	if _, execs := e.prov.counts(); len(execs) != 1 || execs[key] != 1 {
		t.Errorf("the provider executed %v, want %s once", execs, key)
	}
}

// One order sent to its path with a slash repeated or trailing
// (/v1/payouts/, //v1/payouts, /v1//payouts) gets the key of the path
// without them, so one execution: the routers of most providers (Rails,
// Spring, ASP.NET Core, Express) take those spellings for the same
// endpoint, as routes.Table.Match does for a rule's path. Before the fix
// each spelling derived a key of its own, and such a provider executed the
// order once per spelling (5 executions here; an app whose base URL gained
// a trailing slash between an order and its retry paid twice). The
// fingerprint is still the path as sent: 409 idempotency_conflict under the
// first's key, nothing sent. A record an earlier version stored under the
// key of the path as it came is still replayed when it comes so again.
func TestSlashSpellingsAreOneOperation(t *testing.T) {
	e := newEnv(t)
	const body = `{"order_id":"slash-1","amount":"1.00"}`
	first := e.do(t, "POST", "/v1/payouts", body)
	if first.status != http.StatusCreated {
		t.Fatalf("/v1/payouts: %d %s", first.status, first.body)
	}
	key := first.header.Get("Idempotency-Key")
	for _, path := range []string{"/v1/payouts/", "//v1/payouts", "/v1//payouts", "/v1/payouts//", "//v1///p%61youts/"} {
		a := e.do(t, "POST", path, body)
		if a.status != http.StatusConflict || a.header.Get("Idempotency-Key") != key {
			t.Errorf("%s after /v1/payouts: %d %s key %s, want 409 under %s", path, a.status, a.body, a.header.Get("Idempotency-Key"), key)
		}
	}
	if _, execs := e.prov.counts(); len(execs) != 1 || execs[key] != 1 {
		t.Errorf("the provider executed %v, want %s once", execs, key)
	}
	// A slash that is part of an escape or a segment is not repeated:
	// /cards/a%2F/x and /cards/a/x are other resources, other keys.
	for _, path := range []string{"/v1/payouts%2F", "/v1/payouts/x"} {
		if a := e.do(t, "POST", path, body); a.status != http.StatusCreated || a.header.Get("Idempotency-Key") == key {
			t.Errorf("%s: %d %s key %s, want 201 under a key other than %s", path, a.status, a.body, a.header.Get("Idempotency-Key"), key)
		}
	}

	// Stored before the fix under the key of "/cards/c1/close/" as it came.
	sources, _ := idemkey.ParseSources("json:order_id,query:order_id")
	const old, oldBody = "/cards/c1/close/", `{"order_id":"slash-old","amount":"1.00"}`
	kr := idemkey.Request{Method: "POST", Path: old, ContentType: "application/json", Body: []byte(oldBody)}
	oldKey, _, _ := idemkey.Derive(sources, kr)
	fp := idemkey.Fingerprint(kr)
	id := store.ID{Tenant: "default", Key: oldKey}
	ctx := context.Background()
	if _, _, err := e.store.Begin(ctx, id, store.Request{Fingerprint: fp[:], Method: "POST", Path: old, UpstreamKey: oldKey}, "old", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Complete(ctx, id, "old", store.Response{Status: http.StatusCreated, Body: []byte(`{"id":"close_old"}`)}, time.Now()); err != nil {
		t.Fatal(err)
	}
	a := e.do(t, "POST", old, oldBody)
	if a.status != http.StatusCreated || string(a.body) != `{"id":"close_old"}` || a.header.Get("Idempotency-Key") != oldKey {
		t.Errorf("%s: %d %s key %s, want the answer stored under %s replayed", old, a.status, a.body, a.header.Get("Idempotency-Key"), oldKey)
	}
}

// A POST to /cards/ or //cards, spellings of a fingerprint rule's path that
// only a lenient router takes for it, keeps the defaults, and with no
// order_id is 422 under IDEMPROXY_MISSING_KEY=generate, nothing sent: its
// path in normal form (/cards) is not what the routes matched, and the
// check that refuses it reads the path as sent. Read in normal form, it
// found the rule matching exactly and gave each blind retry a random key.
func TestSpeltOtherwiseReadAsSent(t *testing.T) {
	e := newRouteEnv(t, "POST /cards=fingerprint:10m", nil, t.TempDir(), func(o *proxy.Options, _ *retry.Policy) { o.MissingKey = proxy.Generate })
	for _, path := range []string{"/cards/", "//cards", "/cards//"} {
		for try := 1; try <= 2; try++ {
			if a := e.do(t, "POST", path, `{"amount":"50"}`); a.status != http.StatusUnprocessableEntity {
				t.Errorf("%s, try %d: %d %s, want 422", path, try, a.status, a.body)
			}
		}
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("the provider saw %d requests, want none", total)
	}
}

// The operator's order look-up (GET /admin/v1/orders, renew) finds the
// record an earlier version stored under the key of the path as it came,
// as the proxy does for the order's next request (derivationPath): an
// order posted to /cards/c1/close/ before keys took the path in normal form
// and left unknown (kept until settled) was found by neither spelling,
// since OrderKeys derived over /cards/c1/close for both, and the operator
// could not settle or renew it by its order id. Another order under that
// spelling, with no such record, gets the normal form's key.
func TestOrderKeysOfAPathSpelledAsItCame(t *testing.T) {
	e := newEnv(t)
	sources, _ := idemkey.ParseSources("json:order_id,query:order_id")
	const old, oldBody = "/cards/c1/close/", `{"order_id":"slash-unknown","amount":"1.00"}`
	kr := idemkey.Request{Method: "POST", Path: old, ContentType: "application/json", Body: []byte(oldBody)}
	oldKey, _, _ := idemkey.Derive(sources, kr)
	fp := idemkey.Fingerprint(kr)
	id := store.ID{Tenant: proxy.DefaultTenant, Key: oldKey}
	ctx := context.Background()
	if _, _, err := e.store.Begin(ctx, id, store.Request{Fingerprint: fp[:], Method: "POST", Path: old, UpstreamKey: oldKey}, "old", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Park(ctx, id, "old", store.Outcome{FirstSentAt: time.Now(), Attempts: 1, LastError: "timeout after send"}); err != nil {
		t.Fatal(err)
	}
	keys, err := e.h.OrderKeys("POST", old, "slash-unknown", proxy.DefaultTenant, 1)
	if err != nil || keys[0] != oldKey {
		t.Fatalf("OrderKeys(%s, slash-unknown) = %v, %v; want %s first (the record's)", old, keys, err, oldKey)
	}
	gen2, err := e.h.OrderKeys("POST", old, "slash-unknown", proxy.DefaultTenant, 2)
	want2, _, _ := idemkey.Derive(sources, idemkey.Request{Method: "POST", Path: old, ContentType: "application/json", Body: []byte(oldBody), Generation: 2})
	if err != nil || gen2[0] != want2 {
		t.Errorf("OrderKeys(%s, slash-unknown, generation 2) = %v, %v; want %s first", old, gen2, err, want2)
	}
	other, err := e.h.OrderKeys("POST", old, "slash-new", proxy.DefaultTenant, 1)
	normal, _ := e.h.OrderKeys("POST", "/cards/c1/close", "slash-new", proxy.DefaultTenant, 1)
	if err != nil || other[0] != normal[0] {
		t.Errorf("OrderKeys(%s, slash-new) = %v, %v; want the normal form's %v", old, other, err, normal)
	}
}
