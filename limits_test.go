package main

import (
	"math"
	"testing"
)

func TestDeriveLimits(t *testing.T) {
	const mib = 1 << 20
	base := config{MaxBodyBytes: mib}
	set := base
	set.MaxInflight, set.MaxInflightBytes = 50, 8*mib
	tests := []struct {
		name       string
		cfg        config
		nofile     uint64
		storeFiles int
		goLimit    int64
		container  int64
		want       resourceLimits
	}{
		// 256 MiB container: Go limit 40% of it (102.4 MiB), a quarter for bodies.
		{"container, ulimit 1024", base, 1024, 10, 107374182, 256 * mib, resourceLimits{maxInflight: 284, maxInflightBytes: 26843545, clientConns: 379, upstreamConns: 379, nofile: 1024}},
		{"no limits known", base, 0, 0, math.MaxInt64, 0, resourceLimits{maxInflight: 1024, maxInflightBytes: 64 * mib}},
		{"many descriptors", base, 1 << 20, 0, math.MaxInt64, 0, resourceLimits{maxInflight: 1024, maxInflightBytes: 64 * mib, clientConns: 393216, upstreamConns: 393216, nofile: 1 << 20}},
		{"tiny Go limit: still one body at the cap", base, 0, 0, 2 * mib, 0, resourceLimits{maxInflight: 1024, maxInflightBytes: mib}},
		{"almost no descriptors", base, 100, 0, math.MaxInt64, 0, resourceLimits{maxInflight: 12, maxInflightBytes: 64 * mib, clientConns: 16, upstreamConns: 16, nofile: 100}},
		// GOMEMLIMIT=1TiB (README, Memory: it turns the soft limit off) or off
		// in a 256 MiB container: bodies still get a tenth of the container's.
		{"GOMEMLIMIT=1TiB in a container", base, 1024, 10, 1 << 40, 256 * mib, resourceLimits{maxInflight: 284, maxInflightBytes: 26843545, clientConns: 379, upstreamConns: 379, nofile: 1024}},
		{"GOMEMLIMIT=off in a container", base, 0, 0, math.MaxInt64, 256 * mib, resourceLimits{maxInflight: 1024, maxInflightBytes: 26843545}},
		{"GOMEMLIMIT below the container's share", base, 0, 0, 40 * mib, 256 * mib, resourceLimits{maxInflight: 1024, maxInflightBytes: 10 * mib}},
		{"small container: still one body at the cap", base, 0, 0, math.MaxInt64, 8 * mib, resourceLimits{maxInflight: 1024, maxInflightBytes: mib}},
		{"set explicitly", set, 1024, 0, 128 * mib, 256 * mib, resourceLimits{maxInflight: 50, maxInflightBytes: 8 * mib, clientConns: 384, upstreamConns: 384, nofile: 1024}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := deriveLimits(tt.cfg, tt.nofile, tt.storeFiles, tt.goLimit, tt.container); got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestBodyTooLargeForContainer: a body cap whose bodies may not fit the
// container's memory limit is told at start (measured in a 128 MiB
// container: one 50 MiB body got the process killed, 40 MiB passed); with
// no container limit found, nothing is said.
func TestBodyTooLargeForContainer(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		body, container int64
		want            bool
	}{
		{1 * mib, 128 * mib, false}, // the default cap
		{32 * mib, 128 * mib, false},
		{50 * mib, 128 * mib, true},
		{60 * mib, 128 * mib, true},
		{60 * mib, 256 * mib, false},
		{1 << 40, 0, false}, // no container limit
	} {
		if got := bodyTooLargeForContainer(c.body, c.container); got != c.want {
			t.Errorf("bodyTooLargeForContainer(%d MiB, %d MiB) = %v, want %v", c.body/mib, c.container/mib, got, c.want)
		}
	}
}
