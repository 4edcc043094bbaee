package adminapi_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/store"
)

// TestChangeCallsTakeOneJSONObject: a resolve, renew, reviewed or discard
// whose body is not exactly one JSON object with each member named once
// (and, for renew too, only members it knows) is 400 bad_request, and
// nothing is changed or logged. encoding/json alone acted on the first of
// two objects in one body, or on an object followed by anything, and on
// the last of "key" and "KEY": measured on the binary, resolve '{"key":K,
// "outcome":"executed",…} ]]] not json' stored the answer (200), renew
// '{…,"clinet":"x"} trailing' moved the order on (200), and resolve
// '{"key":"nonexistent",…,"KEY":K}' acted on K.
func TestChangeCallsTakeOneJSONObject(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	unknown := store.ID{Tenant: "default", Key: "k-unknown"}
	review := store.ID{Tenant: "default", Key: "k-review"}
	failed := store.ID{Tenant: "default", Key: "POST /cards F-1 #1"}
	for _, c := range []struct {
		id   store.ID
		resp *store.Response
	}{
		{unknown, nil},
		{review, &store.Response{Status: 202, Body: []byte(`{"status":"needs_review"}`)}},
		{failed, &store.Response{Status: 402, Body: []byte(`{"status":"failed"}`)}},
	} {
		req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/cards", UpstreamKey: c.id.Key}
		if _, _, err := s.Begin(ctx, c.id, req, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		var err error
		if c.resp == nil {
			err = s.Park(ctx, c.id, "o", store.Outcome{Attempts: 1, LastError: "504"})
		} else {
			err = s.Complete(ctx, c.id, "o", *c.resp, time.Now())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	var log bytes.Buffer
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default", Logger: slog.New(slog.NewJSONHandler(&log, nil)),
		OrderKeys: func(method, path, value, client string, gen int) ([]string, error) {
			return []string{method + " " + path + " " + value + " #" + strconv.Itoa(gen)}, nil
		}})
	resolve := `{"key":"k-unknown","outcome":"executed","status":201,"body":{"id":"pay_1"}}`
	renew := `{"method":"POST","path":"/cards","value":"F-1"}`
	reviewed := `{"key":"k-review"}`
	for _, c := range []struct{ call, body string }{
		{"records/resolve", resolve + ` ]]] not json`},
		{"records/resolve", resolve + `{"key":"k-other","outcome":"not_executed"}`},
		{"records/resolve", `{"key":"nonexistent","outcome":"not_executed","KEY":"k-unknown"}`},
		{"records/resolve", `{"key":"k-unknown","outcome":"not_executed","outcome":"executed","status":201}`},
		{"records/resolve", `null`},
		{"orders/renew", renew + ` trailing`},
		{"orders/renew", renew + renew},
		{"orders/renew", `{"method":"POST","path":"/cards","value":"F-1","clinet":"x"}`},
		{"orders/renew", `{"method":"POST","path":"/cards","value":"F-0","Value":"F-1"}`},
		{"records/reviewed", reviewed + ` x`},
		{"records/reviewed", `{"key":"k-unknown","Key":"k-review"}`},
		{"records/discard", `{"key":"k-unknown"} x`},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/v1/"+c.call, strings.NewReader(c.body)))
		if w.Code != 400 || !strings.Contains(w.Body.String(), `"bad_request"`) || !strings.Contains(w.Body.String(), "body must be JSON") {
			t.Errorf("%s %s = %d %s, want 400 bad_request: body must be JSON", c.call, c.body, w.Code, w.Body)
		}
	}
	if rec, err := s.Get(ctx, unknown); err != nil || rec.State != store.Unknown {
		t.Errorf("unknown record after the refused calls: %+v, %v; want it unknown", rec, err)
	}
	if rec, err := s.Get(ctx, review); err != nil || rec.Reviewed {
		t.Errorf("needs_review record after the refused calls: %+v, %v; want it not reviewed", rec, err)
	}
	if rec, err := s.Get(ctx, failed); err != nil || rec.Superseded {
		t.Errorf("failed order's record after the refused calls: %+v, %v; want it not superseded", rec, err)
	}
	if log.Len() != 0 {
		t.Errorf("refused calls logged %s", log.String())
	}
	// The same calls, each one object (white space around it is no part
	// of the body's content), are made.
	for _, c := range []struct{ call, body string }{
		{"records/resolve", "\n" + resolve + "\n"},
		{"orders/renew", renew + "\r\n"},
		{"records/reviewed", " " + reviewed + " "},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/v1/"+c.call, strings.NewReader(c.body)))
		if w.Code != 200 {
			t.Errorf("%s %q = %d %s, want 200", c.call, c.body, w.Code, w.Body)
		}
	}
}
