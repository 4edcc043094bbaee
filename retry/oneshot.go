package retry

import (
	"io"
	"net/http"
	"strings"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/internal/heldbody"
)

// OneShot is the RoundTripper right above *http.Transport: it makes every
// request non-replayable so that each RoundTrip is exactly one wire attempt.
// *http.Transport would otherwise resend a "replayable" request on its own
// when a reused connection fails, with the same signature headers (a
// provider with one-time nonces answers 409 nonce_reused) and unseen by the
// retry loop. docs/design/oneshot.md has the analysis.
//
// OneShot sends a shallow copy with GetBody nil (the request itself when it
// has a body and no GetBody already: nothing to change, but for a held body,
// below). A request with a body keeps it: a body without GetBody is never
// replayed, whatever its type. A body the retry loop holds (heldbody) goes as
// a reader net/http knows to be in memory, so that the header and a small
// body leave in one write instead of two (heldbody.Body.InMemory). An empty body is framed as
// its method expects, and still not replayable:
//   - GET, HEAD, OPTIONS and TRACE (replayable by method whenever the body is
//     nil) get an empty reader of a type net/http does not know: it probes
//     it, finds EOF and sends no body and no framing;
//   - every other method gets http.NoBody, so POST, PUT and PATCH go with
//     "Content-Length: 0" (a zero-length chunked body makes some providers and
//     WAFs answer 411). A nil body is replayable only by method or when the
//     header map holds the canonical key "Idempotency-Key" or
//     "X-Idempotency-Key", so those are sent under their lower-case names:
//     the same header on the wire (names are case-insensitive, RFC 9110
//     §5.1). What net/http may still resend is a request of which it wrote
//     nothing, which the upstream never saw.
type OneShot struct {
	// Next is the transport that writes to the wire. If nil,
	// http.DefaultTransport is used.
	Next http.RoundTripper
}

// RoundTrip sends req once through Next without letting Next replay it.
// The returned response's Request is req.
func (o OneShot) RoundTrip(req *http.Request) (*http.Response, error) {
	held, isHeld := req.Body.(*heldbody.Body)
	if req.GetBody == nil && req.Body != nil && req.Body != http.NoBody && !isHeld {
		return o.next().RoundTrip(req) // nothing to change: no copy
	}
	out := req.WithContext(req.Context()) // shallow copy: RoundTrip must not modify req
	out.GetBody = nil
	switch {
	case isHeld:
		out.Body = held.InMemory()
	case req.Body == nil || req.Body == http.NoBody:
		frameEmpty(out)
	}
	resp, err := o.next().RoundTrip(out)
	if resp != nil {
		resp.Request = req
	}
	return resp, err
}

// frameEmpty sets the body and headers of out, a copy of a request without
// body (see OneShot).
func frameEmpty(out *http.Request) {
	out.ContentLength = 0
	out.TransferEncoding = nil
	switch out.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		out.Body = emptyBody{}
		return
	}
	out.Body = http.NoBody
	var h http.Header
	for _, name := range replayLicences {
		vals, ok := out.Header[name]
		if !ok {
			continue
		}
		if h == nil {
			h = out.Header.Clone() // the caller's map stays as it was
		}
		delete(h, name)
		h[strings.ToLower(name)] = vals
	}
	if h != nil {
		out.Header = h
	}
}

// replayLicences are the canonical header keys that make net/http treat a
// request with a nil body as replayable.
var replayLicences = []string{idemkey.HeaderName, "X-Idempotency-Key"}

func (o OneShot) next() http.RoundTripper {
	if o.Next != nil {
		return o.Next
	}
	return http.DefaultTransport
}

// emptyBody is an empty request body that net/http does not recognise as
// http.NoBody or as an in-memory reader, so the request is not replayable.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }
