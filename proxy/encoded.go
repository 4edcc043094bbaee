package proxy

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/idemproxy/idemproxy/internal/heldbody"
)

// maxCodings bounds the content codings decodedBody undoes: a list longer
// than any client sends is not decoded.
const maxCodings = 4

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
	codings, ok := contentCodings(h)
	if !ok {
		return body, true, nil
	}
	decoded = body
	for i := len(codings) - 1; i >= 0; i-- { // the last coding applied is undone first
		decoded, err = decode(codings[i], decoded, limit, t)
		if errors.Is(err, heldbody.ErrRefused) {
			return body, false, errBodyBytes
		}
		if err != nil {
			return body, true, nil
		}
	}
	return decoded, false, nil
}

// contentCodings lists the codings of h's Content-Encoding, identity left
// out, in the order they were applied; ok is false when one is not gzip,
// x-gzip or deflate, or there are more than maxCodings.
func contentCodings(h http.Header) (codings []string, ok bool) {
	for _, line := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(line, ",") {
			c = strings.ToLower(strings.Trim(c, " \t"))
			switch c {
			case "", "identity":
			case "gzip", "x-gzip", "deflate":
				codings = append(codings, c)
			default:
				return nil, false
			}
		}
	}
	return codings, len(codings) <= maxCodings
}

// decode undoes one coding of b.
func decode(coding string, b []byte, limit int64, t *ticket) ([]byte, error) {
	var rd io.Reader
	var err error
	switch coding {
	case "deflate":
		// RFC 9110 §8.4.1.2: the zlib format. Some clients send a raw
		// deflate stream under this name; a provider that decodes both
		// reads either.
		if rd, err = zlib.NewReader(bytes.NewReader(b)); err != nil {
			rd = flate.NewReader(bytes.NewReader(b))
		}
	default:
		if rd, err = gzip.NewReader(bytes.NewReader(b)); err != nil {
			return nil, err
		}
	}
	return heldbody.ReadAll(rd, -1, limit, t.reserve)
}
