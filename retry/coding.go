package retry

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemproxy/idemproxy/internal/contentcoding"
	"github.com/idemproxy/idemproxy/internal/heldbody"
)

// ErrResponseCoding is wrapped when an answer's body does not decode by the
// content coding it names: like a body cut short, an answer lost on the way
// (outcome unknown).
var ErrResponseCoding = errors.New("retry: response body does not decode")

// decodeAnswer undoes the content codings Go's transport left on a
// protected attempt's answer: it asks for gzip and decodes "gzip" only, so
// an answer in "x-gzip" (RFC 9110 §8.4.1.3: the same coding) or "deflate"
// (a gateway that compresses whatever was asked) came as compressed bytes.
// Their business code could not be read, so a retriable 409
// payout.funds_maturing was stored as the operation's final answer, and the
// stored bytes were replayed compressed to apps that never asked for it.
// Only gzip, x-gzip and deflate (identity aside, at most four) are undone;
// an answer in another coding (br, zstd: never asked for) is left as it
// came. The decoded body is bounded by limit; resp's header then names no
// coding and the decoded length.
func decodeAnswer(resp *http.Response, body []byte, limit int64) ([]byte, error) {
	if len(body) == 0 || len(resp.Header.Values("Content-Encoding")) == 0 {
		return body, nil
	}
	codings, ok := contentcoding.List(resp.Header)
	if !ok {
		return body, nil
	}
	decoded := body
	for i := len(codings) - 1; i >= 0; i-- { // the last coding applied is undone first
		var err error
		decoded, err = contentcoding.Undo(codings[i], decoded, limit, nil)
		if errors.Is(err, heldbody.ErrTooLarge) {
			return nil, fmt.Errorf("%w (over %d bytes once decoded)", ErrResponseTooLarge, limit)
		}
		if err != nil {
			return nil, fmt.Errorf("%w (Content-Encoding %s): %w", ErrResponseCoding, codings[i], err)
		}
	}
	resp.Header.Del("Content-Encoding")
	resp.Header.Set("Content-Length", strconv.Itoa(len(decoded)))
	resp.ContentLength = int64(len(decoded))
	resp.Uncompressed = true
	return decoded, nil
}
