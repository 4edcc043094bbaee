package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// proc is a process the harness started and will stop.
type proc struct {
	name string
	addr string // where it serves, host:port
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

// pids returns the process and its children (nginx workers).
func (p *proc) pids() []int { return tree(p.cmd.Process.Pid) }

// stop sends SIGTERM and waits; SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil || p.cmd.Process == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
	}
	p.log.Close()
	trimLog(p.log.Name(), logKeep)
}

// logKeep is how much of a process log is kept: idemproxy logs one line per
// request at its default level (about 240 bytes), so a run's logs would
// otherwise take hundreds of MiB.
const logKeep = 4 << 20

// trimLog keeps the last keep bytes of the file at path, after a first line
// saying how much was cut.
func trimLog(path string, keep int64) {
	info, err := os.Stat(path)
	if err != nil || info.Size() <= keep+4096 { // +4096: a trimmed log stays as it is
		return
	}
	f, err := os.Open(path)
	if err != nil {
		return
	}
	tail := make([]byte, keep)
	_, err = f.ReadAt(tail, info.Size()-keep)
	f.Close()
	if err != nil {
		return
	}
	if i := bytes.IndexByte(tail, '\n'); i >= 0 {
		tail = tail[i+1:]
	}
	head := fmt.Sprintf("[idembench: %d bytes of log cut; the last %d follow]\n", info.Size()-int64(len(tail)), len(tail))
	os.WriteFile(path, append([]byte(head), tail...), 0o644)
}

// start runs bin with args and env, its stderr (and stdout unless
// captureAddr) going to <logDir>/<name>.log. With captureAddr the first line
// of stdout is the address the process chose.
func start(name, logDir, bin string, args, env []string, captureAddr bool) (*proc, error) {
	logf, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logf
	var out *bufio.Reader
	if captureAddr {
		pipe, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		out = bufio.NewReader(pipe)
	} else {
		cmd.Stdout = logf
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logf}
	go func() { cmd.Wait(); close(p.done) }()
	if captureAddr {
		line, err := out.ReadString('\n')
		if err != nil {
			p.stop(time.Second)
			return nil, fmt.Errorf("%s: no address on stdout: %w", name, err)
		}
		p.addr = strings.TrimSpace(line)
	}
	return p, nil
}

// freeAddr returns a loopback address with a port free at the time of the
// call (for programs that take a fixed address, idemproxy and nginx).
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// waitReady polls check until it succeeds, the process exits, or 30 s pass.
func waitReady(p *proc, check func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited at start (see %s)", p.name, p.log.Name())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 30 s: %w", p.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dialCheck(addr string) func() error {
	return func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
}

func httpCheck(url string) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
}

// startIdemproxy runs the real binary with a fresh data directory and its
// defaults (durable writes, the default key source json:order_id), on
// loopback, plus extra environment (e.g. a short record TTL).
func startIdemproxy(name, logDir, bin, dataDir, upstream string, extra ...string) (*proc, error) {
	listen, err := freeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	env := append([]string{
		"IDEMPROXY_UPSTREAM_URL=http://" + upstream,
		"IDEMPROXY_LISTEN_ADDR=" + listen,
		"IDEMPROXY_ADMIN_ADDR=" + admin,
		"IDEMPROXY_DATA_DIR=" + dataDir,
	}, extra...)
	p, err := start(name, logDir, bin, nil, env, false)
	if err != nil {
		return nil, err
	}
	p.addr = listen
	if err := waitReady(p, httpCheck("http://"+admin+"/readyz")); err != nil {
		p.stop(5 * time.Second)
		return nil, err
	}
	return p, nil
}

// nginxConf is baseline C: proxy_pass with upstream keep-alive, no access log,
// keep-alive limits raised so neither side closes connections mid-run (the
// defaults close after 1,000 requests). Workers: one per core, as usual.
const nginxConf = `worker_processes auto;
daemon off;
master_process on;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/client_body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 120s;
    upstream provider {
        server %[2]s;
        keepalive 256;
        keepalive_requests 100000000;
        keepalive_timeout 120s;
    }
    server {
        listen %[3]s;
        location / {
            proxy_pass http://provider;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
`

// startNginx runs nginx in the foreground with a temporary config; nil, nil
// when nginx is not installed.
func startNginx(bin, dir, logDir, upstream string) (*proc, error) {
	if bin == "" {
		return nil, nil
	}
	if _, err := exec.LookPath(bin); err != nil {
		return nil, nil
	}
	listen, err := freeAddr()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, dir, upstream, listen), 0o644); err != nil {
		return nil, err
	}
	// -e: the error log before the config is read (else /var/log/nginx).
	p, err := start("nginx", logDir, bin, []string{"-p", dir, "-c", conf, "-e", filepath.Join(dir, "nginx-start.log")}, nil, false)
	if err != nil {
		return nil, err
	}
	p.addr = listen
	if err := waitReady(p, dialCheck(listen)); err != nil {
		p.stop(5 * time.Second)
		return nil, err
	}
	// Workers are forked after the listener opens; wait until they exist so
	// CPU and memory sampling see them.
	for range 100 {
		if len(p.pids()) > 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p, nil
}
