package retry

// Mode says which failures of one request may be retried. The proxy knows
// whether a request is protected by an idempotency key and passes the mode in
// the request's [Call].
type Mode int

const (
	// Once sends the request a single time and returns whatever comes back.
	// It is the zero Mode and the default: without an idempotency key, a
	// resend of a money-moving request could be a second charge.
	Once Mode = iota
	// Safe is for unprotected safe methods (GET, HEAD): network errors and
	// 5xx are retried (docs/retries.md).
	Safe
	// Protected is for requests carrying an idempotency key: network errors,
	// timeouts, Policy.Statuses and 4xx bodies with a Policy.Codes code are
	// retried, always with the same request (docs/retries.md).
	Protected
)

// String returns the mode's name, for logs and metrics.
func (m Mode) String() string {
	switch m {
	case Safe:
		return "safe"
	case Protected:
		return "protected"
	default:
		return "once"
	}
}
