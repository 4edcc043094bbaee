package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/store"
)

// shortBudget is a real store whose listings' time budget is spent at once,
// as on a store with millions of final answers: every page of a filtered
// listing is cut after the first record looked at.
type shortBudget struct{ *cache.Store }

func (s shortBudget) List(ctx context.Context, f store.Filter, cursor string, limit int) ([]store.Record, string, error) {
	f.Budget = time.Nanosecond
	return s.Store.List(ctx, f, cursor, limit)
}

// TestCLIRecordsListFollowsEmptyPages: records list shows the needs_review
// answers of a store whose pages come empty with a cursor (the API's time for
// a page ran out before it found one): it printed "0 records; more with
// --cursor …", which reads as nothing to settle.
func TestCLIRecordsListFollowsEmptyPages(t *testing.T) {
	st, err := cache.Open(cache.Options{Dir: t.TempDir(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	var review []string
	for i := range 40 {
		id := store.ID{Tenant: "default", Key: fmt.Sprintf("k-%02d", i)}
		if _, _, err := st.Begin(ctx, id, store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/cards"}, "o", time.Hour); err != nil {
			t.Fatal(err)
		}
		body := `{"status":"succeeded"}`
		if i%13 == 5 {
			body = `{"status":"needs_review"}`
			review = append(review, id.Key)
		}
		if err := st.Complete(ctx, id, "o", store.Response{Status: 200, Header: http.Header{}, Body: []byte(body)}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	adm := newAdmin(st, http.NotFoundHandler(), slog.New(slog.NewJSONHandler(io.Discard, nil)))
	adm.api = adminapi.New(adminapi.Options{Store: shortBudget{st}, Token: adminToken, DefaultTenant: "default"})
	srv := httptest.NewServer(adm)
	defer srv.Close()
	var out, errOut bytes.Buffer
	code := recordsList([]string{"--state", "needs_review", "--limit", "2"},
		[]string{"IDEMPROXY_ADMIN_ADDR=" + srv.Listener.Addr().String(), "IDEMPROXY_ADMIN_TOKEN=" + adminToken}, &out, &errOut)
	if code != 0 {
		t.Fatalf("records list = %d\n%s%s", code, out.String(), errOut.String())
	}
	listed := 0
	for _, k := range review {
		if strings.Contains(out.String(), k) {
			listed++
		}
	}
	if listed == 0 || strings.Contains(out.String(), "0 records") {
		t.Fatalf("records list printed no needs_review record (of %v):\n%s", review, out.String())
	}
}
