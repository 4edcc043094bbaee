package imagetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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

// readmeComposeCommands are the `docker compose exec` lines of the README's
// compose example, continuation lines joined.
func readmeComposeCommands(t *testing.T, root string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		if !strings.Contains(block[1], "docker compose exec legacy-app") {
			continue
		}
		for _, line := range strings.Split(strings.ReplaceAll(block[1], "\\\n", " "), "\n") {
			if strings.HasPrefix(line, "docker compose exec ") {
				cmds = append(cmds, line)
			}
		}
	}
	if len(cmds) < 4 {
		t.Fatalf("README's compose example has %d `docker compose exec` lines, want the POST, its repeat, the ledger and the metrics", len(cmds))
	}
	return cmds
}

// The README's compose example, run as written against compose.yaml: the
// images are this run's builds, the legacy app is the Debian stand-in with curl.
func TestComposeExample(t *testing.T) {
	t.Parallel()
	img := need(t)
	compose := composeCommand()
	if compose == nil {
		t.Fatal("docker answers but neither `docker compose` nor docker-compose is installed")
	}
	project := uniqueName("compose")
	secretFile := filepath.Join(t.TempDir(), "provider_secret")
	if err := os.WriteFile(secretFile, []byte(randomHex(32)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := append(compose, "-p", project, "-f", filepath.Join(img.root, "compose.yaml"))
	env := append(os.Environ(), "IDEMPROXY_IMAGE="+img.proxy, "SANDBOX_IMAGE="+img.sandbox,
		"LEGACY_APP_IMAGE="+img.bases.Debian, "PROVIDER_SECRET_FILE="+secretFile)
	run := func(args ...string) (string, error) {
		cmd := exec.Command(base[0], append(base[1:], args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := run("logs", "--no-color", "--tail", "60")
			t.Logf("compose logs:\n%s", out)
		}
		if out, err := run("down", "-v", "--remove-orphans", "-t", "5"); err != nil {
			t.Logf("compose down: %v\n%s", err, out)
		}
	})
	// The images exist, so up uses them and builds nothing.
	if out, err := run("up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}

	// As a person types them; -T because the test has no terminal.
	prefix := strings.Join(quoteAll(base), " ") + " exec -T "
	var outs []string
	for _, c := range readmeComposeCommands(t, img.root) {
		sh := exec.Command("sh", "-c", strings.Replace(c, "docker compose exec ", prefix, 1))
		sh.Env = env
		out, err := sh.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", c, err, out)
		}
		outs = append(outs, strings.ReplaceAll(string(out), "\r\n", "\n"))
	}
	first, again, ledger, metrics := outs[0], outs[1], outs[2], outs[3]
	if statusOf(first) != "201" || headerOf(first, "Idempotency-Key") == "" {
		t.Errorf("first POST, want 201 with an Idempotency-Key:\n%s", first)
	}
	if statusOf(again) != "201" || headerOf(again, "Idempotent-Replayed") != "true" ||
		headerOf(again, "Idempotency-Key") != headerOf(first, "Idempotency-Key") {
		t.Errorf("repeat, want the stored 201 replayed with the same key:\n%s", again)
	}
	l := decodeLedger(t, []byte(ledger))
	if l.Executions != 1 || l.ByOrder["order-1"] != 1 || len(l.DuplicateOrders) != 0 {
		t.Errorf("ledger: %d executions, order-1 %d times, duplicates %v; want one execution\n%s",
			l.Executions, l.ByOrder["order-1"], l.DuplicateOrders, ledger)
	}
	if !strings.Contains(metrics, "idemproxy_requests_total") {
		t.Errorf("metrics from inside the network lack idemproxy_requests_total:\n%s", metrics)
	}
}

// quoteAll single-quotes each word for sh.
func quoteAll(words []string) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return out
}
