package main

import (
	"bytes"
	"net"
	"strings"
	"testing"
)

// Without IDEMPROXY_ADMIN_TOKEN the admin API is open, as the contract
// says; on an address other hosts reach (the default :9090, 0.0.0.0, a
// host's own address) that is named in a WARN line at start, never with a
// secret. A token, or a loopback address, draws no line.
func TestConfigWarnsOfOpenAdminAPI(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		warn        bool
	}{
		{":9090", "", true},
		{"0.0.0.0:9090", "", true},
		{"[::]:9090", "", true},
		{"10.1.2.3:9090", "", true},
		{"admin.internal:9090", "", true},
		{":9090", "admin-token-0123456789", false},
		{"127.0.0.1:9090", "", false},
		{"127.0.0.2:9090", "", false},
		{"[::1]:9090", "", false},
		{"localhost:9090", "", false},
	} {
		var buf bytes.Buffer
		warnOpenAdmin(tc.addr, tc.token, newLogger(&buf, "info", nil))
		got := buf.String()
		if tc.warn != strings.Contains(got, `"variable":"IDEMPROXY_ADMIN_TOKEN"`) {
			t.Errorf("ADMIN_ADDR=%s token %v: log %q, want a warning %v", tc.addr, tc.token != "", got, tc.warn)
		}
		if tc.warn && (!strings.Contains(got, `"level":"WARN"`) || jsonField(got, "admin_addr") != tc.addr) {
			t.Errorf("ADMIN_ADDR=%s: %q, want WARN naming the address", tc.addr, got)
		}
	}
}

// The real binary, admin address on every interface and no admin token:
// the WARN line is written at start. Its proxy port is taken, so that the
// start stops right after the warnings: nothing but this test could reach
// the admin listener.
func TestBinaryWarnsOfOpenAdminAPI(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	env := append(baseEnv("http://127.0.0.1:1", t.TempDir()),
		"IDEMPROXY_LISTEN_ADDR="+taken.Addr().String(), "IDEMPROXY_ADMIN_ADDR=:0")
	out := startStops(t, 1, env...)
	if !strings.Contains(out, `"msg":"admin API open to whoever reaches the admin port: no admin token"`) {
		t.Errorf("no WARN line of the open admin API:\n%s", out)
	}
}
