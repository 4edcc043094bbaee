package pgtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// InstallPgBouncer names what provides the pgbouncer binary.
const InstallPgBouncer = "install the Debian package pgbouncer"

// PgBouncerOptions tune StartPgBouncer.
type PgBouncerOptions struct {
	// PoolMode is pgbouncer's pool_mode: session, transaction or statement.
	// "" means session (pgbouncer's default).
	PoolMode string
	// IgnoreStartupParameters is pgbouncer's ignore_startup_parameters: the
	// startup parameters it accepts from a client and drops.
	IgnoreStartupParameters []string
	// Settings are more lines of the [pgbouncer] section ("name = value").
	Settings []string
}

// PgBouncer is a running pgbouncer in front of a Cluster.
type PgBouncer struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// StartPgBouncer starts pgbouncer on a free loopback port in front of c,
// with trust authentication and every database of c behind it; it is
// stopped and its directory removed when the test ends. As root it runs as
// the postgres user (pgbouncer refuses to run as root). Without pgbouncer
// the test is skipped naming the package to install, or failed when
// IDEMPROXY_REQUIRE_POSTGRES=1.
func StartPgBouncer(t testing.TB, c *Cluster, opts PgBouncerOptions) *PgBouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr == nil {
			bin, err = "/usr/sbin/pgbouncer", nil
		}
	}
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("pgbouncer is required (%s=1) but not found: %v; %s", RequireEnv, err, InstallPgBouncer)
		}
		t.Skipf("pgbouncer not found (%v): %s to run this test", err, InstallPgBouncer)
	}
	b, err := startPgBouncer(bin, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

func startPgBouncer(bin string, c *Cluster, opts PgBouncerOptions) (*PgBouncer, error) {
	dir, err := os.MkdirTemp("", "idemproxy-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{dir: dir, done: make(chan struct{})}
	if b.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	mode := opts.PoolMode
	if mode == "" {
		mode = "session"
	}
	conf := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
max_client_conn = 1000
default_pool_size = 150
logfile = %s
ignore_startup_parameters = %s
`, c.port, b.port, filepath.Join(dir, "userlist.txt"), mode, filepath.Join(dir, "pgbouncer.log"),
		strings.Join(opts.IgnoreStartupParameters, ","))
	for _, line := range opts.Settings {
		conf += line + "\n"
	}
	files := map[string]string{"pgbouncer.ini": conf, "userlist.txt": `"postgres" ""` + "\n"}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	b.cmd = exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	b.cmd.Dir = dir
	if os.Geteuid() == 0 {
		if err := runAsPostgres(b.cmd, dir); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	out := &strings.Builder{}
	b.cmd.Stdout, b.cmd.Stderr = out, out
	if err := b.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	go func() { b.cmd.Wait(); close(b.done) }()
	for deadline := time.Now().Add(30 * time.Second); ; {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)), time.Second)
		if err == nil {
			conn.Close()
			return b, nil
		}
		select {
		case <-b.done:
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgbouncer exited at start: %s\n%s", out, b.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Stop()
			return nil, errors.New("pgbouncer did not listen within 30 s:\n" + b.Log())
		}
	}
}

// runAsPostgres makes cmd run as the postgres user, owner of dir and its files.
func runAsPostgres(cmd *exec.Cmd, dir string) error {
	uid, gid, err := userIDs("postgres")
	if err != nil {
		return fmt.Errorf("running pgbouncer as root needs the postgres user: %w", err)
	}
	err = filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(path, uid, gid)
	})
	if err != nil {
		return err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	return nil
}

// URL returns the connection URL of database db through pgbouncer, as the
// postgres user.
func (b *PgBouncer) URL(db string) string { return localURL(b.port, db) }

// Via returns dbURL, a URL of the cluster behind b, with b's address in
// place of the cluster's.
func (b *PgBouncer) Via(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		panic(err)
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	return u.String()
}

// Log returns pgbouncer's log, for failure messages.
func (b *PgBouncer) Log() string {
	out, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(out)
}

// Stop stops pgbouncer (SIGINT: at once, closing its connections) and
// removes its directory.
func (b *PgBouncer) Stop() {
	if b.cmd != nil && b.cmd.Process != nil {
		b.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-b.done:
		case <-time.After(10 * time.Second):
			b.cmd.Process.Kill()
			<-b.done
		}
	}
	os.RemoveAll(b.dir)
}
