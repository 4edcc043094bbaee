package retry

import (
	"net/http"
	"time"
)

// Call is what one request's attempt sequence needs besides the request. The
// caller knows whether the request is protected and what earlier sequences of
// its operation left, and passes them here, as values.
type Call struct {
	// Mode says which failures may be retried; the zero Mode is Once.
	Mode Mode
	// Resume, if not nil, says that a protected request resumes an operation
	// whose outcome is unknown: its first attempt is a re-send, preceded by
	// the status probe ([Transport.Prober]) and the key-retention check.
	Resume *Resume
	// Store, if not nil, relates the record store's clock to the
	// Transport's, for a store whose clock is not its callers' (one shared
	// by replicas: the database's). Resume.FirstSentAt is then a time of the
	// store's clock, and so are the first sends the sequence reports
	// (Report.FirstSentAt, ExhaustedError.FirstSentAt): times of the two
	// clocks are never compared, only durations measured by each carried to
	// the other. Nil: the store's clock is the Transport's (one process).
	Store *StoreClock
	// Body, if not nil, is a protected request's body, already in memory:
	// every attempt sends these bytes (the signer hashes them in place)
	// instead of a copy read from the request's Body, which is then only
	// closed. A large body at high concurrency would otherwise be held twice
	// for the whole sequence. The bytes must not change until Do returns.
	Body []byte
	// Stop, if not nil, lets another goroutine end a protected sequence
	// (see [Stop]).
	Stop *Stop
}

// StoreClock ties the record store's clock to the Transport's at the claim
// that started a sequence ([Call.Store]).
//
// At, a time of the store's clock, comes from the claim, so it is before the
// sequence begins and after the claim was sent. A first send the sequence
// reports is At plus how long after the sequence began it was, by the
// Transport's clock: earlier than it was by what the claim took after At
// (its commit, its answer), never before the claim. A first send it resumes
// is taken to be At-FirstSentAt plus Since before the sequence began: at
// least as long ago as it was. Both err towards the key retention check
// refusing, not re-sending, and neither moves by how far the clocks are
// apart. A resumed first send that no new one replaced is reported as it was
// given, not carried back (which would move it earlier by Since).
type StoreClock struct {
	// At is the store's time during the claim (pgstore: the claim
	// statement's now(), store.Record.ReadAt).
	At time.Time
	// Since is how long before the sequence began the claim was sent, by
	// the caller's clock.
	Since time.Duration
}

// Report is what an attempt sequence tells its caller besides the response.
type Report struct {
	// Attempts is the number of attempts the sequence sent (a status probe
	// is not one).
	Attempts int
	// Disposition is the returned response's; a response passed on
	// (PassOn) is Unknown when an earlier attempt, or the sequence it
	// resumed (Call.Resume), may have been acted on. For a sequence that ended
	// with an error it is Unknown when the provider may have acted on an
	// attempt, NotSent when no attempt reached it, and Retry otherwise.
	Disposition Disposition
	// FirstSentAt is when the operation first reached the provider, in this
	// sequence or the one it resumed; zero if it never did. By the store's
	// clock with [Call.Store], else by the Transport's.
	FirstSentAt time.Time
	// LastBody is the body of the last ambiguous answer (an Unknown one), for
	// the status probe of a later sequence; nil if none.
	LastBody []byte
	// SentAnew is true when the status probe said the operation resumed had
	// not happened (404) and it was sent again: FirstSentAt is then that
	// send's, not the resumed sequence's, and replaces the first send the
	// record keeps (store.Outcome.SentAnew). The provider can have kept the
	// key only from a send it saw, so the key retention counts from it.
	SentAnew bool
}

// Exchange runs one request's Call through a Transport as an
// http.RoundTripper, for callers that take one (httputil.ReverseProxy): its
// RoundTrip is [Transport.Do] with Call, and keeps the Report for the caller
// to read once RoundTrip returned. An Exchange serves one request.
type Exchange struct {
	Transport *Transport
	Call      Call
	Report    Report
}

// RoundTrip implements http.RoundTripper.
func (e *Exchange) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, rep, err := e.Transport.Do(req, e.Call)
	e.Report = rep
	return resp, err
}
