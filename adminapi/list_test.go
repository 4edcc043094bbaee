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

// TestListWithoutBodyOnePage: N answers of about 900 KiB that say
// needs_review, listed with limit=N and no body=1, come in one page of N
// records, each marked needs_review and without a body, as they do for one
// client (?client=); the same listing with body=1 is paged by bytes, each
// page under store.MaxListBytes (4 MiB). Before, the store read every body
// whether shown or not, and cut the pages by them: the listing without
// body=1 came 4 records to a page (N/4 pages) though each page's JSON was
// a few KiB. No listing shows a fingerprint or an owner token.
func TestListWithoutBodyOnePage(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	size := int(min(s.MaxBodyBytes(), 900<<10))
	const n = 24
	for i := range n {
		k := fmt.Sprintf("review-%02d", i)
		id := store.ID{Tenant: "default", Key: k}
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fingerprint-of-" + k), Method: "POST", Path: "/payments"},
			"owner-token-"+k, time.Hour); err != nil {
			t.Fatal(err)
		}
		body := []byte(`{"status":"needs_review","id":"` + k + `","pad":"`)
		body = append(body, bytes.Repeat([]byte{'x'}, size-len(body)-2)...)
		body = append(body, `"}`...)
		if err := s.Complete(ctx, id, "owner-token-"+k, store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})
	type page struct {
		Records []struct {
			Key         string          `json:"key"`
			NeedsReview bool            `json:"needs_review"`
			Body        json.RawMessage `json:"body"`
		} `json:"records"`
		NextCursor string `json:"next_cursor"`
	}
	get := func(target string) (page, int) {
		t.Helper()
		w := call(t, h, "GET", target, "")
		if w.Code != 200 {
			t.Fatalf("GET %s = %d %s", target, w.Code, w.Body)
		}
		if bytes.Contains(w.Body.Bytes(), []byte("fingerprint-of-")) || bytes.Contains(w.Body.Bytes(), []byte("owner-token-")) {
			t.Fatalf("GET %s shows a fingerprint or an owner token", target)
		}
		var p page
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		return p, w.Body.Len()
	}
	for _, target := range []string{
		fmt.Sprintf("/admin/v1/records?state=needs_review&limit=%d", n),
		fmt.Sprintf("/admin/v1/records?state=needs_review&limit=%d&client=default", n),
	} {
		p, bytes := get(target)
		if len(p.Records) != n {
			t.Fatalf("GET %s: %d records and next cursor %q (%d bytes of JSON), want all %d in one page",
				target, len(p.Records), p.NextCursor, bytes, n)
		}
		if p.NextCursor != "" { // a full page may have one: the rest is empty
			if rest, _ := get(target + "&cursor=" + url.QueryEscape(p.NextCursor)); len(rest.Records) != 0 || rest.NextCursor != "" {
				t.Fatalf("GET %s: after the first page, %d more records and next cursor %q", target, len(rest.Records), rest.NextCursor)
			}
		}
		for _, r := range p.Records {
			if !r.NeedsReview || r.Body != nil {
				t.Fatalf("GET %s: %s listed with needs_review %v and a body of %d bytes, want true and none",
					target, r.Key, r.NeedsReview, len(r.Body))
			}
		}
	}
	cursor, pages, listed := "", 0, 0
	for {
		p, bytes := get(fmt.Sprintf("/admin/v1/records?state=needs_review&limit=%d&body=1&cursor=%s", n, url.QueryEscape(cursor)))
		if bytes > store.MaxListBytes+64<<10 {
			t.Fatalf("page %d with body=1 is %d bytes: more than the listing budget of %d", pages, bytes, store.MaxListBytes)
		}
		for _, r := range p.Records {
			if len(r.Body) != size {
				t.Fatalf("page %d with body=1: %s listed with a body of %d bytes, stored %d", pages, r.Key, len(r.Body), size)
			}
		}
		listed += len(p.Records)
		pages++
		if p.NextCursor == "" {
			break
		}
		if p.NextCursor == cursor || pages > n {
			t.Fatalf("the listing with body=1 does not advance: cursor %q after %d pages", p.NextCursor, pages)
		}
		cursor = p.NextCursor
	}
	if listed != n || pages < 2 {
		t.Fatalf("body=1: %d records in %d pages, want %d in pages of at most 4 MiB", listed, pages, n)
	}
	t.Logf("%d records of %d bytes: one page without body=1, %d pages with", n, size, pages)
}
