package main

// The operator's side of the process: the admin listener (health, readiness,
// metrics), the request log and metrics fed by the proxy's hooks, the JSON
// logger, and the healthcheck subcommand the container image runs.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/metrics"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// pinger is what readiness needs of the store.
type pinger interface{ Ping(context.Context) error }

// readyzBound bounds /readyz's store check: past it, the store counts as
// unavailable (503 with the reason).
const readyzBound = 2 * time.Second

// admin serves /healthz, /readyz and /metrics on the admin listener, and
// hands /admin and everything under it to api (the admin API, which checks
// the token first).
type admin struct {
	mux      *http.ServeMux
	api      http.Handler
	store    pinger
	draining atomic.Bool // set first thing on shutdown
	// log gets a line when the store check's outcome changes (storeState): a
	// health check turning a container unhealthy says only what /readyz
	// answers, and with no traffic nothing else was logged.
	log        *slog.Logger
	storeState atomic.Int32 // storeUnchecked, storeOK or storeFailing
}

// openPaths are the admin listener's paths outside the admin API: GET (and
// HEAD) only, no token.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// The store check's last outcome, for logging its changes only: /readyz is
// asked every few seconds by health checks and probes.
const (
	storeUnchecked = iota
	storeOK
	storeFailing
)

func newAdmin(store pinger, metricsHandler http.Handler, log *slog.Logger) *admin {
	a := &admin{mux: http.NewServeMux(), store: store, log: log}
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	a.mux.HandleFunc("GET /readyz", a.ready)
	a.mux.Handle("GET /metrics", metricsHandler)
	return a
}

// ServeHTTP answers every request on the admin listener with
// Idemproxy-Admin: v1 (adminapi.Header), and with the API's JSON error shape
// for a path it does not serve (404 not_found) or a method it does not take
// (405 method_not_allowed, with Allow). It never redirects: ServeMux's 307
// to a cleaned path (/admin/v1//records) or to /admin/ came before the token
// was checked, without the header or the JSON shape, and a client following
// it would send a POST's change a second time to another path.
func (a *admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(adminapi.Header, "v1")
	p := r.URL.Path
	switch {
	case a.api != nil && (p == "/admin" || strings.HasPrefix(p, "/admin/")):
		a.api.ServeHTTP(w, r)
	case !openPaths[r.URL.EscapedPath()]:
		adminapi.WriteError(w, http.StatusNotFound, "not_found", "no such path on the admin listener: /healthz, /readyz, /metrics and the admin API under /admin/v1/")
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		adminapi.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", p+" takes GET, HEAD")
	default:
		a.mux.ServeHTTP(w, r)
	}
}

// ready is false while shutting down or when the store cannot be written.
func (a *admin) ready(w http.ResponseWriter, r *http.Request) {
	if a.draining.Load() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyzBound)
	defer cancel()
	if err := a.store.Ping(ctx); err != nil {
		if r.Context().Err() == nil { // not a check its caller gave up on
			if prev := a.storeState.Swap(storeFailing); prev != storeFailing {
				a.log.Warn("not ready: the store check failed", "err", err.Error())
			}
		}
		// The cause, for docker inspect's health log and whoever GETs /readyz
		// (the admin port is the operator's); the log line above has it too.
		http.Error(w, "store unavailable: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	if prev := a.storeState.Swap(storeOK); prev == storeFailing {
		a.log.Info("ready again: the store check passed")
	}
	fmt.Fprintln(w, "ready")
}

// observer turns the proxy's hooks into metrics and the request log: one line
// per request (proxy.Options.OnDone) and, at debug level, one per upstream
// attempt (retry.Transport.OnAttempt). Neither hook carries headers or bodies,
// so no credential can reach the log through them.
type observer struct {
	log *slog.Logger
	m   *metrics.Metrics
}

// wrap counts the request in flight.
func (o *observer) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer o.m.RequestStarted()()
		next.ServeHTTP(w, r)
	})
}

// done is proxy.Options.OnDone.
func (o *observer) done(s proxy.Summary) {
	o.m.Request(s)
	level := slog.LevelInfo
	if s.Outcome == proxy.OutcomeUnavailable || s.Outcome == proxy.OutcomeStoreError {
		level = slog.LevelWarn
	}
	ctx, h := context.Background(), o.log.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	// To the handler directly: Logger.LogAttrs would also take the caller's
	// program counter (runtime.Callers), which no handler here reads
	// (AddSource is off), for about 1% of a replay's CPU. The line is the same.
	r := slog.NewRecord(time.Now(), level, "request", 0)
	r.AddAttrs(
		slog.String("method", s.Method),
		slog.String("path", s.Path),
		slog.String("key", s.Key),
		slog.String("upstream_key", s.UpstreamKey),
		slog.String("outcome", string(s.Outcome)),
		slog.Int("status", s.Status),
		slog.Int("attempts", s.Attempts),
		slog.Bool("replayed", s.Replayed),
		slog.Float64("duration_ms", millis(s.Duration)))
	h.Handle(ctx, r) // as Logger does, a failed write is not reported
}

// attempt is retry.Transport.OnAttempt. A provider-wide pause is logged as a
// warning: every outbound request waits while it lasts.
func (o *observer) attempt(a retry.AttemptInfo) {
	o.m.Attempt(a)
	level := slog.LevelDebug
	if a.Paused > 0 {
		level = slog.LevelWarn
	}
	ctx := context.Background()
	if !o.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", a.Method),
		slog.String("path", a.Path),
		slog.String("mode", a.Mode.String()),
		slog.Int("attempt", a.Attempt),
		slog.Int("status", a.Status),
		slog.String("retry_reason", string(a.Reason)),
		slog.Bool("last", a.Last),
		slog.Float64("duration_ms", millis(a.Duration)),
		slog.Float64("gate_wait_ms", millis(a.GateWait)),
		slog.Float64("next_wait_ms", millis(a.Wait)),
	}
	if a.Err != nil {
		attrs = append(attrs, slog.String("err", a.Err.Error()))
	}
	msg := "upstream attempt"
	if a.Paused > 0 {
		msg = "provider asked to pause: all outbound attempts wait"
		attrs = append(attrs, slog.Float64("pause_ms", millis(a.Paused)))
	}
	o.log.LogAttrs(ctx, level, msg, attrs...)
}

// probe is retry.Transport.OnProbe: every status probe is logged, since it
// decides whether an operation whose outcome was unknown is re-sent.
func (o *observer) probe(p retry.ProbeInfo) {
	o.m.Probe(p)
	attrs := []slog.Attr{
		slog.String("method", p.Method),
		slog.String("path", p.Path),
		slog.String("key", p.Key),
		slog.String("probe_method", p.ProbeMethod),
		slog.String("probe_path", p.ProbePath),
		slog.String("result", string(p.Result)),
		slog.Int("status", p.Status),
	}
	if p.Err != nil {
		attrs = append(attrs, slog.String("err", p.Err.Error()))
	}
	o.log.LogAttrs(context.Background(), slog.LevelInfo, "status probe", attrs...)
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// newLogger returns the process's JSON logger at level (validated by
// loadConfig). As a last line of defence, any attribute or message that
// contains one of secrets (values of at least minSecretLen bytes, so that a
// short value cannot blank out ordinary words) is replaced whole.
//
// The audit lines of the admin API (auditLogger) share its handler, so that
// their lines and the others never interleave, and are written whatever the
// level.
func newLogger(w io.Writer, level string, secrets []string) *slog.Logger {
	lvl, _ := parseLevel(level)
	opts := &slog.HandlerOptions{Level: min(lvl, auditLevel)}
	var long []string
	for _, s := range secrets {
		if len(s) >= minSecretLen {
			long = append(long, s)
		}
	}
	if len(long) > 0 {
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			return redact(a, long)
		}
	}
	return slog.New(levelFloor{slog.NewJSONHandler(w, opts), lvl})
}

// auditLevel is the level of the admin API's audit lines (a change made by
// an operator): WARN, and written at any IDEMPROXY_LOG_LEVEL.
const auditLevel = slog.LevelWarn

// auditLogger returns the logger of the admin API's audit lines: log's
// handler, writing lines at auditLevel and above whatever log's level. At
// IDEMPROXY_LOG_LEVEL=error the operator's changes were not logged at all.
func auditLogger(log *slog.Logger) *slog.Logger {
	if f, ok := log.Handler().(levelFloor); ok {
		return slog.New(levelFloor{f.Handler, min(f.min, auditLevel)})
	}
	return log
}

// levelFloor passes to its handler the records at min or above.
type levelFloor struct {
	slog.Handler
	min slog.Level
}

func (h levelFloor) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h levelFloor) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelFloor{h.Handler.WithAttrs(attrs), h.min}
}

func (h levelFloor) WithGroup(name string) slog.Handler {
	return levelFloor{h.Handler.WithGroup(name), h.min}
}

// minSecretLen is the shortest secret the logger's safety net looks for.
const minSecretLen = 6

func redact(a slog.Attr, secrets []string) slog.Attr {
	k := a.Value.Kind()
	if k != slog.KindString && k != slog.KindAny {
		return a
	}
	text := a.Value.String()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			return slog.String(a.Key, "[redacted]")
		}
	}
	return a
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(strings.ToUpper(s)))
	return l, err
}

// healthcheck asks the idemproxy whose admin listener IDEMPROXY_ADMIN_ADDR names
// whether it is ready, and returns the exit status: 0 ready, 1 not (not running,
// shutting down, store not writable). It is the image's HEALTHCHECK, since a
// minimal image has no shell or curl, so it reads only that one variable: the
// rest of the configuration may be absent from the probe's environment.
func healthcheck(environ []string, stderr io.Writer) int {
	url, err := readyURL(lookupEnv(environ, "AdminAddr"))
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy healthcheck:", err)
		return 1
	}
	// No proxy from HTTP_PROXY: the probe goes to this container's loopback.
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{Proxy: nil}}
	resp, err := client.Get(url)
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy healthcheck:", err)
		return 1
	}
	defer resp.Body.Close()
	// The reason /readyz gives ("store unavailable", "shutting down") is
	// what docker inspect shows of a failed check: say it.
	why, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "idemproxy healthcheck: %s: %s: %s\n", url, resp.Status, strings.Join(strings.Fields(string(why)), " "))
		return 1
	}
	return 0
}

// readyURL is the /readyz URL for the admin listen address addr: a wildcard or
// empty host is probed on 127.0.0.1.
func readyURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%sADMIN_ADDR %q: %w", envPrefix, addr, err)
	}
	if port == "" || port == "0" {
		return "", fmt.Errorf("%sADMIN_ADDR %q: no fixed port to probe", envPrefix, addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}

// lookupEnv returns the value in environ of the variable of config's field, or
// the field's envDefault when the variable is unset or empty (as env does).
func lookupEnv(environ []string, field string) string {
	vars := configVars()
	cv := vars[slices.IndexFunc(vars, func(v configVar) bool { return v.field == field })]
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, cv.name+"="); ok && v != "" {
			return v
		}
	}
	return cv.tag.Get("envDefault")
}
