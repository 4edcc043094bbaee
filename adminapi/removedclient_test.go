package adminapi_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/store"
)

// The orders of a client whose token was removed from
// IDEMPROXY_CLIENT_TOKENS can still be looked up and renewed by naming it,
// as its records can be read, listed and resolved; before, both orders calls
// were 400 "no client has a client token", so its failed order could never
// get a new key. A name with no token and no record of the order is still
// refused, on either call.
func TestOrdersOfRemovedClient(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	orderKeys := func(method, path, value, client string, gen int) ([]string, error) {
		return []string{client + " " + method + " " + path + " " + value + " #" + strconv.Itoa(gen)}, nil
	}
	failed := store.ID{Tenant: "gone", Key: "gone POST /cards F-1 #1"}
	unknown := store.ID{Tenant: "gone", Key: "gone POST /cards F-2 #1"}
	for _, id := range []store.ID{failed, unknown} {
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o1", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Complete(ctx, failed, "o1", store.Response{Status: 402, Body: []byte(`{"status":"failed"}`)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Park(ctx, unknown, "o1", store.Outcome{Attempts: 3, LastError: "upstream 504"}); err != nil {
		t.Fatal(err)
	}
	// "gone" had a token when its records were written; it has none now.
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default", Clients: []string{"shop"}, OrderKeys: orderKeys})
	post := func(body string) string {
		t.Helper()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/v1/orders/renew", strings.NewReader(body)))
		return strconv.Itoa(w.Code) + " " + w.Body.String()
	}
	get := func(query string) string {
		t.Helper()
		w := call(t, h, "GET", "/admin/v1/orders?method=POST&path=/cards&"+query, "")
		return strconv.Itoa(w.Code) + " " + w.Body.String()
	}

	if got := get("value=F-1&client=gone"); !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"generation":1`) ||
		!strings.Contains(got, `"client":"gone"`) || !strings.Contains(got, `"status":402`) {
		t.Fatalf("GET the removed client's failed order = %s, want 200 generation 1 with its record", got)
	}
	if got := post(`{"method":"POST","path":"/cards","value":"F-2","client":"gone"}`); !strings.HasPrefix(got, "409 ") ||
		!strings.Contains(got, `"renew_refused"`) {
		t.Fatalf("renew of the removed client's unknown order = %s, want 409 renew_refused", got)
	}
	if got := post(`{"method":"POST","path":"/cards","value":"F-1","client":"gone"}`); !strings.HasPrefix(got, "200 ") ||
		!strings.Contains(got, `"generation":2`) || !strings.Contains(got, `"key":"gone POST /cards F-1 #2"`) {
		t.Fatalf("renew of the removed client's failed order = %s, want 200 generation 2", got)
	}
	// Renewed, generation 2 has no record yet, but the order has records
	// under the name: it is still found, and a second renew refused as such.
	if got := get("value=F-1&client=gone"); !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"generation":2`) ||
		!strings.Contains(got, `"record":null`) {
		t.Fatalf("GET the removed client's order after its renew = %s, want 200 generation 2 with no record", got)
	}
	if got := post(`{"method":"POST","path":"/cards","value":"F-1","client":"gone"}`); !strings.HasPrefix(got, "409 ") ||
		!strings.Contains(got, `"renew_refused"`) {
		t.Fatalf("second renew of the removed client's order = %s, want 409 renew_refused", got)
	}

	// A name with no token and no record of the order: 400, as before.
	for _, c := range []struct{ what, got string }{
		{"GET an order of a name with no token and no records", get("value=F-1&client=gnoe")},
		{"GET an order the removed client never sent", get("value=F-9&client=gone")},
		{"renew for a name with no token and no records", post(`{"method":"POST","path":"/cards","value":"F-1","client":"gnoe"}`)},
		{"renew of an order the removed client never sent", post(`{"method":"POST","path":"/cards","value":"F-9","client":"gone"}`)},
	} {
		if !strings.HasPrefix(c.got, "400 ") || !strings.Contains(c.got, `"bad_request"`) || !strings.Contains(c.got, "shop") {
			t.Fatalf("%s = %s, want 400 bad_request listing the clients", c.what, c.got)
		}
	}
}
