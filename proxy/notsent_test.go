package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// An upstream that refuses connections: nothing was sent, and the answer says
// so (not "outcome may be unknown"); the key is left free, so the next try
// is attempted again at once rather than answered 409 in progress.
func TestUpstreamUnreachableSaysNothingSent(t *testing.T) {
	e := newEnv(t, func(_ *proxy.Options, p *retry.Policy) { p.MaxAttempts = 2 })
	e.up.Close() // refused from now on
	for try := range 2 {
		a := e.do(t, "POST", "/v1/payments", order)
		if a.status != http.StatusBadGateway || errorCode(t, a) != "upstream_unavailable" {
			t.Fatalf("try %d: got %d %s, want 502 upstream_unavailable", try, a.status, a.body)
		}
		if !strings.Contains(string(a.body), "nothing was sent") || strings.Contains(string(a.body), "unknown") {
			t.Errorf("try %d: message does not say nothing was sent: %s", try, a.body)
		}
	}
}

// A client whose body never arrives in full gets 400, not a 502 that says the
// outcome may be unknown: nothing was sent.
func TestBodyCutShortIsNotUnknown(t *testing.T) {
	e := newEnv(t)
	c, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"order_id\":\"ord-cut\"")
	c.(*net.TCPConn).CloseWrite() // the body ends 80 bytes early
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(b), "unknown") {
		t.Fatalf("got %d %s, want 400 saying nothing was sent", resp.StatusCode, b)
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Errorf("upstream saw %d requests, want 0", total)
	}
}
