// Command chaos runs the chaos suite (package chaos) by hand, for runs longer
// than the one CI executes, and prints its report:
//
//	go run ./cmd/chaos -orders 50000
//
// It builds idemproxy from the module it is run in (or runs -binary), starts
// the sandbox provider with about 30% of attempts faulted, and kills the
// proxy with SIGKILL -kills times. Exit status: 0 when every must-be-zero
// count is zero, 1 when one is not, 2 when the run could not be carried out.
// See chaos/README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/chaos"
	"github.com/idemproxy/idemproxy/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command's flags.
type options struct {
	cfg     chaos.Config
	scale   float64
	timeout time.Duration
	quiet   bool
}

// run parses args, carries out one run and prints its report to out;
// progress and errors go to errOut. It returns the exit status.
func run(ctx context.Context, args []string, out, errOut io.Writer) int {
	opt, err := parse(args, errOut)
	if err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, opt.timeout)
	defer cancel()
	tmp, err := os.MkdirTemp("", "idemproxy-chaos")
	if err != nil {
		fmt.Fprintln(errOut, "chaos:", err)
		return 2
	}
	defer os.RemoveAll(tmp)
	if err := prepare(ctx, &opt, tmp, errOut); err != nil {
		fmt.Fprintln(errOut, "chaos:", err)
		return 2
	}
	rep, err := chaos.Run(ctx, opt.cfg)
	if rep != nil {
		_, _ = rep.WriteTo(out) // a failed write to stdout leaves nothing to report to
	}
	switch {
	case err != nil:
		fmt.Fprintln(errOut, "chaos:", err)
		return 2
	case len(rep.Failures()) > 0:
		return 1
	}
	return 0
}

// prepare builds the binary unless -binary was given, picks a data directory
// unless -data was given, and scales the faults.
func prepare(ctx context.Context, opt *options, tmp string, errOut io.Writer) error {
	if !opt.quiet {
		opt.cfg.Logf = func(format string, args ...any) {
			fmt.Fprintf(errOut, "%s "+format+"\n", append([]any{time.Now().Format(time.TimeOnly)}, args...)...)
		}
	}
	if opt.cfg.Binary == "" {
		root, err := chaos.ModuleRoot(".")
		if err != nil {
			return err
		}
		if opt.cfg.Binary, err = chaos.Build(ctx, root, tmp); err != nil {
			return err
		}
	}
	if opt.cfg.DataDir == "" {
		opt.cfg.DataDir = tmp + "/data"
	}
	opt.cfg.Faults = scaled(chaos.DefaultFaults(), opt.scale)
	return nil
}

// scaled multiplies every fault probability by k, capped at 1.
func scaled(f sandbox.Faults, k float64) sandbox.Faults {
	s := func(p float64) float64 { return min(p*k, 1) }
	return sandbox.Faults{DropBeforeProcessing: s(f.DropBeforeProcessing), DropAfterProcessing: s(f.DropAfterProcessing),
		SlowAfterProcessing: s(f.SlowAfterProcessing), GatewayTimeoutAfterProcessing: s(f.GatewayTimeoutAfterProcessing),
		Status5xx:   s(f.Status5xx),
		RateLimited: s(f.RateLimited), Maintenance: s(f.Maintenance)}
}

// parse reads the flags. -kills defaults to one per 2,000 orders, at least 3.
func parse(args []string, errOut io.Writer) (options, error) {
	var opt options
	c := &opt.cfg
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.IntVar(&c.Orders, "orders", 2000, "orders to pay")
	fs.IntVar(&c.Workers, "workers", 32, "orders in flight at once")
	fs.IntVar(&c.Kills, "kills", -1, "SIGKILLs of the proxy; -1 = one per 2,000 orders, at least 3")
	fs.StringVar(&c.Provider, "provider", sandbox.ProviderPayments, "sandbox provider: payments, payouts or cards")
	fs.Int64Var(&c.Seed, "seed", 1, "seed of faults, kill moments and client jitter")
	fs.StringVar(&c.Binary, "binary", "", "idemproxy binary; empty = go build it from the module in the working directory")
	fs.StringVar(&c.DataDir, "data", "", "idemproxy data directory; empty = a fresh temporary one")
	fs.DurationVar(&c.ClientTimeout, "client-timeout", 0, "legacy client's timeout per request; 0 = 700ms")
	fs.IntVar(&c.MaxTries, "max-tries", 0, "legacy client's requests per order; 0 = 20")
	fs.Float64Var(&opt.scale, "fault-scale", 1, "multiplier of the default fault probabilities (1 = about 30% of attempts)")
	fs.DurationVar(&opt.timeout, "timeout", time.Hour, "bound of the whole run")
	fs.BoolVar(&opt.quiet, "q", false, "print the report only, no progress")
	if err := fs.Parse(args); err != nil {
		return opt, err
	}
	if c.Kills < 0 {
		c.Kills = max(3, c.Orders/2000)
	}
	if opt.scale < 0 {
		fmt.Fprintln(errOut, "chaos: -fault-scale must not be negative")
		return opt, flag.ErrHelp
	}
	return opt, nil
}
