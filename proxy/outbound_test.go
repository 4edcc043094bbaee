package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/upstream"
)

// seenRequest is what the upstream received.
type seenRequest struct {
	method, uri string
	header      http.Header
	body        string
}

// TestProtectedRequestIsBuiltAsForwarded: a protected operation builds its
// upstream request itself (no ReverseProxy); what reaches the provider must
// be what the ReverseProxy of the forward path sends for the same request,
// but for the key: no hop-by-hop header, none the client's Connection names,
// no client forwarding header, Te: trailers kept, no Go User-Agent, the
// query cleaned the same way. The answer loses its hop-by-hop headers too.
func TestProtectedRequestIsBuiltAsForwarded(t *testing.T) {
	var mu sync.Mutex
	var seen []seenRequest
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, seenRequest{r.Method, r.RequestURI, r.Header.Clone(), string(b)})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "X-Hop-Answer")
		w.Header().Set("X-Hop-Answer", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Kept", "yes")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()
	st, err := cache.Open(cache.Options{Dir: t.TempDir(), SyncWrites: true, TTL: time.Hour, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	target, _ := url.Parse(up.URL + "/base")
	sources, _ := idemkey.ParseSources("json:order_id")
	tr, err := upstream.New(upstream.Config{Policy: retry.Policy{MaxAttempts: 1}, MaxResponseBytes: st.MaxBodyBytes(), Wire: up.Client().Transport})
	if err != nil {
		t.Fatal(err)
	}
	h, err := proxy.New(proxy.Options{Upstream: target, Store: st, KeySources: sources, Transport: tr,
		Protected: []string{http.MethodPost}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer h.Drain(t.Context())

	const hostile = "Connection: keep-alive, X-Hop-Named\r\nX-Hop-Named: drop me\r\nKeep-Alive: timeout=9\r\n" +
		"Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nTe: trailers, deflate\r\n" +
		"X-Forwarded-For: 10.9.9.9\r\nX-Forwarded-Host: evil\r\nX-Forwarded-Proto: https\r\nForwarded: for=10.9.9.9\r\n" +
		"X-Custom: kept\r\nX-Custom: twice\r\nContent-Type: application/json\r\n"
	body := `{"order_id":"ob-1","amount":1}`
	answers := map[string]*http.Response{}
	for _, method := range []string{http.MethodPost, http.MethodPatch} { // protected, forwarded
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "%s /pay?a=1;b=2&c=%%zz&d=4 HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s", method, hostile, len(body), body)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", method, resp.StatusCode, b)
		}
		answers[method] = resp
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("upstream saw %d requests, want 2", len(seen))
	}
	prot, fwd := seen[0], seen[1]
	if prot.header.Get("Idempotency-Key") == "" {
		t.Error("protected request went upstream without a key")
	}
	for _, s := range []*seenRequest{&prot, &fwd} {
		s.header.Del("Idempotency-Key")
	}
	if prot.uri != fwd.uri || prot.body != fwd.body {
		t.Errorf("protected %s %q, forwarded %s %q", prot.uri, prot.body, fwd.uri, fwd.body)
	}
	if !strings.HasPrefix(prot.uri, "/base/pay?") {
		t.Errorf("protected request went to %s, want under /base/pay", prot.uri)
	}
	keys := func(h http.Header) []string {
		var out []string
		for k, v := range h {
			out = append(out, k+"="+strings.Join(v, "|"))
		}
		slices.Sort(out)
		return out
	}
	if p, f := keys(prot.header), keys(fwd.header); !slices.Equal(p, f) {
		t.Errorf("upstream headers differ:\nprotected %q\nforwarded %q", p, f)
	}
	for _, n := range []string{"X-Hop-Named", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization",
		"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded", "User-Agent"} {
		if v, ok := prot.header[n]; ok {
			t.Errorf("protected request carried %s: %q upstream", n, v)
		}
	}
	if got := prot.header.Get("Te"); got != "trailers" {
		t.Errorf("Te = %q upstream, want trailers", got)
	}
	if got := prot.header.Values("X-Custom"); !slices.Equal(got, []string{"kept", "twice"}) {
		t.Errorf("X-Custom = %q upstream", got)
	}
	a := answers[http.MethodPost]
	if a.Header.Get("X-Hop-Answer") != "" || a.Header.Get("X-Kept") != "yes" {
		t.Errorf("protected answer's headers: %v (want X-Kept, not the hop-by-hop X-Hop-Answer)", a.Header)
	}
}
