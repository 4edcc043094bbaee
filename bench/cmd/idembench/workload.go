package main

import "github.com/idemproxy/idemproxy/bench/workload"

// The requests every target receives: bench/workload's payment calls.

// buildGet is the unprotected request (D, and A/B/C's GET rows).
func buildGet(dst []byte, _ uint64) []byte { return append(dst, workload.Get...) }

// buildNewPost returns requests whose order_id is prefix+seq: a new
// operation every request (E, and A/B/C's POST rows), unique across the run
// because sequence numbers never repeat within it and prefix names the run.
func buildNewPost(prefix string) func([]byte, uint64) []byte {
	return func(dst []byte, seq uint64) []byte { return workload.AppendPost(dst, prefix, seq) }
}

// buildReplayPost returns requests for the operations prefix+0 ..
// prefix+(n-1), cycling: once those are stored, every request is a replay (F).
func buildReplayPost(prefix string, n uint64) func([]byte, uint64) []byte {
	return func(dst []byte, seq uint64) []byte { return workload.AppendPost(dst, prefix, seq%n) }
}
