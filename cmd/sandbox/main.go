// Command sandbox runs a fake payment provider (cards, payments or payouts)
// with fault injection, for trying idemproxy by hand and for chaos tests.
// Settings come from SANDBOX_* environment variables, overridden by flags;
// see sandbox/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/idemproxy/idemproxy/sandbox"
)

// settings are the environment variables; flags of the same meaning win.
type settings struct {
	Provider         string        `env:"SANDBOX_PROVIDER"`
	Addr             string        `env:"SANDBOX_ADDR" envDefault:"127.0.0.1:8081"`
	Secret           string        `env:"SANDBOX_SECRET"`
	SecretFile       string        `env:"SANDBOX_SECRET_FILE,file"` // a path; the file holds the secret (container secrets)
	PublicID         string        `env:"SANDBOX_PUBLIC_ID"`
	Seed             int64         `env:"SANDBOX_SEED"`
	RateLimit        float64       `env:"SANDBOX_RATE_LIMIT"`
	RateBurst        int           `env:"SANDBOX_RATE_BURST"`
	RetryAfter       int           `env:"SANDBOX_RETRY_AFTER"`
	SlowDelay        time.Duration `env:"SANDBOX_SLOW_DELAY"`
	MaturingAttempts int           `env:"SANDBOX_MATURING_ATTEMPTS"`
	MaturingShare    float64       `env:"SANDBOX_MATURING_SHARE"`
	Balance          float64       `env:"SANDBOX_BALANCE"`
	DropBefore       float64       `env:"SANDBOX_FAULT_DROP_BEFORE"`
	DropAfter        float64       `env:"SANDBOX_FAULT_DROP_AFTER"`
	Slow             float64       `env:"SANDBOX_FAULT_SLOW"`
	Timeout504       float64       `env:"SANDBOX_FAULT_504_AFTER"`
	KeyRetention     time.Duration `env:"SANDBOX_KEY_RETENTION"`
	Status5xx        float64       `env:"SANDBOX_FAULT_5XX"`
	RateLimited      float64       `env:"SANDBOX_FAULT_429"`
	Maintenance      float64       `env:"SANDBOX_FAULT_MAINTENANCE"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
}

// run parses the settings, serves until ctx ends, then shuts down.
func run(ctx context.Context, args []string, out io.Writer) error {
	st, err := parse(args)
	if err != nil {
		return err
	}
	cfg := sandbox.Config{Provider: st.Provider, Secret: []byte(st.Secret), PublicID: st.PublicID,
		Seed: st.Seed, RateLimit: st.RateLimit, RateBurst: st.RateBurst, RetryAfter: st.RetryAfter,
		SlowDelay: st.SlowDelay, MaturingAttempts: st.MaturingAttempts, MaturingShare: st.MaturingShare,
		Balance: st.Balance, KeyRetention: st.KeyRetention, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
		Faults: sandbox.Faults{DropBeforeProcessing: st.DropBefore, DropAfterProcessing: st.DropAfter,
			SlowAfterProcessing: st.Slow, GatewayTimeoutAfterProcessing: st.Timeout504, Status5xx: st.Status5xx, RateLimited: st.RateLimited, Maintenance: st.Maintenance}}
	handler, err := sandbox.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", st.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", st.Addr, err)
	}
	url := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "sandbox %s listening on %s (ledger: %s/_sandbox/ledger)\nidemproxy settings:\n", st.Provider, url, url)
	for _, line := range sandbox.ProxyEnv(cfg, url) {
		fmt.Fprintln(out, "  export "+line)
	}
	return serve(ctx, ln, handler)
}

// serve runs an http.Server on ln until ctx ends, then shuts it down,
// cutting requests still held by a slow fault after a few seconds.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close() // slow responses are still held; cut them
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// parse reads SANDBOX_* variables, then lets flags override them.
func parse(args []string) (settings, error) {
	st, err := env.ParseAs[settings]()
	if err != nil {
		return st, fmt.Errorf("environment: %w", err)
	}
	fs := flag.NewFlagSet("sandbox", flag.ContinueOnError)
	fs.StringVar(&st.Provider, "provider", st.Provider, "cards, payments or payouts (SANDBOX_PROVIDER)")
	fs.StringVar(&st.Addr, "addr", st.Addr, "listen address (SANDBOX_ADDR)")
	fs.StringVar(&st.Secret, "secret", st.Secret, "HMAC secret; empty = no signature checks; prefer SANDBOX_SECRET")
	fs.StringVar(&st.PublicID, "public-id", st.PublicID, "payouts: required X-Public-Id (SANDBOX_PUBLIC_ID)")
	fs.Int64Var(&st.Seed, "seed", st.Seed, "random seed (SANDBOX_SEED)")
	fs.Float64Var(&st.RateLimit, "rate-limit", st.RateLimit, "own rate limit, requests/s; 0 = off (SANDBOX_RATE_LIMIT)")
	fs.IntVar(&st.RateBurst, "rate-burst", st.RateBurst, "own rate limit burst; 0 = 1 (SANDBOX_RATE_BURST)")
	fs.IntVar(&st.RetryAfter, "retry-after", st.RetryAfter, "Retry-After seconds on 429; 0 = 60 (SANDBOX_RETRY_AFTER)")
	fs.DurationVar(&st.SlowDelay, "slow-delay", st.SlowDelay, "delay of the slow fault; 0 = 35s (SANDBOX_SLOW_DELAY)")
	fs.IntVar(&st.MaturingAttempts, "maturing-attempts", st.MaturingAttempts, "payouts: 409 funds_maturing/frozen attempts per order (SANDBOX_MATURING_ATTEMPTS)")
	fs.Float64Var(&st.MaturingShare, "maturing-share", st.MaturingShare, "payouts: share of orders that mature; 0 = all (SANDBOX_MATURING_SHARE)")
	fs.Float64Var(&st.Balance, "balance", st.Balance, "payouts: largest payout amount; cards: account funds for holds; 0 = unlimited (SANDBOX_BALANCE)")
	fs.Float64Var(&st.DropBefore, "fault-drop-before", st.DropBefore, "P(drop connection before processing) (SANDBOX_FAULT_DROP_BEFORE)")
	fs.Float64Var(&st.DropAfter, "fault-drop-after", st.DropAfter, "P(execute, then drop connection) (SANDBOX_FAULT_DROP_AFTER)")
	fs.Float64Var(&st.Slow, "fault-slow", st.Slow, "P(execute, then answer after -slow-delay) (SANDBOX_FAULT_SLOW)")
	fs.Float64Var(&st.Timeout504, "fault-504-after", st.Timeout504, "P(execute, then 504 gateway_timeout) (SANDBOX_FAULT_504_AFTER)")
	fs.DurationVar(&st.KeyRetention, "key-retention", st.KeyRetention, "payments: how long a key is remembered; 0 = forever (SANDBOX_KEY_RETENTION)")
	fs.Float64Var(&st.Status5xx, "fault-5xx", st.Status5xx, "P(500/502/503/504 without executing) (SANDBOX_FAULT_5XX)")
	fs.Float64Var(&st.RateLimited, "fault-429", st.RateLimited, "P(429 without executing) (SANDBOX_FAULT_429)")
	fs.Float64Var(&st.Maintenance, "fault-maintenance", st.Maintenance, "P(503 maintenance without executing) (SANDBOX_FAULT_MAINTENANCE)")
	if err := fs.Parse(args); err != nil {
		return st, err
	}
	if st.Secret == "" {
		st.Secret = strings.TrimRight(st.SecretFile, "\r\n")
	}
	return st, nil
}
