package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
)

// A request that brings the key of an order an operator renewed (the app
// kept the Idempotency-Key of the failed answer and sends it itself) is
// answered from that generation's record, as a key no request can follow to
// the next generation: its stored answer is replayed to the same request,
// and another request under that key is 409 idempotency_conflict with
// nothing sent, as before the renew. Before the fix the stored answer was
// replayed whatever the request (another order, another amount): the app
// was told, with Idempotent-Replayed: true, that a request the provider
// never saw had been refused.
func TestSupersededKeyOtherRequestConflicts(t *testing.T) {
	e := newEnv(t)
	first := e.do(t, "POST", "/payments", `{"order_id":"S-1","amount":"-1"}`)
	key := first.header.Get("Idempotency-Key")
	if first.status != http.StatusBadRequest || key == "" {
		t.Fatalf("first = %d %s, want the provider's 400 with a key", first.status, first.body)
	}
	id := store.ID{Tenant: proxy.DefaultTenant, Key: key}
	rec, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Supersede(context.Background(), id, rec.Owner); err != nil {
		t.Fatal(err)
	}
	before, _ := e.prov.counts()
	for _, body := range []string{
		`{"order_id":"S-2","amount":"7"}`, // another order
		`{"order_id":"S-1","amount":"7"}`, // the same order, another request
	} {
		a := e.do(t, "POST", "/payments", body, "Idempotency-Key", key)
		if a.status != http.StatusConflict || !strings.Contains(string(a.body), `"idempotency_conflict"`) ||
			a.header.Get("Idempotent-Replayed") != "" || a.header.Get("Idempotency-Key") != key {
			t.Errorf("%s under the renewed order's key = %d %s (replayed %q), want 409 idempotency_conflict",
				body, a.status, a.body, a.header.Get("Idempotent-Replayed"))
		}
	}
	// The same request under that key is still its answer, replayed.
	a := e.do(t, "POST", "/payments", `{"order_id":"S-1","amount":"-1"}`, "Idempotency-Key", key)
	if a.status != http.StatusBadRequest || a.header.Get("Idempotent-Replayed") != "true" || string(a.body) != string(first.body) {
		t.Errorf("the same request under the renewed order's key = %d %s, want its 400 replayed", a.status, a.body)
	}
	if after, _ := e.prov.counts(); after != before {
		t.Errorf("%d requests reached the provider, want none", after-before)
	}
}
