package adminapi_test

import (
	"context"
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
