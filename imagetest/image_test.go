package imagetest

import (
	"archive/tar"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
)

// provider is a sandbox payments provider container that checks signatures.
type provider struct {
	name, secret string
}

// startProvider runs the sandbox target on network under the alias
// "provider", its port published on loopback, with extra SANDBOX_ settings.
func startProvider(t *testing.T, img images, network string, publish bool, env ...string) provider {
	t.Helper()
	p := provider{secret: randomHex(16)}
	args := []string{"--network", network, "--network-alias", "provider",
		"-e", "SANDBOX_PROVIDER=payments", "-e", "SANDBOX_SECRET=" + p.secret}
	if publish {
		args = append(args, "-p", "127.0.0.1::8081")
	}
	for _, e := range env {
		args = append(args, "-e", e)
	}
	p.name = container(t, "provider", append(args, img.sandbox)...)
	waitLog(t, p.name, "listening on", 1)
	return p
}

// ledger is the provider's ledger, entries included.
func (p provider) ledger(t *testing.T) sandbox.LedgerSnapshot {
	t.Helper()
	return ledgerAt(t, "http://"+published(t, p.name, "8081"))
}

// proxyArgs are `docker run` arguments for idemproxy in front of p, as an
// operator runs it: hardened, configured by the environment only, the signing
// secret in a mounted file (IDEMPROXY_SIGN_SECRET_FILE).
func proxyArgs(t *testing.T, p provider) []string {
	t.Helper()
	secretFile := filepath.Join(t.TempDir(), "sign_secret")
	if err := os.WriteFile(secretFile, []byte(p.secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"-v", secretFile + ":/run/secrets/sign_secret:ro",
		"-e", "IDEMPROXY_UPSTREAM_URL=http://provider:8081",
		"-e", "IDEMPROXY_SIGN_SECRET_FILE=/run/secrets/sign_secret",
		"-e", "IDEMPROXY_SIGN_CANONICAL=" + sandbox.PaymentsCanonical,
		"-e", "IDEMPROXY_NONCE_HEADER=X-Nonce"}
}

// waitReady waits until the container's /readyz answers 200 and returns the
// proxy's loopback base URL.
func waitReady(t *testing.T, c string) string {
	t.Helper()
	waitFor(t, c+" ready", func() bool {
		if inspect(t, c, "{{.State.Running}}") != "true" {
			t.Fatalf("%s is not running:\n%s", c, logs(c))
		}
		status, _ := get("http://" + published(t, c, "9090") + "/readyz")
		return status == http.StatusOK
	})
	return "http://" + published(t, c, "8080")
}

func TestImageVersion(t *testing.T) {
	t.Parallel()
	img := need(t)
	if got := docker(t, "run", "--rm", img.proxy, "version"); got != imageVersion {
		t.Errorf("docker run %s version = %q, want the stamped %q", img.proxy, got, imageVersion)
	}
	// What docker inspect (and a registry or scanner) reads without running it.
	if got := inspect(t, img.proxy, `{{index .Config.Labels "org.opencontainers.image.version"}}`); got != imageVersion {
		t.Errorf("label org.opencontainers.image.version = %q, want the stamped %q", got, imageVersion)
	}
}

// The Dockerfile adds to its runtime base the binary and an empty /data
// owned by nonroot, and nothing else: no shell or other executable (the
// sandbox's binary), no sources, tests or build outputs.
func TestImageContents(t *testing.T) {
	t.Parallel()
	img := need(t)
	base := exportedFiles(t, img.bases.Runtime)
	var added []string
	for name, h := range exportedFiles(t, img.proxy) {
		if _, ok := base[name]; ok {
			continue
		}
		added = append(added, name)
		switch name {
		case "idemproxy":
			if h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 || h.Uid != 0 || h.Mode&0o022 != 0 {
				t.Errorf("/idemproxy: type %c, mode %o, owner %d; want an executable file of root's that only root may change", h.Typeflag, h.Mode, h.Uid)
			}
		case "data/":
			if h.Typeflag != tar.TypeDir || h.Uid != 65532 || h.Gid != 65532 || h.Mode&0o7777 != 0o1777 {
				t.Errorf("/data: type %c, owner %d:%d, mode %o; want a directory of 65532:65532 of mode 1777 (any --user may write in it)", h.Typeflag, h.Uid, h.Gid, h.Mode&0o7777)
			}
		}
	}
	slices.Sort(added)
	if !slices.Equal(added, []string{"data/", "idemproxy"}) {
		t.Errorf("the image adds %q to its runtime base, want only the binary and the empty /data", added)
	}
	if out, err := dockerCmd("run", "--rm", "--entrypoint", "/bin/sh", img.proxy, "-c", "true"); err == nil {
		t.Errorf("the image has a shell: %s", out)
	}
}

// exportedFiles are the entries of a container made from image, by name as
// docker export gives them (a directory's with a trailing slash).
func exportedFiles(t *testing.T, image string) map[string]*tar.Header {
	t.Helper()
	// The entrypoint only has to be named: the container never starts.
	id := docker(t, "create", "--entrypoint", "/idemproxy", image)
	defer dockerCmd("rm", "-v", id)
	cmd := exec.Command("docker", "export", id)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	files := map[string]*tar.Header{}
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("docker export %s: %v", image, err)
		}
		files[strings.TrimPrefix(h.Name, "./")] = h
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("docker export %s: %v", image, err)
	}
	return files
}

// The size goal is for the image as users build it; the stand-in runtime base
// is reported beside it (distroless static is about 2 MB).
func TestImageSize(t *testing.T) {
	img := need(t)
	const goal = 25 << 20
	size, _ := strconv.ParseInt(inspect(t, img.proxy, "{{.Size}}"), 10, 64)
	base, _ := strconv.ParseInt(inspect(t, img.bases.Runtime, "{{.Size}}"), 10, 64)
	t.Logf("image %s: %.1f MB (runtime base stand-in %.1f MB, idemproxy's layers %.1f MB); both targets built in %s",
		img.proxy, mb(size), mb(base), mb(size-base), img.buildTime.Round(time.Second))
	if size <= 0 || size > goal {
		t.Errorf("image size %.1f MB, goal under %.0f MB", mb(size), mb(goal))
	}
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

// The stand-in must be the toolchain the Dockerfile pins, or the test build
// proves nothing about the real one.
func TestImageBuilderMatchesPin(t *testing.T) {
	img := need(t)
	raw, err := os.ReadFile(filepath.Join(img.root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ARG GO_IMAGE=golang:(\d+\.\d+\.\d+)`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("Dockerfile has no ARG GO_IMAGE=golang:<version>")
	}
	if got := docker(t, "run", "--rm", img.bases.Go, "go", "env", "GOVERSION"); got != "go"+string(m[1]) {
		t.Errorf("builder stand-in %s has %s, the Dockerfile pins golang:%s", img.bases.Go, got, m[1])
	}
}

func TestImageRunsAsNonrootAndTurnsHealthy(t *testing.T) {
	t.Parallel()
	img := need(t)
	net := network(t, false)
	p := startProvider(t, img, net, false)
	vol := volume(t)
	c := container(t, "idemproxy", append(proxyArgs(t, p), "--network", net, "-v", vol+":/data", "--memory", "256m",
		"-p", "127.0.0.1::8080", "-p", "127.0.0.1::9090", img.proxy)...)

	if got := inspect(t, c, "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}}"); got != "65532:65532 true [ALL]" {
		t.Errorf("user, read-only, dropped capabilities = %q, want \"65532:65532 true [ALL]\"", got)
	}
	// What the kernel says about the running process, not only the config.
	if got := strings.Fields(docker(t, "top", c, "-o", "pid,uid,gid")); len(got) != 6 || got[4] != "65532" || got[5] != "65532" {
		t.Errorf("docker top pid,uid,gid = %q, want one process, as 65532 65532", got)
	}

	// The first probe runs one interval after the start; it must pass before the
	// start period ends.
	waitFor(t, "health status healthy", func() bool {
		switch s := inspect(t, c, "{{.State.Health.Status}}"); s {
		case "healthy":
			return true
		case "unhealthy":
			t.Fatalf("health status %s:\n%s", s, inspect(t, c, "{{json .State.Health}}"))
		}
		return false
	})
	var started, passed time.Time
	var period time.Duration
	for _, v := range []struct {
		format string
		into   any
	}{{"{{json .State.StartedAt}}", &started}, {"{{json (index .State.Health.Log 0)}}", &struct{ End *time.Time }{&passed}},
		{"{{json .Config.Healthcheck.StartPeriod}}", &period}} {
		if err := json.Unmarshal([]byte(inspect(t, c, v.format)), v.into); err != nil {
			t.Fatalf("docker inspect -f %s: %v", v.format, err)
		}
	}
	if took := passed.Sub(started); took <= 0 || took > period {
		t.Errorf("first passing health check %s after start, start period %s", took, period)
	}

	// The signed request passes the provider's check: the secret came from the file.
	base := "http://" + published(t, c, "8080")
	if r := post(t, base+"/payments", `{"order_id":"img-1","amount":"10.00","currency":"EUR"}`); r.status != http.StatusCreated {
		t.Fatalf("POST /payments = %d %s", r.status, r.body)
	}
	if strings.Contains(logs(c), p.secret) || strings.Contains(inspect(t, c, "{{json .Config.Env}}"), p.secret) {
		t.Error("the signing secret shows in the log or the container's environment")
	}
	// README, Memory: the Go runtime's soft limit is 40% of the container's.
	checkGoLimit(t, logs(c))
	checkLogLines(t, c)

	// Everything the store wrote on the named volume belongs to nonroot.
	owners := docker(t, "run", "--rm", "-v", vol+":/data:ro", img.bases.Debian, "find", "/data", "-printf", "%U:%G %p\n")
	if n := strings.Count(owners, "\n") + 1; n < 3 {
		t.Errorf("the volume holds %d entries: the store wrote nothing?\n%s", n, owners)
	}
	for _, line := range strings.Split(owners, "\n") {
		if !strings.HasPrefix(line, "65532:65532 ") {
			t.Errorf("volume entry not owned by 65532:65532: %s", line)
		}
	}
}

// checkGoLimit checks a log of idemproxy run with a 256 MiB memory limit: the
// Go runtime's soft limit was set to 40% of it, from the container's cgroup.
func checkGoLimit(t *testing.T, log string) {
	t.Helper()
	const container, goLimit = 256 << 20, 107374182
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "Go memory limit set") {
			continue
		}
		line = line[strings.Index(line, "{"):] // compose logs: after "service  | "
		var l struct {
			Container int64 `json:"container_limit_bytes"`
			Go        int64 `json:"go_limit_bytes"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.Container != container || l.Go != goLimit {
			t.Errorf("with --memory 256m: %s; want container_limit_bytes %d, go_limit_bytes %d", line, container, goLimit)
		}
		return
	}
	t.Errorf("no \"Go memory limit set\" line in the log:\n%s", log)
}

func TestImageBadConfigExits2(t *testing.T) {
	t.Parallel()
	img := need(t)
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"bad number", []string{"IDEMPROXY_UPSTREAM_URL=http://provider:8081", "IDEMPROXY_RETRY_MAX_ATTEMPTS=many"}, "IDEMPROXY_RETRY_MAX_ATTEMPTS"},
		{"missing upstream", nil, "IDEMPROXY_UPSTREAM_URL"},
		// The required variable set under a misspelt name: the misspelling is named too.
		{"misspelt upstream", []string{"IDEMPROXY_UPSTREM_URL=http://provider:8081"}, `"variable":"IDEMPROXY_UPSTREM_URL","did_you_mean":"IDEMPROXY_UPSTREAM_URL"`},
		{"secret file absent", []string{"IDEMPROXY_UPSTREAM_URL=http://provider:8081", "IDEMPROXY_SIGN_SECRET_FILE=/run/secrets/none"}, "IDEMPROXY_SIGN_SECRET_FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--read-only", "--cap-drop", "ALL"}
			for _, e := range tc.env {
				args = append(args, "-e", e)
			}
			c := container(t, "badconfig", append(args, img.proxy)...)
			if code := waitExit(t, c); code != "2" {
				t.Errorf("exit code %s, want 2", code)
			}
			if out := logs(c); !strings.Contains(out, tc.want) {
				t.Errorf("docker logs do not name %s:\n%s", tc.want, out)
			}
			checkLogLines(t, c)
		})
	}
}

// What an operator mounts as root, unchanged, and the image's user 65532
// cannot use: a bind-mounted data directory it may not write in, and a secret
// file (mode 600) it may not read. The start fails, and docker logs say which
// variable, which user was denied and what to run on the host; "permission
// denied" alone said neither.
func TestImageNamesTheUserOnUnusableMounts(t *testing.T) {
	t.Parallel()
	img := need(t)
	dataDir := t.TempDir() // 0700, the test's user: 65532 may not write in it
	secretFile := filepath.Join(t.TempDir(), "sign_secret")
	if err := os.WriteFile(secretFile, []byte(randomHex(16)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		exit string
		want []string
	}{
		{"data directory", []string{"-v", dataDir + ":/data"}, "1",
			[]string{"IDEMPROXY_DATA_DIR=/data", "permission denied", "uid 65532", "chown -R 65532:65532"}},
		{"secret file", []string{"-v", secretFile + ":/run/secrets/sign_secret:ro",
			"-e", "IDEMPROXY_SIGN_SECRET_FILE=/run/secrets/sign_secret"}, "2",
			[]string{"IDEMPROXY_SIGN_SECRET_FILE", "permission denied", "uid 65532", "chown 65532"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--read-only", "--cap-drop", "ALL",
				"-e", "IDEMPROXY_UPSTREAM_URL=http://provider:8081"}, tc.args...)
			c := container(t, "unusable", append(args, img.proxy)...)
			if code := waitExit(t, c); code != tc.exit {
				t.Errorf("exit code %s, want %s", code, tc.exit)
			}
			out := logs(c)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("docker logs do not say %q:\n%s", w, out)
				}
			}
			checkLogLines(t, c)
		})
	}
}

// `docker run --user` with a uid other than the image's (a host user's, to
// match a bind mount's owner, or an arbitrary one as some platforms assign)
// on a fresh named volume: the volume starts as a copy of the image's /data,
// so /data must be writable by any user, as /tmp is (mode 1777), or the start
// stops on "permission denied". The store's files then belong to that user,
// and a second start as it opens them again.
func TestImageRunsAsAnyUserOnAFreshVolume(t *testing.T) {
	t.Parallel()
	img := need(t)
	for _, user := range []string{"4321", "4321:4321"} {
		t.Run(user, func(t *testing.T) {
			vol := volume(t)
			args := []string{"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--user", user,
				"-v", vol + ":/data", "-e", "IDEMPROXY_UPSTREAM_URL=http://provider:8081",
				"-p", "127.0.0.1::8080", "-p", "127.0.0.1::9090", img.proxy}
			c := container(t, "anyuser", args...)
			waitReady(t, c) // /readyz: a probe write to the store, fsynced
			docker(t, "stop", "-t", "30", c)
			if code := inspect(t, c, "{{.State.ExitCode}}"); code != "0" {
				t.Errorf("exit code after docker stop = %s, want 0", code)
			}
			docker(t, "start", c)
			waitReady(t, c)
			uid, _, _ := strings.Cut(user, ":")
			owners := docker(t, "run", "--rm", "-v", vol+":/data:ro", img.bases.Debian, "find", "/data", "-mindepth", "1", "-printf", "%U %p\n")
			if strings.Count(owners, "\n")+1 < 2 {
				t.Errorf("the volume holds no store:\n%s", owners)
			}
			for _, line := range strings.Split(owners, "\n") {
				if !strings.HasPrefix(line, uid+" ") {
					t.Errorf("volume entry not owned by the user %s: %s", uid, line)
				}
			}
		})
	}
}

// result is an answer or the error of a request sent from a goroutine.
type result struct {
	reply
	err error
}

// postAsync sends a POST from a goroutine; the answer arrives on the channel.
func postAsync(url, body string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- result{reply{resp.StatusCode, resp.Header, string(b)}, err}
	}()
	return ch
}

// entryKey is the Idempotency-Key the provider executed order with.
func entryKey(t *testing.T, l sandbox.LedgerSnapshot, order string) string {
	t.Helper()
	for _, e := range l.Entries {
		if e.OrderID == order {
			return e.IdempotencyKey
		}
	}
	t.Fatalf("the provider never executed %s", order)
	return ""
}

// retryExecutedOnce sends the app's retry of order (its JSON body) after a
// stop or kill cut it: it must be answered 201 with the key the provider
// executed the order with, and the provider must have executed it once.
func retryExecutedOnce(t *testing.T, p provider, base, order, body string) {
	t.Helper()
	r := post(t, base+"/payments", body)
	if r.status != http.StatusCreated {
		t.Fatalf("retry of %s = %d %s, want 201", order, r.status, r.body)
	}
	l := p.ledger(t)
	if key := entryKey(t, l, order); r.header.Get("Idempotency-Key") != key {
		t.Errorf("retry answered with key %q, the provider executed %s with %q", r.header.Get("Idempotency-Key"), order, key)
	}
	if l.ByOrder[order] != 1 || len(l.DuplicateOrders) != 0 {
		t.Errorf("%s executed %d times, duplicates %v; want once", order, l.ByOrder[order], l.DuplicateOrders)
	}
}

// One container on one named volume through `docker stop`, `docker kill`
// and `docker start`. The provider holds every answer for a few seconds after
// executing, so that each stop and kill lands while an operation is in flight.
func TestImageStopDrainsKillResumes(t *testing.T) {
	t.Parallel()
	img := need(t)
	net := network(t, false)
	p := startProvider(t, img, net, true, "SANDBOX_FAULT_SLOW=1", "SANDBOX_SLOW_DELAY=8s")
	vol := volume(t)
	c := container(t, "idemproxy", append(proxyArgs(t, p), "--network", net, "-v", vol+":/data",
		"-p", "127.0.0.1::8080", "-p", "127.0.0.1::9090", "-e", "IDEMPROXY_SHUTDOWN_GRACE=60s", img.proxy)...)
	base := waitReady(t, c)
	const orderA, orderB = `{"order_id":"stop-A","amount":"10.00"}`, `{"order_id":"kill-B","amount":"20.00"}`
	var first reply

	t.Run("docker stop drains", func(t *testing.T) {
		pending := postAsync(base+"/payments", orderA)
		waitFor(t, "the provider executing stop-A", func() bool { return p.ledger(t).ByOrder["stop-A"] == 1 })
		select {
		case r := <-pending:
			t.Fatalf("stop-A was answered (%d) before docker stop: the machine outran the provider's hold", r.status)
		default:
		}
		docker(t, "stop", "-t", "90", c)
		r := <-pending
		if r.err != nil || r.status != http.StatusCreated {
			t.Fatalf("in-flight stop-A during docker stop = %d %s %v, want 201", r.status, r.body, r.err)
		}
		first = r.reply
		if code := inspect(t, c, "{{.State.ExitCode}}"); code != "0" {
			t.Errorf("exit code after docker stop = %s, want 0", code)
		}
		if out := logs(c); !strings.Contains(out, "shutdown complete") {
			t.Errorf("no \"shutdown complete\" in the log:\n%s", out)
		}
	})
	if first.status == 0 {
		t.FailNow()
	}

	replayA := func(t *testing.T, base string) {
		t.Helper()
		r := post(t, base+"/payments", orderA)
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.body != first.body {
			t.Errorf("repeat of stop-A = %d replayed=%q %s, want the stored 201 %s", r.status, r.header.Get("Idempotent-Replayed"), r.body, first.body)
		}
		if n := p.ledger(t).ByOrder["stop-A"]; n != 1 {
			t.Errorf("stop-A executed %d times, want 1", n)
		}
	}

	t.Run("docker start replays the stored operation", func(t *testing.T) {
		docker(t, "start", c)
		replayA(t, waitReady(t, c))
	})

	t.Run("docker kill then start resumes the in-flight operation with its key", func(t *testing.T) {
		base := waitReady(t, c)
		pending := postAsync(base+"/payments", orderB)
		waitFor(t, "the provider executing kill-B", func() bool { return p.ledger(t).ByOrder["kill-B"] == 1 })
		docker(t, "kill", c)
		if r := <-pending; r.err == nil {
			t.Fatalf("kill-B was answered %d across a SIGKILL", r.status)
		}
		if code := waitExit(t, c); code != "137" {
			t.Errorf("exit code after docker kill = %s, want 137 (SIGKILL)", code)
		}
		docker(t, "start", c)
		base = waitReady(t, c)
		if out := logs(c); !regexp.MustCompile(`released in-flight records.*"count":1\b`).MatchString(out) {
			t.Errorf("the restart did not release kill-B's in-flight record:\n%s", out)
		}
		retryExecutedOnce(t, p, base, "kill-B", orderB)
		replayA(t, base)
	})

	// docker kill -s TERM twice (or Ctrl-C twice on docker run): as PID 1 the
	// second signal's default action was ignored by the kernel and Go's runtime
	// exited 2, which says "bad configuration", with nothing logged.
	t.Run("a second SIGTERM during the drain stops at once with status 1, start resumes", func(t *testing.T) {
		base := waitReady(t, c)
		const orderC = `{"order_id":"twice-C","amount":"30.00"}`
		released := regexp.MustCompile(`released in-flight records.*"count":1\b`)
		releases, drains := len(released.FindAllString(logs(c), -1)), strings.Count(logs(c), "proxy listener closed")
		pending := postAsync(base+"/payments", orderC)
		waitFor(t, "the provider executing twice-C", func() bool { return p.ledger(t).ByOrder["twice-C"] == 1 })
		docker(t, "kill", "-s", "TERM", c)
		waitLog(t, c, "proxy listener closed", drains+1)
		docker(t, "kill", "-s", "TERM", c)
		if code := waitExit(t, c); code != "1" {
			t.Errorf("exit code after a second SIGTERM = %s, want 1", code)
		}
		if out := logs(c); !strings.Contains(out, "second signal during the drain") {
			t.Errorf("no \"second signal during the drain\" in the log:\n%s", out)
		}
		<-pending // cut when the process ended
		docker(t, "start", c)
		base = waitReady(t, c)
		if n := len(released.FindAllString(logs(c), -1)); n != releases+1 {
			t.Errorf("the restart did not release twice-C's in-flight record:\n%s", logs(c))
		}
		retryExecutedOnce(t, p, base, "twice-C", orderC)
		// Four starts, a drain, a kill and a second signal: every line JSON.
		checkLogLines(t, c)
	})
}

// The HEALTHCHECK through a store that stops taking writes and takes them
// again, with no traffic: the data directory (a bind mount of the user the
// container runs as, the capabilities dropped) made read-only on the host,
// then writable again. The container turns unhealthy with the cause in
// docker inspect's health log and in docker logs (before, only "store
// unavailable" and nothing logged), then healthy again with no restart, and
// takes a payment.
func TestImageHealthFollowsTheStore(t *testing.T) {
	t.Parallel()
	img := need(t)
	net := network(t, false)
	p := startProvider(t, img, net, false)
	dataDir := t.TempDir()
	user := strconv.Itoa(os.Getuid()) + ":" + strconv.Itoa(os.Getgid())
	c := container(t, "idemproxy", append(proxyArgs(t, p), "--network", net, "--user", user, "-v", dataDir+":/data",
		"--health-interval", "1s", "--health-retries", "2", "-p", "127.0.0.1::8080", "-p", "127.0.0.1::9090", img.proxy)...)
	health := func(want string) {
		t.Helper()
		waitFor(t, "health status "+want, func() bool { return inspect(t, c, "{{.State.Health.Status}}") == want })
	}
	health("healthy")
	if out := logs(c); strings.Contains(out, "not ready") {
		t.Errorf("a container that was ready logged not ready:\n%s", out)
	}

	if err := os.Chmod(dataDir, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(dataDir, 0o700) }) // for t.TempDir's removal
	health("unhealthy")
	var checks []struct {
		ExitCode int
		Output   string
	}
	if err := json.Unmarshal([]byte(inspect(t, c, "{{json .State.Health.Log}}")), &checks); err != nil || len(checks) == 0 {
		t.Fatalf("health log: %v %v", checks, err)
	}
	const cause = "not writable (permission denied)"
	if last := checks[len(checks)-1]; last.ExitCode != 1 || !strings.Contains(last.Output, "store unavailable") || !strings.Contains(last.Output, cause) {
		t.Errorf("the failed health check: exit %d, %q; want 1 and the cause (%q)", last.ExitCode, last.Output, cause)
	}
	notReady := regexp.MustCompile(`"level":"WARN","msg":"not ready: the store check failed","err":"[^"]*/data[^"]*` + regexp.QuoteMeta(cause))
	if n := len(notReady.FindAllString(logs(c), -1)); n != 1 {
		t.Errorf("%d WARN lines \"not ready\" with the cause, want 1 (one per change, not per check):\n%s", n, logs(c))
	}

	if err := os.Chmod(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	health("healthy")
	if n := strings.Count(logs(c), `"msg":"ready again: the store check passed"`); n != 1 {
		t.Errorf("%d lines \"ready again\", want 1:\n%s", n, logs(c))
	}
	base := "http://" + published(t, c, "8080")
	if r := post(t, base+"/payments", `{"order_id":"health-1","amount":"10.00","currency":"EUR"}`); r.status != http.StatusCreated {
		t.Errorf("POST /payments once healthy again = %d %s, want 201", r.status, r.body)
	}
	checkLogLines(t, c)
}
