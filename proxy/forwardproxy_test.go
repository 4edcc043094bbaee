package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// An app pointed at idemproxy through a forward-proxy setting (HTTP_PROXY,
// HTTPS_PROXY, Java's http.proxyHost) instead of its base URL sends an
// absolute URI, or CONNECT for an https provider. Both are refused with
// nothing sent, and the answer says what to change: the base URL. Before,
// the app was told only "request cannot be proxied" or "CONNECT, TRACE and
// TRACK are not proxied", which read as an idemproxy fault.
func TestForwardProxyUseIsNamed(t *testing.T) {
	e := newEnv(t)
	host := strings.TrimPrefix(e.srv.URL, "http://")
	for _, c := range []struct{ name, raw string }{
		{"absolute URI", "POST http://api.provider.example/v1/payments HTTP/1.1\r\nHost: api.provider.example\r\nContent-Type: application/json\r\nContent-Length: 19\r\n\r\n{\"order_id\":\"fp-1\"}"},
		{"CONNECT", "CONNECT api.provider.example:443 HTTP/1.1\r\nHost: api.provider.example:443\r\n\r\n"},
	} {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, c.raw)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode/100 != 4 || !strings.Contains(string(body), "base URL") || !strings.Contains(string(body), "forward proxy") ||
			!strings.Contains(string(body), "othing was sent upstream") {
			t.Errorf("%s: %d %s, want a 4xx naming forward-proxy use and the base URL, nothing sent", c.name, resp.StatusCode, body)
		}
	}
	e.prov.mu.Lock()
	defer e.prov.mu.Unlock()
	if e.prov.total != 0 {
		t.Errorf("the provider got %d requests, want none", e.prov.total)
	}
}
