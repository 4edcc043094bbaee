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

// With client tokens off every app's records are kept under the default
// client: a call naming another client, under which nothing is kept, is 400
// saying so, on every call that names a client. Before, it was taken as
// given: orders get answered 200 generation 1 with no record ("nothing was
// sent for this order"), records get 404, a listing an empty page, so a
// mistyped --client read as "nothing to settle". A name under which records
// are kept (a client of an earlier configuration with tokens on) is still
// taken, and so are no name and "default".
func TestClientNamedWithTokensOff(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	orderKeys := func(method, path, value, client string, gen int) ([]string, error) {
		return []string{client + " " + method + " " + path + " " + value + " #" + strconv.Itoa(gen)}, nil
	}
	failed := store.ID{Tenant: "default", Key: "default POST /cards F-1 #1"}
	earlier := store.ID{Tenant: "shop", Key: "shop POST /cards F-2 #1"} // stored while tokens were on
	for _, id := range []store.ID{failed, earlier} {
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o1", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Complete(ctx, failed, "o1", store.Response{Status: 402, Body: []byte(`{"status":"failed"}`)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Park(ctx, earlier, "o1", store.Outcome{Attempts: 3, LastError: "upstream 504"}); err != nil {
		t.Fatal(err)
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default", OrderKeys: orderKeys})
	do := func(method, target, body string) string {
		t.Helper()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, target, strings.NewReader(body)))
		return strconv.Itoa(w.Code) + " " + w.Body.String()
	}

	for _, c := range []struct{ what, got string }{
		{"orders get", do("GET", "/admin/v1/orders?method=POST&path=/cards&value=F-1&client=shpo", "")},
		{"orders renew", do("POST", "/admin/v1/orders/renew", `{"method":"POST","path":"/cards","value":"F-1","client":"shpo"}`)},
		{"records get", do("GET", "/admin/v1/records/k?client=shpo", "")},
		{"records list", do("GET", "/admin/v1/records?state=unknown&client=shpo", "")},
		{"records resolve", do("POST", "/admin/v1/records/resolve", `{"key":"k","client":"shpo","outcome":"not_executed"}`)},
		{"records reviewed", do("POST", "/admin/v1/records/reviewed", `{"key":"k","client":"shpo"}`)},
		{"records discard", do("POST", "/admin/v1/records/discard", `{"key":"k","client":"shpo"}`)},
	} {
		if !strings.HasPrefix(c.got, "400 ") || !strings.Contains(c.got, `"bad_request"`) || !strings.Contains(c.got, "client tokens are off") {
			t.Errorf("%s naming a client never configured, with client tokens off = %s, want 400 bad_request saying client tokens are off", c.what, c.got)
		}
	}

	// No name, or the default client's: the records kept without tokens.
	for _, q := range []string{"", "&client=", "&client=default"} {
		if got := do("GET", "/admin/v1/orders?method=POST&path=/cards&value=F-1"+q, ""); !strings.HasPrefix(got, "200 ") ||
			!strings.Contains(got, `"status":402`) {
			t.Errorf("orders get%s = %s, want 200 with the failed record", q, got)
		}
	}
	if got := do("GET", "/admin/v1/orders?method=POST&path=/cards&value=F-9", ""); !strings.HasPrefix(got, "200 ") ||
		!strings.Contains(got, `"record":null`) {
		t.Errorf("orders get of an order never sent, no client named = %s, want 200 with no record", got)
	}
	// A client of an earlier configuration, its records still kept.
	if got := do("GET", "/admin/v1/orders?method=POST&path=/cards&value=F-2&client=shop", ""); !strings.HasPrefix(got, "200 ") ||
		!strings.Contains(got, `"state":"unknown"`) {
		t.Errorf("orders get of a client with records kept = %s, want 200 with its unknown record", got)
	}
	if got := do("GET", "/admin/v1/records?state=unknown&client=shop", ""); !strings.HasPrefix(got, "200 ") ||
		!strings.Contains(got, `"client":"shop"`) {
		t.Errorf("records list of a client with records kept = %s, want 200 listing its record", got)
	}
}
