// Package pgtest starts a throwaway PostgreSQL cluster for tests: initdb in a
// temporary directory, a server on a free loopback port, removed at the end.
// It runs the PostgreSQL binaries installed on the machine (Debian's
// postgresql package); as root it runs them as the postgres user, because
// PostgreSQL refuses to run as root.
//
// Without PostgreSQL, tests that need it are skipped, naming the package to
// install; with IDEMPROXY_REQUIRE_POSTGRES=1 (CI) they fail instead.
package pgtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// RequireEnv turns a missing PostgreSQL into a test failure when set to 1.
const RequireEnv = "IDEMPROXY_REQUIRE_POSTGRES"

// Install names what provides the binaries.
const Install = "install the Debian package postgresql (initdb, pg_ctl and postgres, version 13 or later)"

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	bin  string // directory of initdb, pg_ctl, postgres
	dir  string // temporary root: data/ and the socket
	port int
	as   string // user to run the binaries as; "" = this process's user
	dbs  atomic.Int64
	mu   sync.Mutex // serialises Stop and Start
}

// FindBin returns the directory holding initdb, pg_ctl and postgres: from
// PATH, or the newest /usr/lib/postgresql/*/bin.
func FindBin() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL binaries not found in PATH or /usr/lib/postgresql/*/bin")
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Options tune Start. The zero value is a test server without fsync.
type Options struct {
	// Fsync keeps fsync on (benchmarks); tests turn it off for speed, which
	// loses nothing unless the machine itself crashes.
	Fsync bool
	// MaxConnections is the server's max_connections; 0 means 200.
	MaxConnections int
	// Settings are more postgresql.conf lines ("name = value"), written
	// after the ones above, so that they override them.
	Settings []string
	// TLS turns ssl on with a self-signed certificate for the name
	// localhost only (no IP address in it); CertFile returns it.
	TLS bool
	// HBA are pg_hba.conf lines put before initdb's (which trust every
	// connection), so that they are matched first: "host all app
	// 127.0.0.1/32 scram-sha-256" makes role app give its password.
	HBA []string
}

// Start creates and starts a cluster. The caller must Stop it and Remove it.
func Start(opts Options) (*Cluster, error) {
	bin, err := FindBin()
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin}
	if os.Geteuid() == 0 {
		c.as = "postgres"
	}
	c.dir, err = os.MkdirTemp("", "idemproxy-pg-")
	if err != nil {
		return nil, err
	}
	if err := c.init(opts); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	if c.port, err = freePort(); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	if err := c.Start(); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	return c, nil
}

// init runs initdb and writes the server's settings.
func (c *Cluster) init(opts Options) error {
	if c.as != "" {
		if err := chownTo(c.as, c.dir); err != nil {
			return fmt.Errorf("running as root needs the %s user: %w", c.as, err)
		}
	}
	data := filepath.Join(c.dir, "data")
	if out, err := c.run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	fsync := "off"
	if opts.Fsync {
		fsync = "on"
	}
	conf := fmt.Sprintf("listen_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = %s\nfull_page_writes = %s\nmax_connections = %d\nshared_buffers = 64MB\nlog_min_messages = warning\n",
		c.dir, fsync, fsync, max(opts.MaxConnections, 200))
	if opts.TLS {
		if err := c.writeCert(data); err != nil {
			return err
		}
		conf += "ssl = on\n"
	}
	for _, line := range opts.Settings {
		conf += line + "\n"
	}
	if len(opts.HBA) > 0 {
		hba := filepath.Join(data, "pg_hba.conf")
		old, err := os.ReadFile(hba)
		if err != nil {
			return err
		}
		if err := os.WriteFile(hba, []byte(strings.Join(opts.HBA, "\n")+"\n"+string(old)), 0o600); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(conf)
	return err
}

// writeCert writes a self-signed certificate for localhost and its key as
// server.crt and server.key in data, owned by the server's user.
func (c *Cluster) writeCert(data string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	for name, b := range files {
		path := filepath.Join(data, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return err
		}
		if c.as != "" {
			if err := chownTo(c.as, path); err != nil {
				return err
			}
		}
	}
	return nil
}

// CertFile returns the server's certificate, with Options.TLS.
func (c *Cluster) CertFile() string { return filepath.Join(c.dir, "data", "server.crt") }

// run runs a PostgreSQL binary, as the postgres user when this is root.
func (c *Cluster) run(name string, args ...string) ([]byte, error) {
	path := filepath.Join(c.bin, name)
	var cmd *exec.Cmd
	if c.as != "" {
		cmd = exec.Command("runuser", append([]string{"-u", c.as, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = c.dir
	return cmd.CombinedOutput()
}

// Start starts the server (again, after Stop) on its port and waits until it
// accepts connections.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, err := c.run("pg_ctl", "-D", filepath.Join(c.dir, "data"), "-l", filepath.Join(c.dir, "server.log"),
		"-o", fmt.Sprintf("-p %d", c.port), "-w", "-t", "60", "start")
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		return fmt.Errorf("pg_ctl start: %w: %s\n%s", err, out, log)
	}
	return nil
}

// Stop stops the server. Immediate is a crash stop (what a kill or a lost
// host looks like to clients); otherwise a fast shutdown.
func (c *Cluster) Stop(immediate bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	mode := "fast"
	if immediate {
		mode = "immediate"
	}
	out, err := c.run("pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", mode, "-w", "-t", "60", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, out)
	}
	return nil
}

// Freeze stops every process of the server with SIGSTOP: a hung database,
// whose connections stay open and never answer. Thaw resumes them; call it
// before Stop or Remove.
func (c *Cluster) Freeze() error { return c.signal(syscall.SIGSTOP) }

// Thaw resumes the processes Freeze stopped.
func (c *Cluster) Thaw() error { return c.signal(syscall.SIGCONT) }

// Pids returns the process ids of the server: the postmaster and its
// children (the backends and the auxiliary processes), found through /proc.
func (c *Cluster) Pids() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "data", "postmaster.pid"))
	if err != nil {
		return nil, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("postmaster.pid: %w", err)
	}
	pids := []int{pm}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		st, err := os.ReadFile(f)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(st), ')')
		fields := strings.Fields(string(st[i+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pm) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// signal sends sig to every process of the server.
func (c *Cluster) signal(sig syscall.Signal) error {
	pids, err := c.Pids()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal %v to %d: %w", sig, pid, err)
		}
	}
	return nil
}

// Remove stops the server if it runs and deletes its directory.
func (c *Cluster) Remove() {
	c.Stop(false)
	os.RemoveAll(c.dir)
}

// URL returns the connection URL of database db.
func (c *Cluster) URL(db string) string { return localURL(c.port, db) }

// localURL is the URL of database db on 127.0.0.1:port, as the postgres
// user.
func localURL(port int, db string) string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// DatabaseName is the database a URL of URL's or NewDatabase's form names.
func DatabaseName(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		panic(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// userIDs are the user and group ids of the user name.
func userIDs(name string) (uid, gid int, err error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, 0, err
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// chownTo gives path to the user name (its user and group).
func chownTo(name, path string) error {
	uid, gid, err := userIDs(name)
	if err != nil {
		return err
	}
	return os.Chown(path, uid, gid)
}

// SocketDir returns the directory holding the server's Unix socket.
func (c *Cluster) SocketDir() string { return c.dir }

// NewDatabase creates an empty database and returns its URL.
func (c *Cluster) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d_%d", os.Getpid(), c.dbs.Add(1))
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	return c.URL(name), nil
}

// Log returns the server's log, for failure messages.
func (c *Cluster) Log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	return string(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// shared is the package's cluster, started by Main.
var shared struct {
	c   *Cluster
	err error
}

// Main runs a test binary's tests with one cluster shared by all of them,
// removed at the end: call it from TestMain as os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	shared.c, shared.err = Start(Options{})
	if shared.c != nil {
		defer shared.c.Remove()
	}
	return m.Run()
}

// Shared returns the cluster Main started, skipping the test when there is
// none (failing it when IDEMPROXY_REQUIRE_POSTGRES=1).
func Shared(t testing.TB) *Cluster {
	t.Helper()
	if shared.c == nil {
		err := shared.err
		if err == nil {
			err = errors.New("pgtest.Main did not run (call it from TestMain)")
		}
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("PostgreSQL is required (%s=1) but unavailable: %v; %s", RequireEnv, err, Install)
		}
		t.Skipf("PostgreSQL unavailable (%v): %s to run this test", err, Install)
	}
	return shared.c
}

// Database returns the URL of a new empty database on the shared cluster.
func Database(t testing.TB) string {
	t.Helper()
	c := Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := c.NewDatabase(ctx)
	if err != nil {
		t.Fatalf("new database: %v\n%s", err, c.Log())
	}
	return u
}

// Own starts a cluster of the test's own, which it may stop, freeze or
// restart without disturbing the other tests, and returns it with the URL of
// a new database on it. The cluster is removed when the test ends. Without
// PostgreSQL the test is skipped (or failed) as Shared does.
func Own(t testing.TB, opts Options) (*Cluster, string) {
	t.Helper()
	Shared(t)
	c, err := Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Remove)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := c.NewDatabase(ctx)
	if err != nil {
		t.Fatalf("new database: %v\n%s", err, c.Log())
	}
	return c, u
}
