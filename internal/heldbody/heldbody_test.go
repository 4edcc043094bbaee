package heldbody_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/idemproxy/idemproxy/internal/heldbody"
)

func TestUnread(t *testing.T) {
	b := []byte("payment")
	h := heldbody.New(b)
	got, ok := heldbody.Unread(h)
	if !ok || &got[0] != &b[0] || len(got) != len(b) {
		t.Fatalf("Unread(new Body) = %q, %v; want the same slice", got, ok)
	}
	p := make([]byte, 3)
	h.Read(p)
	if _, ok := heldbody.Unread(h); ok {
		t.Error("Unread of a partly read Body gave its bytes; the caller would send them twice")
	}
	if rest, _ := io.ReadAll(h); string(rest) != "ment" || !bytes.Equal(h.Bytes(), b) {
		t.Errorf("read %q, Bytes %q", rest, h.Bytes())
	}
	for _, r := range []io.Reader{strings.NewReader("x"), io.NopCloser(heldbody.New(b)), (*heldbody.Body)(nil)} {
		if _, ok := heldbody.Unread(r); ok {
			t.Errorf("Unread(%T) gave bytes; only a *Body does", r)
		}
	}
}

func TestReadAll(t *testing.T) {
	body := strings.Repeat("x", 5000)
	b, err := heldbody.ReadAll(strings.NewReader(body), 15, 0, nil) // a 16-byte first buffer, which grows
	if err != nil || string(b) != body {
		t.Fatalf("ReadAll without grow: %d bytes, %v; want all %d", len(b), err, len(body))
	}
	var granted int64
	b, err = heldbody.ReadAll(strings.NewReader(body), 15, 0, func(extra int64) bool {
		if granted+extra > 1000 {
			return false
		}
		granted += extra
		return true
	})
	if !errors.Is(err, heldbody.ErrRefused) || b != nil {
		t.Fatalf("ReadAll past what grow grants: %d bytes, %v; want heldbody.ErrRefused", len(b), err)
	}
	if granted == 0 || granted > 1000 {
		t.Fatalf("granted %d bytes, want some, at most 1000", granted)
	}
}

// oneByte returns at most one byte per Read, so that a limit is crossed by
// exactly one byte.
type oneByte struct{ r io.Reader }

func (o oneByte) Read(p []byte) (int, error) { return o.r.Read(p[:min(len(p), 1)]) }

func TestReadAllLimit(t *testing.T) {
	const limit = 1000
	at := strings.Repeat("x", limit)
	for _, declared := range []int64{-1, 0, limit, 1 << 30} { // a declared length is not trusted: the bytes decide
		b, err := heldbody.ReadAll(strings.NewReader(at), declared, limit, nil)
		if err != nil || string(b) != at {
			t.Errorf("declared %d: a body of exactly the limit: %d bytes, %v; want it whole", declared, len(b), err)
		}
		for _, r := range []io.Reader{strings.NewReader(at + "y"), oneByte{strings.NewReader(at + "y")}} {
			b, err := heldbody.ReadAll(r, declared, limit, nil)
			if !errors.Is(err, heldbody.ErrTooLarge) || b != nil {
				t.Errorf("declared %d, %T: one byte over the limit: %d bytes, %v; want heldbody.ErrTooLarge", declared, r, len(b), err)
			}
		}
	}
	// The limit is checked before the end: a last read that crosses it and
	// reports io.EOF with its bytes is still over.
	b, err := heldbody.ReadAll(iotest.DataErrReader(strings.NewReader(at+"y")), -1, limit, nil)
	if !errors.Is(err, heldbody.ErrTooLarge) || b != nil {
		t.Errorf("over the limit with io.EOF in the same read: %d bytes, %v; want heldbody.ErrTooLarge", len(b), err)
	}
}

func TestReadAllFirstBuffer(t *testing.T) {
	const big = heldbody.MaxPrealloc + 10
	for _, c := range []struct {
		declared, limit int64
		n               int   // body length
		first           int64 // the first buffer's capacity
		over            bool  // ErrTooLarge
	}{
		{-1, 0, 300, 512, false},                           // unknown length: io.ReadAll's start
		{-1, 10, 300, 512, true},                           // the limit does not shrink it
		{0, 0, 0, 1, false},                                // declared empty: room for the read that finds the end
		{300, 0, 300, 301, false},                          // the declared length, in one buffer
		{300, 100, 300, 101, true},                         // never more than the limit allows
		{1 << 30, 0, 300, heldbody.MaxPrealloc + 1, false}, // the sender's word is capped
		{1 << 30, 1 << 20, 300, heldbody.MaxPrealloc + 1, false},
		{big, 0, big, heldbody.MaxPrealloc + 1, false}, // past the cap the buffer grows
	} {
		var asks []int64
		body := strings.Repeat("x", c.n)
		b, err := heldbody.ReadAll(strings.NewReader(body), c.declared, c.limit, func(extra int64) bool {
			asks = append(asks, extra)
			return true
		})
		switch {
		case c.over && (!errors.Is(err, heldbody.ErrTooLarge) || b != nil):
			t.Errorf("declared %d, limit %d: %d bytes, %v; want heldbody.ErrTooLarge", c.declared, c.limit, len(b), err)
		case !c.over && (err != nil || string(b) != body):
			t.Errorf("declared %d, limit %d: %d bytes, %v; want all %d", c.declared, c.limit, len(b), err, c.n)
		}
		if len(asks) == 0 || asks[0] != c.first {
			t.Errorf("declared %d, limit %d: grow asked %v; want the first buffer's %d first", c.declared, c.limit, asks, c.first)
		}
		if fits := int64(c.n) < c.first; fits && len(asks) != 1 {
			t.Errorf("declared %d, limit %d: grow asked %v; a %d-byte body fits the first buffer", c.declared, c.limit, asks, c.n)
		} else if !fits && !c.over && len(asks) < 2 {
			t.Errorf("declared %d, limit %d: grow asked %v; a %d-byte body must grow the first buffer", c.declared, c.limit, asks, c.n)
		}
	}
}

func TestReadAllRefusesFirstBuffer(t *testing.T) {
	calls := 0
	b, err := heldbody.ReadAll(strings.NewReader("x"), -1, 0, func(int64) bool { calls++; return false })
	if !errors.Is(err, heldbody.ErrRefused) || b != nil || calls != 1 {
		t.Fatalf("grow refusing the first buffer: %q, %v after %d asks; want heldbody.ErrRefused after 1", b, err, calls)
	}
}

func TestReadDeclared(t *testing.T) {
	for _, n := range []int{0, 1, 300, heldbody.MaxPrealloc, heldbody.MaxPrealloc + 1, 5*heldbody.MaxPrealloc + 7} {
		body := strings.Repeat("x", n)
		var asks []int64
		b, err := heldbody.ReadDeclared(oneByte{strings.NewReader(body)}, int64(n), func(extra int64) bool {
			asks = append(asks, extra)
			return true
		})
		if err != nil || string(b) != body {
			t.Errorf("%d bytes declared and sent: %d bytes, %v; want them all", n, len(b), err)
			continue
		}
		var granted int64
		for _, a := range asks {
			granted += a
		}
		if granted != int64(n) || int64(cap(b)) != granted {
			t.Errorf("%d bytes: grow granted %v (%d), buffer capacity %d; want exactly the declared length", n, asks, granted, cap(b))
		}
		if first := min(int64(n), heldbody.MaxPrealloc); len(asks) == 0 || asks[0] != first {
			t.Errorf("%d bytes: grow asked %v; want %d first", n, asks, first)
		}
		if n <= heldbody.MaxPrealloc && len(asks) != 1 {
			t.Errorf("%d bytes: grow asked %v; a body up to MaxPrealloc is one buffer", n, asks)
		}
	}
	if _, err := heldbody.ReadDeclared(strings.NewReader("short"), 10, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("5 of 10 declared bytes: %v; want io.ErrUnexpectedEOF", err)
	}
	if _, err := heldbody.ReadDeclared(strings.NewReader(strings.Repeat("x", heldbody.MaxPrealloc)), heldbody.MaxPrealloc+10, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a body ending at the first buffer's end, short of its declared length: %v; want io.ErrUnexpectedEOF", err)
	}
}

// TestReadDeclaredHoldsWhatCame reads a body declared at 1 MiB whose sender
// stops after a few kilobytes (its connection then fails): grow is asked for
// about what came, not for the declared megabyte.
func TestReadDeclaredHoldsWhatCame(t *testing.T) {
	const declared = 1 << 20
	cut := errors.New("connection reset")
	for _, sent := range []int{1, 3000, heldbody.MaxPrealloc + 1, 3 * heldbody.MaxPrealloc} {
		var granted int64
		r := io.MultiReader(strings.NewReader(strings.Repeat("x", sent)), iotest.ErrReader(cut))
		b, err := heldbody.ReadDeclared(r, declared, func(extra int64) bool { granted += extra; return true })
		if !errors.Is(err, cut) || b != nil {
			t.Errorf("%d bytes sent of %d: %d bytes, %v; want the reader's error", sent, declared, len(b), err)
		}
		if limit := max(heldbody.MaxPrealloc, 2*int64(sent)); granted > limit {
			t.Errorf("%d bytes sent of %d: grow granted %d; want at most %d", sent, declared, granted, limit)
		}
	}
	var granted int64
	b, err := heldbody.ReadDeclared(strings.NewReader(strings.Repeat("x", declared)), declared, func(extra int64) bool {
		if granted+extra > 3*heldbody.MaxPrealloc {
			return false
		}
		granted += extra
		return true
	})
	if !errors.Is(err, heldbody.ErrRefused) || b != nil || granted > 3*heldbody.MaxPrealloc {
		t.Errorf("growth refused: %d bytes, %v, %d granted; want heldbody.ErrRefused within what was granted", len(b), err, granted)
	}
}
