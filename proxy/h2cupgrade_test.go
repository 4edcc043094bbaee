package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// TestH2CUpgradeOfferIsIgnored: an offer to upgrade to HTTP/2 over cleartext
// (Upgrade: h2c, HTTP2-Settings), which Java's java.net.http.HttpClient
// sends by default on an http:// URL and curl --http2 too, is optional: a
// server that does not take it answers over HTTP/1.1 (RFC 9110 §7.8). It
// was refused 400 upgrade_not_supported, so every request of such an app
// failed, nothing sent. Now it is served as HTTP/1.1, protected or not,
// and the offer never reaches the provider (which could otherwise switch
// the connection to a protocol idemproxy does not read). An upgrade to
// anything else (websocket, or h2c offered with another protocol) is still
// refused, nothing sent.
func TestH2CUpgradeOfferIsIgnored(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"succeeded"}`))
	}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.Upstream = upURL })
	addr := strings.TrimPrefix(e.srv.URL, "http://")

	offer := "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
	body := `{"order_id":"h2c-1","amount":"10.00"}`
	for _, c := range []struct{ name, req, want string }{
		{"protected POST", "POST /v1/payments HTTP/1.1\r\nHost: x\r\n" + offer +
			"Content-Type: application/json\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n" + body, "200"},
		{"unprotected GET", "GET /v1/payments/p1 HTTP/1.1\r\nHost: x\r\n" + offer + "\r\n", "200"},
		{"h2c in upper case", "GET /v1/payments/p2 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: H2C\r\n\r\n", "200"},
	} {
		if line := rawRequest(t, addr, c.req); !strings.Contains(line, "HTTP/1.1 "+c.want+" ") {
			t.Errorf("%s: status line %q, want HTTP/1.1 %s", c.name, line, c.want)
		}
	}
	mu.Lock()
	if len(seen) != 3 {
		t.Errorf("provider saw %d requests, want 3", len(seen))
	}
	for i, h := range seen {
		if h.Get("Upgrade") != "" || h.Get("HTTP2-Settings") != "" || strings.Contains(strings.ToLower(h.Get("Connection")), "upgrade") {
			t.Errorf("request %d reached the provider with the upgrade offer: %v", i, h)
		}
	}
	n := len(seen)
	mu.Unlock()

	for _, req := range []string{
		"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c, websocket\r\n\r\n",
	} {
		if line := rawRequest(t, addr, req); !strings.Contains(line, " 400 ") {
			t.Errorf("%q: status line %q, want 400", req, line)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Errorf("a refused upgrade reached the provider")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
