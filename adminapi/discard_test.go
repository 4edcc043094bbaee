package adminapi_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/store"
)

// TestDiscardCall: POST /admin/v1/records/discard takes {key, client}
// (400 for another field, no key, or no client with client tokens on),
// refuses a readable record 409 discard_refused and leaves it, answers 404
// for none; GET on its path is the record of the key "discard".
func TestDiscardCall(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	id := store.ID{Tenant: "shop", Key: "k-1"}
	if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Park(ctx, id, "o", store.Outcome{Attempts: 1, LastError: "504"}); err != nil {
		t.Fatal(err)
	}
	h := adminapi.New(adminapi.Options{Store: s, Clients: []string{"shop"}})
	post := func(body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/v1/records/discard", strings.NewReader(body)))
		return w
	}
	for _, c := range []struct {
		body string
		want int
		code string
	}{
		{`{"key":"k-1","client":"shop","force":true}`, 400, "bad_request"},
		{`{"client":"shop"}`, 400, "bad_request"},
		{`{"key":"k-1"}`, 400, "bad_request"},
		{`{"key":"k-2","client":"shop"}`, 404, "not_found"},
		{`{"key":"k-1","client":"shop"}`, 409, "discard_refused"},
	} {
		if w := post(c.body); w.Code != c.want || !strings.Contains(w.Body.String(), `"`+c.code+`"`) || w.Header().Get(adminapi.Header) != "v1" {
			t.Errorf("discard %s = %d %s, want %d %s", c.body, w.Code, w.Body, c.want, c.code)
		}
	}
	if rec, err := s.Get(ctx, id); err != nil || rec.State != store.Unknown {
		t.Fatalf("record after the refused discard = %+v, %v; want it unknown as it was", rec, err)
	}
	callPathIsAlsoAKey(t, h, "discard")
}
