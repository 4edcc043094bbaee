package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/syncbuf"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// fullDisk is a real store whose claims (failBegin) or later writes
// (failWrites: Complete, Park, Abandon) are refused as a full disk refuses
// them.
type fullDisk struct {
	proxy.Store
	failBegin, failWrites atomic.Bool
}

func noSpace(op string) error {
	return fmt.Errorf("cache: %s: %w: 1024 bytes free, reserve is 272629760", op, store.ErrNoSpace)
}

func (s *fullDisk) Begin(ctx context.Context, id store.ID, req store.Request, owner string, lease time.Duration) (store.Record, bool, error) {
	if s.failBegin.Load() {
		return store.Record{}, false, noSpace("begin")
	}
	return s.Store.Begin(ctx, id, req, owner, lease)
}

func (s *fullDisk) Complete(ctx context.Context, id store.ID, owner string, resp store.Response, sent time.Time) error {
	if s.failWrites.Load() {
		return noSpace("complete")
	}
	return s.Store.Complete(ctx, id, owner, resp, sent)
}

func (s *fullDisk) Park(ctx context.Context, id store.ID, owner string, o store.Outcome) error {
	if s.failWrites.Load() {
		return noSpace("park")
	}
	return s.Store.Park(ctx, id, owner, o)
}

func (s *fullDisk) Abandon(ctx context.Context, id store.ID, owner string) error {
	if s.failWrites.Load() {
		return noSpace("abandon")
	}
	return s.Store.Abandon(ctx, id, owner)
}

// TestStoreFailureLinesSayWhatToDo: the ERROR lines of a store that refuses
// writes (a full disk) each say what becomes of the operation and where to
// look. They said only what failed: "keeping an operation whose outcome is
// unknown failed", after the provider had executed the order, did not say
// that its record stays in flight, that the app's retry is answered 409
// idempotency_in_progress until the record's lease ends, or that the
// operation may have run.
func TestStoreFailureLinesSayWhatToDo(t *testing.T) {
	var logs syncbuf.Buffer
	var fd *fullDisk
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		fd = &fullDisk{Store: o.Store}
		o.Store = fd
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	fd.failBegin.Store(true)
	if a := e.do(t, "POST", "/v1/payments", `{"order_id":"full-1","amount":"1"}`); a.status != http.StatusServiceUnavailable {
		t.Fatalf("claim on a full disk = %d %s, want 503", a.status, a.body)
	}
	fd.failBegin.Store(false)
	fd.failWrites.Store(true)
	if a := e.do(t, "POST", "/v1/payments", `{"order_id":"full-2","amount":"1"}`); a.status != http.StatusServiceUnavailable {
		t.Fatalf("final answer on a full disk = %d %s, want 503", a.status, a.body)
	}
	e.prov.mu.Lock()
	e.prov.status = http.StatusTooManyRequests // not acted on: the key is released
	e.prov.mu.Unlock()
	e.do(t, "POST", "/v1/payments", `{"order_id":"full-3","amount":"1"}`)
	e.h.Drain(context.Background())

	want := map[string][]string{
		"claiming the key in the store failed":                          {"retry", "/readyz"},
		"storing the final response failed after the upstream answered": {"may have", "retry with the same key", "/readyz"},
		"keeping an operation whose outcome is unknown failed":          {"stays in flight", "may have", "lease", "next start", "/readyz"},
		"releasing in-flight record failed":                             {"stays in flight", "lease", "/readyz"},
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if l.Level != "ERROR" && l.Level != "WARN" {
			continue
		}
		for prefix, says := range want {
			if !strings.HasPrefix(l.Msg, prefix) {
				continue
			}
			seen[prefix] = true
			for _, s := range says {
				if !strings.Contains(l.Msg, s) {
					t.Errorf("%s line %q does not say %q", l.Level, l.Msg, s)
				}
			}
		}
	}
	for prefix := range want {
		if !seen[prefix] {
			t.Errorf("no line %q; the log:\n%s", prefix, logs.String())
		}
	}
}
