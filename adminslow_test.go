package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
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
