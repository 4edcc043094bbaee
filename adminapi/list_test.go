package adminapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/store"
)

// TestListLargeAnswersPagedByBytes: 40 answers of about 900 KiB that say
// needs_review, listed with limit=1000&body=1, come in pages of at most
// store.MaxListBytes (4 MiB) each, which together hold every record once
// with its body. Before, the first page held all 40: the store read 36 MiB
// of records and the answer copied them into 36 MiB of JSON, and a thousand
// such records would have taken 1-2 GiB of a proxy meant to run in 256 MiB.
func TestListLargeAnswersPagedByBytes(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	size := int(min(s.MaxBodyBytes(), 900<<10))
	want := map[string]int{}
	for i := range 40 {
		k := fmt.Sprintf("review-%02d", i)
		id := store.ID{Tenant: "default", Key: k}
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/payments"}, "o", time.Hour); err != nil {
			t.Fatal(err)
		}
		body := []byte(`{"status":"needs_review","id":"` + k + `","pad":"`)
		body = append(body, bytes.Repeat([]byte{'x'}, size-len(body)-2)...)
		body = append(body, `"}`...)
		if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
			t.Fatal(err)
		}
		want[k] = len(body)
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})
	seen := map[string]bool{}
	cursor, pages := "", 0
	for {
		w := call(t, h, "GET", "/admin/v1/records?state=needs_review&limit=1000&body=1&cursor="+url.QueryEscape(cursor), "")
		if w.Code != 200 {
			t.Fatalf("page %d = %d %s", pages, w.Code, w.Body)
		}
		// The answer is the page's bodies and a few hundred bytes per record.
		if n := w.Body.Len(); n > store.MaxListBytes+64<<10 {
			t.Fatalf("page %d is %d bytes: more than the listing budget of %d (store.MaxListBytes)", pages, n, store.MaxListBytes)
		}
		var p struct {
			Records []struct {
				Key         string          `json:"key"`
				NeedsReview bool            `json:"needs_review"`
				Body        json.RawMessage `json:"body"`
			} `json:"records"`
			NextCursor string `json:"next_cursor"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Records) == 0 && p.NextCursor != "" {
			t.Fatalf("page %d is empty with a next cursor", pages)
		}
		for _, r := range p.Records {
			if seen[r.Key] {
				t.Fatalf("%s listed twice", r.Key)
			}
			seen[r.Key] = true
			if n, ok := want[r.Key]; !ok || len(r.Body) != n || !r.NeedsReview {
				t.Fatalf("page %d: %s listed with needs_review %v and a body of %d bytes, want %d", pages, r.Key, r.NeedsReview, len(r.Body), n)
			}
		}
		pages++
		if p.NextCursor == "" {
			break
		}
		if p.NextCursor == cursor || pages > 40 {
			t.Fatalf("the listing does not advance: cursor %q after %d pages", p.NextCursor, pages)
		}
		cursor = p.NextCursor
	}
	if len(seen) != len(want) {
		t.Fatalf("%d pages listed %d of the %d records", pages, len(seen), len(want))
	}
	t.Logf("%d records of %d bytes in %d pages", len(want), size, pages)
}
