package imagetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// composeCommand is `docker compose` where the plugin is installed, else the
// standalone docker-compose; nil when there is neither.
func composeCommand() []string {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if exec.Command("docker-compose", "version").Run() == nil {
		return []string{"docker-compose"}
	}
	return nil
}

// readmeComposeCommands are the lines of the README's compose examples that
// start with prefix (e.g. "docker compose exec "), continuation lines joined.
func readmeComposeCommands(t *testing.T, root, prefix string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		for _, line := range strings.Split(strings.ReplaceAll(block[1], "\\\n", " "), "\n") {
			if strings.HasPrefix(line, prefix) {
				cmds = append(cmds, line)
			}
		}
	}
	if len(cmds) < 3 {
		t.Fatalf("the README has %d lines starting %q, want the POST, its repeat and the ledger", len(cmds), prefix)
	}
	return cmds
}

// readmeSetup are the lines of the README's sh block holding the line up
// (the example's `docker compose … up`) that come before it, comments left
// out: what a person runs first, in the repository, to make the secret files.
func readmeSetup(t *testing.T, root, up string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		var setup []string
		for _, line := range strings.Split(strings.ReplaceAll(block[1], "\\\n", " "), "\n") {
			if line == up {
				return setup
			}
			if line != "" && !strings.HasPrefix(line, "#") {
				setup = append(setup, line)
			}
		}
	}
	t.Fatalf("the README has no sh block with the line %q", up)
	return nil
}

// composeProject brings file up as a project of its own, with this run's
// images (and the stand-ins for the ones it would pull), and takes it down after t.
type composeProject struct {
	base []string // the compose command with -p and -f
	env  []string
}

// exampleVarPrefix starts the name of every variable a compose example reads
// a secret file's host path from: ${IDEMPROXY_EXAMPLE_<NAME>_FILE:-./secrets/<name>}.
// A generic name (POSTGRES_PASSWORD_FILE, STORE_URL_FILE) left exported in a
// shell or CI would point the secret at another file.
const exampleVarPrefix = "IDEMPROXY_EXAMPLE_"

// upCompose runs the README's setup lines before its line up in a
// directory of the test's own, under umask 077 (compose mounts secret files
// with their host mode, and idemproxy reads them as uid 65532: the lines
// must make them readable), points file's secrets at the files they made
// (each secret's file is ${IDEMPROXY_EXAMPLE_<NAME>_FILE:-./secrets/<name>}
// in the compose file) with the generic <NAME>_FILE set to a decoy, and
// brings file up.
func upCompose(t *testing.T, img images, file, up string) composeProject {
	t.Helper()
	compose := composeCommand()
	if compose == nil {
		t.Fatal("docker answers but neither `docker compose` nor docker-compose is installed")
	}
	yaml, err := os.ReadFile(filepath.Join(img.root, file))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*file:\s*\$\{([A-Za-z0-9_]*)`).FindAllStringSubmatch(string(yaml), -1) {
		if !strings.HasPrefix(m[1], exampleVarPrefix) {
			t.Errorf("%s reads a secret file's path from ${%s}, want a name starting %s", file, m[1], exampleVarPrefix)
		}
	}
	dir := t.TempDir()
	for _, line := range readmeSetup(t, img.root, up) {
		sh := exec.Command("sh", "-c", "umask 077; "+line)
		sh.Dir = dir
		if out, err := sh.CombinedOutput(); err != nil {
			t.Fatalf("README setup line %s: %v\n%s", line, err, out)
		}
	}
	made, err := os.ReadDir(filepath.Join(dir, "secrets"))
	if err != nil || len(made) == 0 {
		t.Fatalf("the README's setup lines for %s made no secret files: %v", file, err)
	}
	env := append(os.Environ(), "IDEMPROXY_IMAGE="+img.proxy, "SANDBOX_IMAGE="+img.sandbox,
		"LEGACY_APP_IMAGE="+img.bases.Debian, "POSTGRES_IMAGE="+img.bases.Postgres)
	decoy := filepath.Join(t.TempDir(), "decoy")
	if err := os.WriteFile(decoy, []byte("decoy, not a secret of the example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range made {
		generic := strings.ToUpper(f.Name()) + "_FILE"
		v := exampleVarPrefix + generic
		if !strings.Contains(string(yaml), "file: ${"+v+":-./secrets/"+f.Name()+"}") {
			t.Fatalf("the README makes secrets/%s, but %s does not read it as ${%s:-./secrets/%s}", f.Name(), file, v, f.Name())
		}
		env = append(env, v+"="+filepath.Join(dir, "secrets", f.Name()), generic+"="+decoy)
	}
	p := composeProject{
		base: append(compose, "-p", uniqueName("compose"), "-f", filepath.Join(img.root, file)),
		env:  env,
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := p.run("logs", "--no-color", "--tail", "60")
			t.Logf("compose logs:\n%s", out)
		}
		if out, err := p.run("down", "-v", "--remove-orphans", "-t", "5"); err != nil {
			t.Logf("compose down: %v\n%s", err, out)
		}
	})
	// The images exist, so up uses them and builds nothing.
	if out, err := p.run("up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	return p
}

func (p composeProject) run(args ...string) (string, error) {
	cmd := exec.Command(p.base[0], append(p.base[1:], args...)...)
	cmd.Env = p.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// readme runs the README's lines that start with prefix, as a person types
// them but with -T (the test has no terminal), and returns their outputs.
func (p composeProject) readme(t *testing.T, root, prefix string) []string {
	t.Helper()
	with := strings.Join(quoteAll(p.base), " ") + " exec -T "
	var outs []string
	for _, c := range readmeComposeCommands(t, root, prefix) {
		sh := exec.Command("sh", "-c", strings.Replace(c, prefix, with, 1))
		sh.Env = p.env
		out, err := sh.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", c, err, out)
		}
		outs = append(outs, strings.ReplaceAll(string(out), "\r\n", "\n"))
	}
	return outs
}

// checkOnce checks a README sequence: a 201, its repeat replayed with the
// same key, and a ledger with one execution of order.
func checkOnce(t *testing.T, outs []string, order string) {
	t.Helper()
	first, again, ledger := outs[0], outs[1], outs[2]
	if statusOf(first) != "201" || headerOf(first, "Idempotency-Key") == "" {
		t.Errorf("first POST, want 201 with an Idempotency-Key:\n%s", first)
	}
	if statusOf(again) != "201" || headerOf(again, "Idempotent-Replayed") != "true" ||
		headerOf(again, "Idempotency-Key") != headerOf(first, "Idempotency-Key") {
		t.Errorf("repeat, want the stored 201 replayed with the same key:\n%s", again)
	}
	l := decodeLedger(t, []byte(ledger))
	if l.Executions != 1 || l.ByOrder[order] != 1 || len(l.DuplicateOrders) != 0 {
		t.Errorf("ledger: %d executions, %s %d times, duplicates %v; want one execution\n%s",
			l.Executions, order, l.ByOrder[order], l.DuplicateOrders, ledger)
	}
}

// The README's compose example, run as written against compose.yaml.
func TestComposeExample(t *testing.T) {
	t.Parallel()
	img := need(t)
	p := upCompose(t, img, "compose.yaml", "docker compose up --build -d")
	outs := p.readme(t, img.root, "docker compose exec ")
	checkOnce(t, outs, "order-1")
	if len(outs) < 4 || !strings.Contains(outs[3], "idemproxy_requests_total") {
		t.Errorf("the README's metrics command, from inside the network, shows no idemproxy_requests_total: %q", outs[3:])
	}
	// compose.yaml's mem_limit: 256m, 40% of it for Go (its comment, README Memory).
	log, err := p.run("logs", "--no-color", "idemproxy")
	if err != nil {
		t.Fatalf("compose logs: %v\n%s", err, log)
	}
	checkGoLimit(t, log)

	// A crash: the store on the volume outlives it, and the restarted
	// process replays the order.
	p.crash(t, "idemproxy")
	if out := p.pay(t, "idemproxy", `{"order_id":"order-1","amount":"10.00","currency":"EUR"}`); statusOf(out) != "201" ||
		headerOf(out, "Idempotent-Replayed") != "true" || headerOf(out, "Idempotency-Key") != headerOf(outs[0], "Idempotency-Key") {
		t.Errorf("order-1 after the restart, want the stored 201 replayed with its key:\n%s", out)
	}
}

// The README's replicas example: two idemproxy containers on one PostgreSQL
// (the Debian-packaged stand-in), the database password and the store URL
// from secret files the README's lines make; the repeat goes to the other
// replica.
func TestComposeReplicasExample(t *testing.T) {
	t.Parallel()
	img := need(t)
	p := upCompose(t, img, "compose.replicas.yaml", "docker compose -f compose.replicas.yaml up --build -d")
	outs := p.readme(t, img.root, "docker compose -f compose.replicas.yaml exec ")
	checkOnce(t, outs, "order-2")

	// The other way round: an order through idemproxy-b, replayed by
	// idemproxy-a; and idemproxy-a crashed meanwhile, started again by its
	// restart policy while idemproxy-b served.
	const order3 = `{"order_id":"order-3","amount":"5.00","currency":"EUR"}`
	var first string
	p.crash(t, "idemproxy-a", func() {
		if first = p.pay(t, "idemproxy-b", order3); statusOf(first) != "201" || headerOf(first, "Idempotent-Replayed") != "" {
			t.Errorf("order-3 through idemproxy-b while idemproxy-a restarts, want 201 executed:\n%s", first)
		}
	})
	again := p.pay(t, "idemproxy-a", order3)
	if statusOf(again) != "201" || headerOf(again, "Idempotent-Replayed") != "true" ||
		headerOf(again, "Idempotency-Key") != headerOf(first, "Idempotency-Key") {
		t.Errorf("order-3 repeated through the restarted idemproxy-a, want the stored 201 replayed with its key:\n%s", again)
	}
	ledger, err := p.run("exec", "-T", "legacy-app", "curl", "-sS", "http://provider:8081/_sandbox/ledger")
	if err != nil {
		t.Fatalf("ledger: %v\n%s", err, ledger)
	}
	if l := decodeLedger(t, []byte(ledger)); l.ByOrder["order-3"] != 1 || len(l.DuplicateOrders) != 0 {
		t.Errorf("order-3 executed %d times, duplicates %v; want once\n%s", l.ByOrder["order-3"], l.DuplicateOrders, ledger)
	}
}

// pay POSTs a JSON order to service's proxy port from the legacy app and
// returns curl -i's output.
func (p composeProject) pay(t *testing.T, service, body string) string {
	t.Helper()
	out, err := p.run("exec", "-T", "legacy-app", "curl", "-sSi", "--max-time", "60", "http://"+service+":8080/payments",
		"-H", "Content-Type: application/json", "-d", body)
	if err != nil {
		t.Fatalf("POST to %s: %v\n%s", service, err, out)
	}
	return strings.ReplaceAll(out, "\r\n", "\n")
}

// crash kills service's process with SIGKILL from the host, as the kernel's
// OOM killer does (docker kill would count as a stop the operator asked
// for, which no restart policy undoes), runs meanwhile (if any) while it is
// down, and waits for the restart policy to have started it again and for
// it to be healthy.
func (p composeProject) crash(t *testing.T, service string, meanwhile ...func()) {
	t.Helper()
	id, err := p.run("ps", "-q", service)
	id = strings.TrimSpace(id)
	if err != nil || id == "" {
		t.Fatalf("compose ps -q %s: %v %q", service, err, id)
	}
	restarts := inspect(t, id, "{{.RestartCount}}")
	pid, err := strconv.Atoi(inspect(t, id, "{{.State.Pid}}"))
	if err != nil || pid <= 1 {
		t.Fatalf("%s: no process to kill (pid %d, %v)", service, pid, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -KILL %d (%s's process; the test runs as root where docker does): %v", pid, service, err)
	}
	for _, f := range meanwhile {
		f()
	}
	killed := time.Now()
	waitFor(t, service+" started again by its restart policy and healthy", func() bool {
		if inspect(t, id, "{{.RestartCount}}") == restarts {
			if time.Since(killed) > 20*time.Second {
				t.Fatalf("%s killed 20 s ago and not started again: %s (no restart policy?)", service, inspect(t, id, "{{.State.Status}} {{.HostConfig.RestartPolicy.Name}}"))
			}
			return false
		}
		return inspect(t, id, "{{.State.Health.Status}}") == "healthy"
	})
}

// quoteAll single-quotes each word for sh.
func quoteAll(words []string) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return out
}
