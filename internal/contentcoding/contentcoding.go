// Package contentcoding undoes the HTTP content codings idemproxy reads
// through: gzip (x-gzip) and deflate. The proxy reads a request body's key
// and fingerprint decoded; a protected attempt's answer is judged and
// stored decoded (Go's transport decodes only "gzip").
package contentcoding

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strings"

	"github.com/idemproxy/idemproxy/internal/heldbody"
)

// Max bounds the codings undone: a list longer than any client or server
// sends is not decoded.
const Max = 4

// List lists the codings of h's Content-Encoding, identity left out, in the
// order they were applied; ok is false when one is not gzip, x-gzip or
// deflate (br, zstd…), or there are more than Max.
func List(h http.Header) (codings []string, ok bool) {
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
	return codings, len(codings) <= Max
}

// Undo undoes one coding of b, one List returned, reading at most limit
// decoded bytes (heldbody.ReadAll; grow, if set, reserves them as they
// come).
func Undo(coding string, b []byte, limit int64, grow func(extra int64) bool) ([]byte, error) {
	var rd io.Reader
	var err error
	switch coding {
	case "deflate":
		// RFC 9110 §8.4.1.2: the zlib format. Some clients and servers send
		// a raw deflate stream under this name; a peer that decodes both
		// reads either.
		if rd, err = zlib.NewReader(bytes.NewReader(b)); err != nil {
			rd = flate.NewReader(bytes.NewReader(b))
		}
	default:
		if rd, err = gzip.NewReader(bytes.NewReader(b)); err != nil {
			return nil, err
		}
	}
	return heldbody.ReadAll(rd, -1, limit, grow)
}
