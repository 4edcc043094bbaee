package chaos

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ModulePath is idemproxy's Go module path; ModuleRoot looks for it.
const ModulePath = "github.com/idemproxy/idemproxy"

// ModuleRoot walks up from dir to the directory whose go.mod declares
// ModulePath.
func ModuleRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("module root: %w", err)
	}
	for {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(mod), []byte("module "+ModulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("module root: no go.mod for %s above the working directory", ModulePath)
		}
		dir = parent
	}
}

// Build compiles the idemproxy binary of the module at root into dir, as the
// container build does (`go build -o dir/idemproxy .`), and returns its path.
func Build(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "idemproxy")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build idemproxy: %w\n%s", err, out)
	}
	return bin, nil
}

// startTimeout bounds one start of the binary, from exec to "listening".
const startTimeout = 30 * time.Second

// Proxy runs the idemproxy binary. The first Start picks free loopback ports;
// every later Start reuses them and the same data directory, as a container
// restarted by its orchestrator would. Methods must not be called
// concurrently.
type Proxy struct {
	// Addr is the proxy listener's host:port, set by the first Start.
	Addr string

	bin   string
	env   []string
	admin string
	cur   *process
	tail  *logTail
}

// process is one run of the binary.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and its log is read
	err  error         // exit status, valid once done is closed
}

// NewProxy prepares bin to run with env (IDEMPROXY_* lines) and a data
// directory; listen addresses are chosen by the first Start.
func NewProxy(bin, dataDir string, env []string) *Proxy {
	return &Proxy{bin: bin, env: append(slices.Clone(env), "IDEMPROXY_DATA_DIR="+dataDir), tail: newLogTail(200)}
}

// Start runs the binary and returns once it logs that it listens. It fails if
// the process exits first or takes longer than 30 s. An address still held
// by the previous process's sockets is retried for a few seconds.
func (p *Proxy) Start(ctx context.Context) error {
	if p.cur != nil {
		return errors.New("proxy: already running")
	}
	listen, admin := "127.0.0.1:0", "127.0.0.1:0"
	if p.Addr != "" {
		listen, admin = p.Addr, p.admin
	}
	deadline := time.Now().Add(startTimeout)
	for {
		err := p.startOnce(ctx, listen, admin, deadline)
		if err == nil || !strings.Contains(err.Error(), "address already in use") || time.Now().After(deadline) {
			return err
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

func (p *Proxy) startOnce(ctx context.Context, listen, admin string, deadline time.Time) error {
	cmd := exec.Command(p.bin)
	cmd.Env = append(slices.Clone(p.env), "IDEMPROXY_LISTEN_ADDR="+listen, "IDEMPROXY_ADMIN_ADDR="+admin)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("proxy: start %s: %w", p.bin, err)
	}
	proc := &process{cmd: cmd, done: make(chan struct{})}
	listening := make(chan [2]string, 1)
	go func() {
		p.tail.read(stderr, listening)
		proc.err = cmd.Wait()
		close(proc.done)
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case addrs := <-listening:
		p.Addr, p.admin, p.cur = addrs[0], addrs[1], proc
		return nil
	case <-proc.done:
		return fmt.Errorf("proxy exited at start: %v\n%s", proc.err, p.tail.String())
	case <-timer.C:
	case <-ctx.Done():
	}
	_ = cmd.Process.Kill() // it never became ready; the error below says why
	<-proc.done
	return fmt.Errorf("proxy did not start (%v):\n%s", ctx.Err(), p.tail.String())
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proxy) Kill() error {
	if p.cur == nil {
		return errors.New("proxy: not running")
	}
	if err := p.cur.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("proxy: kill: %w", err)
	}
	<-p.cur.done
	p.cur = nil
	return nil
}

// Stop sends SIGTERM, which lets detached operations finish and be stored
// (IDEMPROXY_SHUTDOWN_GRACE), and waits; after grace it kills the process.
// It returns the exit error of a process that did not stop cleanly.
func (p *Proxy) Stop(grace time.Duration) error {
	if p.cur == nil {
		return nil
	}
	cur := p.cur
	p.cur = nil
	if err := cur.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("proxy: stop: %w", err)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-cur.done:
	case <-timer.C:
		_ = cur.cmd.Process.Kill() // past the grace period; the error below says so
		<-cur.done
		return fmt.Errorf("proxy: did not stop within %v after SIGTERM", grace)
	}
	if cur.err != nil {
		return fmt.Errorf("proxy: exit after SIGTERM: %w\n%s", cur.err, p.tail.String())
	}
	return nil
}

// Released is the number of in-flight records the proxy's starts released
// (main.go logs it at start): operations a SIGKILL cut short, which the next
// request for their key resumes. Zero when the log line is absent.
func (p *Proxy) Released() int {
	p.tail.mu.Lock()
	defer p.tail.mu.Unlock()
	return p.tail.released
}

// Probes counts the status probes the proxies sent, by result (found,
// not_found, other, unfilled): each one found is a re-send it saved.
func (p *Proxy) Probes() map[string]int {
	p.tail.mu.Lock()
	defer p.tail.mu.Unlock()
	out := map[string]int{}
	for k, n := range p.tail.probes {
		out[k] = n
	}
	return out
}

// Log returns the last lines the binary wrote, across restarts.
func (p *Proxy) Log() string { return p.tail.String() }

// logTail keeps the last lines of the binaries' logs for error messages, sums
// the in-flight records each start released, and counts status probes by
// result.
type logTail struct {
	mu       sync.Mutex
	lines    []string
	max      int
	released int
	probes   map[string]int
}

func newLogTail(max int) *logTail { return &logTail{max: max} }

// read consumes r line by line and sends the proxy and admin addresses once,
// when the "idemproxy listening" line comes (main.go's serve logs it).
func (l *logTail) read(r io.Reader, listening chan<- [2]string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		l.add(line)
		if strings.Contains(line, `"msg":"released in-flight records`) {
			n, _ := strconv.Atoi(jsonNumber(line, "count"))
			l.mu.Lock()
			l.released += n
			l.mu.Unlock()
		}
		if strings.Contains(line, `"msg":"status probe"`) {
			l.mu.Lock()
			if l.probes == nil {
				l.probes = map[string]int{}
			}
			l.probes[jsonField(line, "result")]++
			l.mu.Unlock()
		}
		if !sent && strings.Contains(line, `"msg":"idemproxy listening"`) {
			listening <- [2]string{jsonField(line, "proxy"), jsonField(line, "admin")}
			sent = true
		}
	}
	_, _ = io.Copy(io.Discard, r) // a line over 1 MiB stops the scanner; keep the pipe drained
}

func (l *logTail) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	if len(l.lines) > l.max {
		l.lines = l.lines[len(l.lines)-l.max:]
	}
}

// String is the kept lines, oldest first.
func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// jsonField pulls "name":"value" out of one JSON log line.
func jsonField(line, name string) string {
	_, rest, ok := strings.Cut(line, `"`+name+`":"`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// jsonNumber pulls "name":123 out of one JSON log line; "" when absent.
func jsonNumber(line, name string) string {
	_, rest, ok := strings.Cut(line, `"`+name+`":`)
	if !ok {
		return ""
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	return rest[:end]
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
