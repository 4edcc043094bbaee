package retry

import (
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// An exhausted sequence says whether anything can have reached the
// upstream: failures before the request was written (refused, no file
// descriptor, a certificate that does not verify, a server that does not
// speak TLS) are "not sent"; a connection cut after the request was written
// is not.
func TestExhaustedNotSent(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + closed.Addr().String()
	closed.Close()
	untrusted := httptest.NewUnstartedServer(http.NotFoundHandler()) // the wire below does not trust its certificate
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0)
	untrusted.StartTLS()
	defer untrusted.Close()
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	cut := newProvider(t, resetBeforeProcessing, resetBeforeProcessing)
	tests := []struct {
		name    string
		url     string
		notSent bool
	}{
		{"connection refused", refusedURL, true},
		{"certificate does not verify", untrusted.URL, true},
		{"server does not speak TLS", strings.Replace(plain.URL, "http:", "https:", 1), true},
		{"connection dropped after the request", cut.srv.URL, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := testPolicy()
			pol.MaxAttempts = 2
			h := newHarness(t, pol)
			resp, err := send(t, h.tr, post(t, tt.url), Protected)
			ex := wantExhausted(t, resp, err, 2, false, 0)
			if ex.NotSent != tt.notSent {
				t.Errorf("NotSent = %v, want %v (%v)", ex.NotSent, tt.notSent, ex.Err)
			}
		})
	}
}
