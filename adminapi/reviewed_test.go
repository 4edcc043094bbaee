package adminapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/store"
)

// TestReviewedRecord: POST /admin/v1/records/reviewed marks only a final
// answer that needs review, refusing the rest in the contract's error shape
// with nothing written or logged; a marked record leaves the needs_review
// listing and expires a TTL from then; the change is logged once.
func TestReviewedRecord(t *testing.T) {
	s := openStore(t) // TTL an hour
	ctx := context.Background()
	final := func(key string, resp store.Response) store.ID {
		t.Helper()
		id := store.ID{Tenant: "shop", Key: key}
		req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/cards", UpstreamKey: "up-" + key}
		if _, _, err := s.Begin(ctx, id, req, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, id, "o", resp, time.Time{}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	review := store.Response{Status: 200, Header: http.Header{}, Body: []byte(`{"id":"op_1","status":"needs_review"}`)}
	id := final("k-review", review)
	final("k-ok", store.Response{Status: 200, Header: http.Header{}, Body: []byte(`{"id":"op_2","status":"succeeded"}`)})
	inflight := store.ID{Tenant: "shop", Key: "k-inflight"}
	if _, _, err := s.Begin(ctx, inflight, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	unknown := store.ID{Tenant: "shop", Key: "k-unknown"}
	if _, _, err := s.Begin(ctx, unknown, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Park(ctx, unknown, "o", store.Outcome{Attempts: 1, LastBody: review.Body}); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	h := adminapi.New(adminapi.Options{Store: s, Clients: []string{"shop"}, Logger: slog.New(slog.NewJSONHandler(&log, nil))})
	post := func(body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/v1/records/reviewed", strings.NewReader(body)))
		return w
	}
	listed := func() string {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/admin/v1/records?state=needs_review", nil))
		return w.Body.String()
	}
	if !strings.Contains(listed(), `"key":"k-review"`) {
		t.Fatalf("needs_review listing = %s, want k-review", listed())
	}
	for _, c := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"key":"k-review"}`, 400, "bad_request"},                                // no client with client tokens on
		{`{"key":"","client":"shop"}`, 400, "bad_request"},                        // no key
		{`{"key":"k-review","client":"shop","reviewd":true}`, 400, "bad_request"}, // a mistyped field
		{`not json`, 400, "bad_request"},                                          // not JSON
		{`{"key":"k-none","client":"shop"}`, 404, "not_found"},                    // no record
		{`{"key":"k-inflight","client":"shop"}`, 409, "review_refused"},           // in flight
		{`{"key":"k-unknown","client":"shop"}`, 409, "review_refused"},            // unknown, whatever its last answer
		{`{"key":"k-ok","client":"shop"}`, 409, "review_refused"},                 // an answer that needs no review
	} {
		w := post(c.body)
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || w.Code != c.status || e.Error.Code != c.code ||
			e.Error.Message == "" || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s = %d %s, want %d {\"error\":{\"code\":%q,…}}", c.body, w.Code, w.Body, c.status, c.code)
		}
	}
	for _, k := range []string{"k-review", "k-ok"} {
		if rec, err := s.Get(ctx, store.ID{Tenant: "shop", Key: k}); err != nil || rec.Reviewed {
			t.Fatalf("%s after refused calls: %+v, %v; want it unmarked", k, rec, err)
		}
	}
	if log.Len() != 0 {
		t.Fatalf("refused calls logged %s", log.String())
	}

	w := post(`{"key":"k-review","client":"shop"}`)
	var out adminapi.Reviewed
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || w.Code != 200 || out.Key != "k-review" || out.Client != "shop" ||
		!out.Record.Reviewed || !out.Record.NeedsReview || out.Record.State != "final" {
		t.Fatalf("reviewed = %d %s (%v), want 200 with the record marked", w.Code, w.Body, err)
	}
	if e := out.Record.ExpiresAt; e == nil || e.Before(time.Now().Add(50*time.Minute)) || e.After(time.Now().Add(70*time.Minute)) {
		t.Fatalf("reviewed record expires at %v, want about an hour (the TTL) from now", e)
	}
	if strings.Contains(listed(), `"key":"k-review"`) {
		t.Fatalf("needs_review listing after reviewed = %s, want k-review gone", listed())
	}
	for _, want := range []string{`"level":"WARN"`, `marked reviewed`, `"client":"shop"`, `"key":"k-review"`,
		`"upstream_key":"up-k-review"`, `"who":"192.0.2.1:1234"`, `"expires_at":"`} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log %s lacks %s", log.String(), want)
		}
	}
	// Again: the same answer, nothing changed, nothing logged again.
	logged := log.Len()
	w = post(`{"key":"k-review","client":"shop"}`)
	var again adminapi.Reviewed
	if err := json.Unmarshal(w.Body.Bytes(), &again); err != nil || w.Code != 200 || !again.Record.Reviewed ||
		again.Record.ExpiresAt == nil || !again.Record.ExpiresAt.Equal(*out.Record.ExpiresAt) || log.Len() != logged {
		t.Fatalf("second reviewed = %d %s, log %s; want 200, the same expiry, no new log line", w.Code, w.Body, log.String()[logged:])
	}
	if rec, err := s.Get(ctx, id); err != nil || string(rec.Response.Body) != string(review.Body) {
		t.Fatalf("reviewed record's answer = %+v, %v; want it kept", rec, err)
	}

	callPathIsAlsoAKey(t, h, "reviewed")
}

// reviewedBetweenStore is a real store that runs between right before the
// first Reviewed only (not the ones between makes itself).
type reviewedBetweenStore struct {
	*cache.Store
	between func()
	first   atomic.Bool
}

func (s *reviewedBetweenStore) Reviewed(ctx context.Context, id store.ID) (store.Record, bool, error) {
	if s.first.CompareAndSwap(false, true) {
		s.between()
	}
	return s.Store.Reviewed(ctx, id)
}

// Two reviewed calls for one record that both read it before either wrote
// (two operators, or two replicas): both answer 200 with the record marked,
// as a second call does, and the change is logged once. Both were logged as
// the operator's mark, one change shown as two.
func TestReviewedTwiceAtOnceLoggedOnce(t *testing.T) {
	cs := openStore(t)
	ctx := context.Background()
	id := store.ID{Tenant: "default", Key: "k-review"}
	if _, _, err := cs.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := cs.Complete(ctx, id, "o", store.Response{Status: 200, Body: []byte(`{"status":"needs_review"}`)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	var h *adminapi.Handler
	mark := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/v1/records/reviewed", strings.NewReader(`{"key":"k-review"}`)))
		return w
	}
	var second *httptest.ResponseRecorder
	s := &reviewedBetweenStore{Store: cs, between: func() { second = mark() }}
	h = adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default", Logger: slog.New(slog.NewJSONHandler(&log, nil))})
	first := mark()
	for _, w := range []*httptest.ResponseRecorder{first, second} {
		if w.Code != 200 || !strings.Contains(w.Body.String(), `"reviewed":true`) {
			t.Fatalf("reviewed = %d %s, want 200 with the record marked", w.Code, w.Body)
		}
	}
	if n := strings.Count(log.String(), "marked reviewed by an operator"); n != 1 {
		t.Fatalf("%d marks logged, want 1:\n%s", n, log.String())
	}
}
