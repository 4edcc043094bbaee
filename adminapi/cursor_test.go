package adminapi_test

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/store"
)

// TestListCursorOfAnotherState: a cursor is a position in the listing of
// one state. Given to the listing of another state (a script that pages the
// unknown records, then the in-flight ones with the cursor it kept) it is
// refused 400 bad_request; before, it was taken as a position there too,
// and that listing silently left out every record before it.
func TestListCursorOfAnotherState(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	for i, k := range []string{"a", "b", "c", "d", "e", "f"} {
		id := store.ID{Tenant: "default", Key: k}
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Hour); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := s.Park(ctx, id, "o", store.Outcome{Attempts: 1, LastError: "504"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})
	page := func(state, cursor string, limit int) (int, []string, string) {
		t.Helper()
		w := call(t, h, "GET", "/admin/v1/records?state="+state+"&limit="+strconv.Itoa(limit)+"&cursor="+url.QueryEscape(cursor), "")
		var p struct {
			Records    []struct{ Key string } `json:"records"`
			NextCursor string                 `json:"next_cursor"`
		}
		if w.Code != 200 {
			return w.Code, nil, w.Body.String()
		}
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, r := range p.Records {
			keys = append(keys, r.Key)
		}
		return 200, keys, p.NextCursor
	}
	code, first, cursor := page("unknown", "", 2)
	if code != 200 || len(first) != 2 || cursor == "" {
		t.Fatalf("first page of unknown = %d %v %q", code, first, cursor)
	}
	if code, keys, body := page("in_flight", cursor, 9); code != 400 || !strings.Contains(body, `"bad_request"`) {
		t.Fatalf("in_flight listing given the unknown listing's cursor = %d %v %s, want 400 bad_request", code, keys, body)
	}
	code, rest, next := page("unknown", cursor, 9)
	if code != 200 || len(rest) != 1 || next != "" {
		t.Fatalf("second page of unknown = %d %v %q, want the last unknown record", code, rest, next)
	}
	if code, keys, _ := page("in_flight", "", 9); code != 200 || len(keys) != 3 {
		t.Fatalf("in_flight listing = %d %v, want its 3 records", code, keys)
	}
}

// TestListOneClient: with client tokens on, ?client= lists that client's
// records only, page by page, each once; before, the parameter was
// silently ignored and an operator asking for one client's unknown
// operations got every client's. A client without a token is 400, and a
// cursor of one client's listing is refused for another's.
func TestListOneClient(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	want := map[string]bool{}
	for i := range 12 {
		tenant := []string{"shop", "games", "bank"}[i%3]
		id := store.ID{Tenant: tenant, Key: "k" + strconv.Itoa(i)}
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := s.Park(ctx, id, "o", store.Outcome{Attempts: 1, LastError: "504"}); err != nil {
			t.Fatal(err)
		}
		if tenant == "shop" {
			want[id.Key] = true
		}
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default", Clients: []string{"shop", "games", "bank"}})
	got := map[string]int{}
	cursor := ""
	for page := 1; ; page++ {
		if page > 5 {
			t.Fatalf("no last page after 5 pages; got %v", got)
		}
		w := call(t, h, "GET", "/admin/v1/records?state=unknown&limit=2&client=shop&cursor="+url.QueryEscape(cursor), "")
		var p struct {
			Records []struct {
				Key    string `json:"key"`
				Client string `json:"client"`
			} `json:"records"`
			NextCursor string `json:"next_cursor"`
		}
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &p) != nil {
			t.Fatalf("page %d = %d %s", page, w.Code, w.Body)
		}
		for _, r := range p.Records {
			if r.Client != "shop" {
				t.Errorf("listing of client shop shows %s of client %s", r.Key, r.Client)
			}
			got[r.Key]++
		}
		if p.NextCursor == "" {
			break
		}
		if page == 1 {
			if w := call(t, h, "GET", "/admin/v1/records?state=unknown&client=games&cursor="+url.QueryEscape(p.NextCursor), ""); w.Code != 400 {
				t.Errorf("client games's listing given shop's cursor = %d %s, want 400", w.Code, w.Body)
			}
		}
		cursor = p.NextCursor
	}
	if len(got) != len(want) {
		t.Fatalf("listing of client shop = %v, want each of %v once", got, want)
	}
	for k, n := range got {
		if !want[k] || n != 1 {
			t.Fatalf("listing of client shop = %v, want each of %v once", got, want)
		}
	}
	if w := call(t, h, "GET", "/admin/v1/records?state=unknown&client=nobody", ""); w.Code != 400 || !strings.Contains(w.Body.String(), `"bad_request"`) {
		t.Fatalf("listing of a client with no token = %d %s, want 400 bad_request", w.Code, w.Body)
	}
	if w := call(t, h, "GET", "/admin/v1/records?state=unknown&limit=1000", ""); !strings.Contains(w.Body.String(), `"client":"games"`) {
		t.Fatalf("listing without client = %d %s, want every client's records", w.Code, w.Body)
	}
}
