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

// InMemory returns a reader of h's unread bytes that net/http knows to be
// in memory (an io.NopCloser over the *bytes.Reader): for a request body of
// any other type, net/http writes the header to the connection first and the
// body in a second write, in case the body blocks, so a small request costs
// two system calls and two packets instead of one. Reading it reads h.
func (h *Body) InMemory() io.ReadCloser { return io.NopCloser(&h.Reader) }

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

// ErrRefused is ReadAll's and ReadDeclared's error when grow refused more room.
var ErrRefused = errors.New("heldbody: no room to grow the body")

// ErrTooLarge is ReadAll's error when more bytes came than its limit.
var ErrTooLarge = errors.New("heldbody: body over the limit")

// MaxPrealloc bounds the first buffer ReadAll and ReadDeclared make from a declared length,
// before any byte came: a declared length is the sender's word, not bytes
// yet. A body longer than this grows its buffer as the bytes come.
//
// Why 64 KiB, the retry loop's former cap rather than the signer's 4 MiB:
// every upstream answer of a protected request is read here, and so is an
// unprotected request's body the signer hashes, whose length the client
// declares (up to the proxy's body cap) and which no in-flight bytes bound
// reserves: a larger cap lets a header alone pin that much memory for as
// long as the body takes to come. What it would save is growths, only for
// bodies past 64 KiB, which payment answers rarely are. The answers on the
// paths the proxy's allocation budget measures are far smaller, so their
// allocations per request are what they were with the retry loop's own copy.
const MaxPrealloc = 64 << 10

// ReadDeclared reads a body of the length n (n >= 0) its sender declared,
// from a reader that ends it there (net/http's server does): exactly n
// bytes, io.ErrUnexpectedEOF if fewer come.
//
// A body of up to MaxPrealloc bytes is read into one buffer of n bytes. A
// longer one starts at MaxPrealloc and doubles as its bytes fill it, never
// past n: a declared length is the sender's word, not bytes yet, and a
// sender that declares a megabyte and sends a kilobyte, or sends slowly,
// holds about what it sent (at most twice), not what it declared.
//
// grow, if not nil, is asked for every capacity before it is allocated: the
// first buffer's, then each growth's added bytes. A refusal ends the read
// with ErrRefused. The first ask comes before the first read.
func ReadDeclared(r io.Reader, n int64, grow func(extra int64) bool) ([]byte, error) {
	if n < 0 {
		return nil, errors.New("heldbody: negative declared length")
	}
	c := min(n, MaxPrealloc)
	if grow != nil && !grow(c) {
		return nil, ErrRefused
	}
	b := make([]byte, c)
	for read := 0; ; {
		m, err := io.ReadFull(r, b[read:])
		read += m
		if errors.Is(err, io.EOF) { // nothing came for this buffer: the body ended early
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, err
		}
		if int64(read) == n {
			return b, nil
		}
		next := min(2*int64(len(b)), n)
		if grow != nil && !grow(next-int64(len(b))) {
			return nil, ErrRefused
		}
		grown := make([]byte, next)
		copy(grown, b)
		b = grown
	}
}

// unknownSize is the first buffer of a body of unknown length (io.ReadAll's).
const unknownSize = 512

// ReadAll is io.ReadAll into one growing buffer, sized from the length the
// sender declares and bounded.
//
// declared is that length, negative if unknown. The first buffer holds
// declared+1 bytes (the one more is room for the read that finds the end,
// so a body of its declared length is read into one buffer), but at most
// limit+1 and MaxPrealloc+1; a body of unknown length starts at 512 bytes.
//
// limit, if positive, ends the read with ErrTooLarge as soon as more than
// limit bytes came (a body of exactly limit bytes is read whole); the
// buffer grows as usual until then, by whatever the reads bring. Zero or
// negative means no limit.
//
// grow, if not nil, is asked for every capacity the buffer gains: the first
// buffer's before it is made, each growth's added capacity once the larger
// buffer is allocated and before it is used. A refusal ends the read with
// ErrRefused: a body bound can count bytes as they come.
func ReadAll(r io.Reader, declared, limit int64, grow func(extra int64) bool) ([]byte, error) {
	first := int64(unknownSize)
	if declared >= 0 {
		first = min(declared, MaxPrealloc)
		if limit > 0 {
			first = min(first, limit)
		}
		first++
	}
	if grow != nil && !grow(first) {
		return nil, ErrRefused
	}
	b := make([]byte, 0, first)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if limit > 0 && int64(len(b)) > limit {
			return nil, ErrTooLarge
		}
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
