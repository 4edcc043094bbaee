package retry

import (
	"io"
	"net/http"
)

// OneShot is the RoundTripper right above *http.Transport: it makes every
// request non-replayable so that each RoundTrip is exactly one wire attempt.
//
// Why: *http.Transport silently resends a request when a REUSED keep-alive
// connection fails after the request was written, if the request is
// "replayable". That resend carries the SAME signature headers (the signer
// above ran once), so a provider with one-time nonces answers 409
// nonce_reused (seed payments-idempotency-and-retries), and the attempt is
// neither counted nor paced by the retry loop. In Go 1.26 source:
//
//   - net/http/transport.go:818 (*persistConn).shouldRetryRequest: on a reused
//     connection, a nothingWrittenError is retried when
//     req.outgoingLength() == 0 || req.GetBody != nil (line 845); otherwise
//     only if req.isReplayable() (line 847), for transportReadFromServerError
//     (the server closed the connection before the first response byte) and
//     errServerClosedIdle;
//   - net/http/request.go:1534 (*Request).isReplayable: true when Body is nil
//     or NoBody or GetBody is set, AND the method is GET/HEAD/OPTIONS/TRACE
//     or the request has an Idempotency-Key or X-Idempotency-Key header
//     (golang.org/issue/19943) — exactly our protected requests;
//   - net/http/h2_bundle.go:7969 http2shouldRetryRequest: the HTTP/2 path
//     replays a request with a nil/NoBody body or a GetBody after GOAWAY or
//     REFUSED_STREAM.
//
// OneShot therefore sends a shallow copy with GetBody nil and a body that is
// neither nil nor http.NoBody: the caller's body when it has one, else an
// empty reader of a type net/http does not know. outgoingLength of such an
// empty body is -1 (request.go:1552), so even the "nothing written" case is
// not resent. On the wire an empty body stays empty: for GET, HEAD, DELETE
// and OPTIONS net/http probes the reader, finds EOF and sends no body, as for
// a nil one (transfer.go:183 and :208 probeRequestBody); for POST, PUT and
// PATCH it sends a zero-length chunked body ("Transfer-Encoding: chunked",
// then "0\r\n\r\n") instead of "Content-Length: 0", which is how net/http
// frames a non-nil body of unknown length (transfer.go:170-190).
type OneShot struct {
	// Next is the transport that writes to the wire. If nil,
	// http.DefaultTransport is used.
	Next http.RoundTripper
}

// RoundTrip sends req once through Next without letting Next replay it.
// The returned response's Request is req.
func (o OneShot) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.WithContext(req.Context()) // shallow copy: RoundTrip must not modify req
	out.GetBody = nil
	if req.Body == nil || req.Body == http.NoBody {
		out.Body = emptyBody{}
		out.ContentLength = 0
	}
	resp, err := o.next().RoundTrip(out)
	if resp != nil {
		resp.Request = req
	}
	return resp, err
}

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
