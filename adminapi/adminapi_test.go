package adminapi_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
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

// openStore is a real Badger store in a temporary directory.
func openStore(t *testing.T) *cache.Store {
	t.Helper()
	s, err := cache.Open(cache.Options{Dir: t.TempDir(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func call(t *testing.T, h http.Handler, method, target, token string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestAuth(t *testing.T) {
	h := adminapi.New(adminapi.Options{Store: openStore(t), Token: "s3cret-admin-token", DefaultTenant: "default"})
	cases := []struct {
		name, token string
		want        int
	}{
		{"no token", "", 401},
		{"wrong token", "s3cret-admin-tokeX", 401},
		{"prefix of the token", "s3cret", 401},
		{"right token", "s3cret-admin-token", 404}, // authorized; the record does not exist
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := call(t, h, "GET", "/admin/v1/records/k-1", c.token)
			if w.Code != c.want {
				t.Fatalf("= %d %s, want %d", w.Code, w.Body, c.want)
			}
			if c.want == 401 && (w.Header().Get("WWW-Authenticate") == "" || !strings.Contains(w.Body.String(), `"unauthorized"`)) {
				t.Fatalf("401 without WWW-Authenticate or code: %v %s", w.Header(), w.Body)
			}
		})
	}
	// A known call with another method is 405 naming the right one, not
	// 404 not_found, which reads as "no such record".
	for _, c := range []struct{ method, target, allow string }{
		{"DELETE", "/admin/v1/records/k-1", "GET, HEAD"},
		{"POST", "/admin/v1/records", "GET, HEAD"},
		{"GET", "/admin/v1/orders/renew", "POST"},
	} {
		w := call(t, h, c.method, c.target, "s3cret-admin-token")
		if w.Code != 405 || w.Header().Get("Allow") != c.allow || !strings.Contains(w.Body.String(), `"method_not_allowed"`) {
			t.Fatalf("%s %s = %d %v %s, want 405 method_not_allowed with Allow: %s", c.method, c.target, w.Code, w.Header(), w.Body, c.allow)
		}
	}
	// The first 405s of a new handler, served at once (the race detector
	// watches the handler's state).
	h = adminapi.New(adminapi.Options{Store: openStore(t), Token: "s3cret-admin-token", DefaultTenant: "default"})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := httptest.NewRequest("DELETE", "/admin/v1/records/k-1", nil)
			r.Header.Set("Authorization", "Bearer s3cret-admin-token")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("concurrent DELETE = %d, Allow %q; want 405 with Allow: GET, HEAD", w.Code, w.Header().Get("Allow"))
			}
		}()
	}
	wg.Wait()
	if w := call(t, h, "GET", "/admin/v1/nothing", "s3cret-admin-token"); w.Code != 404 || !strings.Contains(w.Body.String(), `"not_found"`) {
		t.Fatalf("an unknown call = %d %s, want 404 not_found", w.Code, w.Body)
	}
	open := adminapi.New(adminapi.Options{Store: openStore(t), DefaultTenant: "default"})
	if w := call(t, open, "GET", "/admin/v1/records/k-1", ""); w.Code != 404 {
		t.Fatalf("without a configured token = %d, want 404 (open)", w.Code)
	}
}

func TestGetRecord(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	final := store.ID{Tenant: "default", Key: "k-final"}
	unknown := store.ID{Tenant: "shop", Key: "k-unknown"}
	if _, _, err := s.Begin(ctx, final, store.Request{Fingerprint: []byte("fp")}, "o1", time.Minute); err != nil {
		t.Fatal(err)
	}
	body := `{"id":"op_1","status":"needs_review"}`
	if err := s.Complete(ctx, final, "o1", store.Response{Status: 200, Header: http.Header{"Idemproxy-Attempts": {"2"}}, Body: []byte(body)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	sent := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/payments", UpstreamKey: "bound-to-shop-1f2e"}
	if _, _, err := s.Begin(ctx, unknown, req, "o2", time.Minute); err != nil {
		t.Fatal(err)
	}
	lastBody := `{"payment_id":"pay_secret_7"}`
	if err := s.Park(ctx, unknown, "o2", store.Outcome{FirstSentAt: sent, Attempts: 3, LastError: "504 from upstream", LastBody: []byte(lastBody)}); err != nil {
		t.Fatal(err)
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})

	w := call(t, h, "GET", "/admin/v1/records/k-final", "")
	var rec adminapi.Record
	if err := json.Unmarshal(w.Body.Bytes(), &rec); err != nil || w.Code != 200 {
		t.Fatalf("= %d %s (%v)", w.Code, w.Body, err)
	}
	if rec.Key != "k-final" || rec.Client != "default" || rec.State != "final" || rec.Status != 200 ||
		!rec.NeedsReview || rec.Attempts != 2 || rec.Body != nil {
		t.Fatalf("final record = %+v", rec)
	}
	// An answer that needs review is kept until an operator marks it
	// reviewed; from then it expires as any final record.
	if rec.ExpiresAt != nil || rec.Reviewed {
		t.Fatalf("final record that needs review: expires_at = %v, reviewed %v; want null (kept), not reviewed", rec.ExpiresAt, rec.Reviewed)
	}
	if _, _, err := s.Reviewed(ctx, final); err != nil {
		t.Fatal(err)
	}
	w = call(t, h, "GET", "/admin/v1/records/k-final", "")
	if err := json.Unmarshal(w.Body.Bytes(), &rec); err != nil || w.Code != 200 || !rec.Reviewed || !rec.NeedsReview {
		t.Fatalf("after Reviewed = %d %s (%v), want it reviewed, still saying needs_review", w.Code, w.Body, err)
	}
	if rec.ExpiresAt == nil || rec.ExpiresAt.Before(time.Now().Add(50*time.Minute)) || rec.ExpiresAt.After(time.Now().Add(70*time.Minute)) {
		t.Fatalf("final record: expires_at = %v, want about an hour (the TTL) from now", rec.ExpiresAt)
	}
	if w.Header().Get(adminapi.Header) != "v1" {
		t.Fatalf("answer without %s: v1: %v", adminapi.Header, w.Header())
	}
	hasFields(t, w.Body.Bytes(), "key", "upstream_key", "client", "state", "method", "path", "status", "attempts",
		"created_at", "first_sent_at", "expires_at", "last_error")
	w = call(t, h, "GET", "/admin/v1/records/k-final?body=1", "")
	json.Unmarshal(w.Body.Bytes(), &rec)
	if string(rec.Body) != body {
		t.Fatalf("body with ?body=1 = %s, want %s", rec.Body, body)
	}
	if strings.Contains(w.Body.String(), "o1") {
		t.Fatalf("the owner token is shown: %s", w.Body)
	}

	if w := call(t, h, "GET", "/admin/v1/records/k-unknown", ""); w.Code != 404 {
		t.Fatalf("another client's record without ?client= = %d, want 404", w.Code)
	}
	w = call(t, h, "GET", "/admin/v1/records/k-unknown?client=shop", "")
	rec = adminapi.Record{}
	json.Unmarshal(w.Body.Bytes(), &rec)
	if rec.State != "unknown" || rec.Attempts != 3 || rec.LastError != "504 from upstream" ||
		rec.FirstSentAt == nil || !rec.FirstSentAt.Equal(sent) || rec.Client != "shop" {
		t.Fatalf("unknown record = %+v (%s)", rec, w.Body)
	}
	// The key sent upstream is the record's, not the app's key.
	if rec.UpstreamKey != req.UpstreamKey || rec.Method != "POST" || rec.Path != "/payments" {
		t.Fatalf("unknown record: upstream key %q, method %q, path %q; want %q POST /payments",
			rec.UpstreamKey, rec.Method, rec.Path, req.UpstreamKey)
	}
	if rec.ExpiresAt != nil {
		t.Fatalf("unknown record: expires_at = %v, want null: kept until resumed", rec.ExpiresAt)
	}
	hasFields(t, w.Body.Bytes(), "key", "upstream_key", "client", "state", "method", "path", "attempts",
		"created_at", "first_sent_at", "expires_at", "last_error")
	if strings.Contains(w.Body.String(), "pay_secret_7") {
		t.Fatalf("the last ambiguous answer's body is shown without ?body=1: %s", w.Body)
	}
}

// hasFields checks that the JSON object body has every one of fields (the
// operator's record, field by field), null or not.
func hasFields(t *testing.T, body []byte, fields ...string) {
	t.Helper()
	var got map[string]json.RawMessage
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("record %s: %v", body, err)
	}
	for _, f := range fields {
		if _, ok := got[f]; !ok {
			t.Errorf("record has no %q: %s", f, body)
		}
	}
}

// The Authorization scheme is case-insensitive (RFC 9110, section 11.1).
func TestAuthSchemeCase(t *testing.T) {
	h := adminapi.New(adminapi.Options{Store: openStore(t), Token: "s3cret-admin-token", DefaultTenant: "default"})
	for _, v := range []string{"bearer s3cret-admin-token", "BEARER s3cret-admin-token", "Bearer  s3cret-admin-token"} {
		r := httptest.NewRequest("GET", "/admin/v1/records/k-1", nil)
		r.Header.Set("Authorization", v)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 404 { // authorized; the record does not exist
			t.Errorf("Authorization %q = %d %s, want 404", v, w.Code, w.Body)
		}
	}
	for _, v := range []string{"Basic s3cret-admin-token", "Bearers3cret-admin-token", "s3cret-admin-token"} {
		r := httptest.NewRequest("GET", "/admin/v1/records/k-1", nil)
		r.Header.Set("Authorization", v)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 401 {
			t.Errorf("Authorization %q = %d %s, want 401", v, w.Code, w.Body)
		}
	}
}

// With ?body=1 every final record has "body": a JSON answer as it is,
// anything else (a gateway's HTML, text, an empty body) as a JSON string.
func TestRecordBodyNotJSON(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	bodies := map[string]string{"k-html": "<html>502 Bad Gateway</html>", "k-empty": "", "k-json": `{"id":"op_1"}`}
	for key, body := range bodies {
		id := store.ID{Tenant: "default", Key: key}
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, id, "o", store.Response{Status: 400, Body: []byte(body)}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})
	for key, body := range bodies {
		w := call(t, h, "GET", "/admin/v1/records/"+key+"?body=1", "")
		var got struct {
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != 200 {
			t.Fatalf("%s = %d %s (%v)", key, w.Code, w.Body, err)
		}
		want, _ := json.Marshal(body)
		if key == "k-json" {
			want = []byte(body)
		}
		if string(got.Body) != string(want) {
			t.Errorf("%s: body = %s, want %s", key, got.Body, want)
		}
	}
}

// A final record's attempts count those of the sequences before it that
// ended unknown, and those of the one that got the answer.
func TestRecordAttemptsAfterResume(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	id := store.ID{Tenant: "default", Key: "k-resumed"}
	req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/payments"}
	if _, _, err := s.Begin(ctx, id, req, "o1", time.Minute); err != nil {
		t.Fatal(err)
	}
	sent := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	if err := s.Park(ctx, id, "o1", store.Outcome{FirstSentAt: sent, Attempts: 3, LastError: "504 from upstream"}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Begin(ctx, id, req, "o2", time.Minute); err != nil || !ok {
		t.Fatalf("resume: %v %v", ok, err)
	}
	if err := s.Complete(ctx, id, "o2", store.Response{Status: 201, Header: http.Header{"Idemproxy-Attempts": {"1"}}, Body: []byte(`{}`)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})
	var rec adminapi.Record
	w := call(t, h, "GET", "/admin/v1/records/k-resumed", "")
	if err := json.Unmarshal(w.Body.Bytes(), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.State != "final" || rec.Attempts != 4 || rec.FirstSentAt == nil || !rec.FirstSentAt.Equal(sent) {
		t.Fatalf("resumed record = %+v, want final, 4 attempts, first sent %v", rec, sent)
	}
}

// POST /admin/v1/orders/renew answers exactly {"key","generation"}: the
// next generation has no record yet, so there is none to show.
func TestRenewAnswer(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	orderKey := func(method, path, value, client string, gen int) (string, error) {
		return method + " " + path + " " + value + " " + client + " #" + strconv.Itoa(gen), nil
	}
	first, _ := orderKey("POST", "/cards", "F-1", "default", 1)
	id := store.ID{Tenant: "default", Key: first}
	if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: []byte(`{"id":"op_1","status":"failed"}`)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default", OrderKeys: func(method, path, value, client string, gen int) ([]string, error) {
		k, err := orderKey(method, path, value, client, gen)
		return []string{k}, err
	}})
	r := httptest.NewRequest("POST", "/admin/v1/orders/renew", strings.NewReader(`{"method":"POST","path":"/cards","value":"F-1","client":""}`))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var got map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != 200 {
		t.Fatalf("renew = %d %s (%v)", w.Code, w.Body, err)
	}
	next, _ := orderKey("POST", "/cards", "F-1", "default", 2)
	want := map[string]any{"key": next, "generation": float64(2)}
	if !maps.Equal(got, want) {
		t.Fatalf("renew = %s, want exactly %v", w.Body, want)
	}
	// A second renew in a row would skip a generation nothing was sent under.
	r = httptest.NewRequest("POST", "/admin/v1/orders/renew", strings.NewReader(`{"method":"POST","path":"/cards","value":"F-1"}`))
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 409 || !strings.Contains(w.Body.String(), `"renew_refused"`) {
		t.Fatalf("second renew = %d %s, want 409 renew_refused", w.Code, w.Body)
	}
	// The method as a person may type it names the same order.
	w = call(t, h, "GET", "/admin/v1/orders?method=post&path=/cards&value=F-1", "")
	if !strings.Contains(w.Body.String(), `"key":"`+next+`"`) || !strings.Contains(w.Body.String(), `"generation":2`) {
		t.Fatalf("order with method=post = %d %s, want the POST order at generation 2, key %s", w.Code, w.Body, next)
	}
}
