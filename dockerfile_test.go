package main

// No container engine runs here, so the image is checked in two halves: the
// Dockerfile, compose.yaml and .dockerignore are read and checked for what the
// image must be; and the binary, built with the Dockerfile's flags, is run the
// way the image runs it.

import (
	"debug/elf"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd   string // upper case: FROM, RUN, ...
	args  string
	stage string // the AS name of its stage
}

func parseDockerfile(t *testing.T) []instruction {
	t.Helper()
	raw, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var stage, cur string
	for _, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur += strings.TrimSuffix(trimmed, "\\") + " "
			continue
		}
		cur += trimmed
		cmd, args, _ := strings.Cut(cur, " ")
		cur = ""
		cmd, args = strings.ToUpper(cmd), strings.TrimSpace(args)
		if cmd == "FROM" {
			f := strings.Fields(args)
			stage = f[len(f)-1]
		}
		out = append(out, instruction{cmd, args, stage})
	}
	return out
}

// goDirective is go.mod's go line.
func goDirective(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(string(raw))
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	return m[1]
}

// imageBuildFlags are the go build flags of the Dockerfile, with CGO_ENABLED=0:
// the image-like test builds with exactly these.
func imageBuildFlags(version string) []string {
	return []string{"-trimpath", "-ldflags", "-s -w -X main.version=" + version}
}

func TestDockerfile(t *testing.T) {
	ins := parseDockerfile(t)
	final := ins[len(ins)-1].stage
	var finalIns []instruction
	all := map[string][]string{} // cmd → args, every stage
	for _, in := range ins {
		all[in.cmd] = append(all[in.cmd], in.args)
		if in.stage == final {
			finalIns = append(finalIns, in)
		}
	}
	in := func(cmd string) []string {
		var out []string
		for _, i := range finalIns {
			if i.cmd == cmd {
				out = append(out, i.args)
			}
		}
		return out
	}
	build := ""
	for _, r := range all["RUN"] {
		if strings.Contains(r, "-o /out/idemproxy .") {
			build = r
		}
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"first stage is golang:" + goDirective(t) + " (go.mod's go line)",
			regexp.MustCompile(`^golang:` + regexp.QuoteMeta(goDirective(t)) + `(-\S+)? AS build$`).MatchString(all["FROM"][0])},
		{"static build: CGO_ENABLED=0", slices.ContainsFunc(all["ENV"], func(s string) bool { return strings.Contains(s, "CGO_ENABLED=0") })},
		{"build runs go build -trimpath", strings.HasPrefix(build, "go build -trimpath ")},
		{"build stamps the version: " + `-ldflags "-s -w -X main.version=${VERSION}"`, strings.Contains(build, `-ldflags "-s -w -X main.version=${VERSION}"`)},
		{"VERSION is a build argument", slices.Contains(all["ARG"], "VERSION=dev")},
		{"final stage is distroless static (CA certificates, no shell)", regexp.MustCompile(`^gcr\.io/distroless/static-debian\d+:nonroot AS \S+$`).MatchString(in("FROM")[0])},
		{"final stage runs as a non-root user", len(in("USER")) == 1 && !slices.Contains([]string{"root", "0", "0:0"}, in("USER")[0])},
		{"HEALTHCHECK runs the binary", len(in("HEALTHCHECK")) == 1 && strings.HasSuffix(in("HEALTHCHECK")[0], `CMD ["/idemproxy", "healthcheck"]`)},
		{"VOLUME /data", slices.Equal(in("VOLUME"), []string{"/data"})},
		{"IDEMPROXY_DATA_DIR=/data", slices.ContainsFunc(in("ENV"), func(s string) bool { return strings.Contains(s, "IDEMPROXY_DATA_DIR=/data") })},
		{"EXPOSE 8080 9090, the default ports", slices.Equal(in("EXPOSE"), []string{"8080 9090"})},
		{"ENTRYPOINT is the binary", slices.Equal(in("ENTRYPOINT"), []string{`["/idemproxy"]`})},
		{"/data belongs to the non-root user", slices.Contains(in("COPY"), "--from=build --chown=65532:65532 /out/data /data")},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("Dockerfile: %s", c.name)
		}
	}
	for _, port := range []string{portOf(lookupEnv(nil, "ListenAddr")), portOf(lookupEnv(nil, "AdminAddr"))} {
		if !strings.Contains(in("EXPOSE")[0], port) {
			t.Errorf("Dockerfile does not expose default port %s", port)
		}
	}
	checkVariables(t, "Dockerfile")
}

func portOf(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// checkVariables fails for an IDEMPROXY_ variable in file that config lacks.
func checkVariables(t *testing.T, file string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	ct := reflect.TypeFor[config]()
	for i := range ct.NumField() {
		name, _, _ := strings.Cut(ct.Field(i).Tag.Get("env"), ",")
		known[envPrefix+name] = true
	}
	for _, v := range regexp.MustCompile(`IDEMPROXY_[A-Z0-9_]+`).FindAllString(string(raw), -1) {
		if !known[v] {
			t.Errorf("%s uses %s, which is not a configuration variable", file, v)
		}
	}
}

func TestCompose(t *testing.T) {
	raw, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for _, want := range []string{
		"\n  legacy-app:\n", "\n  idemproxy:\n", "\n  provider:\n",
		"target: idemproxy", "target: sandbox",
		"IDEMPROXY_UPSTREAM_URL: http://provider:8081",
		"- idemproxy-data:/data",
		"replicas: 1",
		"condition: service_healthy",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("compose.yaml lacks %q", want)
		}
	}
	// The engine must wait longer than the drain, or it kills operations in flight.
	grace := regexp.MustCompile(`IDEMPROXY_SHUTDOWN_GRACE: (\d+)s`).FindStringSubmatch(text)
	stop := regexp.MustCompile(`stop_grace_period: (\d+)s`).FindStringSubmatch(text)
	if grace == nil || stop == nil || len(stop[1]) < len(grace[1]) || (len(stop[1]) == len(grace[1]) && stop[1] <= grace[1]) {
		t.Errorf("stop_grace_period %v must exceed IDEMPROXY_SHUTDOWN_GRACE %v", stop, grace)
	}
	checkVariables(t, "compose.yaml")
	sandboxMain, err := os.ReadFile("cmd/sandbox/main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range regexp.MustCompile(`SANDBOX_[A-Z0-9_]+`).FindAllString(text, -1) {
		if !strings.Contains(string(sandboxMain), `"`+v+`"`) {
			t.Errorf("compose.yaml sets %s, which cmd/sandbox does not read", v)
		}
	}
}

func TestDockerignore(t *testing.T) {
	raw, err := os.ReadFile(".dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	for _, want := range []string{".git", "data/", "*.test", ".env*"} {
		if !slices.Contains(lines, want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}

var (
	imageBinOnce sync.Once
	imageBin     string
	imageBinErr  error
)

const imageVersion = "v0.0.0-imagetest"

// buildImageBinary builds the binary as the Dockerfile does, once, into a
// directory any user can read.
func buildImageBinary(t *testing.T) string {
	t.Helper()
	imageBinOnce.Do(func() {
		// Inside TestMain's directory, which is removed after the run; the image's
		// user must be able to reach it.
		dir := filepath.Join(filepath.Dir(binPath), "image")
		if imageBinErr = os.MkdirAll(dir, 0o755); imageBinErr != nil {
			return
		}
		if imageBinErr = os.Chmod(filepath.Dir(binPath), 0o755); imageBinErr != nil {
			return
		}
		imageBin = filepath.Join(dir, "idemproxy")
		cmd := exec.Command("go", append(append([]string{"build"}, imageBuildFlags(imageVersion)...), "-o", imageBin, ".")...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
		out, err := cmd.CombinedOutput()
		if err != nil {
			imageBinErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if imageBinErr != nil {
		t.Fatal(imageBinErr)
	}
	return imageBin
}

// nonroot is the image's user (distroless nonroot).
const nonroot = 65532

// imageUser returns the credential the image runs with when the test can
// switch to it (it runs as root), else nil.
func imageUser(t *testing.T) *syscall.Credential {
	if os.Geteuid() != 0 {
		t.Logf("not root: running as uid %d, not as the image's %d", os.Geteuid(), nonroot)
		return nil
	}
	return &syscall.Credential{Uid: nonroot, Gid: nonroot}
}

func TestImageLikeRun(t *testing.T) {
	bin := buildImageBinary(t)
	checkStatic(t, bin)
	out, err := exec.Command(bin, "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != imageVersion {
		t.Errorf("version = %q, %v; want %q stamped by -ldflags", out, err, imageVersion)
	}

	up := httptest.NewServer(newScriptedProvider())
	defer up.Close()
	cred := imageUser(t)
	root, err := os.MkdirTemp("", "idemproxy-image")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	data := filepath.Join(root, "data") // empty, like a new volume
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chown(data, nonroot, nonroot); err != nil {
			t.Fatal(err)
		}
	}
	admin := "127.0.0.1:" + freePort(t)
	// Only what the image sets, the test's free ports and the upstream.
	env := []string{"IDEMPROXY_DATA_DIR=" + data, "IDEMPROXY_LISTEN_ADDR=127.0.0.1:" + freePort(t),
		"IDEMPROXY_ADMIN_ADDR=" + admin, "IDEMPROXY_UPSTREAM_URL=" + up.URL}
	probe := func() int { return runHealthcheck(t, bin, cred, "IDEMPROXY_ADMIN_ADDR="+admin) }

	if got := probe(); got != 1 {
		t.Errorf("healthcheck before start: exit %d, want 1", got)
	}
	p := launch(t, launchSpec{bin: bin, env: env, cred: cred})
	if got := probe(); got != 0 {
		t.Errorf("healthcheck while ready: exit %d, want 0\n%s", got, p.text())
	}
	body := `{"order_id":"image-1","amount":"5.00"}`
	if r := send(t, "POST", "http://"+p.proxy+"/v1/payments", body); r.status != 201 {
		t.Errorf("POST = %d %s", r.status, r.body)
	}
	if r := send(t, "POST", "http://"+p.proxy+"/v1/payments", body); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("repeat not replayed: %d %v", r.status, r.header)
	}
	if cred != nil {
		checkOwner(t, data, nonroot)
	}
	if err := p.terminate(t); err != nil {
		t.Fatalf("exit on SIGTERM: %v, want 0\n%s", err, p.text())
	}
	if got := probe(); got != 1 {
		t.Errorf("healthcheck after exit: exit %d, want 1", got)
	}
}

// runHealthcheck runs `bin healthcheck` with env only and returns its exit status.
func runHealthcheck(t *testing.T, bin string, cred *syscall.Credential, env ...string) int {
	t.Helper()
	cmd := exec.Command(bin, "healthcheck")
	cmd.Env = env
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("healthcheck: %v\n%s", err, out)
	return -1
}

// checkStatic fails unless bin is a statically linked ELF (no interpreter, no
// shared libraries), as a distroless/static image needs.
func checkStatic(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("binary has a dynamic loader (PT_INTERP): not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs shared libraries %v", libs)
	}
}

// checkOwner fails if anything under dir is not owned by uid.
func checkOwner(t *testing.T, dir string, uid int) {
	t.Helper()
	n := 0
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
			t.Errorf("%s is owned by uid %d, want %d", path, st.Uid, uid)
		}
		n++
		return nil
	})
	if n < 2 {
		t.Errorf("data directory has %d entries: the store wrote nothing?", n)
	}
}
