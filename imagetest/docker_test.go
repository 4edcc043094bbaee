package imagetest

// The harness: builds the images once, runs docker, names everything after
// this run so that parallel runs on one engine never collide, and removes
// what each test made.

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
)

// imageVersion is stamped into the test build with --build-arg VERSION.
const imageVersion = "v0.0.0-imagetest"

// runID prefixes every container, network, volume, image and compose project
// this test binary makes.
var runID = "idemproxy-it-" + randomHex(4)

// images are the Dockerfile's two targets built for this run, and the base
// images they were built on.
type images struct {
	proxy, sandbox string        // tags of the idemproxy and sandbox targets
	bases          baseImages    // what scripts/local-bases.sh made
	buildTime      time.Duration // both targets, from the first docker build to the last
	root           string        // the repository: the build context
}

// baseImages are scripts/local-bases.sh's output.
type baseImages struct {
	Go, Runtime, Debian, Postgres string
}

var (
	buildOnce  sync.Once
	built      images
	buildErr   error
	skipReason string // set when no engine answers
)

func TestMain(m *testing.M) {
	code := m.Run()
	if built.proxy != "" {
		// --no-prune keeps the layers: the next run's build is a cache hit.
		_ = exec.Command("docker", "rmi", "--no-prune", built.proxy, built.sandbox).Run()
	}
	os.Exit(code)
}

// need returns the built images, building them on first use. Where no docker
// engine answers it skips t, or fails it under IDEMPROXY_REQUIRE_DOCKER=1.
func need(t *testing.T) images {
	t.Helper()
	buildOnce.Do(func() { built, skipReason, buildErr = build() })
	if skipReason != "" {
		if os.Getenv("IDEMPROXY_REQUIRE_DOCKER") == "1" {
			t.Fatalf("IDEMPROXY_REQUIRE_DOCKER=1, but %s", skipReason)
		}
		t.Skipf("image tests skipped: %s (IDEMPROXY_REQUIRE_DOCKER=1 makes this a failure)", skipReason)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// build makes the stand-in bases and builds both targets of the Dockerfile on them.
func build() (img images, skip string, err error) {
	if out, err := exec.Command("docker", "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		return img, fmt.Sprintf("no docker engine answers (docker version: %v: %s)", err, bytes.TrimSpace(out)), nil
	}
	if img.root, err = filepath.Abs(".."); err != nil {
		return img, "", err
	}
	script := exec.Command(filepath.Join(img.root, "scripts", "local-bases.sh"))
	var stderr bytes.Buffer
	script.Stderr = &stderr
	out, err := script.Output()
	if err != nil {
		return img, "", fmt.Errorf("scripts/local-bases.sh: %v\n%s", err, stderr.Bytes())
	}
	vars := map[string]string{}
	for _, line := range strings.Fields(string(out)) {
		k, v, _ := strings.Cut(line, "=")
		vars[k] = v
	}
	img.bases = baseImages{Go: vars["GO_IMAGE"], Runtime: vars["RUNTIME_IMAGE"], Debian: vars["DEBIAN_IMAGE"], Postgres: vars["POSTGRES_IMAGE"]}
	if img.bases.Go == "" || img.bases.Runtime == "" || img.bases.Debian == "" || img.bases.Postgres == "" {
		return img, "", fmt.Errorf("scripts/local-bases.sh printed %q, want GO_IMAGE, RUNTIME_IMAGE, DEBIAN_IMAGE and POSTGRES_IMAGE", out)
	}
	img.proxy, img.sandbox = runID+"-proxy:test", runID+"-sandbox:test"
	start := time.Now()
	for _, b := range []struct{ target, tag string }{{"idemproxy", img.proxy}, {"sandbox", img.sandbox}} {
		cmd := exec.Command("docker", "build", "--target", b.target, "-t", b.tag,
			"--build-arg", "GO_IMAGE="+img.bases.Go, "--build-arg", "RUNTIME_IMAGE="+img.bases.Runtime,
			"--build-arg", "VERSION="+imageVersion, img.root)
		if out, err := cmd.CombinedOutput(); err != nil {
			return img, "", fmt.Errorf("docker build --target %s: %v\n%s", b.target, err, tail(out, 4000))
		}
	}
	img.buildTime = time.Since(start)
	return img, "", nil
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var seq atomic.Int64

// uniqueName is a docker object name no other test or run uses.
func uniqueName(what string) string {
	return fmt.Sprintf("%s-%d-%s", runID, seq.Add(1), what)
}

// dockerCmd runs the docker CLI and returns its trimmed output, stdout and
// stderr together.
func dockerCmd(args ...string) (string, error) {
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return strings.TrimSpace(string(out)), nil
}

// docker runs the docker CLI and fails t unless it succeeds.
func docker(t testing.TB, args ...string) string {
	t.Helper()
	out, err := dockerCmd(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// network creates a private bridge network, removed after t. An internal
// network has no route out of it.
func network(t testing.TB, internal bool) string {
	t.Helper()
	name := uniqueName("net")
	args := []string{"network", "create", name}
	if internal {
		args = append(args, "--internal")
	}
	docker(t, args...)
	t.Cleanup(func() { _, _ = dockerCmd("network", "rm", name) })
	return name
}

// volume creates a named volume, removed after t.
func volume(t testing.TB) string {
	t.Helper()
	name := uniqueName("vol")
	docker(t, "volume", "create", name)
	t.Cleanup(func() { _, _ = dockerCmd("volume", "rm", "-f", name) })
	return name
}

// container runs `docker run -d --name <name> args...` and removes the
// container after t, printing its log if t failed.
func container(t testing.TB, what string, args ...string) string {
	t.Helper()
	name := uniqueName(what)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("docker", "logs", "--tail", "60", name).CombinedOutput()
			t.Logf("docker logs %s:\n%s", what, out)
		}
		_, _ = dockerCmd("rm", "-f", "-v", name)
	})
	docker(t, append([]string{"run", "-d", "--name", name}, args...)...)
	return name
}

// published is the loopback address that port (e.g. "8080") of container is
// published on; it changes when the container restarts.
func published(t testing.TB, container, port string) string {
	t.Helper()
	for _, line := range strings.Split(docker(t, "port", container, port+"/tcp"), "\n") {
		if strings.HasPrefix(line, "127.0.0.1:") {
			return line
		}
	}
	t.Fatalf("port %s of %s is not published on 127.0.0.1", port, container)
	return ""
}

// waitFor polls cond until it holds, failing t after a generous deadline:
// the machine is shared, so the deadline is only a guard against hanging.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logs is the container's output so far.
func logs(container string) string {
	out, _ := exec.Command("docker", "logs", container).CombinedOutput()
	return string(out)
}

// checkLogLines fails t unless every line of the container's log so far is
// a JSON object with time, level and msg: the format the README's Logs
// section gives, which a log pipeline reads at each line's level.
func checkLogLines(t testing.TB, container string) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(logs(container)), "\n") {
		var l struct{ Time, Level, Msg string }
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.Time == "" || l.Level == "" || l.Msg == "" {
			t.Errorf("docker logs: not a JSON log line with time, level and msg: %s", line)
		}
	}
}

// waitLog waits until the container's log has n lines containing s.
func waitLog(t testing.TB, container, s string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d log lines with %q from %s", n, s, container), func() bool {
		return strings.Count(logs(container), s) >= n
	})
}

// inspect is `docker inspect -f format container`.
func inspect(t testing.TB, container, format string) string {
	t.Helper()
	return docker(t, "inspect", "-f", format, container)
}

// waitExit waits for the container to stop and returns its exit code.
func waitExit(t testing.TB, container string) string {
	t.Helper()
	return docker(t, "wait", container)
}

// reply is an HTTP answer as the tests look at it.
type reply struct {
	status int
	header http.Header
	body   string
}

// code is the error code of an idemproxy or provider error body.
func (r reply) code() string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(r.body), &e)
	return e.Error.Code
}

var client = &http.Client{Timeout: 2 * time.Minute}

// post sends a JSON POST from the host to a published loopback address.
func post(t testing.TB, url, body string) reply {
	t.Helper()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the answer: %v", url, err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// get is a GET from the host; it returns the status, or 0 when nothing answered.
func get(url string) (int, []byte) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// ledgerAt reads a sandbox's ledger from a base URL on the host.
func ledgerAt(t testing.TB, base string) sandbox.LedgerSnapshot {
	t.Helper()
	status, body := get(base + "/_sandbox/ledger?full=1")
	if status != http.StatusOK {
		t.Fatalf("GET %s/_sandbox/ledger = %d %s", base, status, body)
	}
	return decodeLedger(t, body)
}

func decodeLedger(t testing.TB, body []byte) sandbox.LedgerSnapshot {
	t.Helper()
	var l sandbox.LedgerSnapshot
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatalf("ledger %q: %v", body, err)
	}
	return l
}

// curl runs curl in a throwaway Debian container on network and returns its
// output: the status line, headers and body with -i.
func curl(t testing.TB, img images, network string, args ...string) string {
	t.Helper()
	return docker(t, append([]string{"run", "--rm", "--network", network, img.bases.Debian, "curl", "-sS"}, args...)...)
}

// statusOf is the status code of curl -i output ("HTTP/1.1 201 Created").
func statusOf(out string) string {
	line, _, _ := strings.Cut(out, "\n")
	if f := strings.Fields(line); len(f) >= 2 {
		return f[1]
	}
	return ""
}

// headerOf is a header's value in curl -i output.
func headerOf(out, name string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
