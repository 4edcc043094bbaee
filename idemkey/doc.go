// Package idemkey decides which idempotency key protects a request and what
// "the same request" means for replay.
//
// docs/keys.md: the key is the client's Idempotency-Key when it
// sent one ([FromHeader]); otherwise it is derived from the first configured
// source that is present ([ParseSources], [Derive]). docs/contract.md, "Replay": a repeat
// with the same key is replayed only when its [Fingerprint] (method, path,
// canonical query and body) matches the stored one; otherwise it is a conflict.
//
// Everything here is pure computation over an already read request; nothing
// does I/O, reads the environment or keeps mutable global state (an internal
// sync.Pool of scratch buffers aside).
package idemkey
