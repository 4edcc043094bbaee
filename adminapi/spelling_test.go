package adminapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/store"
)

// An app's UUID key is stored in lower case (idemkey.Canonical); the operator
// who copies it from the app's database, where a uniqueidentifier column
// gave it back upper-cased (in braces through ADO), finds its record and
// settles it. Before, the admin API looked keys up byte for byte: 404. A
// record a build before the change stored under the app's spelling is found
// under that spelling.
func TestRecordKeyInAnySpelling(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	const lower = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	upper := strings.ToUpper(lower)
	needsReview := store.ID{Tenant: "default", Key: lower}
	if _, _, err := s.Begin(ctx, needsReview, store.Request{Fingerprint: []byte("fp")}, "o1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, needsReview, "o1", store.Response{Status: 200, Body: []byte(`{"status":"needs_review"}`)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	const oldLower = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	old := store.ID{Tenant: "default", Key: strings.ToUpper(oldLower)} // stored as the app sent it
	if _, _, err := s.Begin(ctx, old, store.Request{Fingerprint: []byte("fp")}, "o2", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, old, "o2", store.Response{Status: 201}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})

	for _, key := range []string{lower, upper, "{" + upper + "}"} {
		w := call(t, h, "GET", "/admin/v1/records/"+key, "")
		var rec adminapi.Record
		if err := json.Unmarshal(w.Body.Bytes(), &rec); err != nil || w.Code != 200 || rec.Key != lower || rec.Status != 200 {
			t.Errorf("GET %s = %d %s, want 200 with the record of %s", key, w.Code, w.Body, lower)
		}
	}
	w := call(t, h, "GET", "/admin/v1/records/"+old.Key, "")
	var rec adminapi.Record
	if json.Unmarshal(w.Body.Bytes(), &rec) != nil || w.Code != 200 || rec.Key != old.Key || rec.Status != 201 {
		t.Errorf("GET of a record stored under the app's spelling = %d %s, want 200 with it", w.Code, w.Body)
	}

	r := httptest.NewRequest("POST", "/admin/v1/records/reviewed", strings.NewReader(`{"key":"`+upper+`"}`))
	rw := httptest.NewRecorder()
	h.ServeHTTP(rw, r)
	if rw.Code != http.StatusOK {
		t.Fatalf("reviewed with the upper-cased key = %d %s, want 200", rw.Code, rw.Body)
	}
	if rec, err := s.Get(ctx, needsReview); err != nil || !rec.Reviewed {
		t.Errorf("record after reviewed = %+v, %v; want marked reviewed", rec, err)
	}
}
