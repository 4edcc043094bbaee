package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/internal/syncbuf"
	"github.com/idemproxy/idemproxy/metrics"
	"github.com/idemproxy/idemproxy/proxy"
)

// pingFunc is a pinger made of a function.
type pingFunc func(context.Context) error

func (f pingFunc) Ping(ctx context.Context) error { return f(ctx) }

func TestReadiness(t *testing.T) {
	ok := pingFunc(func(context.Context) error { return nil })
	broken := pingFunc(func(context.Context) error { return errors.New("disk full") })
	cases := []struct {
		name     string
		store    pinger
		draining bool
		path     string
		want     int
	}{
		{"ready", ok, false, "/readyz", 200},
		{"store not writable", broken, false, "/readyz", 503},
		{"shutting down", ok, true, "/readyz", 503},
		{"alive while shutting down", broken, true, "/healthz", 200},
		{"metrics", ok, false, "/metrics", 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newAdmin(c.store, metrics.New("test").Handler(), slog.New(slog.DiscardHandler))
			a.draining.Store(c.draining)
			rec := httptest.NewRecorder()
			a.ServeHTTP(rec, httptest.NewRequest("GET", c.path, nil))
			if rec.Code != c.want {
				t.Errorf("GET %s = %d %s, want %d", c.path, rec.Code, rec.Body, c.want)
			}
		})
	}
}

// A container turned unhealthy by its health check (docker inspect showed
// "store unavailable") with nothing in its log when no request came: the
// store check's failure is logged, with its cause, once when /readyz turns
// 503 and once when it turns 200 again, not at every check; the cause is in
// the answer too, which the health check prints.
func TestReadinessLogsItsChanges(t *testing.T) {
	var failing atomic.Bool
	store := pingFunc(func(context.Context) error {
		if failing.Load() {
			return errors.New("the data directory /data is not writable (permission denied)")
		}
		return nil
	})
	var logBuf bytes.Buffer
	a := newAdmin(store, metrics.New("test").Handler(), slog.New(slog.NewJSONHandler(&logBuf, nil)))
	check := func(want int) string {
		t.Helper()
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		if rec.Code != want {
			t.Fatalf("GET /readyz = %d %s, want %d", rec.Code, rec.Body, want)
		}
		return rec.Body.String()
	}
	type line struct{ Level, Msg, Err string }
	lines := func() []line {
		var ls []line
		for _, s := range strings.Split(strings.TrimSpace(logBuf.String()), "\n") {
			var l line
			if s != "" && json.Unmarshal([]byte(s), &l) == nil {
				ls = append(ls, l)
			}
		}
		return ls
	}
	check(200)
	check(200)
	if got := lines(); len(got) != 0 {
		t.Errorf("ready checks logged %v, want nothing", got)
	}
	failing.Store(true)
	for range 3 {
		if body := check(503); !strings.Contains(body, "store unavailable") || !strings.Contains(body, "not writable (permission denied)") {
			t.Errorf("/readyz 503 says %q, want the cause after \"store unavailable\"", body)
		}
	}
	failing.Store(false)
	check(200)
	check(200)
	want := []line{{"WARN", "not ready: the store check failed", "the data directory /data is not writable (permission denied)"},
		{"INFO", "ready again: the store check passed", ""}}
	if got := lines(); !slices.Equal(got, want) {
		t.Errorf("log after ready, 3 failing checks, 2 passing:\n%s\nwant %v", logBuf.String(), want)
	}
}

func TestReadyURL(t *testing.T) {
	cases := []struct {
		addr, want string
		bad        bool
	}{
		{":9090", "http://127.0.0.1:9090/readyz", false},
		{"0.0.0.0:9090", "http://127.0.0.1:9090/readyz", false},
		{"[::]:9091", "http://127.0.0.1:9091/readyz", false},
		{"10.1.2.3:9090", "http://10.1.2.3:9090/readyz", false},
		{"[::1]:9090", "http://[::1]:9090/readyz", false},
		{"localhost:9090", "http://localhost:9090/readyz", false},
		{"127.0.0.1:0", "", true},
		{"9090", "", true},
	}
	for _, c := range cases {
		t.Run(c.addr, func(t *testing.T) {
			got, err := readyURL(c.addr)
			if (err != nil) != c.bad || got != c.want {
				t.Errorf("readyURL(%q) = %q, %v; want %q, error %v", c.addr, got, err, c.want, c.bad)
			}
		})
	}
}

func TestLookupEnv(t *testing.T) {
	cases := []struct {
		name    string
		environ []string
		want    string
	}{
		{"unset: the struct's default", []string{"IDEMPROXY_LISTEN_ADDR=:1"}, ":9090"},
		{"empty: the default, as env does", []string{"IDEMPROXY_ADMIN_ADDR="}, ":9090"},
		{"set", []string{"IDEMPROXY_ADMIN_ADDR_X=:2", "IDEMPROXY_ADMIN_ADDR=:7"}, ":7"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := lookupEnv(c.environ, "AdminAddr"); got != c.want {
				t.Errorf("= %q, want %q", got, c.want)
			}
		})
	}
}

// freePort returns a loopback port nothing listens on (it was free a moment ago).
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	return port
}

func TestHealthcheckCommand(t *testing.T) {
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
		}
	}))
	defer ready.Close()
	draining := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
	}))
	defer draining.Close()
	port := func(s *httptest.Server) string { u, _ := url.Parse(s.URL); return u.Port() }
	cases := []struct {
		name    string
		environ []string
		want    int
		says    string // on stderr: what docker inspect shows of the check
	}{
		{"ready, wildcard address", []string{"IDEMPROXY_ADMIN_ADDR=:" + port(ready)}, 0, ""},
		{"ready, only this variable and a proxy that must be ignored", []string{"HTTP_PROXY=http://127.0.0.1:1", "IDEMPROXY_ADMIN_ADDR=0.0.0.0:" + port(ready)}, 0, ""},
		// The reason /readyz gives: the check once said only "503 Service Unavailable".
		{"not ready", []string{"IDEMPROXY_ADMIN_ADDR=:" + port(draining)}, 1, "503 Service Unavailable: shutting down"},
		{"not running", []string{"IDEMPROXY_ADMIN_ADDR=127.0.0.1:" + freePort(t)}, 1, "connection refused"},
		{"bad address", []string{"IDEMPROXY_ADMIN_ADDR=nonsense"}, 1, "IDEMPROXY_ADMIN_ADDR"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if got := command([]string{"healthcheck"}, c.environ, &out, &errOut); got != c.want {
				t.Errorf("exit %d, want %d; stderr %s", got, c.want, errOut.String())
			}
			if c.want != 0 && !strings.Contains(errOut.String(), c.says) {
				t.Errorf("a failed check says %q, want it to say %q", errOut.String(), c.says)
			}
		})
	}
}

func TestCommandUsage(t *testing.T) {
	var vars strings.Builder
	printVariables(&vars)
	variablesHelp := vars.String()
	cases := []struct {
		args       []string
		want       int
		stdout     string
		stderrWant string
	}{
		{[]string{"version"}, 0, version + "\n", ""},
		// What a container binary is usually asked (docker run image
		// --version) was "unknown command" with exit 2.
		{[]string{"--version"}, 0, version + "\n", ""},
		{[]string{"-version"}, 0, version + "\n", ""},
		{[]string{"-v"}, 0, version + "\n", ""},
		{[]string{"serve-please"}, 2, "", "unknown command"},
		// Help is asked for, not a mistake: on stdout, exit 0.
		{[]string{"--help"}, 0, usage + variablesHelp, ""},
		{[]string{"-h"}, 0, usage + variablesHelp, ""},
		{[]string{"help"}, 0, usage + variablesHelp, ""},
		{[]string{"records", "--help"}, 0, "usage: " + recordsGetUsage + "\n       " + recordsListUsage + "\n       " + recordsResolveUsage + "\n       " + recordsReviewedUsage + "\n       " + recordsDiscardUsage + "\n", ""},
		{[]string{"orders", "-h"}, 0, "usage: " + ordersUsage + "\n", ""},
		{nil, 2, "", "IDEMPROXY_UPSTREAM_URL"}, // serving needs the upstream
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			got := command(c.args, nil, &out, &errOut)
			if got != c.want || out.String() != c.stdout || !strings.Contains(errOut.String(), c.stderrWant) {
				t.Errorf("exit %d stdout %q stderr %q; want %d %q %q", got, out.String(), errOut.String(), c.want, c.stdout, c.stderrWant)
			}
		})
	}
	// A subcommand's --help lists its flags on stdout.
	for _, args := range [][]string{{"records", "get", "--help"}, {"records", "list", "-h"}, {"records", "resolve", "--help"}, {"orders", "renew", "--help"}} {
		var out, errOut bytes.Buffer
		if got := command(args, nil, &out, &errOut); got != 0 || !strings.HasPrefix(out.String(), "usage: idemproxy "+args[0]) ||
			!strings.Contains(out.String(), "-admin") || errOut.Len() != 0 {
			t.Errorf("%v = exit %d stdout %q stderr %q; want 0 and the usage with the flags on stdout", args, got, out.String(), errOut.String())
		}
	}
}

// TestCLIAdminUnreachable: an admin address nothing listens on is said
// plainly, with what to check.
func TestCLIAdminUnreachable(t *testing.T) {
	var out, errOut bytes.Buffer
	got := command([]string{"records", "list", "--state", "unknown"}, []string{"IDEMPROXY_ADMIN_ADDR=127.0.0.1:" + freePort(t)}, &out, &errOut)
	if got != 1 || !strings.Contains(errOut.String(), "cannot reach the admin API at http://") ||
		!strings.Contains(errOut.String(), "IDEMPROXY_ADMIN_ADDR") {
		t.Fatalf("exit %d stderr %q; want 1 saying the admin API cannot be reached and to check IDEMPROXY_ADMIN_ADDR", got, errOut.String())
	}
}

func TestRedact(t *testing.T) {
	secrets := []string{"s3cr3t-value", "pub_abcdef"}
	cases := []struct {
		attr slog.Attr
		want string
	}{
		{slog.String("msg", "signing with s3cr3t-value"), "[redacted]"},
		{slog.Any("err", errors.New("bad header X-Public-Id: pub_abcdef")), "[redacted]"},
		{slog.String("path", "/v1/payments"), "/v1/payments"},
		{slog.Int("status", 201), "201"},
	}
	for _, c := range cases {
		t.Run(c.attr.Key, func(t *testing.T) {
			if got := redact(c.attr, secrets).Value.String(); got != c.want {
				t.Errorf("redact(%v) = %q, want %q", c.attr, got, c.want)
			}
		})
	}
	var buf bytes.Buffer
	log := newLogger(&buf, "info", []string{"abc", "long-enough-secret"})
	log.Info("x abc long-enough-secret", "k", "abc")
	if got := buf.String(); strings.Contains(got, "long-enough-secret") || !strings.Contains(got, `"k":"abc"`) {
		t.Errorf("log line %s: want the long secret redacted and the short value (below %d bytes) kept", got, minSecretLen)
	}
}

// TestStreamedRequestThroughObserver sends an unprotected GET through the
// observer and the proxy to an upstream that streams: the client must read the
// first chunk while the upstream still holds the rest (Flush passes through the
// status-capturing writer), and the request line must carry the status.
func TestStreamedRequestThroughObserver(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "second\n")
	}))
	defer up.Close()
	store, err := cache.Open(cache.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var logBuf syncbuf.Buffer
	obs := &observer{log: slog.New(slog.NewJSONHandler(&logBuf, nil)), m: metrics.New("test")}
	u, _ := url.Parse(up.URL)
	h, err := proxy.New(proxy.Options{Upstream: u, Store: store, OnDone: obs.done})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(obs.wrap(h))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "first\n" {
		t.Fatalf("first chunk %q, %v", first, err)
	}
	close(release) // only now may the rest come
	rest, _ := io.ReadAll(br)
	if string(rest) != "second\n" || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("rest %q status %d", rest, resp.StatusCode)
	}
	srv.Close() // waits for the handler, so the request line is written
	var line struct {
		Msg, Outcome string
		Status       int
		Attempts     int
	}
	if err := json.Unmarshal(logBuf.Bytes(), &line); err != nil || line.Msg != "request" {
		t.Fatalf("request line %q: %v", logBuf.Bytes(), err)
	}
	if line.Status != http.StatusAccepted || line.Outcome != "forwarded" || line.Attempts != 1 {
		t.Errorf("request line = %+v, want status 202 outcome forwarded, 1 attempt", line)
	}
}

// TestRequestLineIsLoggersLine: observer.done hands its record to the handler
// itself; the line must be the one Logger.LogAttrs writes, time aside.
func TestRequestLineIsLoggersLine(t *testing.T) {
	for _, s := range []proxy.Summary{
		{Method: "POST", Path: "/v1/payments", Key: "k-1", UpstreamKey: "k-1", Outcome: proxy.OutcomeReplayed,
			Status: 200, Attempts: 1, Replayed: true, Duration: 1234567},
		{Method: "GET", Path: "/v1/x", Outcome: proxy.OutcomeUnavailable, Status: 502, Attempts: 5}, // a warning
	} {
		var got, want bytes.Buffer
		(&observer{log: newLogger(&got, "info", nil), m: metrics.New("test")}).done(s)
		level := slog.LevelInfo
		if s.Outcome == proxy.OutcomeUnavailable {
			level = slog.LevelWarn
		}
		newLogger(&want, "info", nil).LogAttrs(context.Background(), level, "request",
			slog.String("method", s.Method), slog.String("path", s.Path), slog.String("key", s.Key),
			slog.String("upstream_key", s.UpstreamKey), slog.String("outcome", string(s.Outcome)),
			slog.Int("status", s.Status), slog.Int("attempts", s.Attempts), slog.Bool("replayed", s.Replayed),
			slog.Float64("duration_ms", millis(s.Duration)))
		// Both lines start with {"time":"<RFC 3339>", and differ only there.
		g, w := got.String(), want.String()
		if g[strings.Index(g, `","level"`):] != w[strings.Index(w, `","level"`):] {
			t.Errorf("request line\n%s\nwant\n%s", g, w)
		}
	}
	var quiet bytes.Buffer
	(&observer{log: newLogger(&quiet, "warn", nil), m: metrics.New("test")}).done(proxy.Summary{Outcome: proxy.OutcomeForwarded})
	if quiet.Len() != 0 {
		t.Errorf("info line written at level warn: %s", quiet.String())
	}
}
