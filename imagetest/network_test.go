package imagetest

import (
	"encoding/json"
	"strings"
	"testing"
)

// idemproxy between two private networks with no route out: the app's
// network (front) and the provider's (back). A decoy provider on the front
// network is reachable from idemproxy, so that refusing to go there is
// idemproxy's doing, not the network's.
func TestNetworkIsolation(t *testing.T) {
	t.Parallel()
	img := need(t)
	front, back := network(t, true), network(t, true)
	p := startProvider(t, img, back, false)
	decoy := container(t, "decoy", "--network", front, "--network-alias", "decoy",
		"-e", "SANDBOX_PROVIDER=payments", img.sandbox)
	c := container(t, "idemproxy", append(proxyArgs(t, p), "--network", back,
		"-e", "IDEMPROXY_RETRY_MAX_ATTEMPTS=3", "-e", "IDEMPROXY_RETRY_BASE_DELAY=200ms",
		"-e", "IDEMPROXY_RETRY_BUDGET=10s", "-e", "IDEMPROXY_ATTEMPT_TIMEOUT=5s", img.proxy)...)
	docker(t, "network", "connect", "--alias", "idemproxy", front, c)
	app := container(t, "app", "--network", front, "--entrypoint", "sleep", img.bases.Debian, "infinity")
	waitLog(t, decoy, "listening on", 1)
	waitLog(t, c, "idemproxy listening", 1)

	// exec runs curl in the app container; a non-zero exit is returned, not fatal.
	exec := func(args ...string) (string, error) {
		out, err := dockerCmd(append([]string{"exec", app, "curl", "-sS", "--max-time", "60"}, args...)...)
		return strings.ReplaceAll(out, "\r\n", "\n"), err
	}
	ledger := func() []byte {
		return []byte(curl(t, img, back, "http://provider:8081/_sandbox/ledger?full=1"))
	}
	const pay = "http://idemproxy:8080/payments"

	t.Run("idemproxy reaches the provider and nothing outside", func(t *testing.T) {
		// From inside idemproxy's network namespace: the provider answers, a
		// public host (the Debian mirror) cannot even be resolved.
		if out, err := dockerCmd("run", "--rm", "--network", "container:"+c, img.bases.Debian,
			"curl", "-sS", "--max-time", "20", "-o", "/dev/null", "http://deb.debian.org/debian/"); err == nil {
			t.Errorf("idemproxy's network reaches beyond its two networks: %s", out)
		}
		if out := docker(t, "run", "--rm", "--network", "container:"+c, img.bases.Debian,
			"curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "http://provider:8081/_sandbox/ledger"); out != "200" {
			t.Errorf("provider from idemproxy's network = %q, want 200", out)
		}
		if out, err := exec("-o", "/dev/null", "http://provider:8081/_sandbox/ledger"); err == nil {
			t.Errorf("the app reached the provider directly: %s", out)
		}
	})

	t.Run("requests for other hosts are refused", func(t *testing.T) {
		// Forward-proxy form (absolute URI) and CONNECT: refused by idemproxy.
		out, _ := exec("-i", "-x", "http://idemproxy:8080", "http://decoy:8081/payments",
			"-H", "Content-Type: application/json", "-d", `{"order_id":"net-proxy","amount":"1.00"}`)
		if statusOf(out) != "400" || !strings.Contains(out, "bad_request") {
			t.Errorf("absolute-URI request for decoy, want 400 bad_request:\n%s", out)
		}
		out, _ = exec("-i", "-p", "-x", "http://idemproxy:8080", "http://decoy:8081/payments")
		if !strings.Contains(out, " 405 ") {
			t.Errorf("CONNECT to decoy, want 405:\n%s", out)
		}
		// Another Host header: still the one configured upstream.
		out, _ = exec("-i", "-H", "Host: decoy:8081", pay,
			"-H", "Content-Type: application/json", "-d", `{"order_id":"net-host","amount":"1.00"}`)
		if statusOf(out) != "201" {
			t.Errorf("request with Host: decoy, want 201 from the provider:\n%s", out)
		}
		if l := decodeLedger(t, ledger()); l.ByOrder["net-host"] != 1 {
			t.Errorf("the provider executed net-host %d times, want 1", l.ByOrder["net-host"])
		}
		if d, _ := exec("http://decoy:8081/_sandbox/ledger?full=1"); decodeLedger(t, []byte(d)).Executions != 0 {
			t.Errorf("the decoy executed something: %s", d)
		}
	})

	t.Run("provider cut off, then back: same key", func(t *testing.T) {
		const order = `{"order_id":"net-cut","amount":"3.00"}`
		docker(t, "network", "disconnect", back, p.name)
		out, _ := exec("-i", pay, "-H", "Content-Type: application/json", "-d", order)
		key := headerOf(out, "Idempotency-Key")
		var body struct {
			Error struct {
				Code           string `json:"code"`
				IdempotencyKey string `json:"idempotency_key"`
			} `json:"error"`
		}
		_ = json.Unmarshal([]byte(out[strings.Index(out, "\n\n")+2:]), &body)
		if s := statusOf(out); (s != "502" && s != "504") || body.Error.Code != "upstream_unavailable" || key == "" ||
			body.Error.IdempotencyKey != key {
			t.Fatalf("with the provider cut off, want 502/504 upstream_unavailable with the key in header and body:\n%s", out)
		}
		docker(t, "network", "connect", "--alias", "provider", back, p.name)
		out, _ = exec("-i", pay, "-H", "Content-Type: application/json", "-d", order)
		if statusOf(out) != "201" || headerOf(out, "Idempotency-Key") != key {
			t.Errorf("after reconnecting, want 201 with key %s:\n%s", key, out)
		}
		l := decodeLedger(t, ledger())
		if l.ByOrder["net-cut"] != 1 || l.ByKey[key] != 1 {
			t.Errorf("net-cut executed %d times, %d with key %s; want once with it", l.ByOrder["net-cut"], l.ByKey[key], key)
		}
	})
}
