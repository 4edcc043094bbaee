package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// `idemproxy --help` (and help, -h) prints every variable with the default of
// the contract's table and exits 0; it once printed only the commands,
// leaving an operator without the variables and their defaults at hand.
func TestBinaryHelpListsVariablesAndDefaults(t *testing.T) {
	// The contract's table (docs/contract.md, Configuration).
	defaults := map[string]string{
		"UPSTREAM_URL":                 "required",
		"LISTEN_ADDR":                  "default :8080",
		"ADMIN_ADDR":                   "default :9090",
		"DATA_DIR":                     "default ./data",
		"RECORD_TTL":                   "default 72h",
		"MAX_BODY_BYTES":               "default 1048576",
		"INFLIGHT_WAIT":                "default 10s",
		"KEY_SOURCES":                  "default json:order_id",
		"MISSING_KEY":                  "default reject",
		"SIGN_SECRET":                  "default empty",
		"SIGN_CANONICAL":               `default {timestamp}\n{method}\n{path}\n{body}`,
		"SIGN_ENCODING":                "default hex",
		"SIGNATURE_HEADER":             "default X-Signature",
		"TIMESTAMP_HEADER":             "default X-Timestamp",
		"NONCE_HEADER":                 "default empty",
		"STATIC_HEADERS":               "default empty",
		"RETRY_MAX_ATTEMPTS":           "default 5",
		"RETRY_BASE_DELAY":             "default 500ms",
		"RETRY_MAX_DELAY":              "default 60s",
		"RETRY_BUDGET":                 "default 2m",
		"ATTEMPT_TIMEOUT":              "default 30s",
		"RETRY_STATUSES":               "default 429,500,502,503,504",
		"RETRY_CODES":                  "default idempotency.in_progress,idempotency_in_progress,payout.funds_maturing,payout.frozen",
		"RATE_LIMIT":                   "default 0",
		"RATE_BURST":                   "default 1",
		"STORE_URL":                    "default empty",
		"STORE_URL_FILE":               "default empty",
		"STATUS_PROBE":                 "default empty",
		"STATUS_PROBE_ROUTES":          "default empty",
		"STATUS_PROBE_NOT_FOUND_CODES": "default empty",
		"PROVIDER_KEY_RETENTION":       "default 0",
		"ROUTES":                       "default empty",
		"PRESET":                       "default empty",
		"INPROGRESS_STATUS":            "default 409",
		"INPROGRESS_CODE":              "default idempotency_in_progress",
		"ADMIN_TOKEN":                  "default empty",
		"ADMIN_TOKEN_FILE":             "default empty",
		"SIGN_SECRET_FILE":             "default empty",
	}
	for _, arg := range []string{"--help", "-h", "help"} {
		t.Run(arg, func(t *testing.T) {
			cmd := exec.Command(binPath, arg)
			cmd.Env = []string{} // no configuration needed
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v\n%s", arg, err, stderr.String())
			}
			for name, def := range defaults {
				if want := "IDEMPROXY_" + name + " (" + def + ")\n"; !strings.Contains(string(out), want) {
					t.Errorf("%s does not list %q", arg, strings.TrimSpace(want))
				}
			}
		})
	}
}

// When the start fails on the configuration, the warnings for misspelt
// names still come, before the error: a misspelt IDEMPROXY_UPSTREAM_URL
// stopped the start saying only that IDEMPROXY_UPSTREAM_URL was not set,
// which the operator had (under another name), without a word of the name.
func TestBinaryWarnsOfUnknownVariablesWhenConfigFails(t *testing.T) {
	token := "tok_" + randomHex(t, 12)
	out := startStops(t, 2, "PATH="+os.Getenv("PATH"), "IDEMPROXY_DATA_DIR="+t.TempDir(),
		"IDEMPROXY_UPSTREM_URL=http://127.0.0.1:1", "IDEMPROXY_ADMIN_TOKN="+token)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for name, closest := range map[string]string{"IDEMPROXY_UPSTREM_URL": "IDEMPROXY_UPSTREAM_URL", "IDEMPROXY_ADMIN_TOKN": "IDEMPROXY_ADMIN_TOKEN"} {
		i := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, `"variable":"`+name+`"`) })
		if i < 0 || !strings.Contains(lines[i], `"level":"WARN"`) || jsonField(lines[i], "did_you_mean") != closest {
			t.Errorf("no WARN line naming %s with did_you_mean %s:\n%s", name, closest, out)
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, "IDEMPROXY_UPSTREAM_URL") || !strings.Contains(last, "not set") {
		t.Errorf("the last line is not the error naming IDEMPROXY_UPSTREAM_URL: %s", last)
	}
	if strings.Contains(out, token) {
		t.Errorf("the misspelt variable's value is in the output:\n%s", out)
	}
}

// An IDEMPROXY_ variable that is no setting (a misspelt IDEMPROXY_ADMIN_TOKEN,
// which left the admin API open without a word) is named in a warning at
// start, with the setting it is closest to, and without its value.
func TestBinaryWarnsOfUnknownVariables(t *testing.T) {
	token := "tok_" + randomHex(t, 12)
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", t.TempDir(),
		"IDEMPROXY_ADMIN_TOKN="+token, "IDEMPROXY_MAX_BODY_BYTE=5000",
		// Names are case-sensitive: a lower-case one was ignored without a word.
		"idemproxy_admin_token="+token, "IDEMPROXY_RETRY_MAX_ATTEMPT=3")})
	for name, closest := range map[string]string{"IDEMPROXY_ADMIN_TOKN": "IDEMPROXY_ADMIN_TOKEN", "IDEMPROXY_MAX_BODY_BYTE": "IDEMPROXY_MAX_BODY_BYTES",
		"idemproxy_admin_token": "IDEMPROXY_ADMIN_TOKEN", "IDEMPROXY_RETRY_MAX_ATTEMPT": "IDEMPROXY_RETRY_MAX_ATTEMPTS"} {
		line := p.waitLine(t, `"variable":"`+name+`"`)
		if !strings.Contains(line, `"level":"WARN"`) || jsonField(line, "did_you_mean") != closest {
			t.Errorf("warning for %s = %s; want WARN naming %s", name, line, closest)
		}
	}
	if strings.Contains(p.text(), token) {
		t.Errorf("the misspelt variable's value is in the log:\n%s", p.text())
	}
}
