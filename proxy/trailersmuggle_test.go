package proxy_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// TestTrailerTooLongClosesTheConnection: a chunked body whose trailer
// section runs past what net/http reads of it (its 4 KiB buffer without the
// blank line) fails the body's read, and idemproxy answers 400 bad_request,
// nothing sent, and closes the connection. What follows on the connection is the trailer section's
// bytes, which a front proxy (or the client) framed as this request's: they
// must never be read as another request. net/http closes the connection
// after such a body, but not once the handler has put another reader in
// r.Body (idemproxy's MaxBytesReader on a body of unknown length): its own
// discard of the rest then reads "already closed" and takes the body for
// consumed. So the trailer section was read as a request, and a payment
// hidden in it (a request line and headers padded past 4 KiB) was sent to
// the provider and made, behind the refusal of the request that carried it.
func TestTrailerTooLongClosesTheConnection(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"succeeded"}`))
	}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.Upstream = upURL })
	addr := strings.TrimPrefix(e.srv.URL, "http://")

	hidden := `{"order_id":"hidden-1","amount":"500.00"}`
	trailer := "POST /v1/payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + itoa(len(hidden)) +
		"\r\nX-Pad: " + strings.Repeat("p", 5000) + "\r\n\r\n" + hidden
	for _, c := range []struct{ name, head, body string }{
		{"protected", "POST /v1/payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n", `{"order_id":"carrier-1","amount":"1.00"}`},
		{"unprotected", "PUT /v1/notes/n1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n", `{"note":"x"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := c.head + "Transfer-Encoding: chunked\r\n\r\n" + strings.ToLower(strconvHex(len(c.body))) + "\r\n" + c.body + "\r\n0\r\n" + trailer
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, req)
			conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			// The close may come as a reset (the trailer's bytes unread),
			// before the carrier's 400 is read: at most that one answer.
			got, err := io.ReadAll(conn)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Errorf("the connection was left open after the carrier's answer")
			}
			if n := strings.Count(string(got), "HTTP/1.1 "); n > 1 {
				t.Errorf("%d answers on the connection, want the carrier's alone, then the connection closed:\n%s", n, got)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range seen {
				if strings.Contains(s, "hidden-1") {
					t.Errorf("the request hidden in the trailer section reached the provider: %s", s)
				}
			}
			seen = nil
		})
	}
}

func strconvHex(n int) string {
	const digits = "0123456789abcdef"
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 16 {
		b = append([]byte{digits[n%16]}, b...)
	}
	return string(b)
}
