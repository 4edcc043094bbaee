package adminapi_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/store"
)

// TestResolveRecord: the checks of POST /admin/v1/records/resolve before
// anything is written, the answer stored for executed, and the log line.
func TestResolveRecord(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	id := store.ID{Tenant: "shop", Key: "k-1"}
	req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/payments", UpstreamKey: "up-k-1"}
	if _, _, err := s.Begin(ctx, id, req, "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Park(ctx, id, "o", store.Outcome{Attempts: 2, LastError: "504 from upstream"}); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	h := adminapi.New(adminapi.Options{Store: s, Clients: []string{"shop"}, Logger: slog.New(slog.NewJSONHandler(&log, nil))})
	post := func(body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/v1/records/resolve", strings.NewReader(body)))
		return w
	}
	for _, body := range []string{
		`{"key":"k-1","outcome":"not_executed"}`,                              // no client with client tokens on
		`{"key":"k-1","client":"shop","outcome":"maybe"}`,                     // no such outcome
		`{"key":"","client":"shop","outcome":"not_executed"}`,                 // no key
		`{"key":"k-1","client":"shop","outcome":"not_executed","status":200}`, // an answer for not_executed
		`{"key":"k-1","client":"shop","outcome":"executed"}`,                  // no status
		`{"key":"k-1","client":"shop","outcome":"executed","status":302}`,     // not 2xx or 4xx
		`{"key":"k-1","client":"shop","outcome":"executed","status":503}`,     // not 2xx or 4xx
		`{"key":"k-1","client":"shop","outcome":"executed","statsu":200}`,     // a mistyped field
		`{"key":"k-1","client":"shop","outcome":"executed","status":200,"headers":{"Content-Length":"9"}}`,
		`{"key":"k-1","client":"shop","outcome":"executed","status":200,"headers":{"Idemproxy-Attempts":"1"}}`,
		`{"key":"k-1","client":"shop","outcome":"executed","status":200,"headers":{"X-A":"1\r\nX-B: 2"}}`,
		`{"key":"k-1","client":"shop","outcome":"executed","status":200,"headers":{"X A":"1"}}`,
		// One header twice, its names differing in case: the value stored
		// was either, by the map's order (measured: 19 of 20 resolves stored
		// application/xml, 1 text/plain).
		`{"key":"k-1","client":"shop","outcome":"executed","status":200,"headers":{"Content-Type":"text/plain","content-type":"application/xml"}}`,
		// One header twice under one name: encoding/json kept the last
		// value and the resolve stored it, 200.
		`{"key":"k-1","client":"shop","outcome":"executed","status":200,"headers":{"Content-Type":"text/plain","Content-Type":"application/xml"}}`,
	} {
		if w := post(body); w.Code != 400 || !strings.Contains(w.Body.String(), `"bad_request"`) {
			t.Errorf("%s = %d %s, want 400 bad_request", body, w.Code, w.Body)
		}
	}
	if rec, err := s.Get(ctx, id); err != nil || rec.State != store.Unknown || log.Len() != 0 {
		t.Fatalf("after refused calls: %+v, %v, log %q; want unknown and nothing logged", rec, err, log.String())
	}
	// A person's note in text, with its type.
	w := post(`{"key":"k-1","client":"shop","outcome":"executed","status":402,"body":"card declined","headers":{"content-type":"text/plain"}}`)
	if w.Code != 200 || w.Header().Get(adminapi.Header) != "v1" || !strings.Contains(w.Body.String(), `"state":"final"`) ||
		!strings.Contains(w.Body.String(), `"reconciled":true`) || !strings.Contains(w.Body.String(), `"status":402`) {
		t.Fatalf("resolve executed = %d %s, want 200 with the final record", w.Code, w.Body)
	}
	rec, err := s.Get(ctx, id)
	if err != nil || rec.State != store.Final || rec.Response.Status != 402 || string(rec.Response.Body) != "card declined" ||
		rec.Response.Header.Get("Content-Type") != "text/plain" || rec.Response.Header.Get("Idemproxy-Reconciled") != "true" {
		t.Fatalf("stored = %+v, %v; want 402 text/plain 'card declined', reconciled", rec, err)
	}
	for _, want := range []string{`"level":"WARN"`, `"outcome":"executed"`, `"client":"shop"`, `"key":"k-1"`, `"upstream_key":"up-k-1"`, `"who":"192.0.2.1:1234"`, `"status":402`, `"attempts":2`} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log %s lacks %s", log.String(), want)
		}
	}
	callPathIsAlsoAKey(t, h, "resolve")
}

// callPathIsAlsoAKey checks that another method than POST on the path of
// the call /admin/v1/records/<call> is 405, and that GET there is the record
// of the key <call> (none here: 404).
func callPathIsAlsoAKey(t *testing.T, h http.Handler, call string) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("PUT", "/admin/v1/records/"+call, nil))
	if w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD, POST" {
		t.Fatalf("PUT = %d %v, want 405 with Allow: GET, HEAD, POST", w.Code, w.Header())
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/admin/v1/records/"+call+"?client=shop", nil))
	if w.Code != 404 || !strings.Contains(w.Body.String(), "no record for this key") {
		t.Fatalf("GET /admin/v1/records/%s = %d %s, want the record of the key %s (404)", call, w.Code, w.Body, call)
	}
}

// A resolve executed whose body is text (`records resolve --body 'paid,
// see dashboard'` sends it as a JSON string) stores it with Content-Type
// text/plain unless a type is given: it was stored as application/json, and
// the app's next request got 201 application/json with a body no JSON parser
// reads. A JSON body, or a JSON string holding JSON, keeps application/json.
func TestResolveTextBodyType(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default", Logger: slog.New(slog.DiscardHandler)})
	for i, c := range []struct{ body, wantType string }{
		{`"paid, see the dashboard"`, "text/plain; charset=utf-8"},
		{`{"payment_id":"p-1","status":"succeeded"}`, "application/json"},
		{`"{\"payment_id\":\"p-1\"}"`, "application/json"},
		{`"ok","headers":{"Content-Type":"text/html"}`, "text/html"},
	} {
		id := store.ID{Tenant: "default", Key: "k-" + string(rune('a'+i))}
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/payments"}, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Park(ctx, id, "o", store.Outcome{Attempts: 1, LastError: "504 from upstream"}); err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/v1/records/resolve",
			strings.NewReader(`{"key":"`+id.Key+`","outcome":"executed","status":201,"body":`+c.body+`}`)))
		if w.Code != 200 {
			t.Fatalf("resolve with body %s = %d %s, want 200", c.body, w.Code, w.Body)
		}
		rec, err := s.Get(ctx, id)
		if err != nil || rec.Response.Header.Get("Content-Type") != c.wantType {
			t.Errorf("body %s stored as %+v, %v; want Content-Type %s", c.body, rec.Response, err, c.wantType)
		}
	}
}
