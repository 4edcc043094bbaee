package adminapi_test

import (
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/internal/syncbuf"
)

// logLines parses the JSON lines written to buf.
func logLines(t *testing.T, buf *syncbuf.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestRefusedCallsAreLogged: a call refused for its token leaves a WARN
// line naming who tried what (never the token sent); a burst of refusals
// is one line, not one each, so that guessing tokens cannot flood the log;
// and a forwarded address list of any length is cut in the line.
func TestRefusedCallsAreLogged(t *testing.T) {
	var buf syncbuf.Buffer
	h := adminapi.New(adminapi.Options{Store: openStore(t), Token: "s3cret-admin-token", DefaultTenant: "default",
		Logger: slog.New(slog.NewJSONHandler(&buf, nil))})

	longXFF := strings.Repeat("203.0.113.7, ", 80_000) // ~1 MB
	for i := range 50 {
		r := httptest.NewRequest("POST", "/admin/v1/orders/renew", strings.NewReader(`{}`))
		r.Header.Set("Authorization", "Bearer guess-number-"+strings.Repeat("x", i))
		if i == 0 {
			r.Header.Set("X-Forwarded-For", longXFF)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 401 {
			t.Fatalf("refused call %d = %d %s, want 401", i, w.Code, w.Body)
		}
	}
	lines := logLines(t, &buf)
	if len(lines) != 1 {
		t.Fatalf("50 refused calls within a second wrote %d log lines, want 1: %v", len(lines), lines)
	}
	l := lines[0]
	if l["level"] != "WARN" || !strings.Contains(l["msg"].(string), "refused") || l["what"] != "POST /admin/v1/orders/renew" {
		t.Fatalf("refused call's line = %v, want a WARN line naming the call refused", l)
	}
	who, _ := l["who"].(string)
	if !strings.Contains(who, "203.0.113.7") || len(who) > 400 {
		t.Fatalf("who = %d bytes %.120q…, want the forwarded list cut to a few hundred bytes", len(who), who)
	}
	raw, _ := json.Marshal(l)
	if strings.Contains(string(raw), "guess-number") || strings.Contains(string(raw), "s3cret") {
		t.Fatalf("the refused call's line holds a token: %s", raw)
	}
}
