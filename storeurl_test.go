package main

// End-to-end tests of IDEMPROXY_STORE_URL as an operator meets it: values
// refused at start, a database that refuses or cannot be reached, the URL
// from a file, and replicas started together on an empty database. The
// URL's password never reaches the output.

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore"
	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// storePassword is the password the tests put in store URLs.
const storePassword = "Pw-never-shown-7431"

// withPassword puts storePassword into a pgtest URL (postgres://postgres@…).
func withPassword(t *testing.T, u string) string {
	t.Helper()
	rest, ok := strings.CutPrefix(u, "postgres://postgres@")
	if !ok {
		t.Fatalf("unexpected test URL %q", u)
	}
	return "postgres://postgres:" + storePassword + "@" + rest
}

// refusedStart starts the binary with IDEMPROXY_STORE_URL=storeURL, wants
// it to stop with status, its output naming the variable and each of want,
// and never showing the password.
func refusedStart(t *testing.T, storeURL string, status int, want ...string) {
	t.Helper()
	out := startStops(t, status, "PATH=/usr/bin:/bin", "IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1",
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0", "IDEMPROXY_STORE_URL="+storeURL)
	for _, w := range append(want, "IDEMPROXY_STORE_URL") {
		if !strings.Contains(out, w) {
			t.Errorf("output does not name %s:\n%s", w, out)
		}
	}
	if strings.Contains(out, storePassword) {
		t.Errorf("output shows the password:\n%s", out)
	}
}

// TestStoreURLRefusedAtStart: a value that is not a usable PostgreSQL URL,
// in its form or in one of its parameters (a pool smaller than the 4
// connections a replica uses at once among them), stops the start with
// status 2 naming the variable and the parameter; a database that answers but refuses (here: no such
// database) stops it with status 1, naming the variable and the cause.
// Neither shows the password.
func TestStoreURLRefusedAtStart(t *testing.T) {
	refusing := withPassword(t, pgtest.Shared(t).URL("no_such_db"))
	cases := []struct {
		name   string
		url    string
		status int
		want   []string
	}{
		{"not postgres", "mysql://u:" + storePassword + "@127.0.0.1/x", 2, nil},
		// PostgreSQL's clients (libpq, pgx) take only the lower-case scheme
		// as a URL; pgx read this one as key=value settings and said so.
		{"scheme in capitals", "POSTGRES://u:" + storePassword + "@127.0.0.1/x", 2, []string{"in lower case"}},
		{"bad sslmode", "postgres://u:" + storePassword + "@127.0.0.1:1/x?sslmode=sometimes", 2, []string{"sslmode"}},
		{"bad connect_timeout", "postgres://u:" + storePassword + "@127.0.0.1:1/x?connect_timeout=soon", 2, nil},
		{"pool too small", "postgres://u:" + storePassword + "@127.0.0.1:1/x?pool_max_conns=3", 2, []string{"pool_max_conns=3 is below 4"}},
		{"pool minimum above its size", "postgres://u:" + storePassword + "@127.0.0.1:1/x?pool_max_conns=8&pool_min_conns=9", 2,
			[]string{"pool_min_conns=9", "pool_max_conns=8"}},
		{"no pool health check", "postgres://u:" + storePassword + "@127.0.0.1:1/x?pool_health_check_period=0s", 2,
			[]string{"pool_health_check_period"}},
		{"database refuses", refusing, 1, []string{"no_such_db"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { refusedStart(t, c.url, c.status, c.want...) })
	}
}

// TestStoreUserWithoutGrantsRefused: a database user lacking the privileges
// the README lists stops the start with status 1, naming the variable and
// what is missing: on an empty database, CREATE on its schema; once the
// schema is in place, the table grants (a user with SELECT only was taken
// as ready, and every protected request got 503).
func TestStoreUserWithoutGrantsRefused(t *testing.T) {
	ctx := context.Background()
	role := "idemproxy_nogrants_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	admin, err := pgx.Connect(ctx, pgtest.Shared(t).URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	var cleanup []string
	t.Cleanup(func() {
		for _, u := range cleanup {
			if c, err := pgx.Connect(context.Background(), u); err == nil {
				c.Exec(context.Background(), `DROP OWNED BY `+role)
				c.Close(context.Background())
			}
		}
		admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	as := func(dbURL string) string {
		cleanup = append(cleanup, dbURL)
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(role, storePassword)
		return u.String()
	}

	refusedStart(t, as(pgtest.Database(t)), 1, "permission denied for schema public")

	ready := pgtest.Database(t)
	s, err := pgstore.Open(ctx, pgstore.Options{URL: ready, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := pgx.Connect(ctx, ready)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	if _, err := db.Exec(ctx, `GRANT SELECT ON ALL TABLES IN SCHEMA public TO `+role); err != nil {
		t.Fatal(err)
	}
	refusedStart(t, as(ready), 1, role, "INSERT, UPDATE, DELETE on idemproxy_records")
}

// TestStoreUnreachableAtStart: with nothing listening at the URL's address
// the replica starts anyway, not ready, saying which variable names the
// database it waits for; a protected request gets 503 store_unavailable
// with nothing sent upstream, /healthz is 200. The password is never shown.
func TestStoreUnreachableAtStart(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	prov := newDedupProvider()
	up := httptest.NewServer(prov)
	defer up.Close()
	p := launch(t, launchSpec{env: sharedEnv(up.URL, "postgres://idemproxy:"+storePassword+"@"+addr+"/idemproxy?sslmode=disable")})
	if line := p.waitLine(t, "IDEMPROXY_STORE_URL"); !strings.Contains(line, `"level":"WARN"`) {
		t.Errorf("the line naming the variable is not a warning: %s", line)
	}
	if s := getStatus(t, "http://"+p.admin+"/readyz"); s != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d, want 503", s)
	}
	if s := getStatus(t, "http://"+p.admin+"/healthz"); s != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", s)
	}
	r := send(t, "POST", "http://"+p.proxy+"/v1/payments", `{"order_id":"u-1","amount":"1"}`)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, `"store_unavailable"`) {
		t.Errorf("POST = %d %s, want 503 store_unavailable", r.status, r.body)
	}
	if n := prov.total(); n != 0 {
		t.Errorf("%d requests went upstream", n)
	}
	if strings.Contains(p.text(), storePassword) {
		t.Errorf("the log shows the password:\n%s", p.text())
	}
}

// TestStoreURLFromFile: IDEMPROXY_STORE_URL_FILE names a file holding the
// URL (a container secret); two replicas reading it share the records.
func TestStoreURLFromFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "store_url")
	if err := os.WriteFile(file, []byte(pgtest.Database(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prov := newDedupProvider()
	up := httptest.NewServer(prov)
	defer up.Close()
	env := sharedEnv(up.URL, "")
	for i, v := range env {
		if strings.HasPrefix(v, "IDEMPROXY_STORE_URL=") {
			env[i] = "IDEMPROXY_STORE_URL_FILE=" + file
		}
	}
	a := launch(t, launchSpec{env: env})
	b := launch(t, launchSpec{env: env})
	order := `{"order_id":"file-1","amount":"3.00"}`
	first := send(t, "POST", "http://"+a.proxy+"/v1/payments", order)
	second := send(t, "POST", "http://"+b.proxy+"/v1/payments", order)
	if first.status != http.StatusCreated || second.status != http.StatusCreated || second.body != first.body ||
		second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("through a: %d %s; through b: %d %s replayed=%q; want b to replay a's answer",
			first.status, first.body, second.status, second.body, second.header.Get("Idempotent-Replayed"))
	}
	if !strings.Contains(a.text(), "record store: PostgreSQL") {
		t.Fatalf("replica a does not say it uses PostgreSQL:\n%s", a.text())
	}
}

// TestStoreURLUnixSocket: a URL naming a Unix socket directory in its query
// (postgres://user@/db?host=/dir, libpq's form, as a database proxy sidecar
// offers) is taken, and the replica serves on it. It was refused at start
// as not being a URL.
func TestStoreURLUnixSocket(t *testing.T) {
	c := pgtest.Shared(t)
	u, err := url.Parse(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("host", c.SocketDir())
	q.Set("port", u.Port())
	u.Host, u.RawQuery = "", q.Encode()
	prov := newDedupProvider()
	up := httptest.NewServer(prov)
	defer up.Close()
	p := launch(t, launchSpec{env: sharedEnv(up.URL, u.String())})
	waitReady(t, "the database behind the socket", p)
	r := send(t, "POST", "http://"+p.proxy+"/v1/payments", `{"order_id":"socket-1","amount":"1.00"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("POST = %d %s, want 201", r.status, r.body)
	}
	if n := prov.total(); n != 1 {
		t.Fatalf("provider saw %d requests, want 1", n)
	}
}

// TestStoreURLTLSRefused: an sslmode the database cannot satisfy stops the
// start with status 1, naming the variable and the cause, as a wrong
// password does: TLS required of a server without it, or a certificate that
// fails verify-full (issued for localhost, reached as 127.0.0.1). Both were
// taken for an unreachable database: the replica started, never ready,
// logging "database still unreachable" every few seconds. With verify-full
// on the name in the certificate, the replica serves.
func TestStoreURLTLSRefused(t *testing.T) {
	withParams := func(raw string, params ...string) string {
		t.Helper()
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		for i := 0; i+1 < len(params); i += 2 {
			q.Set(params[i], params[i+1])
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	refusedStart(t, withParams(withPassword(t, pgtest.Database(t)), "sslmode", "require"), 1, "server refused TLS connection")

	c, dbURL := pgtest.Own(t, pgtest.Options{TLS: true})
	verified := withParams(dbURL, "sslmode", "verify-full", "sslrootcert", c.CertFile())
	refusedStart(t, withPassword(t, verified), 1, "certificate")

	u, err := url.Parse(verified)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = net.JoinHostPort("localhost", u.Port())
	prov := newDedupProvider()
	up := httptest.NewServer(prov)
	defer up.Close()
	p := launch(t, launchSpec{env: sharedEnv(up.URL, u.String())})
	waitReady(t, "the start with verify-full", p)
	if r := send(t, "POST", "http://"+p.proxy+"/v1/payments", `{"order_id":"tls-1","amount":"1.00"}`); r.status != http.StatusCreated {
		t.Fatalf("POST over TLS = %d %s, want 201", r.status, r.body)
	}
}

// TestReplicasStartTogether: three replicas started at the same moment on an
// empty database create the schema once between them, with no error, and
// all serve.
func TestReplicasStartTogether(t *testing.T) {
	url := pgtest.Database(t)
	prov := newDedupProvider()
	up := httptest.NewServer(prov)
	defer up.Close()
	env := sharedEnv(up.URL, url)
	ps := []*opsProc{startProc(t, launchSpec{env: env}), startProc(t, launchSpec{env: env}), startProc(t, launchSpec{env: env})}
	for _, p := range ps {
		p.listening(t)
	}
	order := `{"order_id":"together-1","amount":"1.00"}`
	var first reply
	for i, p := range ps {
		if s := getStatus(t, "http://"+p.admin+"/readyz"); s != http.StatusOK {
			t.Errorf("replica %d: /readyz = %d, want 200", i, s)
		}
		r := send(t, "POST", "http://"+p.proxy+"/v1/payments", order)
		if r.status != http.StatusCreated || i > 0 && (r.body != first.body || r.header.Get("Idempotent-Replayed") != "true") {
			t.Errorf("replica %d: %d %s replayed=%q; want 201, replayed after the first", i, r.status, r.body, r.header.Get("Idempotent-Replayed"))
		}
		if i == 0 {
			first = r
		}
	}
	for i, p := range ps {
		for _, l := range strings.Split(p.text(), "\n") {
			if strings.Contains(l, `"level":"ERROR"`) || strings.Contains(l, `"level":"WARN"`) && !strings.Contains(l, `"msg":"request"`) {
				t.Errorf("replica %d logged: %s", i, l)
			}
		}
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var rows, version int
	if err := conn.QueryRow(context.Background(), `SELECT count(*), max(version) FROM idemproxy_schema`).Scan(&rows, &version); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || version < 4 {
		t.Fatalf("idemproxy_schema holds %d rows, version %d; want one row at the current version", rows, version)
	}
	if n := prov.total(); n != 1 {
		t.Fatalf("provider saw %d requests, want 1", n)
	}
}
