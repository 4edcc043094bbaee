// Command idemproxy is a reverse proxy that makes a legacy app's money-moving
// requests to a payment provider safe to repeat. Configuration is environment
// variables only (SPEC.md); see README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/ratelimit"
	"github.com/idemproxy/idemproxy/resign"
	"github.com/idemproxy/idemproxy/retry"
)

func main() {
	cfg, set, err := loadConfig(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemproxy: configuration:", err)
		os.Exit(2)
	}
	level, _ := parseLevel(cfg.LogLevel)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, set, log, nil); err != nil {
		log.Error("idemproxy stopped", "err", err)
		os.Exit(1)
	}
}

// listeners reports where run listens, once both listeners are open.
type listeners struct{ Proxy, Admin net.Addr }

// run serves until ctx ends, then shuts down gracefully. ready, if non-nil, is
// called once the listeners are open (end-to-end tests use ":0").
func run(ctx context.Context, cfg config, set settings, log *slog.Logger, ready func(listeners)) error {
	store, err := cache.Open(cache.Options{
		Dir:        cfg.DataDir,
		SyncWrites: true,
		TTL:        cfg.RecordTTL,
		Logger:     log,
	})
	if err != nil {
		return fmt.Errorf("open data directory %s: %w", cfg.DataDir, err)
	}
	defer store.Close()
	// One process owns a Badger directory, so every in-flight record here was left
	// by a crash: release them so the first retry resumes at once with the same key.
	n, err := store.ReleaseInFlight()
	if err != nil {
		return fmt.Errorf("release in-flight records: %w", err)
	}
	log.Info("released in-flight records left by a previous process", "count", n)

	handler, err := proxy.New(proxy.Options{
		Upstream:     set.upstream,
		Transport:    upstreamTransport(cfg, set),
		Store:        store,
		Protected:    set.protected,
		KeySources:   set.sources,
		MissingKey:   set.missingKey,
		MaxBodyBytes: cfg.MaxBodyBytes,
		InflightWait: cfg.InflightWait,
		Lease:        cfg.RetryBudget + cfg.AttemptTimeout + time.Minute,
		Logger:       log,
	})
	if err != nil {
		return err
	}
	return serve(ctx, cfg, handler, store, log, ready)
}

// upstreamTransport builds the attempt chain: retry loop → signer → one wire
// attempt per RoundTrip → a pooled transport.
func upstreamTransport(cfg config, set settings) http.RoundTripper {
	wire := &http.Transport{
		DialContext:       (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2: true,
		// The default keeps 2 idle connections per host, which collapses throughput
		// to a single upstream under concurrency.
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	signer, err := resign.New(set.sign, &retry.OneShot{Next: wire})
	if err != nil {
		panic(err) // set.sign was validated by loadConfig
	}
	return &retry.Transport{
		Next:   signer,
		Policy: set.policy,
		Gate:   ratelimit.New(cfg.RateLimit, cfg.RateBurst),
	}
}

// serve runs the proxy and admin listeners until ctx ends, then drains: readiness
// turns false, listeners stop accepting, in-flight operations finish and are stored
// (bounded by the grace period), and the store is closed by the caller.
func serve(ctx context.Context, cfg config, h *proxy.Handler, store *cache.Store, log *slog.Logger, ready func(listeners)) error {
	pl, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.ListenAddr, err)
	}
	al, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		pl.Close()
		return fmt.Errorf("listen %s: %w", cfg.AdminAddr, err)
	}
	adm := newAdmin(store)
	ps := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	as := &http.Server{Handler: adm, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- ps.Serve(pl) }()
	go func() { errc <- as.Serve(al) }()
	log.Info("idemproxy listening", "proxy", pl.Addr().String(), "admin", al.Addr().String(), "upstream", cfg.UpstreamURL)
	if ready != nil {
		ready(listeners{Proxy: pl.Addr(), Admin: al.Addr()})
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	}
	return shutdown(cfg.ShutdownGrace, ps, as, h, adm, log)
}

func shutdown(grace time.Duration, ps, as *http.Server, h *proxy.Handler, adm *admin, log *slog.Logger) error {
	adm.draining.Store(true)
	log.Info("shutting down", "grace", grace.String())
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := ps.Shutdown(ctx)
	if derr := h.Drain(ctx); derr != nil {
		err = errors.Join(err, derr)
	}
	as.Close()
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("shutdown complete")
	return nil
}
