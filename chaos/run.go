package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
)

// stopGrace bounds the proxy's graceful stop at the end of a run; it is above
// the IDEMPROXY_SHUTDOWN_GRACE the suite sets.
const stopGrace = 15 * time.Second

// Run carries out one chaos run: sandbox up, proxy up, the client pays every
// order while the proxy is killed and restarted cfg.Kills times, then the
// proxy stops gracefully, the sandbox stops, and Judge compares. A broken
// promise is a Report with Failures; an error means the run itself could not
// be carried out (the proxy did not restart, ctx ended, ...), and the report,
// when not nil, holds what was seen until then.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	up, err := StartUpstream(sandboxConfig(cfg))
	if err != nil {
		return nil, err
	}
	env, err := up.ProxyEnv()
	if err != nil {
		return nil, errors.Join(err, up.Close())
	}
	var pxs []*Proxy
	for i := range cfg.Replicas {
		px := NewProxy(cfg.Binary, replicaDir(cfg, i), replicaEnv(cfg, env, i))
		pxs = append(pxs, px)
		if err := px.Start(ctx); err != nil {
			for _, p := range pxs {
				p.Kill()
			}
			return nil, errors.Join(err, up.Close())
		}
	}
	cfg.Logf("chaos: sandbox %s at %s, %d idemproxy replicas from %s, %d orders, %d kills", cfg.Provider, up.URL, len(pxs), pxs[0].Addr, cfg.Orders, cfg.Kills)
	rep := &Report{Provider: cfg.Provider, Workers: cfg.Workers, MaxTries: cfg.MaxTries}
	orders, runErr := pay(ctx, cfg, pxs, rep)
	for _, px := range pxs {
		rep.Released += px.Released()
		for k, n := range px.Probes() {
			if rep.Probes == nil {
				rep.Probes = map[string]int{}
			}
			rep.Probes[k] += n
		}
		if err := px.Stop(stopGrace); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	if err := up.Close(); err != nil {
		runErr = errors.Join(runErr, err)
	}
	wire, unattributed := up.Wire()
	rep.Verdict = Judge(up.Ledger(), wire, unattributed, orders)
	return rep, runErr
}

// replicaDir is replica i's data directory: DataDir itself for one replica.
func replicaDir(cfg Config, i int) string {
	if cfg.Replicas == 1 {
		return cfg.DataDir
	}
	return filepath.Join(cfg.DataDir, fmt.Sprintf("r%d", i))
}

// replicaEnv is replica i's environment: the sandbox's settings, the suite's
// timings, the shared store if any, cfg.ProxyEnv, and a static header naming
// the replica, so that the wire counter can tell which replica sent what.
func replicaEnv(cfg Config, sandboxEnv []string, i int) []string {
	env := append(slices.Clone(sandboxEnv), proxyTimings...)
	if cfg.StoreURL != "" {
		env = append(env, "IDEMPROXY_STORE_URL="+cfg.StoreURL, "IDEMPROXY_STORE_LEASE=2s")
	}
	env = append(env, cfg.ProxyEnv...)
	tag := fmt.Sprintf("%s=r%d", replicaHeader, i)
	for j, kv := range env {
		if v, ok := strings.CutPrefix(kv, "IDEMPROXY_STATIC_HEADERS="); ok {
			env[j] = "IDEMPROXY_STATIC_HEADERS=" + v + "," + tag
			return env
		}
	}
	return append(env, "IDEMPROXY_STATIC_HEADERS="+tag)
}

// pay runs the client over every order while a killer goroutine kills and
// restarts replicas at the drawn moments. It owns pxs until it returns.
func pay(ctx context.Context, cfg Config, pxs []*Proxy, rep *Report) ([]Order, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ids, path, body := orderPlan(cfg)
	k := &killer{pxs: pxs, rng: mrand.New(mrand.NewPCG(uint64(cfg.Seed), 0x6b696c6c)), logf: cfg.Logf,
		at: killMoments(cfg), signal: make(chan struct{}, cfg.Kills)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := k.run(ctx); err != nil {
			k.err = err
			cancel() // no proxy to talk to: stop the client
		}
	}()
	var targets []string
	for _, px := range pxs {
		targets = append(targets, "http://"+px.Addr)
	}
	halfway, finished := make(chan struct{}), make(chan struct{})
	var once sync.Once
	if cfg.RestartStore != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-halfway:
			case <-finished:
				return
			}
			cfg.Logf("chaos: restarting the database")
			if err := cfg.RestartStore(); err != nil {
				k.storeErr = fmt.Errorf("chaos: restart the database: %w", err)
				cancel()
				return
			}
			rep.StoreRestarts++
			cfg.Logf("chaos: database back")
		}()
	}
	client := &Client{Target: targets[0], Targets: targets, Path: path, Body: body, Timeout: cfg.ClientTimeout, MaxTries: cfg.MaxTries}
	var done atomic.Int64
	start := time.Now()
	orders := client.PayAll(ctx, ids, cfg.Workers, cfg.Seed, func() {
		n := int(done.Add(1))
		k.progress(n)
		if n >= cfg.Orders/2 {
			once.Do(func() { close(halfway) })
		}
		if n%max(cfg.Orders/10, 1) == 0 {
			cfg.Logf("chaos: %d/%d orders settled", n, cfg.Orders)
		}
	})
	rep.Duration = time.Since(start)
	close(k.signal)
	close(finished)
	wg.Wait()
	rep.Kills, rep.Restarts = k.kills, k.restarts
	if err := errors.Join(k.err, k.storeErr); err != nil {
		return orders, err
	}
	if ctx.Err() != nil {
		return orders, fmt.Errorf("chaos: run interrupted: %w", ctx.Err())
	}
	return orders, nil
}

// killer SIGKILLs the proxy when the client's progress reaches each moment in
// at, after a random pause of up to 200 ms so that the kill lands anywhere in
// the requests then in flight, and restarts it at once.
type killer struct {
	pxs      []*Proxy
	rng      *mrand.Rand
	logf     func(string, ...any)
	at       []int         // settled-order counts that trigger a kill, ascending
	signal   chan struct{} // one value per kill due; closed when the client is done
	kills    int
	restarts []time.Duration
	err      error
	storeErr error // from the database restart
}

// progress is called with the number of settled orders, once per order.
func (k *killer) progress(n int) {
	if _, found := slices.BinarySearch(k.at, n); found {
		k.signal <- struct{}{} // buffered for every kill
	}
}

func (k *killer) run(ctx context.Context) error {
	for range k.signal {
		pause := time.Duration(k.rng.Int64N(int64(200 * time.Millisecond)))
		if err := sleepCtx(ctx, pause); err != nil {
			return nil // the run is ending anyway
		}
		px := k.pxs[k.rng.IntN(len(k.pxs))]
		if err := px.Kill(); err != nil {
			return err
		}
		k.kills++
		start := time.Now()
		if err := px.Start(ctx); err != nil {
			return fmt.Errorf("chaos: restart after SIGKILL %d: %w", k.kills, err)
		}
		k.restarts = append(k.restarts, time.Since(start))
		k.logf("chaos: SIGKILL %d, proxy listening again after %s", k.kills, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// killMoments draws cfg.Kills progress counts between 5% and 90% of the
// orders: one in the middle half of each of Kills equal stretches, so the
// moments are random yet at least half a stretch apart, and every kill finds
// many orders still to go and a proxy that has been up for a while.
func killMoments(cfg Config) []int {
	rng := mrand.New(mrand.NewPCG(uint64(cfg.Seed), 0x6d6f6d))
	lo, hi := cfg.Orders/20, cfg.Orders*9/10
	if cfg.Kills == 0 || hi-lo < 4*cfg.Kills {
		lo, hi = 0, cfg.Orders // too few orders to spread them: anywhere
	}
	seen := map[int]bool{}
	var at []int
	for i := range cfg.Kills {
		seg := (hi - lo) / cfg.Kills
		n := max(lo+i*seg+seg/4+rng.IntN(seg/2+1), 1)
		if !seen[n] && n <= cfg.Orders {
			seen[n] = true
			at = append(at, n)
		}
	}
	slices.Sort(at)
	return at
}

// orderPlan names the orders and gives the route and body the legacy client
// sends for the provider.
func orderPlan(cfg Config) (ids []string, path string, body func(string) []byte) {
	ids = make([]string, cfg.Orders)
	for i := range ids {
		ids[i] = fmt.Sprintf("chaos-%d-%07d", cfg.Seed, i)
	}
	switch cfg.Provider {
	case sandbox.ProviderCards:
		// A card issue carries no id the provider deduplicates by: the cards
		// preset keys it by a fingerprint window. order_id is only the app's
		// own reference, which the provider ignores and the ledger counts by.
		return ids, "/cards", func(id string) []byte {
			return fmt.Appendf(nil, `{"tariff_id":"t-chaos","holder_external_id":%q,"amount":"%d","order_id":%q}`, id, 5+len(id)%40, id)
		}
	case sandbox.ProviderPayouts:
		return ids, "/v1/payout", func(id string) []byte {
			return fmt.Appendf(nil, `{"amount":"%d","currency":"USDT","network":"tron","address":"TXYchaos","order_id":%q}`, 10+len(id)%90, id)
		}
	}
	return ids, "/payments", func(id string) []byte {
		return fmt.Appendf(nil, `{"order_id":%q,"amount":"%d.%02d","currency":"EUR"}`, id, 1+len(id)%50, len(id)%100)
	}
}

// sandboxConfig is the provider for cfg: signatures on with a fresh secret,
// faults as configured, and for payouts the public id and a tenth of the
// orders answering 409 funds_maturing/frozen once.
func sandboxConfig(cfg Config) sandbox.Config {
	sc := sandbox.Config{Provider: cfg.Provider, Secret: newSecret(), Faults: cfg.Faults,
		SlowDelay: cfg.SlowDelay, RetryAfter: cfg.RetryAfter, Seed: cfg.Seed, KeyRetention: cfg.KeyRetention}
	if cfg.Provider == sandbox.ProviderPayouts {
		sc.PublicID = "chaos-public-id"
		sc.MaturingAttempts, sc.MaturingShare = 1, 0.1
	}
	return sc
}

// newSecret returns a random HMAC secret for one run.
func newSecret() []byte {
	var b [24]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return []byte(hex.EncodeToString(b[:]))
}
