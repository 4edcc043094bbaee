// Package chaos proves idemproxy's promise — no second charge, no lost
// payment — by running the real idemproxy binary between a fault-injecting
// provider sandbox and a simulated legacy client, killing the proxy with
// SIGKILL at random moments, and judging the run from the sandbox ledger and
// the client's records (docs/contract.md).
//
// The pieces:
//
//   - Upstream is the sandbox (package sandbox) serving one provider on
//     127.0.0.1 with Config.Faults, behind a wire counter that sees every
//     request idemproxy sends: its order_id and Idempotency-Key.
//   - Proxy is the idemproxy binary on fixed loopback ports and one data
//     directory; Kill sends SIGKILL and Start brings it back on the same
//     ports and directory.
//   - Client is the legacy application: one POST per order with an order_id
//     and NO Idempotency-Key, a client timeout, and blind retries on a fresh
//     connection after timeouts, connection errors, 5xx and 409
//     idempotency_in_progress, up to a limit per order.
//   - Judge turns the ledger, the wire counts and the client's records into a
//     Report whose Failures must be empty.
//
// Run wires them together; the test in this package is the short run CI
// executes, and cmd/chaos runs a long one by hand. README.md says how to
// read the report.
package chaos
