package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A change whose call got no answer (the instance died, or hung, after the
// request reached it) may have been made: the operator commands say so,
// and to look the record or order up before repeating it. They said
// "cannot reach the admin API ... is idemproxy running?", as for an address
// nothing listens on, which reads as "nothing was done": an operator would
// repeat a resolve on another replica, or resolve it otherwise. A call that
// could not connect still says it cannot reach the API.
func TestCLIChangeWithoutAnswer(t *testing.T) {
	p := startBinary(t, "IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR="+t.TempDir())
	// Stopped, the instance's kernel still takes connections and the
	// request, which nothing reads; killed, it resets them.
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, p.cmd.Process.Pid)
	_, port, _ := net.SplitHostPort(p.admin)
	type result struct {
		code   int
		stderr string
	}
	done := make(chan result, 1)
	go func() {
		var stderr bytes.Buffer
		code := command([]string{"records", "resolve", "k-1", "--outcome", "not_executed", "--admin", p.admin}, nil, &bytes.Buffer{}, &stderr)
		done <- result{code, stderr.String()}
	}()
	waitQueued(t, port)
	p.cmd.Process.Kill()
	<-p.done
	r := <-done
	if r.code != 1 || !strings.Contains(r.stderr, "may have been made") || !strings.Contains(r.stderr, "look the record or order up") ||
		strings.Contains(r.stderr, "cannot reach") {
		t.Errorf("resolve without an answer = exit %d %q; want 1 saying it may have been made, to look it up", r.code, r.stderr)
	}
	// Nothing listens there now: nothing was sent.
	var stderr bytes.Buffer
	if code := command([]string{"records", "resolve", "k-1", "--outcome", "not_executed", "--admin", p.admin}, nil, &bytes.Buffer{}, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "cannot reach the admin API") || strings.Contains(stderr.String(), "may have been made") {
		t.Errorf("resolve on a closed address = exit %d %q; want 1 saying it cannot reach the admin API", code, stderr.String())
	}
}

// waitQueued waits until a connection to the local port is established
// (in /proc/net/tcp: the local port in hex, state 01).
func waitQueued(t *testing.T, port string) {
	t.Helper()
	var n int
	fmt.Sscan(port, &n)
	want := fmt.Sprintf(":%04X ", n)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile("/proc/net/tcp")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 3 && strings.HasSuffix(f[1]+" ", want) && f[3] == "01" {
				return
			}
		}
	}
	t.Fatal("the command's connection was not established within 10 s")
}

// waitStopped waits until the process is stopped (state T in
// /proc/<pid>/stat): a signal is delivered after kill returns, and a
// process still running answered the request the test wants unanswered.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// "pid (comm) state ...": the state follows the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
	}
	t.Fatalf("process %d not stopped after SIGSTOP", pid)
}
