package main

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestStorePasswordNeverShownWhenTheDatabaseFails: with
// IDEMPROXY_STORE_URL holding a password, on a PostgreSQL cluster that asks
// for it (scram-sha-256), whatever goes wrong with the database (a wrong
// password or database name at start, nothing listening, the password
// changed, the database renamed, the server stopped while serving) the
// password shows neither in /readyz's cause, nor in the healthcheck
// command's output, nor in any log line, while each says what is wrong.
func TestStorePasswordNeverShownWhenTheDatabaseFails(t *testing.T) {
	const pw = "SECRETPW"
	c, _ := pgtest.Own(t, pgtest.Options{HBA: []string{"host all app 127.0.0.1/32 scram-sha-256"}})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	exec1 := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec1(`CREATE ROLE app LOGIN PASSWORD '` + pw + `'`)
	exec1(`CREATE DATABASE appdb OWNER app`)
	base, err := url.Parse(c.URL("appdb"))
	if err != nil {
		t.Fatal(err)
	}
	storeURL := func(host, password, db string) string {
		u := *base
		u.Host, u.User, u.Path = host, url.UserPassword("app", password), "/"+db
		return u.String()
	}
	noPassword := func(where, text string) {
		t.Helper()
		if strings.Contains(text, pw) {
			t.Errorf("%s shows the password:\n%s", where, text)
		}
	}
	env := func(storeURL string) []string {
		return sharedEnv("http://127.0.0.1:1", storeURL, "IDEMPROXY_STORE_TIMEOUT=2s")
	}

	// Refused at start: the process stops, saying why.
	for _, s := range []struct{ name, url, want string }{
		{"wrong password", storeURL(base.Host, "not-"+pw, "appdb"), "password authentication failed"},
		{"wrong database", storeURL(base.Host, pw, "appdb_none"), "appdb_none"},
	} {
		out := startStops(t, 1, env(s.url)...)
		if !strings.Contains(out, s.want) {
			t.Errorf("%s at start: output does not say %q:\n%s", s.name, s.want, out)
		}
		noPassword(s.name+" at start: the output", out)
	}

	// notReady waits until p's /readyz fails, and checks its cause and the
	// healthcheck command's output.
	notReady := func(p *opsProc, what, want string) {
		t.Helper()
		var r reply
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			r = send(t, http.MethodGet, "http://"+p.admin+"/readyz", "")
			if r.status == http.StatusServiceUnavailable && strings.Contains(r.body, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: /readyz = %d %q, want 503 saying %q", what, r.status, r.body, want)
			}
		}
		t.Logf("%s: /readyz: %s", what, strings.TrimSpace(r.body))
		noPassword(what+": /readyz", r.body)
		hc := exec.Command(binPath, "healthcheck")
		hc.Env = []string{"PATH=/usr/bin:/bin", "IDEMPROXY_ADMIN_ADDR=" + p.admin}
		out, err := hc.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "store unavailable") {
			t.Errorf("%s: healthcheck = %v, %s; want status 1 and the cause", what, err, out)
		}
		noPassword(what+": healthcheck", string(out))
	}
	ready := func(p *opsProc, what string) {
		t.Helper()
		waitReadyz(t, p.admin, http.StatusOK)
		t.Logf("ready again after %s", what)
	}

	// Nothing listening at the URL's address.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := l.Addr().String()
	l.Close()
	p := launch(t, launchSpec{env: env(storeURL(nowhere, pw, "appdb"))})
	notReady(p, "nothing listening", "schema not in place")
	noPassword("nothing listening: the log", p.text())

	// Serving, then the database fails under it.
	p = launch(t, launchSpec{env: env(storeURL(base.Host, pw, "appdb"))})
	ready(p, "the start")
	// terminate ends the replica's sessions and waits until they are gone:
	// pg_terminate_backend only signals them, and a RENAME of their
	// database while one is still exiting fails ("is being accessed by
	// other users", seen once under load).
	terminate := func() {
		t.Helper()
		exec1(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'app'`)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var left int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d sessions of app still there 10 s after pg_terminate_backend", left)
			}
		}
	}

	exec1(`ALTER ROLE app PASSWORD 'changed-` + pw + `'`)
	terminate()
	notReady(p, "password changed", "password authentication failed")
	exec1(`ALTER ROLE app PASSWORD '` + pw + `'`)
	ready(p, "the password was put back")

	exec1(`ALTER DATABASE appdb ALLOW_CONNECTIONS false`)
	terminate()
	exec1(`ALTER DATABASE appdb RENAME TO appdb_moved`)
	notReady(p, "database renamed", "appdb")
	exec1(`ALTER DATABASE appdb_moved RENAME TO appdb`)
	exec1(`ALTER DATABASE appdb ALLOW_CONNECTIONS true`)
	ready(p, "the database's name was put back")

	admin.Close(ctx)
	if err := c.Stop(false); err != nil {
		t.Fatal(err)
	}
	notReady(p, "server stopped", "store unavailable")
	noPassword("the log of the replica that served", p.text())
	if !strings.Contains(p.text(), "not ready: the store check failed") {
		t.Errorf("the log does not say the store check failed:\n%s", p.text())
	}
}
