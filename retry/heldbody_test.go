package retry

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/heldbody"
)

// wireFunc answers attempts in process.
type wireFunc func(*http.Request) (*http.Response, error)

func (f wireFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestCallBodyIsSentWithoutACopy: with Call.Body set, every attempt reaching
// the layer below carries those very bytes (no copy of a body that may be a
// megabyte held for the whole sequence), and the request's own Body is
// closed without being read.
func TestCallBodyIsSentWithoutACopy(t *testing.T) {
	h := newHarness(t, testPolicy())
	body := bytes.Repeat([]byte("x"), 64<<10)
	var seen [][]byte
	h.tr.Next = wireFunc(func(r *http.Request) (*http.Response, error) {
		b, ok := heldbody.Unread(r.Body)
		if !ok {
			t.Errorf("attempt %d: body %T is not the held bytes", len(seen)+1, r.Body)
		}
		if r.ContentLength != int64(len(body)) {
			t.Errorf("attempt %d: ContentLength %d, want %d", len(seen)+1, r.ContentLength, len(body))
		}
		seen = append(seen, b)
		status := http.StatusServiceUnavailable
		if len(seen) == 2 {
			status = http.StatusOK
		}
		return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
	})
	req, _ := http.NewRequest(http.MethodPost, "http://provider.invalid/v1/payout", nil)
	own := &unreadBody{}
	req.Body, req.ContentLength = own, int64(len(body))
	resp, _, err := h.tr.Do(req, Call{Mode: Protected, Body: body})
	readFinal(t, resp, err, http.StatusOK, 2)
	if len(seen) != 2 {
		t.Fatalf("%d attempts reached the wire, want 2", len(seen))
	}
	for i, b := range seen {
		if len(b) != len(body) || &b[0] != &body[0] {
			t.Errorf("attempt %d sent a copy of the body, not Call.Body itself", i+1)
		}
	}
	if own.read || !own.closed {
		t.Errorf("request Body read %v, closed %v; want closed unread", own.read, own.closed)
	}
}

type unreadBody struct{ read, closed bool }

func (u *unreadBody) Read([]byte) (int, error) { u.read = true; return 0, io.EOF }
func (u *unreadBody) Close() error             { u.closed = true; return nil }
