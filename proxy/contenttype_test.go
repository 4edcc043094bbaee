package proxy_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// A body sent with two Content-Type lines that differ is read one way by
// idemproxy (the first) and may be read the other way by the provider: here
// the first names boundary AAA, whose one part holds everything up to
// "--AAA--", and the second boundary BBB, whose part is order B. Each such
// request got a key of its own while a provider reading the last line saw
// order B every time (before: both were sent). It is refused, nothing sent.
func TestContentTypeTwiceIsRefused(t *testing.T) {
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.KeySources, _ = idemkey.ParseSources("form:order_id")
	})
	addr := strings.TrimPrefix(e.srv.URL, "http://")
	part := func(boundary, val string) string {
		return "--" + boundary + "\r\nContent-Disposition: form-data; name=\"order_id\"\r\n\r\n" + val + "\r\n"
	}
	for i, junk := range []string{"A1", "A2"} {
		body := part("AAA", junk) + part("BBB", "B") + "--BBB--\r\n--AAA--\r\n"
		req := "POST /v1/payments HTTP/1.1\r\nHost: x\r\n" +
			"Content-Type: multipart/form-data; boundary=AAA\r\n" +
			"Content-Type: multipart/form-data; boundary=BBB\r\n" +
			"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		if line := rawRequest(t, addr, req); !strings.Contains(line, " 400 ") {
			t.Errorf("request %d: status line %q, want 400", i, line)
		}
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("upstream saw %d requests, want 0", total)
	}
	// The same value twice is one Content-Type: the order goes through.
	body := "order_id=ct-1&amount=1"
	req := "POST /v1/payments HTTP/1.1\r\nHost: x\r\n" +
		"Content-Type: application/x-www-form-urlencoded\r\nContent-Type: application/x-www-form-urlencoded\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if line := rawRequest(t, addr, req); !strings.Contains(line, " 201 ") {
		t.Errorf("one Content-Type sent twice: status line %q, want 201", line)
	}
}
