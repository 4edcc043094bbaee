package heldbody_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

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
	b, err := heldbody.ReadAll(strings.NewReader(body), 16, nil)
	if err != nil || string(b) != body {
		t.Fatalf("ReadAll without grow: %d bytes, %v; want all %d", len(b), err, len(body))
	}
	var granted int64
	b, err = heldbody.ReadAll(strings.NewReader(body), 16, func(extra int64) bool {
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
