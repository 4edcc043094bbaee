package proxy

import (
	"errors"
	"net/http"

	"github.com/idemproxy/idemproxy/internal/contentcoding"
	"github.com/idemproxy/idemproxy/internal/heldbody"
)

// decodedBody returns the bytes a protected request's key and fingerprint
// are read from: body itself, or, when its Content-Encoding lists gzip
// (x-gzip) and deflate only (identity aside), body decoded, which is what a
// provider that decodes request bodies acts on. The body sent upstream is
// always the one that came.
//
// Without this, an order whose body came gzipped had no key source: with
// IDEMPROXY_MISSING_KEY=generate each blind retry got a new random key (a
// second charge at a provider that decodes it), and a retry with the app's
// own key whose gzip bytes differed (gzip writes the time into its header:
// Python's gzip.compress) was 409 idempotency_conflict, its answer lost.
//
// The decoded bytes are reserved on t (MaxInflightBytes) and bounded by
// limit (MaxBodyBytes). undecodable is set, and body returned, for a coding
// that is not decoded here (br, zstd…), a body that does not decode, and
// one that decodes to more than limit bytes: its key sources cannot be read
// (ErrKeyMissingEncoded) and its fingerprint takes the bytes as they came.
// err is errBodyBytes when t could not reserve the decoded bytes.
func decodedBody(h http.Header, body []byte, limit int64, t *ticket) (decoded []byte, undecodable bool, err error) {
	if len(body) == 0 { // nothing to decode: a bodyless POST whatever its header says
		return body, false, nil
	}
	codings, ok := contentcoding.List(h)
	if !ok {
		return body, true, nil
	}
	decoded = body
	for i := len(codings) - 1; i >= 0; i-- { // the last coding applied is undone first
		decoded, err = contentcoding.Undo(codings[i], decoded, limit, t.reserve)
		if errors.Is(err, heldbody.ErrRefused) {
			return body, false, errBodyBytes
		}
		if err != nil {
			return body, true, nil
		}
	}
	return decoded, false, nil
}
