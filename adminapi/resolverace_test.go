package adminapi_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/store"
)

// resolveBetweenStore is a real store that runs between once, right before
// the first Resolve: what another operator's call does between a resolve's
// read and its write.
type resolveBetweenStore struct {
	*cache.Store
	between func()
	once    sync.Once
}

func (s *resolveBetweenStore) Resolve(ctx context.Context, id store.ID, resp *store.Response) (store.Record, error) {
	s.once.Do(s.between)
	return s.Store.Resolve(ctx, id, resp)
}

// Two operators resolve one unknown operation at once, and the other's
// not_executed removes the record between this resolve's read (unknown) and
// its write: this one is 409 resolve_refused, the record changed, as when
// the other's executed wins; it was 404 not_found "no record for this key",
// which reads as a wrong key for a record the operator had just listed
// (seen on PostgreSQL with two replicas: 9 of 30 races).
func TestResolveRacingNotExecuted(t *testing.T) {
	cs := openStore(t)
	ctx := context.Background()
	id := store.ID{Tenant: "default", Key: "k-1"}
	if _, _, err := cs.Begin(ctx, id, store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/payments"}, "o1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := cs.Park(ctx, id, "o1", store.Outcome{Attempts: 2, LastError: "upstream 504"}); err != nil {
		t.Fatal(err)
	}
	s := &resolveBetweenStore{Store: cs, between: func() {
		if _, err := cs.Resolve(ctx, id, nil); err != nil { // the other operator: not_executed
			t.Errorf("the other resolve: %v", err)
		}
	}}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/v1/records/resolve",
		strings.NewReader(`{"key":"k-1","outcome":"executed","status":201,"body":{"id":"pay_1"}}`)))
	if w.Code != 409 || !strings.Contains(w.Body.String(), `"resolve_refused"`) || !strings.Contains(w.Body.String(), "look it up again") {
		t.Fatalf("resolve losing to another's not_executed = %d %s, want 409 resolve_refused saying to look the record up again", w.Code, w.Body)
	}
	if _, err := cs.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record after the refused resolve: %v, want none (the other's not_executed stands)", err)
	}
}
