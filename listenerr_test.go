package main

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestListenErrorSaysIPv6IsOff: an IPv6 listen address on a host whose
// IPv6 is off failed to start with the system's words only; the error now
// says that IPv6 is off and which IPv4 address to set instead. The errors
// are the system's own: a bind of an address no interface holds (as ::1 is
// once IPv6 is turned off by sysctl), and the error of a socket of a family
// the kernel lacks (as AF_INET6 is without IPv6 in the kernel), which
// net.Listen returns as below.
func TestListenErrorSaysIPv6IsOff(t *testing.T) {
	_, notHeld := net.Listen("tcp", "[2001:db8::1]:8080") // a documentation address
	if !errors.Is(notHeld, syscall.EADDRNOTAVAIL) {
		t.Fatalf("listen on an address no interface holds: %v; want EADDRNOTAVAIL", notHeld)
	}
	fd, noFamily := syscall.Socket(1<<10, syscall.SOCK_STREAM, 0) // no such family
	if noFamily == nil {
		syscall.Close(fd)
	}
	if !errors.Is(noFamily, syscall.EAFNOSUPPORT) {
		t.Fatalf("socket of an unknown family: %v; want EAFNOSUPPORT", noFamily)
	}
	noIPv6 := &net.OpError{Op: "listen", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv6zero, Port: 8080},
		Err: os.NewSyscallError("socket", noFamily)}
	for _, c := range []struct {
		name, addr string
		err        error
		want       string // "": the error as it was
	}{
		{"LISTEN_ADDR", "[::]:8080", noIPv6, "IPv6 is off on this host; listen on IPv4 instead: IDEMPROXY_LISTEN_ADDR=0.0.0.0:8080"},
		{"ADMIN_ADDR", "[::1]:9090", noIPv6, "IPv6 is off on this host; listen on IPv4 instead: IDEMPROXY_ADMIN_ADDR=127.0.0.1:9090"},
		{"LISTEN_ADDR", "[2001:db8::1]:8080", notHeld, "no interface holds 2001:db8::1 (IPv6 may be off on this host); listen on IPv4 instead: IDEMPROXY_LISTEN_ADDR=0.0.0.0:8080"},
		{"LISTEN_ADDR", "[::1]:8080", notHeld, "IDEMPROXY_LISTEN_ADDR=127.0.0.1:8080"},
		{"LISTEN_ADDR", "192.0.2.1:8080", notHeld, ""}, // IPv4: not about IPv6
		{"LISTEN_ADDR", ":8080", noIPv6, ""},
		{"LISTEN_ADDR", "[::]:8080", errors.New("bind: address already in use"), ""},
	} {
		got := listenError(c.name, c.addr, c.err).Error()
		if !strings.HasPrefix(got, "IDEMPROXY_"+c.name+": "+c.err.Error()) {
			t.Errorf("%s=%s: %q; want the variable and the system's error first", c.name, c.addr, got)
		}
		if c.want == "" && got != "IDEMPROXY_"+c.name+": "+c.err.Error() {
			t.Errorf("%s=%s: %q; want the error as it was", c.name, c.addr, got)
		}
		if !strings.Contains(got, c.want) {
			t.Errorf("%s=%s: %q; want it to say %q", c.name, c.addr, got, c.want)
		}
	}
}
