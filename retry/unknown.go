package retry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idemproxy/idemproxy/idemkey"
)

// ReconciledHeader marks an answer that is the status probe's, not the
// operation's own: the provider said the operation exists.
const ReconciledHeader = "Idemproxy-Reconciled"

// ErrKeyExpired is wrapped in an [ExhaustedError] when an operation whose
// outcome is unknown was first sent longer ago than the provider keeps keys
// ([Transport.KeyRetention]) and no probe resolved it: a resend could
// execute it a second time, so nothing is sent.
var ErrKeyExpired = errors.New("retry: the provider may have forgotten the key of an operation whose outcome is unknown; not re-sent")

// Prober builds the status lookup sent before re-sending an operation whose
// outcome is unknown (IDEMPROXY_STATUS_PROBE); probe.Lookup implements it.
// req is the operation's request, body its body and last the body of the
// last ambiguous answer (nil if none). An error means the lookup cannot be
// built for this operation, and the operation is re-sent as it is.
//
// A Prober whose lookup is only for some operations also has
// Covers(req *http.Request) bool (IDEMPROXY_STATUS_PROBE_ROUTES); an
// operation it does not cover is handled as with no Prober: not looked up,
// not reported to OnProbe.
//
// A 404 says the operation did not happen only when the Prober also has
// NotFound(status int, body []byte) bool and it says so of the answer (the
// provider's documented answer for an unknown operation, such as 404
// payout.not_found): a 404 from a gateway or load balancer in between (a
// wrong route, an HTML page) or one for another reason says nothing of the
// operation. Without that method no answer means "not found".
type Prober interface {
	Lookup(ctx context.Context, req *http.Request, body, last []byte) (*http.Request, error)
}

// covers reports whether p's lookup is for the operation req.
func covers(p Prober, req *http.Request) bool {
	c, ok := p.(interface{ Covers(*http.Request) bool })
	return !ok || c.Covers(req)
}

// notFound reports whether p says the probe's answer (status, body) is the
// provider's own "no such operation".
func notFound(p Prober, status int, body []byte) bool {
	n, ok := p.(interface{ NotFound(int, []byte) bool })
	return ok && n.NotFound(status, body)
}

// contradiction returns why a lookup's 2xx answer is not about the operation
// whose request body is req: the answer is not a JSON object (a gateway's
// or login page's HTML, an empty body), or a member the request has at the
// top level is in the answer (at its top level or under "data") with
// another value (another order_id, amount or currency), numbers and decimal
// strings compared as numbers ("25" is "25.00"). Empty when nothing
// contradicts it. A request body that is not a JSON object is not compared.
func contradiction(req, answer []byte) string {
	ans := object(answer)
	if ans == nil {
		return "the answer is not a JSON object"
	}
	reqObj := object(req)
	if reqObj == nil {
		return ""
	}
	places := []map[string]json.RawMessage{ans, object(ans["data"])}
	for _, name := range slices.Sorted(maps.Keys(reqObj)) {
		want, ok := scalar(reqObj[name])
		if !ok {
			continue
		}
		for _, place := range places {
			raw, there := place[name]
			if !there {
				continue
			}
			got, ok := scalar(raw)
			if !ok || !sameValue(want, got) {
				return fmt.Sprintf("the answer's %s is not the request's", name)
			}
		}
	}
	return ""
}

// scalar returns a JSON string's text, or a number's or boolean's as
// written; ok is false for null, objects and arrays.
func scalar(raw json.RawMessage) (string, bool) {
	if s, ok := str(raw); ok {
		return s, true
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if len(raw) == 0 || d.Decode(&v) != nil {
		return "", false
	}
	switch v := v.(type) {
	case json.Number:
		return v.String(), true
	case bool:
		return strconv.FormatBool(v), true
	}
	return "", false
}

// sameValue compares two scalar texts, as decimal numbers when both are.
func sameValue(a, b string) bool {
	if a == b {
		return true
	}
	x, okx := new(big.Rat).SetString(a)
	y, oky := new(big.Rat).SetString(b)
	return okx && oky && x.Cmp(y) == 0
}

// Resume describes an earlier attempt sequence of the same operation that
// ended with its outcome unknown ([Call.Resume]), so that this one treats its
// first attempt as a re-send.
type Resume struct {
	// FirstSentAt is when the operation was first sent upstream: by the
	// store's clock with [Call.Store], else by the Transport's.
	FirstSentAt time.Time
	// LastBody is the body of the last ambiguous answer, for {resp.…}
	// placeholders; nil when not known.
	LastBody []byte
}

// ProbeResult is what a status probe said, for metrics and logs.
type ProbeResult string

// The probe results.
const (
	ProbeFound    ProbeResult = "found"     // 2xx about this operation: it exists; its answer is the result
	ProbeNotFound ProbeResult = "not_found" // the provider's own "no such operation" (Prober's NotFound): it did not happen; re-sent with the same key
	ProbeOther    ProbeResult = "other"     // another answer (any other 404, a 2xx not about it), or a network error; re-sent (or refused when the key expired)
	ProbeUnfilled ProbeResult = "unfilled"  // the lookup could not be built for this operation
)

// ProbeInfo describes one probe for [Transport.OnProbe]; like AttemptInfo it
// carries no header, body or query.
type ProbeInfo struct {
	Method, Path string // the operation's
	// Key is the Idempotency-Key the operation is sent with upstream.
	Key string
	// ProbeMethod and ProbePath are the lookup's own; empty when it could
	// not be built (ProbeUnfilled).
	ProbeMethod, ProbePath string
	Result                 ProbeResult
	Status                 int   // the probe's answer; 0 when none
	Err                    error // why no answer came, or why the lookup could not be built
}

// noteSent updates what the sequence knows about the operation after an
// attempt whose verdict is v: whether anything reached the provider, when the
// operation first did, and whether the provider may have acted (Dispose's
// Unknown).
func (s *sequence) noteSent(o outcome, v Verdict) {
	if v.Disposition == NotSent {
		return
	}
	s.sent = true
	if s.mode != Protected {
		return
	}
	if s.firstSent.IsZero() {
		s.firstSent = o.start
	}
	if v.Disposition == Unknown {
		s.unknown = true
		// A timeout or a drop is no answer: the last answer is still the
		// one before, and may name the operation for the probe. Nor does
		// a conflict name it: it says only that the key has one.
		if o.resp != nil && len(o.body) > 0 && !conflictAnswer(o.resp.StatusCode, o.body) {
			s.lastBody = o.body
		}
	}
}

// resolve runs before re-sending an operation whose outcome is unknown. It
// returns the probe's answer when the provider says the operation exists;
// nil to go on and send; an error when the provider may have forgotten the
// key and nothing resolved the outcome.
func (s *sequence) resolve() (*http.Response, error) {
	if s.t.Prober != nil && covers(s.t.Prober, s.req) {
		resp, result := s.probe()
		switch result {
		case ProbeFound:
			return resp, nil
		case ProbeNotFound:
			// It did not happen: a resend is a first send, and the key
			// retention counts from it, the first send the provider saw.
			// The answer the probe was filled from names nothing the
			// provider has: a later probe filled from it would be told 404
			// again whatever the re-send did, and re-send past the
			// retention; only a newer answer may fill one.
			s.unknown, s.firstSent, s.resumedSent, s.lastBody, s.sentAnew = false, time.Time{}, time.Time{}, nil, true
			return nil, nil
		}
	}
	if r := s.t.KeyRetention; r > 0 && !s.firstSent.IsZero() && s.t.now().Sub(s.firstSent) > r {
		return nil, s.exhausted(fmt.Errorf("%w (first sent %s ago, provider keeps keys %s)",
			ErrKeyExpired, s.t.now().Sub(s.firstSent).Round(time.Second), r))
	}
	return nil, nil
}

// probe sends the status lookup once, through the Gate and Next like any
// attempt (so it is signed afresh), and classifies the answer.
func (s *sequence) probe() (*http.Response, ProbeResult) {
	info := ProbeInfo{Method: s.req.Method, Path: s.req.URL.Path, Key: s.req.Header.Get(idemkey.HeaderName)}
	defer func() {
		if s.t.OnProbe != nil {
			s.t.OnProbe(info)
		}
	}()
	ctx, cancel := s.attemptContext()
	defer s.endAttempt(cancel)
	preq, err := s.t.Prober.Lookup(ctx, s.req, s.body, s.lastBody)
	if err != nil {
		info.Result, info.Err = ProbeUnfilled, err
		return nil, info.Result
	}
	info.ProbeMethod, info.ProbePath = preq.Method, preq.URL.Path
	if _, err := s.passGate(); err != nil {
		info.Result, info.Err = ProbeOther, err
		return nil, info.Result
	}
	resp, err := s.t.next().RoundTrip(preq)
	if err != nil {
		info.Result, info.Err = ProbeOther, redact(err)
		return nil, info.Result
	}
	defer resp.Body.Close()
	// A 429 or 503 with Retry-After describes the provider, not the lookup:
	// it pauses every attempt (the re-send that follows included), as an
	// attempt's does.
	s.noteRetryAfter(&outcome{resp: resp})
	body, err := readLimited(resp.Body, resp.ContentLength, s.t.maxResponseBytes())
	if err == nil {
		body, err = decodeAnswer(resp, body, s.t.maxResponseBytes())
	}
	info.Status = resp.StatusCode
	switch {
	case err != nil:
		info.Result, info.Err = ProbeOther, err
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		if preq.Method != http.MethodHead {
			// Stored and replayed as the operation's result, it must be
			// the provider's answer about this operation: a gateway's 200
			// page, or another order's payment, would settle it as done
			// (and never send it) while it may never have run.
			if why := contradiction(s.body, body); why != "" {
				info.Result, info.Err = ProbeOther, errors.New("not about this operation: "+why)
				break
			}
		}
		info.Result = ProbeFound
		if preq.Method == http.MethodHead {
			// A HEAD answer's Content-Length is that of a body it does not
			// carry: kept, every answer to the app (the stored one replayed
			// too) declared that length and ended short of it.
			resp.Header.Del("Content-Length")
		}
		return s.reconciled(resp, body), info.Result
	case notFound(s.t.Prober, resp.StatusCode, body):
		info.Result = ProbeNotFound
	default:
		info.Result = ProbeOther
	}
	return nil, info.Result
}

// reconciled turns the probe's 2xx answer into the operation's final answer.
func (s *sequence) reconciled(resp *http.Response, body []byte) *http.Response {
	o := outcome{resp: resp, body: body}
	out := s.response(o)
	out.Header.Set(ReconciledHeader, "true")
	return out
}
