package main

import (
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestUnreachableUpstreamLogsWhy: a protected request whose attempts never
// reached the provider (a name that does not resolve, a certificate that
// does not verify, a refused connection) is answered 502 "nothing was
// sent", and the log at the default level says why, as it does for an
// unprotected one. It said only outcome upstream_unavailable, so a mistyped
// IDEMPROXY_UPSTREAM_URL or a provider certificate the image does not trust
// looked like a provider that is down, every payment refused.
func TestUnreachableUpstreamLogsWhy(t *testing.T) {
	tlsUp := httptest.NewTLSServer(http.NotFoundHandler()) // its certificate is signed by no authority the binary trusts
	defer tlsUp.Close()
	tlsUp.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	for _, c := range []struct{ name, upstream, why string }{
		{"name that does not resolve", "http://payments-provider.invalid", "no such host"},
		{"certificate not trusted", tlsUp.URL, "x509: certificate signed by unknown authority"},
		{"connection refused", "http://" + closedAddr(t), "connection refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := launch(t, launchSpec{env: baseEnv(c.upstream, t.TempDir(),
				"IDEMPROXY_RETRY_MAX_ATTEMPTS=2", "IDEMPROXY_RETRY_BASE_DELAY=10ms", "IDEMPROXY_RETRY_MAX_DELAY=50ms",
				"IDEMPROXY_ATTEMPT_TIMEOUT=2s")})
			r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
			key := r.header.Get("Idempotency-Key")
			if r.status != http.StatusBadGateway || !strings.Contains(r.body, "nothing was sent") || key == "" {
				t.Fatalf("app got %d %s (key %q), want 502 nothing was sent with the key", r.status, r.body, key)
			}
			line := p.waitLine(t, `"key":"`+key+`","attempts":2,"err"`)
			if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, c.why) {
				t.Fatalf("log line %s does not say %q at WARN", line, c.why)
			}
		})
	}
}

// closedAddr is a loopback address nothing listens on: a listener opened and
// closed at once.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
