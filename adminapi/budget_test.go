package adminapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/store"
)

// filterSeen is a real store that keeps the filters List was called with.
type filterSeen struct {
	*cache.Store
	filters []store.Filter
}

func (s *filterSeen) List(ctx context.Context, f store.Filter, cursor string, limit int) ([]store.Record, string, error) {
	s.filters = append(s.filters, f)
	return s.Store.List(ctx, f, cursor, limit)
}

// TestListHasABudget: every listing asks the store for a page within a time
// budget (store.Filter.Budget) well under the operator commands' 10 s
// timeout. Without one, listing needs_review read every final answer of the
// store in one call: 6.5 s for 500,000 answers on PostgreSQL, and on a
// larger store records list gave up at its timeout saying it could not
// reach the admin API, the page never answered, while the instance read on.
func TestListHasABudget(t *testing.T) {
	s := &filterSeen{Store: openStore(t)}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})
	for _, q := range []string{"state=in_flight", "state=unknown", "state=needs_review", "state=needs_review&client=default&body=1"} {
		s.filters = nil
		if w := call(t, h, "GET", "/admin/v1/records?"+q, ""); w.Code != 200 {
			t.Fatalf("%s = %d %s", q, w.Code, w.Body)
		}
		if len(s.filters) != 1 {
			t.Fatalf("%s: %d List calls, want 1", q, len(s.filters))
		}
		if b := s.filters[0].Budget; b <= 0 || b > 3*time.Second {
			t.Fatalf("%s: List's budget = %v, want above 0 and at most 3s (the operator commands wait 10 s)", q, b)
		}
	}
}

// spentBudget is a real store on which the time budget a listing asks for
// is spent at once, as on a store of millions of records: each page stops
// at the first record it reads past.
type spentBudget struct{ *cache.Store }

func (s spentBudget) List(ctx context.Context, f store.Filter, cursor string, limit int) ([]store.Record, string, error) {
	if f.Budget > 0 {
		f.Budget = time.Nanosecond
	}
	return s.Store.List(ctx, f, cursor, limit)
}

// TestListMistypedClientOnALargeStore: a listing naming a client with no
// token and no record is 400 naming the clients, also on a store whose
// pages the time budget cuts. With the budget its first page came empty
// with a cursor (another client's records read past), 200, and records
// list, following the cursor, printed "0 records": a mistyped name read as
// nothing to settle.
func TestListMistypedClientOnALargeStore(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	for i := range 20 {
		id := store.ID{Tenant: "shop", Key: fmt.Sprintf("u-%02d", i)}
		if _, _, err := st.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := st.Park(ctx, id, "o", store.Outcome{Attempts: 1, LastError: "504"}); err != nil {
			t.Fatal(err)
		}
	}
	h := adminapi.New(adminapi.Options{Store: spentBudget{st}, DefaultTenant: "default", Clients: []string{"shop"}})
	if w := call(t, h, "GET", "/admin/v1/records?state=unknown&client=shpo", ""); w.Code != 400 || !strings.Contains(w.Body.String(), `no client \"shpo\"`) {
		t.Fatalf("listing a mistyped client = %d %s, want 400 naming it", w.Code, w.Body)
	}
	if w := call(t, h, "GET", "/admin/v1/records?state=unknown&client=shop&limit=1000", ""); w.Code != 200 || strings.Count(w.Body.String(), `"key":`) != 20 {
		t.Fatalf("listing the client = %d %s, want its 20 records", w.Code, w.Body)
	}
}
