package proxy_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// A budget spent on answers that say the provider did not act on the
// operation (every attempt a retried 503: "money did not move") is 502
// upstream_unavailable saying the operation was not executed, and its key
// is free. Before, the 502 said "the outcome may be unknown", which sends an
// operator to the provider about an operation it refused. After 504s, the
// 502 still says the outcome may be unknown, and the record is kept unknown.
func TestBudgetSpentOnRefusalsSaysNotExecuted(t *testing.T) {
	for _, c := range []struct {
		status        int
		want, notWant string
		unknown       bool
	}{
		{503, "not executed", "may be unknown", false},
		{504, "may be unknown", "not executed", true},
	} {
		e := newEnv(t, func(_ *proxy.Options, p *retry.Policy) { p.MaxAttempts = 3 })
		e.prov.status = c.status
		a := e.do(t, "POST", "/payments", `{"order_id":"o-1","amount":5}`)
		var body struct {
			Error struct{ Code, Message string }
		}
		json.Unmarshal(a.body, &body)
		total, _ := e.prov.counts()
		if a.status != http.StatusBadGateway || body.Error.Code != "upstream_unavailable" || total != 3 {
			t.Fatalf("%d every time: %d %s after %d attempts, want 502 upstream_unavailable after 3", c.status, a.status, a.body, total)
		}
		if !strings.Contains(body.Error.Message, c.want) || strings.Contains(body.Error.Message, c.notWant) {
			t.Errorf("%d every time: message %q, want it to say %q, not %q", c.status, body.Error.Message, c.want, c.notWant)
		}
		recs, _, err := e.store.List(t.Context(), store.Filter{State: store.Unknown}, "", 10)
		if err != nil || (len(recs) == 1) != c.unknown {
			t.Errorf("%d every time: %d records listed unknown (%v), want the record kept unknown: %v", c.status, len(recs), err, c.unknown)
		}
	}
}
