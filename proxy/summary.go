package proxy

import (
	"errors"
	"net/http"
	"time"
)

// Outcome says what idemproxy did with a request.
type Outcome string

// Outcomes, as used in logs and metrics.
const (
	OutcomeForwarded   Outcome = "forwarded"
	OutcomeReplayed    Outcome = "replayed"
	OutcomeConflict    Outcome = "conflict"
	OutcomeInProgress  Outcome = "in_progress"
	OutcomeRejected    Outcome = "rejected"
	OutcomeUnavailable Outcome = "upstream_unavailable"
	OutcomeStoreError  Outcome = "store_unavailable"
	// OutcomeClientGone: the client left before its answer; an operation it
	// started still finishes and is stored for its retry (docs/contract.md).
	OutcomeClientGone Outcome = "client_gone"
	// OutcomeOverloaded: refused past Options.MaxInflight or MaxInflightBytes;
	// nothing was sent and the key is free.
	OutcomeOverloaded Outcome = "overloaded"
)

// Summary describes one finished request, for logs and metrics. It never holds
// bodies or credential headers.
type Summary struct {
	Method, Path string
	Key          string // the app's key
	UpstreamKey  string // the key sent upstream: Key, or Key bound to the client (Options.KeySecret)
	Outcome      Outcome
	Status       int
	Attempts     int
	Replayed     bool
	// Limit names the bound that refused an OutcomeOverloaded request:
	// LimitRequests or LimitBytes.
	Limit    string
	Start    time.Time
	Duration time.Duration
}

// newSummary starts the summary of r at now.
func newSummary(r *http.Request, now time.Time) *Summary {
	return &Summary{Method: r.Method, Path: r.URL.Path, Start: now}
}

// fail answers err and records it on the summary.
func (h *Handler) fail(w http.ResponseWriter, sum *Summary, err error) {
	status, code, _, attempts := classify(err)
	sum.Status, sum.Attempts = status, attempts
	switch code {
	case "upstream_unavailable":
		sum.Outcome = OutcomeUnavailable
	case ErrStore.Code:
		sum.Outcome = OutcomeStoreError
	case ErrConflict.Code:
		sum.Outcome = OutcomeConflict
	case ErrInProgress.Code, h.inProgress.e.Code:
		sum.Outcome = OutcomeInProgress
	case ErrClientGone.Code:
		sum.Outcome = OutcomeClientGone
	case ErrOverloaded.Code:
		sum.Outcome, sum.Limit = OutcomeOverloaded, LimitRequests
		if errors.Is(err, ErrOverloadedBytes) {
			sum.Limit = LimitBytes
		}
	default:
		sum.Outcome = OutcomeRejected
	}
	writeError(w, err, sum.Key)
}

func (h *Handler) done(sum *Summary) {
	if h.opt.OnDone == nil {
		return
	}
	sum.Duration = h.opt.Now().Sub(sum.Start)
	h.opt.OnDone(*sum)
}
