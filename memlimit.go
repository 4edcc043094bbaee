package main

import (
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// cgroupLimitFiles are where a container's memory limit is found: cgroup v2
// first, then v1.
var cgroupLimitFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// goMemoryShare is the part of a container's memory limit given to the Go
// runtime as its soft limit. The rest is for the page cache of Badger's
// mapped files, which the cgroup counts but the kernel can reclaim, and for
// what the runtime holds outside the heap. With half, a 256 MiB container
// holding a million records peaked at 153 MiB resident, 117 MiB of it
// anonymous (BENCHMARKS.md, Memory and disk); 40% (102 MiB) brings the heap
// near the 100 MiB used outside a container.
const goMemoryShare = 0.4

// defaultGoMemoryLimit is the Go runtime's soft memory limit when neither
// GOMEMLIMIT nor a container limit gives one. Under a sustained write load
// the store's live heap peaks at about 80 MiB (Badger's pooled table
// builders, docs/design/memory.md), and with the collector's default
// headroom the heap reached twice that; the limit makes the collector run
// earlier instead, at some CPU while the heap is near it.
const defaultGoMemoryLimit = 100 << 20

// setMemoryLimit sets the Go runtime's soft memory limit, unless GOMEMLIMIT
// is set (the runtime has applied it already): to goMemoryShare of the
// container's limit when one is found, else to defaultGoMemoryLimit. Without
// a soft limit the heap grows to twice its live size between collections,
// which a tight container answers with an OOM kill.
func setMemoryLimit(environ []string, files []string, log *slog.Logger) {
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOMEMLIMIT=") {
			return
		}
	}
	limit, file := cgroupMemoryLimit(files)
	if limit <= 0 {
		debug.SetMemoryLimit(defaultGoMemoryLimit)
		log.Info("Go memory limit set to the default (no GOMEMLIMIT, no container limit)", "go_limit_bytes", int64(defaultGoMemoryLimit))
		return
	}
	soft := containerGoLimit(limit)
	debug.SetMemoryLimit(soft)
	log.Info("Go memory limit set from the container's", "container_limit_bytes", limit, "go_limit_bytes", soft, "from", file)
}

// containerGoLimit is the Go soft memory limit for a container limit of
// limit bytes: goMemoryShare of it.
func containerGoLimit(limit int64) int64 {
	return int64(float64(limit) * goMemoryShare)
}

// cgroupMemoryLimit returns the first limit found in files, 0 when there is
// none ("max", a v1 "unlimited" value, or no such file).
func cgroupMemoryLimit(files []string) (int64, string) {
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(raw))
		if s == "max" {
			return 0, f
		}
		n, err := strconv.ParseInt(s, 10, 64)
		// cgroup v1 reports "no limit" as a huge page-aligned number.
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0, f
		}
		return n, f
	}
	return 0, ""
}

// sharedStoreGCPercent is the collector's GOGC for a replica on PostgreSQL
// when GOGC is not set. Such a replica keeps no records in memory: its live
// heap is the requests in flight, a few MiB, so with Go's default of 100 the
// collector runs every few MiB allocated, many times a second under load,
// in each of the replicas. At 400 it runs a fifth as often; the soft memory
// limit (setMemoryLimit) still bounds the heap, and the collector runs
// earlier when the heap nears it. Measured with 3 replicas and the database
// on two cores (BENCHMARKS.md): 2-12 % less CPU per new key in alternated
// runs, peak RSS 107 MiB per replica against 72. The embedded Badger store keeps Go's
// default: its live heap is the store's, up to about 80 MiB under writes.
const sharedStoreGCPercent = 400

// setGCPercent sets the collector's GOGC to sharedStoreGCPercent for a
// replica on a shared store, unless GOGC is set (the runtime has applied it
// already).
func setGCPercent(environ []string, sharedStore bool, log *slog.Logger) {
	if !sharedStore {
		return
	}
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOGC=") {
			return
		}
	}
	debug.SetGCPercent(sharedStoreGCPercent)
	log.Info("Go collector set to GOGC=400 for a shared store (no GOGC set)", "gogc", sharedStoreGCPercent)
}
