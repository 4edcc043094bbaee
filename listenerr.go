package main

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// listenError is the start error when the listener of the variable name
// (LISTEN_ADDR, ADMIN_ADDR) cannot open at addr. An IPv6 address on a host
// whose IPv6 is off failed with the system's words only ("socket: address
// family not supported by protocol", or "cannot assign requested address"),
// which do not say that IPv6 is the cause nor what to set instead: the
// error now says both, naming the variable and an IPv4 address on the same
// port.
func listenError(name, addr string, err error) error {
	host, port, splitErr := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	if splitErr != nil || ip == nil || ip.To4() != nil {
		return fmt.Errorf("%s%s: %w", envPrefix, name, err)
	}
	v4 := "0.0.0.0"
	if ip.IsLoopback() {
		v4 = "127.0.0.1"
	}
	switch {
	case errors.Is(err, syscall.EAFNOSUPPORT):
		// No IPv6 in the kernel (ipv6.disable=1): no IPv6 socket opens.
		return fmt.Errorf("%s%s: %w: IPv6 is off on this host; listen on IPv4 instead: %s%s=%s",
			envPrefix, name, err, envPrefix, name, net.JoinHostPort(v4, port))
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		// IPv6 turned off by sysctl (net.ipv6.conf.all.disable_ipv6=1)
		// leaves no IPv6 address to bind, ::1 included; or the address
		// is not this host's.
		return fmt.Errorf("%s%s: %w: no interface holds %s (IPv6 may be off on this host); listen on IPv4 instead: %s%s=%s",
			envPrefix, name, err, host, envPrefix, name, net.JoinHostPort(v4, port))
	}
	return fmt.Errorf("%s%s: %w", envPrefix, name, err)
}
