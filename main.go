// Command idemproxy is a reverse proxy that makes a legacy app's money-moving
// requests to a payment provider safe to repeat. Configuration is environment
// variables only; see README.md and docs/contract.md.
//
// Usage:
//
//	idemproxy              serve (proxy and admin listeners) until SIGTERM, SIGINT or SIGHUP
//	idemproxy healthcheck  exit 0 if the idemproxy on IDEMPROXY_ADMIN_ADDR is ready, else 1
//	idemproxy version      print the version stamped at build time (also --version, -v)
//	idemproxy records get KEY [--client C] [--body] [--json]
//	idemproxy records list --state in_flight|unknown|needs_review [--limit N] [--cursor C] [--json]
//	idemproxy records resolve KEY --outcome not_executed|executed [--status N --body B] [--client C] [--json]
//	idemproxy records reviewed KEY [--client C] [--json]
//	idemproxy records discard KEY [--client C] [--json]
//	idemproxy orders get|renew --method POST --path /cards --value F-1 [--client C] [--json]
//	                       operator commands, through a running instance's admin API
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/metrics"
	"github.com/idemproxy/idemproxy/pgstore"
	"github.com/idemproxy/idemproxy/probe"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/ratelimit"
	"github.com/idemproxy/idemproxy/upstream"
)

// version is stamped at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	os.Exit(command(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// command runs the subcommand named by args[0] (none: serve) and returns the
// exit status: 0 done, 1 failed, 2 bad usage or configuration.
func command(args, environ []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return serveFromEnv(environ, stderr)
	}
	switch args[0] {
	case "healthcheck":
		return healthcheck(environ, stderr)
	case "version", "--version", "-version", "-v":
		fmt.Fprintln(stdout, version)
		return 0
	case "records":
		return records(args[1:], environ, stdout, stderr)
	case "orders":
		return orders(args[1:], environ, stdout, stderr)
	}
	if isHelp(args[0]) {
		fmt.Fprint(stdout, usage)
		printVariables(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "idemproxy: unknown command %q\n%s", args[0], usage)
	return 2
}

// usage is what `idemproxy --help` prints.
const usage = `usage:
  idemproxy              serve (proxy and admin listeners) until SIGTERM, SIGINT or SIGHUP;
                         configured by IDEMPROXY_* environment variables (see README.md)
  idemproxy healthcheck  exit 0 if the idemproxy on IDEMPROXY_ADMIN_ADDR is ready, else 1
  idemproxy version      print the version stamped at build time (also --version, -v)
  ` + recordsGetUsage + `
  ` + recordsListUsage + `
  ` + recordsResolveUsage + `
  ` + recordsReviewedUsage + `
  ` + recordsDiscardUsage + `
  ` + ordersUsage + `

The records and orders commands call a running instance's admin API: its address
from --admin or IDEMPROXY_ADMIN_ADDR, its token from IDEMPROXY_ADMIN_TOKEN or
IDEMPROXY_ADMIN_TOKEN_FILE. Their output is for people; --json prints the API's answer.
Exit status: 0 done, 1 failed (the API refused, or could not be reached), 2 bad usage.
`

// printVariables prints every configuration variable with its default and
// meaning, from config's tags (as the README's table), for --help.
func printVariables(w io.Writer) {
	fmt.Fprint(w, `
Configuration is environment variables only; a bad value stops the start with
exit status 2 and a message naming the variable. <NAME>_FILE reads a secret
from a file.

`)
	for _, v := range configVars() {
		def, ok := v.tag.Lookup("envDefault")
		switch {
		case strings.Contains(v.opts, "required"):
			def = "required"
		case !ok:
			def = "default empty"
		default:
			def = "default " + def
		}
		fmt.Fprintf(w, "%s (%s)\n    %s\n", v.name, def, v.tag.Get("doc"))
	}
}

// serveFromEnv loads the configuration and serves until SIGTERM, SIGINT or
// SIGHUP. A second signal during the drain stops the process at once: what
// was in flight is released at the next start.
func serveFromEnv(environ []string, stderr io.Writer) int {
	cfg, set, err := loadConfig(environ)
	if err != nil {
		// The misspelt names first: the variable the error names (a required
		// one "not set") may be one of them, set under another name. The
		// error is a JSON log line like every other (README, Logs), so that a
		// log pipeline reads it at its level.
		log := newLogger(stderr, "info", nil)
		warnUnknownVariables(environ, log)
		log.Error("idemproxy not started: bad configuration", "err", err.Error())
		return 2
	}
	ownerOnlyFiles()
	log := newLogger(stderr, cfg.LogLevel, set.secrets())
	// net/http's transport writes some warnings through the standard
	// logger, as plain text among the JSON lines: an upstream connection
	// that sent bytes no request asked for (a provider answering a 204 or
	// a HEAD with a body) gave "2026/12/04 12:31:07 Unsolicited response
	// received on idle HTTP channel ...", which a log pipeline reading
	// JSON lines drops or chokes on. They are WARN lines like every other.
	stdlog.SetFlags(0)
	stdlog.SetOutput(slog.NewLogLogger(log.Handler(), slog.LevelWarn).Writer())
	warnUnknownVariables(environ, log)
	warnIneffective(cfg, environ, log)
	warnShortAdminToken(set.adminToken, log)
	warnOpenAdmin(cfg.AdminAddr, set.adminToken, log)
	warnUnboundSignature(set.sign, log)
	warnPresetCredentials(cfg, set, log)
	warnPresetCleared(cfg, environ, log)
	warnSlowRate(cfg, log)
	warnProxyVariables(environ, log)
	setMemoryLimit(environ, cgroupLimitFiles, log)
	setGCPercent(environ, set.storeURL != "", log)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sigs := make(chan os.Signal, 2)
	// SIGHUP too (docker kill -s HUP, a closed terminal): left to Go's default
	// it ended the process at once, as PID 1 with exit status 2 and no log
	// line, cutting what was in flight. There is nothing to reload: it drains.
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go stopOnSignals(sigs, stop, log, ctx.Done(), inFlightCut(set.storeURL != ""))
	if err := run(ctx, cfg, set, log, nil); err != nil {
		if errors.Is(err, errStoppedDuringStart) {
			log.Info("stopped during the start by a signal: nothing was served", "err", err.Error())
			return 0
		}
		log.Error("idemproxy stopped", "err", err)
		return 1
	}
	return 0
}

// errStoppedDuringStart is run's error when a signal came while the store
// was opening (PostgreSQL not answering, its schema's lock held): the start
// stops at once, before any request was served, and the process exits 0.
var errStoppedDuringStart = errors.New("stopped during the start")

// stopOnSignals cancels serving (stop) at the first signal on sigs, and ends
// the process with exit status 1 at the second, during the drain. The second
// is handled here, not left to the default action: as PID 1 in a container a
// signal with the default action is ignored by the kernel, and Go's runtime
// then exits with status 2, which says "bad configuration", with no log line.
// Ending at once keeps the guarantee of a SIGKILL: what was in flight is
// released at the next start (Badger) or resumed once its lease runs out
// (PostgreSQL); cut says which, in the log line.
func stopOnSignals(sigs <-chan os.Signal, stop func(), log *slog.Logger, served <-chan struct{}, cut string) {
	select {
	case <-sigs:
		stop()
	case <-served:
		return
	}
	s := <-sigs
	log.Warn("second signal during the drain: stopping at once; operations still in flight "+cut,
		"signal", s.String())
	os.Exit(1)
}

// inFlightCut says what becomes of the operations a process ends with in
// flight (a second signal, as a SIGKILL would).
func inFlightCut(shared bool) string {
	if shared {
		return "keep their records until their lease runs out: the app's retry with the same key, on any replica, then resumes them, and one left unretried is parked as unknown by a sweep a minute after its lease"
	}
	return "are released at the next start and resumed by the app's retry with the same key"
}

// listeners reports where run listens, once both listeners are open.
type listeners struct{ Proxy, Admin net.Addr }

// run serves until ctx ends, then shuts down gracefully. ready, if non-nil, is
// called once the listeners are open (end-to-end tests use ":0").
func run(ctx context.Context, cfg config, set settings, log *slog.Logger, ready func(listeners)) (err error) {
	m := metrics.New(version)
	lim := processLimits(cfg) // before the store opens its files
	st, lease, err := openStore(ctx, cfg, set, m, log)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return fmt.Errorf("%w: %w", errStoppedDuringStart, err)
		}
		return err
	}
	// The grace's end, once a shutdown began: the store's close must end by
	// it too (closeReserve).
	var graceEnd time.Time
	defer func() { err = errors.Join(err, closeStore(st, log, graceEnd)) }()
	log.Info("limits", "max_inflight", lim.maxInflight, "max_inflight_bytes", lim.maxInflightBytes,
		"max_body_bytes", cfg.MaxBodyBytes, "open_files_limit", lim.nofile,
		"client_connections", lim.clientConns, "upstream_connections", lim.upstreamConns)
	if container, _ := cgroupMemoryLimit(cgroupLimitFiles); bodyTooLargeForContainer(cfg.MaxBodyBytes, container) {
		log.Warn("setting may not fit the container's memory", "variable", envPrefix+"MAX_BODY_BYTES",
			"max_body_bytes", cfg.MaxBodyBytes, "container_memory_limit", container,
			"why", "a body near the cap is held with up to two more copies while its key and fingerprint are read: "+
				"one such request may get the process killed for lack of memory; lower the cap or raise the limit")
	}
	log.Info("protection", "preset", cfg.Preset, "routes", set.routes.String(), "key_settings", keySettings(set),
		"inprogress_status", cfg.InProgressStatus, "inprogress_code", cfg.InProgressCode)
	obs := &observer{log: log, m: m}
	instrumented := m.Store(st)
	m.UnknownOperations(countUnknown(st, log, time.Now, unknownScanBound(st)), time.Now)
	gate := ratelimit.New(cfg.RateLimit, cfg.RateBurst)
	var settle func(context.Context) error
	if ps, ok := st.(*pgstore.Store); ok {
		// Closed by the store's close, within the grace's end: on a hung
		// database its last statement would wait on its own.
		shareThrottle(ps, gate, set, log)
		settle = ps.Settle
	}
	chain := upstream.Config{
		Sign:   set.sign,
		Policy: set.policy,
		Gate:   gate,
		// An answer the store cannot hold could never be replayed: refuse it
		// at the attempt instead of after the fact.
		MaxResponseBytes: st.MaxBodyBytes(),
		OnAttempt:        obs.attempt,
		OnProbe:          obs.probe,
		KeyRetention:     cfg.ProviderKeyRetention,
		MaxConns:         lim.upstreamConns,
	}
	if set.probe != nil {
		chain.Prober = &probe.Lookup{Template: set.probe, Base: set.upstream, For: set.probeFor, NotFoundCodes: set.notFound}
	}
	attempts, err := upstream.New(chain)
	if err != nil {
		return err
	}
	handler, err := proxy.New(proxy.Options{
		Upstream:         set.upstream,
		Transport:        attempts,
		Store:            instrumented,
		Clients:          set.clients,
		KeySecret:        set.keySecret,
		OwnedHeaders:     set.sign.Headers(),
		Protected:        set.protected,
		KeySources:       set.sources,
		MissingKey:       set.missingKey,
		Routes:           set.routes,
		MaxBodyBytes:     cfg.MaxBodyBytes,
		MaxInflight:      lim.maxInflight,
		MaxInflightBytes: lim.maxInflightBytes,
		SignsBody:        set.sign.SignsBody(),
		InflightWait:     cfg.InflightWait,
		InProgressStatus: cfg.InProgressStatus,
		InProgressCode:   cfg.InProgressCode,
		Lease:            lease,
		Logger:           log,
		OnDone:           obs.done,
	})
	if err != nil {
		return err
	}
	adm := newAdmin(instrumented, m.Handler(), log)
	adm.api = adminapi.New(adminapi.Options{Store: instrumented, Token: set.adminToken,
		DefaultTenant: proxy.DefaultTenant, Clients: set.clients.Names(), OrderKeys: handler.OrderKeys, Logger: auditLogger(log)})
	return serve(ctx, cfg, lim.clientConns, app{proxy: obs.wrap(handler), drain: handler.Drain, settle: settle, stopWaits: gate.Close, cutReads: handler.CutBodyReads,
		answerRunning: handler.AnswerRunning, graceEnd: &graceEnd,
		admin: adm, connMetrics: m.ClientConnections}, log, ready)
}

// app is what serve runs: the proxy handler (wrapped for logs and metrics), the
// proxy's drain of detached operations, and the admin handler.
type app struct {
	proxy http.Handler
	drain func(context.Context) error
	// settle, if set, redoes the store writes that failed during the drain
	// and wait to be redone (PostgreSQL's deferred parks and releases), so
	// that they are done before the store closes.
	settle func(context.Context) error
	// stopWaits refuses the attempts still queued at the outbound gate (behind
	// a provider's pause), and those past it still waiting for a connection
	// to the provider: they were never sent and get a 503 at once.
	stopWaits func()
	// cutReads ends the reads of request bodies still arriving: those
	// requests get a 503 at once, instead of holding the drain for the
	// server's read timeout. Bodies streamed upstream as they arrive
	// (unprotected) are cut once they stop arriving for a moment, or at
	// streamEnd at the latest.
	cutReads func(streamEnd time.Time)
	// answerRunning answers the requests still waiting for an operation in
	// flight, shortly before the grace ends (the operations go on).
	answerRunning func()
	// graceEnd, if set, is given the end of the shutdown grace when the
	// shutdown begins, for the store's close after serve returns.
	graceEnd *time.Time
	admin    *admin
	// connMetrics, if set, exports the client connection bound (limit,
	// open, closed idle).
	connMetrics func(limit int, open, closedIdle func() int64)
}

// serve runs the proxy and admin listeners until ctx ends, then drains (see
// shutdown); the caller closes the store after, by the grace's end.
//
// conns bounds the client connections (0: no bound, see connLimiter).
// adminReadTimeout bounds reading one admin request whole, body included:
// its bodies are small JSON, and a client that stops sending one does not
// hold a connection, and a file descriptor the proxy shares, for ever.
const adminReadTimeout = 15 * time.Second

func serve(ctx context.Context, cfg config, conns int, a app, log *slog.Logger, ready func(listeners)) error {
	pl, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return listenError("LISTEN_ADDR", cfg.ListenAddr, err)
	}
	al, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		pl.Close()
		return listenError("ADMIN_ADDR", cfg.AdminAddr, err)
	}
	ps, pl, cl := proxyServer(pl, a.proxy, conns, writeStall, log)
	// "OPTIONS *" reaches the admin handler, which answers it as any path it
	// does not serve (404 not_found, JSON, with its header); net/http
	// otherwise answers it itself, 200 with neither.
	as := &http.Server{Handler: a.admin, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: adminReadTimeout, IdleTimeout: time.Minute,
		DisableGeneralOptionsHandler: true}
	if cl != nil && a.connMetrics != nil {
		a.connMetrics(conns, cl.Open, cl.ClosedIdle)
	}
	errc := make(chan error, 2)
	go func() { errc <- ps.Serve(&loggedListener{Listener: pl, log: log}) }()
	go func() { errc <- as.Serve(al) }()
	log.Info("idemproxy listening", "proxy", pl.Addr().String(), "admin", al.Addr().String(),
		"upstream", cfg.UpstreamURL, "version", version)
	if ready != nil {
		ready(listeners{Proxy: pl.Addr(), Admin: al.Addr()})
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		ps.Close()
		as.Close()
		return fmt.Errorf("serve: %w", err)
	}
	return shutdown(cfg.ShutdownGrace, ps, as, a, log)
}

// proxyServer returns the proxy port's server for handler and the listener,
// wrapping l, to serve it on. conns bounds the client connections (0: no
// bound, see connLimiter); the limiter is returned, or nil. Each write to a
// client may wait stall for the client to read (stallConn; 0: no bound).
// net/http's own refusals are answered in idemproxy's error format
// (answerRefusalsInJSON).
func proxyServer(l net.Listener, handler http.Handler, conns int, stall time.Duration, log *slog.Logger) (*http.Server, net.Listener, *connLimiter) {
	ps := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// "OPTIONS *" reaches the handler, which refuses a request target
		// not starting with "/" (400 bad_request); net/http otherwise
		// answers it itself, 200 with no body.
		DisableGeneralOptionsHandler: true,
	}
	if stall > 0 {
		l = stallListener{l, stall}
	}
	var cl *connLimiter
	if conns > 0 {
		cl = newConnLimiter(l, conns)
		ps.ConnState = cl.ConnState
		l = cl
	}
	return ps, answerRefusalsInJSON(ps, l), cl
}

// shutdown drains within grace, less closeReserve: readiness turns false
// first, then the proxy listener closes, requests being served finish, and
// detached operations whose clients left finish and are stored. What the
// drain could not write while the database did not answer (an unstored
// answer's park as unknown) is redone once it answers, before the caller
// closes the store: closed, the store would drop it. Operations still
// running when the drain ends stay in flight and are released at the next
// start (Badger) or parked by another replica's sweep (PostgreSQL). The
// caller closes the store in the rest of the grace (a.graceEnd).
func shutdown(grace time.Duration, ps, as *http.Server, a app, log *slog.Logger) error {
	a.admin.draining.Store(true)
	log.Info("shutting down: not ready, draining", "grace", grace.String())
	end := time.Now().Add(grace)
	if a.graceEnd != nil {
		*a.graceEnd = end
	}
	ctx, cancel := context.WithDeadline(context.Background(), end.Add(-closeReserve(grace)))
	defer cancel()
	if a.stopWaits != nil {
		a.stopWaits()
	}
	if a.cutReads != nil {
		a.cutReads(time.Now().Add(grace - streamMargin(grace)))
	}
	if a.answerRunning != nil {
		// Answered before the grace ends, while their connections are
		// still open: cut when the process exits, they had no answer.
		t := time.AfterFunc(grace-streamMargin(grace), a.answerRunning)
		defer t.Stop()
	}
	err := ps.Shutdown(ctx)
	if derr := a.drain(ctx); derr != nil {
		err = errors.Join(err, derr)
	}
	if a.settle != nil {
		if serr := a.settle(ctx); serr != nil {
			err = errors.Join(err, serr)
		}
	}
	as.Close()
	if err != nil {
		return fmt.Errorf("shutdown after %s grace: %w", grace, err)
	}
	log.Info("shutdown complete: in-flight operations finished and stored")
	return nil
}

// closeReserve is the end of the grace kept for the store's close: the drain
// ends before it, so that the close (a hung database's connections cut, a
// Badger that cannot flush left behind) ends by the grace's end and the
// process exits within the grace. An eighth of it, at most a second: less
// than streamMargin, so that the clients still waiting are answered first.
func closeReserve(grace time.Duration) time.Duration {
	return min(grace/8, time.Second)
}

// streamMargin is how long before the grace ends a body still streaming
// upstream is cut: time for its 503 and the rest of the shutdown. A quarter
// of the grace, at most 5 s (25 s into the default 30 s).
func streamMargin(grace time.Duration) time.Duration {
	return min(grace/4, 5*time.Second)
}

// loggedListener logs when the proxy listener closes, the moment from which no
// new connection is accepted.
type loggedListener struct {
	net.Listener
	log  *slog.Logger
	once sync.Once
}

func (l *loggedListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { l.log.Info("proxy listener closed; finishing requests in flight") })
	return err
}
