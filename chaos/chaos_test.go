package chaos

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

var (
	ordersFlag = flag.Int("chaos.orders", 2000, "orders in TestChaos (the short run; cmd/chaos runs long ones)")
	killsFlag  = flag.Int("chaos.kills", 4, "SIGKILLs in TestChaos")
	seedFlag   = flag.Int64("chaos.seed", 1, "seed of TestChaos")
	binFlag    = flag.String("chaos.binary", "", "idemproxy binary to test; empty = build it from the module root")
)

// binPath is the idemproxy binary built once from the module root, the
// directory above this package's.
var binPath string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "idemproxy-chaos")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		binPath = *binFlag
		var err error
		if binPath == "" {
			var root string
			if root, err = ModuleRoot(".."); err == nil {
				binPath, err = Build(context.Background(), root, dir)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return pgtest.Main(m)
	}()
	os.Exit(code)
}

// TestChaos is the short run CI executes: the real binary between the
// faulty sandbox and the blind legacy client, killed at random moments. Any
// non-zero must-be-zero count fails the build. The payments provider
// deduplicates by key only, so it shows any second charge in its ledger; the
// payouts provider adds its 409 idempotency.in_progress and funds_maturing
// answers, which the proxy must retry under the same key; the cards provider
// keeps keys for ever and its card issues are keyed by a fingerprint window.
func TestChaos(t *testing.T) {
	cases := []struct {
		name, provider string
		orders, kill   int
		env            []string
	}{
		{sandbox.ProviderPayments, sandbox.ProviderPayments, *ordersFlag, *killsFlag, nil},
		{sandbox.ProviderPayouts, sandbox.ProviderPayouts, max(*ordersFlag/4, 1), max(*killsFlag-1, 0), nil},
		{sandbox.ProviderCards, sandbox.ProviderCards, max(*ordersFlag/4, 1), max(*killsFlag-1, 0), nil},
		// The payments provider: "after 504, first GET the payment". The
		// sandbox's 504 after executing names the payment.
		{"payments-with-probe", sandbox.ProviderPayments, max(*ordersFlag/2, 1), max(*killsFlag-1, 0),
			[]string{"IDEMPROXY_STATUS_PROBE=GET /payments/{resp.payment_id}"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			rep, err := Run(ctx, Config{Binary: binPath, DataDir: t.TempDir(), Provider: c.provider,
				Orders: c.orders, Kills: c.kill, Faults: DefaultFaults(), Seed: *seedFlag, Logf: t.Logf, ProxyEnv: c.env})
			if rep != nil {
				t.Logf("report:\n%s", rep)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range rep.Failures() {
				t.Errorf("promise broken: %s", f)
			}
			checkRunHappened(t, rep, min(c.kill, 3))
			if c.env != nil && rep.Probes["found"] == 0 {
				t.Errorf("the status probe saved no re-send (probes %v)", rep.Probes)
			}
		})
	}
}

// checkRunHappened fails a run that did not go through what it claims, so
// that its verdict would prove nothing.
func checkRunHappened(t *testing.T, rep *Report, kills int) {
	t.Helper()
	if rep.Kills < kills {
		t.Errorf("proxy killed %d times, want at least %d", rep.Kills, kills)
	}
	faulted := 0
	for kind, n := range rep.Faults {
		faulted += n
		if n == 0 {
			t.Errorf("no %s fault was injected", kind)
		}
	}
	if faulted*5 < rep.UpstreamTotal { // DefaultFaults is about 30%
		t.Errorf("%d of %d upstream requests faulted, want at least 20%%", faulted, rep.UpstreamTotal)
	}
	if rep.Succeeded == 0 || rep.Executions == 0 {
		t.Errorf("nothing succeeded (%d) or executed (%d)", rep.Succeeded, rep.Executions)
	}
}

// TestChaosCatchesKeyChange is the control experiment: a proxy that gives
// every request a new random key (no key source matches, MISSING_KEY=generate)
// and does not retry itself must be caught charging twice, so a passing
// TestChaos means something.
func TestChaosCatchesKeyChange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Binary: binPath, DataDir: t.TempDir(), Orders: 200, Workers: 16,
		Faults: sandbox.Faults{DropAfterProcessing: 0.3}, Seed: 2,
		ProxyEnv: []string{"IDEMPROXY_KEY_SOURCES=header:X-Chaos-Absent", "IDEMPROXY_MISSING_KEY=generate",
			"IDEMPROXY_RETRY_MAX_ATTEMPTS=1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", rep)
	if rep.DuplicateExecutions == 0 || rep.KeyChanges == 0 {
		t.Errorf("duplicates %d, key changes %d: want both caught", rep.DuplicateExecutions, rep.KeyChanges)
	}
	if len(rep.Failures()) == 0 {
		t.Error("Failures() is empty for a run with second charges")
	}
}

func TestShellUnquote(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain", "plain"},
		{"'json:order_id'", "json:order_id"},
		{`'{timestamp}\n{method}'`, `{timestamp}\n{method}`},
		{`'it'\''s'`, "it's"},
		{"''", ""},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := shellUnquote(c.in)
			if err != nil || got != c.want {
				t.Errorf("shellUnquote(%q) = %q, %v; want %q", c.in, got, err, c.want)
			}
		})
	}
	for _, bad := range []string{"'open", "'a'b"} {
		if got, err := shellUnquote(bad); err == nil {
			t.Errorf("shellUnquote(%q) = %q, want an error", bad, got)
		}
	}
}

func TestUpstreamProxyEnvFillsSecret(t *testing.T) {
	up, err := StartUpstream(sandbox.Config{Provider: sandbox.ProviderPayments, Secret: []byte("s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	env, err := up.ProxyEnv()
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(env, "\n")
	for _, want := range []string{
		"IDEMPROXY_UPSTREAM_URL=" + up.URL,
		"IDEMPROXY_SIGN_SECRET=s3cret",
		"IDEMPROXY_PRESET=payments",
	} {
		if !strings.Contains(joined, want+"\n") && !strings.HasSuffix(joined, want) {
			t.Errorf("ProxyEnv lacks %q:\n%s", want, joined)
		}
	}
}

func TestHistogramQuantile(t *testing.T) {
	h := Histogram{1: 90, 2: 9, 7: 1}
	cases := []struct {
		q    float64
		want int
	}{{0.5, 1}, {0.9, 1}, {0.95, 2}, {0.99, 2}, {1, 7}}
	for _, c := range cases {
		if got := h.Quantile(c.q); got != c.want {
			t.Errorf("Quantile(%v) = %d, want %d", c.q, got, c.want)
		}
	}
	if got := (Histogram{}).Quantile(0.5); got != 0 {
		t.Errorf("empty Quantile = %d, want 0", got)
	}
}

func TestKillMoments(t *testing.T) {
	cases := []struct {
		orders, kills, want, minGap int
	}{
		{2000, 4, 4, 200},
		{50000, 25, 25, 800},
		{2000, 0, 0, 0},
		{10, 3, 3, 1},
		{2, 5, 1, 0}, // more kills than moments: as many as fit
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d orders %d kills", c.orders, c.kills), func(t *testing.T) {
			at := killMoments(Config{Orders: c.orders, Kills: c.kills, Seed: 3})
			if len(at) != c.want {
				t.Fatalf("killMoments = %v, want %d moments", at, c.want)
			}
			for i, n := range at {
				if n < 1 || n > c.orders {
					t.Errorf("moment %d out of 1..%d", n, c.orders)
				}
				if i > 0 && n-at[i-1] < c.minGap {
					t.Errorf("moments %d and %d closer than %d", at[i-1], n, c.minGap)
				}
			}
		})
	}
}
