package sandbox

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// FaultKind names an injected fault; the ledger counts faults by kind.
type FaultKind string

// The fault kinds, one per Faults field.
const (
	FaultDropBefore  FaultKind = "drop_before_processing"
	FaultDropAfter   FaultKind = "drop_after_processing"
	FaultSlow        FaultKind = "slow_after_processing"
	FaultTimeout504  FaultKind = "gateway_timeout_after_processing"
	FaultStatus5xx   FaultKind = "status_5xx"
	FaultRateLimited FaultKind = "rate_limited"
	FaultMaintenance FaultKind = "maintenance"
)

// faultKinds lists every kind, so snapshots show zero counts too.
var faultKinds = []FaultKind{FaultDropBefore, FaultDropAfter, FaultSlow, FaultTimeout504, FaultStatus5xx,
	FaultRateLimited, FaultMaintenance}

// faultPlan is what one request will suffer; "" means nothing.
type faultPlan struct {
	before FaultKind // instead of processing
	after  FaultKind // once processing is done
}

// chance is one fault and its probability.
type chance struct {
	kind FaultKind
	p    float64
}

// plan draws every fault independently, always in the same order so that a
// seed gives the same run, and keeps the first hit of each phase.
func (s *Server) plan() faultPlan {
	f := s.faults
	p := faultPlan{
		before: s.firstHit(
			chance{FaultDropBefore, f.DropBeforeProcessing},
			chance{FaultMaintenance, f.Maintenance},
			chance{FaultRateLimited, f.RateLimited},
			chance{FaultStatus5xx, f.Status5xx}),
		after: s.firstHit(
			chance{FaultDropAfter, f.DropAfterProcessing},
			chance{FaultSlow, f.SlowAfterProcessing},
			chance{FaultTimeout504, f.GatewayTimeoutAfterProcessing}),
	}
	if p.before != "" {
		p.after = "" // nothing was processed, so nothing can be lost after it
	}
	return p
}

// firstHit draws each chance and returns the first kind that hit.
func (s *Server) firstHit(chances ...chance) FaultKind {
	var kind FaultKind
	for _, c := range chances {
		if s.rng.hit(c.p) && kind == "" {
			kind = c.kind
		}
	}
	return kind
}

// injectBefore answers with a fault instead of processing the request.
func (s *Server) injectBefore(w http.ResponseWriter, r *http.Request, kind FaultKind) {
	s.ledger.fault(kind)
	s.log.Info("sandbox: fault injected", "kind", string(kind), "method", r.Method, "path", r.URL.Path)
	switch kind {
	case FaultDropBefore:
		dropConnection(w)
	case FaultMaintenance:
		// The cards provider's 503 maintenance: money did not move.
		errorReply(http.StatusServiceUnavailable, "maintenance", "scheduled maintenance, money did not move; retry later with the same key").write(w)
	case FaultRateLimited:
		s.api.throttled(s.retryAfter).write(w)
	case FaultStatus5xx:
		serverError(s.rng.IntN(4)).write(w)
	}
}

// serverError is one of four upstream failures. 502 and 504 come as HTML, as
// from a gateway in front of the provider (the payouts provider warns of
// non-JSON bodies, e.g. a proxy's HTML on 502).
func serverError(n int) reply {
	switch n {
	case 0:
		return errorReply(http.StatusInternalServerError, "internal_error", "internal server error")
	case 1:
		return reply{status: http.StatusBadGateway, contentType: "text/html; charset=utf-8",
			body: []byte("<html><body><h1>502 Bad Gateway</h1></body></html>\n")}
	case 2:
		return errorReply(http.StatusServiceUnavailable, "service_unavailable", "service temporarily unavailable")
	default:
		return reply{status: http.StatusGatewayTimeout, contentType: "text/html; charset=utf-8",
			body: []byte("<html><body><h1>504 Gateway Time-out</h1></body></html>\n")}
	}
}

// deliver writes rep, unless the fault after processing loses or delays it.
func (s *Server) deliver(w http.ResponseWriter, r *http.Request, rep reply, after FaultKind) {
	if after != "" {
		s.ledger.fault(after)
		s.log.Info("sandbox: fault injected", "kind", string(after), "method", r.Method, "path", r.URL.Path)
	}
	switch after {
	case FaultDropAfter:
		dropConnection(w)
		return
	case FaultSlow:
		if !wait(r.Context(), s.slowDelay) {
			return // the caller gave up; the operation stands
		}
	case FaultTimeout504:
		gatewayTimeout(s.provider, rep).write(w)
		return
	}
	rep.write(w)
}

// gatewayTimeout is the 504 a gateway gives when the provider took too long,
// although it went on and executed. The payments provider names the payment
// it was creating, so that the client can look it up (the payments
// provider: after a 504, first GET /payments/{payment_id}).
func gatewayTimeout(provider string, executed reply) reply {
	body := struct {
		Error     errorDetail `json:"error"`
		PaymentID string      `json:"payment_id,omitempty"`
	}{Error: errorDetail{Code: "gateway_timeout", Message: "the operation did not finish in time; look up its status before repeating"}}
	if provider == ProviderPayments && executed.status < 300 {
		var p struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(executed.body, &p) == nil {
			body.PaymentID = p.ID
		}
	}
	return jsonReply(http.StatusGatewayTimeout, body)
}

// wait sleeps for d; it reports false if ctx ended first.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// dropConnection closes the client's connection without a response. Where
// hijacking is impossible (HTTP/2) it aborts the handler, which net/http
// turns into a reset stream without logging.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close() // the point is to close it; an error changes nothing
}
