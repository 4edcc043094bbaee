package adminapi_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// renewBetweenStore is a real store that runs between right before the
// first Supersede only (not the ones between makes itself).
type renewBetweenStore struct {
	*cache.Store
	between func()
	first   atomic.Bool
}

func (s *renewBetweenStore) Supersede(ctx context.Context, id store.ID, owner string) (store.Record, error) {
	if s.first.CompareAndSwap(false, true) {
		s.between()
	}
	return s.Store.Supersede(ctx, id, owner)
}

// Two renews of one failed order that both read its record before either
// wrote (two operators, or two replicas, at once): the first to write moves
// the order to generation 2, the other is refused 409 renew_refused, as a
// second renew in a row is, and only one renew is logged. Both were
// answered 200 and logged as a renew, one change shown as two.
func TestRenewTwiceAtOnceOneWins(t *testing.T) {
	cs := openStore(t)
	ctx := context.Background()
	id := store.ID{Tenant: "default", Key: "POST /cards F-1 #1"}
	if _, _, err := cs.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := cs.Complete(ctx, id, "o1", store.Response{Status: 402, Body: []byte(`{"status":"failed"}`)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var h *adminapi.Handler
	renew := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/admin/v1/orders/renew", strings.NewReader(`{"method":"POST","path":"/cards","value":"F-1"}`))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	var second *httptest.ResponseRecorder
	s := &renewBetweenStore{Store: cs, between: func() { second = renew() }}
	h = adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default", Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		OrderKeys: func(method, path, value, client string, gen int) ([]string, error) {
			return []string{method + " " + path + " " + value + " #" + strconv.Itoa(gen)}, nil
		}})
	first := renew()
	if second.Code != 200 || !strings.Contains(second.Body.String(), `"generation":2`) {
		t.Fatalf("the renew that wrote first = %d %s, want 200 generation 2", second.Code, second.Body)
	}
	if first.Code != 409 || !strings.Contains(first.Body.String(), `"renew_refused"`) {
		t.Fatalf("the renew that read the same record and wrote second = %d %s, want 409 renew_refused", first.Code, first.Body)
	}
	if n := strings.Count(logs.String(), "order renewed"); n != 1 {
		t.Fatalf("%d renews logged, want 1:\n%s", n, logs.String())
	}
	w := call(t, h, "GET", "/admin/v1/orders?method=POST&path=/cards&value=F-1", "")
	if !strings.Contains(w.Body.String(), `"generation":2`) || !strings.Contains(w.Body.String(), `"record":null`) {
		t.Fatalf("order after the renews = %d %s, want generation 2 with no record yet", w.Code, w.Body)
	}
}
