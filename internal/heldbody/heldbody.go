// Package heldbody is a request body already read into memory, passed
// between the layers an upstream attempt goes through (proxy, retry loop,
// signer, wire) so that each reads the one slice instead of copying it.
//
// A protected request's body is held for as long as its operation runs,
// retries included; with large bodies at high concurrency every extra copy
// multiplies the memory a process needs. The proxy reads the body once; the
// retry loop gives every attempt a fresh Body over the same bytes; the signer
// hashes the bytes in place; net/http reads them to the wire.
package heldbody

import (
	"bytes"
	"errors"
	"io"
)

// Body is an io.ReadCloser over bytes held in memory. Close does nothing:
// the bytes need no release. A Body is read by one goroutine at a time; the
// bytes it holds must not be modified.
type Body struct {
	bytes.Reader
	b []byte
}

// New returns a Body reading b from the start. b is not copied.
func New(b []byte) *Body {
	h := &Body{b: b}
	h.Reset(b)
	return h
}

// Close does nothing.
func (*Body) Close() error { return nil }

// Bytes returns the whole body, whatever has been read of it.
func (h *Body) Bytes() []byte { return h.b }

// Unread reports the bytes of r when r is a Body nothing has been read from
// yet: a layer may use them in place of reading r. Any other reader, or a
// Body partly read, gives false, and the caller reads r as usual.
func Unread(r io.Reader) ([]byte, bool) {
	h, ok := r.(*Body)
	if !ok || h == nil || h.Len() != len(h.b) {
		return nil, false
	}
	return h.b, true
}

// ErrRefused is ReadAll's error when grow refused more room.
var ErrRefused = errors.New("heldbody: no room to grow the body")

// ReadAll is io.ReadAll into a buffer of capacity size at first. If grow is
// not nil it is asked for each growth's added capacity before the larger
// buffer is used (it is allocated just before), and a refusal ends the read
// with ErrRefused: a body bound can count bytes as they come.
func ReadAll(r io.Reader, size int, grow func(extra int64) bool) ([]byte, error) {
	b := make([]byte, 0, max(size, 1))
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
		if len(b) == cap(b) {
			grown := append(b, 0)[:len(b)]
			if grow != nil && !grow(int64(cap(grown)-cap(b))) {
				return nil, ErrRefused
			}
			b = grown
		}
	}
}
