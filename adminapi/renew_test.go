package adminapi_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/store"
)

// betweenStore is a real store that runs between once, right before the
// first Supersede: what happens between a renew's read and its write.
type betweenStore struct {
	*cache.Store
	between func()
	once    sync.Once
}

func (s *betweenStore) Supersede(ctx context.Context, id store.ID, owner string) (store.Record, error) {
	s.once.Do(s.between)
	return s.Store.Supersede(ctx, id, owner)
}

// A renew supersedes only the record it judged. If that failed record
// expires between the renew's read and its write and a new request for the
// order claims the key, the renew is refused and the new claim's record is
// left as it is: moving the order to a new key while that operation runs,
// or after it succeeded, could charge twice.
func TestRenewRefusesReclaimedRecord(t *testing.T) {
	for _, done := range []bool{true, false} {
		name := map[bool]string{true: "new claim succeeded", false: "new claim in flight"}[done]
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			now := time.Now()
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			cs, err := cache.Open(cache.Options{Dir: t.TempDir(), TTL: time.Minute, Now: clock})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cs.Close() })
			ctx := context.Background()
			id := store.ID{Tenant: "default", Key: "POST /cards F-1 #1"}
			req := store.Request{Fingerprint: []byte("fp")}
			if _, _, err := cs.Begin(ctx, id, req, "o1", time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := cs.Complete(ctx, id, "o1", store.Response{Status: 402, Body: []byte(`{"status":"failed"}`)}, time.Time{}); err != nil {
				t.Fatal(err)
			}
			s := &betweenStore{Store: cs, between: func() {
				mu.Lock()
				now = now.Add(2 * time.Minute) // the failed record expires
				mu.Unlock()
				if _, created, err := cs.Begin(ctx, id, req, "o2", time.Minute); err != nil || !created {
					t.Errorf("new claim: created %v, %v", created, err)
				}
				if done {
					if err := cs.Complete(ctx, id, "o2", store.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, time.Time{}); err != nil {
						t.Error(err)
					}
				}
			}}
			h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default", OrderKeys: func(method, path, value, client string, gen int) ([]string, error) {
				return []string{method + " " + path + " " + value + " #" + strconv.Itoa(gen)}, nil
			}})
			r := httptest.NewRequest("POST", "/admin/v1/orders/renew", strings.NewReader(`{"method":"POST","path":"/cards","value":"F-1"}`))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != 409 || !strings.Contains(w.Body.String(), `"renew_refused"`) {
				t.Fatalf("renew = %d %s, want 409 renew_refused", w.Code, w.Body)
			}
			rec, err := cs.Get(ctx, id)
			if err != nil || rec.Superseded || rec.Owner != "o2" {
				t.Fatalf("new claim's record after the renew = %+v, %v; want it untouched, not superseded", rec, err)
			}
			w = call(t, h, "GET", "/admin/v1/orders?method=POST&path=/cards&value=F-1", "")
			if !strings.Contains(w.Body.String(), `"generation":1`) {
				t.Fatalf("order after the refused renew = %d %s, want generation 1", w.Code, w.Body)
			}
		})
	}
}
