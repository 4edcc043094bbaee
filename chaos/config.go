package chaos

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
)

// Config is one chaos run. Binary and DataDir are required; every other zero
// value takes the default its comment states.
type Config struct {
	// Binary is the idemproxy executable (see Build). Required.
	Binary string
	// DataDir is idemproxy's Badger directory, kept across every restart.
	// Required; it should start empty.
	DataDir string

	// Provider is the sandbox provider: "payments", "payouts" or "cards".
	// Empty means "payments", the stricter one: it deduplicates by
	// Idempotency-Key only, so any change of key for an order shows as a
	// second execution. The payouts provider also deduplicates by order_id,
	// which would hide such a change from the ledger (the wire counter still
	// sees it). The cards client issues one card per order; its preset keys
	// card issues by a fingerprint window, not by any field.
	Provider string

	// Orders is how many distinct orders the client pays. Zero means 2000.
	Orders int
	// Workers is how many orders the client has in flight at once. Zero
	// means 32.
	Workers int
	// Kills is how many times the proxy is killed with SIGKILL during the
	// run, at random moments. Zero means none.
	Kills int

	// Faults are the sandbox's per-attempt fault probabilities. The zero
	// value means no faults; DefaultFaults is about 30% of attempts.
	Faults sandbox.Faults
	// SlowDelay is how long the sandbox's slow fault holds an answer. Zero
	// means 1 s, longer than the proxy's attempt timeout below.
	SlowDelay time.Duration
	// RetryAfter is the sandbox's Retry-After on 429, in seconds. Zero means 1.
	RetryAfter int

	// ClientTimeout bounds one client request. Zero means 700 ms: above one
	// slow attempt, below a sequence that meets several, so the client does
	// time out and retry while its operation is still running in the proxy.
	ClientTimeout time.Duration
	// MaxTries is how many requests the client sends for one order before it
	// gives up, the first included. Zero means 20.
	MaxTries int

	// Replicas is how many idemproxy processes serve the client, which sends
	// each try to one of them at random; kills hit a random one. Zero means 1.
	// With StoreURL they share that database; without, each has its own
	// Badger directory under DataDir, which is unsafe (the control run).
	Replicas int
	// StoreURL is the PostgreSQL database the replicas share; empty means
	// Badger. Its runs use 2 s leases, so a killed replica's keys are
	// resumed within the client's tries.
	StoreURL string
	// RestartStore, when set, is called once when half the orders are
	// settled: it restarts the database under the running replicas.
	RestartStore func() error
	// KeyRetention is the sandbox's; a tiny one makes a provider that does
	// not deduplicate, for the control run. Zero means forever.
	KeyRetention time.Duration

	// ProxyEnv are extra NAME=value settings for idemproxy, applied after the
	// suite's own (so they override them). Nil means none.
	ProxyEnv []string

	// Seed drives the sandbox's faults, the kill moments and the client's
	// jitter. Runs with one seed are alike but not identical: timing differs.
	Seed int64

	// Logf, when set, receives progress lines (start, kills, restarts). Nil
	// means silent.
	Logf func(format string, args ...any)
}

// DefaultFaults fault about a third of upstream attempts: 20% before
// processing (nothing happens at the provider) and 13% after it (the
// provider executed, the proxy never learns it in time, or learns only that
// a gateway timed out).
func DefaultFaults() sandbox.Faults {
	return sandbox.Faults{
		DropBeforeProcessing:          0.06,
		Maintenance:                   0.05,
		RateLimited:                   0.02,
		Status5xx:                     0.09,
		DropAfterProcessing:           0.05,
		SlowAfterProcessing:           0.07,
		GatewayTimeoutAfterProcessing: 0.04,
	}
}

// Proxy timings: small, so that a run exercises every retry path in seconds.
// The attempt timeout is below the sandbox's slow delay, so a slow answer is a
// timed-out attempt whose operation did execute; the budget is below the
// client's timeout, so the client usually gets the proxy's own verdict.
var proxyTimings = []string{
	"IDEMPROXY_ATTEMPT_TIMEOUT=300ms",
	"IDEMPROXY_RETRY_BASE_DELAY=10ms",
	"IDEMPROXY_RETRY_MAX_DELAY=200ms",
	"IDEMPROXY_RETRY_MAX_ATTEMPTS=5",
	"IDEMPROXY_RETRY_BUDGET=3s",
	"IDEMPROXY_INFLIGHT_WAIT=500ms",
	"IDEMPROXY_SHUTDOWN_GRACE=5s",
	"IDEMPROXY_LOG_LEVEL=info",
}

// withDefaults fills the zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.Binary == "" || c.DataDir == "" {
		return c, errors.New("chaos: Config.Binary and Config.DataDir are required")
	}
	c.Provider = orDefault(c.Provider, sandbox.ProviderPayments)
	switch c.Provider {
	case sandbox.ProviderPayments, sandbox.ProviderPayouts, sandbox.ProviderCards:
	default:
		return c, fmt.Errorf("chaos: Config.Provider %q: want payments, payouts or cards", c.Provider)
	}
	c.Orders = orDefault(c.Orders, 2000)
	c.Workers = orDefault(c.Workers, 32)
	c.SlowDelay = orDefault(c.SlowDelay, time.Second)
	c.RetryAfter = orDefault(c.RetryAfter, 1)
	c.ClientTimeout = orDefault(c.ClientTimeout, 700*time.Millisecond)
	c.MaxTries = orDefault(c.MaxTries, 20)
	c.Replicas = orDefault(c.Replicas, 1)
	if c.Orders < 0 || c.Workers < 0 || c.Kills < 0 || c.MaxTries < 0 {
		return c, errors.New("chaos: Orders, Workers, Kills and MaxTries must not be negative")
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c, nil
}

// orDefault returns v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
