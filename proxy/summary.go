package proxy

import (
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
	OutcomeUnavailable Outcome = CodeUpstreamUnavailable
	OutcomeStoreError  Outcome = CodeStoreUnavailable
	// OutcomeClientGone: the client left before its answer; an operation it
	// started still finishes and is stored for its retry (docs/contract.md).
	OutcomeClientGone Outcome = "client_gone"
	// OutcomeOverloaded: refused past Options.MaxInflight or MaxInflightBytes;
	// nothing was sent and the key is free.
	OutcomeOverloaded Outcome = CodeOverloaded
)

// Summary describes one finished request, for logs and metrics. It never holds
// bodies or credential headers.
type Summary struct {
	Method, Path string
	Key          string // the app's key
	UpstreamKey  string // the key sent upstream: Key, Key bound to the client (Options.KeySecret), or the key a resumed record was first sent with
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

// fail answers err and records it on the summary. A client that left gets
// no answer: the connection is closed without one (docs/contract.md). Only
// a client that shut down its write side once its request was sent, which
// net/http takes for gone, could still read one, and a 499 it does not
// know, taken as final by an app, would say its order failed while the
// operation it started runs on; a dropped connection is what it retries.
func (h *Handler) fail(w http.ResponseWriter, sum *Summary, err error) {
	a := classify(err)
	sum.settle(result{}, &a)
	if a.Outcome == OutcomeClientGone {
		panic(http.ErrAbortHandler) // the deferred summary still reports it
	}
	writeClassified(w, err, a, sum.Key)
}

// settle records what became of the request: refused or failed with a (the
// class of its error, from classify) when a is not nil, else answered with
// res, replayed or fresh (a streamed answer included). It is the one place
// that decides a request's Outcome.
func (s *Summary) settle(res result, a *apiError) {
	switch {
	case a != nil:
		s.Outcome, s.Status, s.Attempts, s.Limit = a.Outcome, a.Status, a.Attempts, a.Limit
		return
	case res.replayed:
		s.Outcome, s.Replayed = OutcomeReplayed, true
	default:
		s.Outcome = OutcomeForwarded
	}
	s.Status, s.Attempts = res.resp.Status, res.report.Attempts
}

func (h *Handler) done(sum *Summary) {
	if h.opt.OnDone == nil {
		return
	}
	sum.Duration = h.opt.Now().Sub(sum.Start)
	h.opt.OnDone(*sum)
}
