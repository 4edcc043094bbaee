package main

import (
	"math"
	"os"
	"runtime/debug"
)

// Bounds on work in flight, derived from the process's resources when the
// configuration leaves them at 0 (README, Sizing limits).
const (
	// defaultMaxInflight caps the derived request bound: past a thousand
	// concurrent operations a single provider is the bottleneck anyway.
	defaultMaxInflight = 1024
	// defaultInflightBytes is the body byte bound without a Go memory limit.
	defaultInflightBytes = 64 << 20
	// inflightBytesShare: the derived byte bound is this part of the Go
	// memory limit. A body held is one copy, but fingerprinting a JSON body
	// makes up to two short-lived ones, the answers are held too, and the GC
	// needs room to work below the limit.
	inflightBytesShare = 4
	// minFDReserve is the least part of RLIMIT_NOFILE kept for what is not a
	// client or provider connection: the store's files (Badger's tables, or
	// PostgreSQL's pool), the admin listener and its scrapes, logs, DNS.
	minFDReserve = 128
)

// resourceLimits are the bounds run applies.
type resourceLimits struct {
	maxInflight      int64 // requests served at once
	maxInflightBytes int64 // request body bytes held at once
	clientConns      int   // client connections open at once; 0 = no bound
	upstreamConns    int   // provider connections open at once; 0 = no bound
	nofile           uint64
}

// bodyMemoryShare: a request body up to a container's memory limit over
// this fits beside the rest. A body is held once, and its key and
// fingerprint are read from it with up to two more copies of it at once;
// measured in a 128 MiB container, one 40 MiB body passed and one of 50 MiB
// got the process killed for lack of memory.
const bodyMemoryShare = 4

// bodyTooLargeForContainer says whether one request body of maxBody bytes
// may not fit the container's memory limit (0: none found).
func bodyTooLargeForContainer(maxBody, container int64) bool {
	return container > 0 && maxBody > container/bodyMemoryShare
}

// deriveLimits fills the bounds cfg leaves at 0. nofile is RLIMIT_NOFILE (0:
// unknown), storeFiles the files the store holds open at start, goLimit the
// Go runtime's soft memory limit (math.MaxInt64: none), container the
// container's memory limit (0: none found).
//
// Bytes: a quarter of goLimit, and never more than a quarter of the Go limit
// the container's would give (a tenth of it): a GOMEMLIMIT set above that
// (the README's GOMEMLIMIT=1TiB, to turn the soft limit off) made the bound a
// quarter of a tebibyte in a 256 MiB container, no bound before the OOM kill.
//
// File descriptors: a quarter of nofile (at least minFDReserve) plus the
// store's files is kept for other uses; the rest is shared equally between
// client connections and provider connections, since every request in
// flight may hold one of each. The request bound is at most three quarters
// of the client connections: the rest carry the 503 overloaded answers and
// idle keep-alive connections, so that past the bound a request is refused
// clearly instead of waiting for a connection.
func deriveLimits(cfg config, nofile uint64, storeFiles int, goLimit, container int64) resourceLimits {
	l := resourceLimits{maxInflight: cfg.MaxInflight, maxInflightBytes: cfg.MaxInflightBytes, nofile: nofile}
	if nofile > 0 && nofile < math.MaxInt32 {
		reserve := max(nofile/4, minFDReserve) + uint64(storeFiles)
		usable := 32 // a process started with almost no descriptors still serves a few
		if nofile > reserve+uint64(usable) {
			usable = int(nofile - reserve)
		}
		l.clientConns = usable / 2
		l.upstreamConns = usable - l.clientConns
	}
	if l.maxInflight == 0 {
		l.maxInflight = defaultMaxInflight
		if l.clientConns > 0 {
			l.maxInflight = min(l.maxInflight, int64(l.clientConns)*3/4)
		}
	}
	if l.maxInflightBytes == 0 {
		l.maxInflightBytes = defaultInflightBytes
		if goLimit > 0 && goLimit < math.MaxInt64 {
			l.maxInflightBytes = goLimit / inflightBytesShare
		}
		if container > 0 {
			l.maxInflightBytes = min(l.maxInflightBytes, containerGoLimit(container)/inflightBytesShare)
		}
		l.maxInflightBytes = max(l.maxInflightBytes, cfg.MaxBodyBytes)
	}
	return l
}

// processLimits derives the bounds for this process: its RLIMIT_NOFILE, the
// files in the Badger directory (none with STORE_URL), the Go memory limit
// (GOMEMLIMIT, or the one set from the container's, memlimit.go) and the
// container's memory limit.
func processLimits(cfg config) resourceLimits {
	files := 0
	if cfg.StoreURL == "" {
		if entries, err := os.ReadDir(cfg.DataDir); err == nil {
			files = len(entries)
		}
	}
	container, _ := cgroupMemoryLimit(cgroupLimitFiles)
	return deriveLimits(cfg, openFileLimit(), files, debug.SetMemoryLimit(-1), container)
}
