package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// TestAdminPortEndsSlowBodies: a call whose body never arrives does not
// hold an admin connection (and its file descriptor, shared with the
// proxy's listener) for ever: the admin server reads a request whole within
// adminReadTimeout, then answers or closes.
func TestAdminPortEndsSlowBodies(t *testing.T) {
	t.Parallel()
	p := launch(t, launchSpec{env: unknownEnv(auditProvider(t), t.TempDir(), "IDEMPROXY_ADMIN_TOKEN="+adminToken)})
	c, err := net.Dial("tcp", p.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Headers whole, 10 of the 100 bytes of body announced, then nothing.
	fmt.Fprintf(c, "POST /admin/v1/records/resolve HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"key\":\"k", adminToken)
	start := time.Now()
	c.SetReadDeadline(start.Add(adminReadTimeout + 15*time.Second))
	// Whatever the server writes before it closes (an error answer, or
	// nothing), the connection must end.
	r := bufio.NewReader(c)
	for {
		if _, err := r.ReadByte(); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the admin connection with a body that never came was still open after %v", time.Since(start).Round(time.Second))
			}
			break
		}
	}
	t.Logf("admin connection ended %v after the headers", time.Since(start).Round(100*time.Millisecond))
}

// TestAdminPortClosesIdleConnections: a keep-alive connection left idle on
// the admin port after an answer is closed by the server after a minute
// (README, Admin API), not before (net/http would otherwise use the 15 s
// read timeout), and not never.
func TestAdminPortClosesIdleConnections(t *testing.T) {
	t.Parallel()
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", t.TempDir())})
	c, err := net.Dial("tcp", p.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n")
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /healthz = %d, close %v; want 200 on a connection kept alive", resp.StatusCode, resp.Close)
	}
	idle := time.Now()
	c.SetReadDeadline(idle.Add(time.Minute + 30*time.Second))
	n, err := r.Read(make([]byte, 1))
	took := time.Since(idle)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatalf("the idle admin connection was still open %v after the answer, want it closed after a minute", took.Round(time.Second))
	case n > 0 || !errors.Is(err, io.EOF):
		t.Fatalf("read on the idle connection = %d bytes, %v; want EOF", n, err)
	case took < time.Minute-2*time.Second || took > time.Minute+15*time.Second:
		t.Fatalf("the idle admin connection was closed %v after the answer, want a minute", took.Round(100*time.Millisecond))
	}
	t.Logf("idle admin connection closed %v after the answer", took.Round(100*time.Millisecond))
}
