package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/upstream"
)

// Configuration that parses but cannot work stops the process with exit 2 and
// a message naming every variable at fault.
func TestConfigBounds(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + t.TempDir()}
	tests := []struct {
		name string
		env  []string
		want []string // substrings of the message
	}{
		{"attempts above the ceiling", []string{"IDEMPROXY_RETRY_MAX_ATTEMPTS=1000000"}, []string{"IDEMPROXY_RETRY_MAX_ATTEMPTS", "from 1 to 20"}},
		{"attempts one above", []string{"IDEMPROXY_RETRY_MAX_ATTEMPTS=21"}, []string{"IDEMPROXY_RETRY_MAX_ATTEMPTS"}},
		// 2562047h + 1h overflowed the lease to a negative duration that a
		// one-minute TTL passed: two executions of one order.
		{"budget that overflows the lease", []string{"IDEMPROXY_RETRY_BUDGET=2562047h", "IDEMPROXY_ATTEMPT_TIMEOUT=1h", "IDEMPROXY_RECORD_TTL=1m"}, []string{"IDEMPROXY_RETRY_BUDGET", "24h"}},
		{"attempt timeout that overflows the lease", []string{"IDEMPROXY_ATTEMPT_TIMEOUT=2562047h", "IDEMPROXY_RECORD_TTL=1m"}, []string{"IDEMPROXY_ATTEMPT_TIMEOUT"}},
		{"absurd body cap", []string{"IDEMPROXY_MAX_BODY_BYTES=1099511627776"}, []string{"IDEMPROXY_MAX_BODY_BYTES", "64 MiB"}},
		{"byte bound below the body cap", []string{"IDEMPROXY_MAX_BODY_BYTES=1048576", "IDEMPROXY_MAX_INFLIGHT_BYTES=1000000"}, []string{"IDEMPROXY_MAX_INFLIGHT_BYTES", "MAX_BODY_BYTES"}},
		{"negative request bound", []string{"IDEMPROXY_MAX_INFLIGHT=-1"}, []string{"IDEMPROXY_MAX_INFLIGHT"}},
		// Secrets of white space only once started: signing with a key of
		// three spaces, or client tokens that parse as none.
		{"sign secret of spaces", []string{"IDEMPROXY_SIGN_SECRET=   "}, []string{"IDEMPROXY_SIGN_SECRET", "white space"}},
		{"client tokens of spaces", []string{"IDEMPROXY_CLIENT_TOKENS= ", "IDEMPROXY_KEY_SECRET=key-secret-0123456789"}, []string{"IDEMPROXY_CLIENT_TOKENS", "white space"}},
		{"key secret of spaces", []string{"IDEMPROXY_CLIENT_TOKENS=app=0123456789abcdef", "IDEMPROXY_KEY_SECRET=                "}, []string{"IDEMPROXY_KEY_SECRET", "white space"}},
		// +Inf once started with no limit at all, as if it were 0 (off).
		{"infinite rate", []string{"IDEMPROXY_RATE_LIMIT=+Inf"}, []string{"IDEMPROXY_RATE_LIMIT"}},
		{"rate not a number", []string{"IDEMPROXY_RATE_LIMIT=NaN"}, []string{"IDEMPROXY_RATE_LIMIT"}},
		// An unknown placeholder once went to the provider as literal braces.
		{"probe placeholder unknown", []string{"IDEMPROXY_STATUS_PROBE=GET /payments/{payment_id}"}, []string{"IDEMPROXY_STATUS_PROBE", "{payment_id}"}},
		// A GET probe's body was sent, and many providers drop or refuse
		// one: the lookup before every re-send found nothing or failed.
		// (The data directory cannot be made: taken, it stops with 1.)
		{"GET probe with a body", []string{`IDEMPROXY_STATUS_PROBE=GET /payments/search {"order_id":"{req.order_id}"}`, "IDEMPROXY_DATA_DIR=/dev/null/x"}, []string{"IDEMPROXY_STATUS_PROBE", "has no body"}},
		{"probe routes with a policy", []string{"IDEMPROXY_STATUS_PROBE_ROUTES=POST /payments=unprotected"}, []string{"IDEMPROXY_STATUS_PROBE_ROUTES", "no =POLICY"}},
		{"probe routes without a path", []string{"IDEMPROXY_STATUS_PROBE_ROUTES=POST payments"}, []string{"IDEMPROXY_STATUS_PROBE_ROUTES", "must start with /"}},
		{"probe not-found code with a status", []string{"IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES=404 payout.not_found"}, []string{"IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES", "comma list of error codes"}},
		{"same listen and admin address", []string{"IDEMPROXY_LISTEN_ADDR=:8080", "IDEMPROXY_ADMIN_ADDR=:8080"}, []string{"IDEMPROXY_LISTEN_ADDR", "IDEMPROXY_ADMIN_ADDR"}},
		// These once started, opened the store, and stopped with status 1
		// and "listen bogus: ...", naming no variable.
		{"listen address without a port", []string{"IDEMPROXY_LISTEN_ADDR=bogus"}, []string{"IDEMPROXY_LISTEN_ADDR"}},
		{"listen port out of range", []string{"IDEMPROXY_LISTEN_ADDR=127.0.0.1:99999"}, []string{"IDEMPROXY_LISTEN_ADDR"}},
		{"admin address without a port", []string{"IDEMPROXY_ADMIN_ADDR=localhost"}, []string{"IDEMPROXY_ADMIN_ADDR"}},
		{"admin port not a number", []string{"IDEMPROXY_ADMIN_ADDR=:nine"}, []string{"IDEMPROXY_ADMIN_ADDR"}},
		// The token header once could be Idempotency-Key: the token became
		// the app's key, echoed in answers and logged.
		{"client header is the key header", []string{"IDEMPROXY_CLIENT_TOKENS=app=0123456789abcdef", "IDEMPROXY_KEY_SECRET=key-secret-0123456789", "IDEMPROXY_CLIENT_HEADER=idempotency-key"}, []string{"IDEMPROXY_CLIENT_HEADER", "Idempotency-Key"}},
		{"client header is Host", []string{"IDEMPROXY_CLIENT_TOKENS=app=0123456789abcdef", "IDEMPROXY_KEY_SECRET=key-secret-0123456789", "IDEMPROXY_CLIENT_HEADER=Host"}, []string{"IDEMPROXY_CLIENT_HEADER"}},
		{"client header is the signature header", []string{"IDEMPROXY_CLIENT_HEADER=X-Signature"}, []string{"IDEMPROXY_CLIENT_HEADER"}},
		{"client header is a static header", []string{"IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-1", "IDEMPROXY_CLIENT_HEADER=X-Public-Id"}, []string{"IDEMPROXY_CLIENT_HEADER"}},
		{"client header not a header name", []string{"IDEMPROXY_CLIENT_HEADER=App Token"}, []string{"IDEMPROXY_CLIENT_HEADER"}},
		// A header key source once could be the token header: every order
		// of one app then had one key, its token.
		{"client header is a key source", []string{"IDEMPROXY_CLIENT_TOKENS=app=0123456789abcdef", "IDEMPROXY_KEY_SECRET=key-secret-0123456789", "IDEMPROXY_CLIENT_HEADER=X-App-Token", "IDEMPROXY_KEY_SOURCES=json:order_id,header:X-App-Token"}, []string{"IDEMPROXY_CLIENT_HEADER", "X-App-Token"}},
		{"client header is a key source, other case", []string{"IDEMPROXY_CLIENT_HEADER=x-app-token", "IDEMPROXY_KEY_SOURCES=header:X-APP-TOKEN"}, []string{"IDEMPROXY_CLIENT_HEADER"}},
		{"client header is a route's key source", []string{"IDEMPROXY_CLIENT_HEADER=X-App-Token", "IDEMPROXY_ROUTES=POST /v1/payout/info=unprotected; POST /v1/payouts=key:json:order_id,header:x-app-token"}, []string{"IDEMPROXY_CLIENT_HEADER"}},
		{"client header is a route's key source, preset set", []string{"IDEMPROXY_PRESET=payouts", "IDEMPROXY_CLIENT_HEADER=X-Order", "IDEMPROXY_ROUTES=POST /v1/payouts=key:header:X-Order"}, []string{"IDEMPROXY_CLIENT_HEADER"}},
		{"same port, wildcard and loopback", []string{"IDEMPROXY_LISTEN_ADDR=127.0.0.1:9090", "IDEMPROXY_ADMIN_ADDR=:9090"}, []string{"IDEMPROXY_LISTEN_ADDR", "IDEMPROXY_ADMIN_ADDR"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := command(nil, append(base, tt.env...), io.Discard, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("message %q does not say %q", stderr.String(), w)
				}
			}
		})
	}
}

// A start refused on its configuration logs as the process always does:
// JSON lines on stderr (README, Logs), the error last, at ERROR, naming the
// variable. It was a line of plain text, the only one a JSON log pipeline
// could not read, and so not seen at its level.
func TestConfigErrorIsALogLine(t *testing.T) {
	var stderr bytes.Buffer
	env := []string{"IDEMPROXY_UPSTREM_URL=http://127.0.0.1:1", "IDEMPROXY_SIGN_SECRET_FILE=/nonexistent/\"quoted\""}
	if code := command(nil, env, io.Discard, &stderr); code != 2 {
		t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	var last struct{ Time, Level, Msg, Err string }
	for _, line := range lines {
		last.Time, last.Level, last.Msg, last.Err = "", "", "", ""
		if err := json.Unmarshal([]byte(line), &last); err != nil || last.Time == "" || last.Level == "" || last.Msg == "" {
			t.Errorf("not a JSON log line with time, level and msg (%v): %s", err, line)
		}
	}
	if len(lines) < 2 || last.Level != "ERROR" || !strings.Contains(last.Err, "IDEMPROXY_UPSTREAM_URL") {
		t.Errorf("want the misspelling's WARN line, then an ERROR line whose err names IDEMPROXY_UPSTREAM_URL:\n%s", stderr.String())
	}
}

// A RETRY_CODES list written with another separator than the comma once
// started as one code that no answer carries: every 409
// payout.funds_maturing was stored as final and the payout dropped.
// (loadConfig, not command: a list accepted would serve.)
func TestConfigRetryCodesRefused(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}
	for _, list := range []string{"payout.funds_maturing; payout.frozen", "payout.funds_maturing payout.frozen", `"payout.frozen"`} {
		_, _, err := loadConfig(append(base, "IDEMPROXY_RETRY_CODES="+list))
		if err == nil || !strings.Contains(err.Error(), "IDEMPROXY_RETRY_CODES") {
			t.Errorf("RETRY_CODES=%q: %v, want a refusal naming IDEMPROXY_RETRY_CODES", list, err)
		}
	}
}

// A KEY_SOURCES list (or a route's key: sources) written with ; or |
// between its sources once started as one source, a field of that whole
// name that no request has: with MISSING_KEY=generate the real binary gave
// each of two identical POSTs of one order its own random key, and the
// provider executed the order twice. (loadConfig: a list accepted would serve.)
func TestConfigKeySourcesSeparatorRefused(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_MISSING_KEY=generate"}
	for _, tt := range []struct{ env, name string }{
		{"IDEMPROXY_KEY_SOURCES=json:order_id;header:X-Order-Id", "IDEMPROXY_KEY_SOURCES"},
		{"IDEMPROXY_KEY_SOURCES=json:order_id|query:order_id", "IDEMPROXY_KEY_SOURCES"},
		{"IDEMPROXY_ROUTES=POST /payouts=key:json:payout.id|header:X-Payout-Id", "IDEMPROXY_ROUTES"},
	} {
		_, _, err := loadConfig(append(base, tt.env))
		if err == nil || !strings.Contains(err.Error(), tt.name) || !strings.Contains(err.Error(), "separate sources with commas") {
			t.Errorf("%s: %v, want a refusal naming %s", tt.env, err, tt.name)
		}
	}
}

func TestConfigAccepts(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}
	for _, env := range [][]string{
		{"IDEMPROXY_RETRY_MAX_ATTEMPTS=20"},
		{"IDEMPROXY_RETRY_BUDGET=24h", "IDEMPROXY_ATTEMPT_TIMEOUT=24h", "IDEMPROXY_RECORD_TTL=49h"},
		{"IDEMPROXY_LISTEN_ADDR=127.0.0.1:8080", "IDEMPROXY_ADMIN_ADDR=127.0.0.2:8080"},
		{"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0"},
		{"IDEMPROXY_LISTEN_ADDR=[::1]:8080", "IDEMPROXY_ADMIN_ADDR=localhost:9090"},
		{"IDEMPROXY_CLIENT_TOKENS=app=0123456789abcdef", "IDEMPROXY_KEY_SECRET=key-secret-0123456789", "IDEMPROXY_CLIENT_HEADER=X-App-Token"},
		{"IDEMPROXY_CLIENT_HEADER=X-App-Token", "IDEMPROXY_KEY_SOURCES=header:X-Order-Id", "IDEMPROXY_ROUTES=POST /x=key:header:X-Other"},
		{"IDEMPROXY_LISTEN_ADDR=:http", "IDEMPROXY_ADMIN_ADDR=0.0.0.0:65535"},
		{"IDEMPROXY_RETRY_CODES= payout.frozen , ERR-42:x,"},
		{"IDEMPROXY_RATE_LIMIT=0.000278"},
		{"IDEMPROXY_RATE_LIMIT=0.5", "IDEMPROXY_RATE_BURST=3"},
		{"IDEMPROXY_SIGN_CANONICAL={timestamp}"},
		// Base64 tokens end in =; a token may hold = inside.
		{"IDEMPROXY_CLIENT_TOKENS=app=MDEyMzQ1Njc4OWFiY2RlZg==, b = x=0123456789abcdef", "IDEMPROXY_KEY_SECRET=key-secret-0123456789"},
	} {
		if _, _, err := loadConfig(append(base, env...)); err != nil {
			t.Errorf("%v refused: %v", env, err)
		}
	}
}

// A client named default was given the records stored while client tokens
// were off, every app's, and was replayed their answers: the name is
// refused, however the list spaces it, and names that only start with it
// are not. (loadConfig, not command: a list accepted would serve.)
func TestConfigClientNamedDefault(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_KEY_SECRET=key-secret-0123456789"}
	for _, list := range []string{"default=0123456789abcdef", "app=0123456789abcdef, default =\tfedcba9876543210"} {
		_, _, err := loadConfig(append(base, "IDEMPROXY_CLIENT_TOKENS="+list))
		if err == nil || !strings.Contains(err.Error(), "IDEMPROXY_CLIENT_TOKENS") || !strings.Contains(err.Error(), `client name "default" is reserved`) {
			t.Errorf("CLIENT_TOKENS=%q: %v, want a refusal naming IDEMPROXY_CLIENT_TOKENS and the name", list, err)
		}
		if err != nil && strings.Contains(err.Error(), "0123456789abcdef") {
			t.Errorf("error %q shows a token", err)
		}
	}
	if _, _, err := loadConfig(append(base, "IDEMPROXY_CLIENT_TOKENS=default-app=0123456789abcdef")); err != nil {
		t.Errorf("client default-app refused: %v", err)
	}
}

// `docker run --env-file` keeps quotes: IDEMPROXY_UPSTREAM_URL="http://…"
// stopped the start with only "not a URL", and a quoted signing secret
// started and signed with the quotes in it, every request then refused by the
// provider. A value wrapped in quotes is refused (exit 2 at start) naming the
// variable, never the value; quotes inside a value are kept.
func TestConfigQuotedValues(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + t.TempDir()}
	for _, tc := range []struct{ env, name string }{
		{`IDEMPROXY_UPSTREAM_URL="http://127.0.0.1:1"`, "IDEMPROXY_UPSTREAM_URL"},
		{`IDEMPROXY_SIGN_SECRET="quoted-sign-secret"`, "IDEMPROXY_SIGN_SECRET"},
		{`IDEMPROXY_ADMIN_TOKEN='quoted-admin-token'`, "IDEMPROXY_ADMIN_TOKEN"},
		{`IDEMPROXY_RETRY_BUDGET="30s"`, "IDEMPROXY_RETRY_BUDGET"},
	} {
		// loadConfig, not command: a value accepted would serve.
		_, _, err := loadConfig(append(base, tc.env))
		if err == nil {
			t.Errorf("%s accepted, want a refusal", tc.env)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.name) || !strings.Contains(msg, "wrapped in quotes") || strings.Contains(msg, "quoted-") {
			t.Errorf("%s: message %q does not name %s and the quotes, or shows the value", tc.env, msg, tc.name)
		}
	}
	if _, set, err := loadConfig(append(base, `IDEMPROXY_SIGN_SECRET=in"side"`, `IDEMPROXY_ADMIN_TOKEN="unbalanced-token`)); err != nil ||
		string(set.sign.Secret) != `in"side"` {
		t.Errorf("quotes inside or on one side of a value: %v", err)
	}
}

// A secret file that is empty stops the start: it once turned the feature
// off silently (an empty IDEMPROXY_ADMIN_TOKEN_FILE left the admin API open).
func TestConfigEmptySecretFiles(t *testing.T) {
	dir := t.TempDir()
	empty, blank := filepath.Join(dir, "empty"), filepath.Join(dir, "blank")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blank, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + dir}
	for _, name := range []string{"IDEMPROXY_ADMIN_TOKEN_FILE", "IDEMPROXY_SIGN_SECRET_FILE", "IDEMPROXY_CLIENT_TOKENS_FILE",
		"IDEMPROXY_STORE_URL_FILE", "IDEMPROXY_STATIC_HEADERS_FILE", "IDEMPROXY_KEY_SECRET_FILE"} {
		for _, file := range []string{empty, blank} {
			var stderr bytes.Buffer
			if code := command(nil, append(base, name+"="+file), io.Discard, &stderr); code != 2 {
				t.Errorf("%s=%s: exit %d, want 2; stderr:\n%s", name, file, code, stderr.String())
				continue
			}
			if !strings.Contains(stderr.String(), name) || !strings.Contains(stderr.String(), "empty") {
				t.Errorf("%s=%s: message %q does not say the variable's file is empty", name, file, stderr.String())
			}
		}
	}
	secretFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(secretFile, []byte("an-admin-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, set, err := loadConfig(append(base, "IDEMPROXY_ADMIN_TOKEN_FILE="+secretFile)); err != nil || set.adminToken != "an-admin-token" {
		t.Errorf("a token file: %v, token %q", err, set.adminToken)
	}
}

// A <NAME>_FILE that is no regular file, or far larger than any secret,
// stops the start with a message naming the variable, before anything reads
// it. The real binary read IDEMPROXY_SIGN_SECRET_FILE=/dev/zero until it ran
// out of memory, waited for ever on a FIFO that no one writes to, and took a
// file of megabytes as the secret. The operator commands read
// IDEMPROXY_ADMIN_TOKEN_FILE the same way.
func TestConfigSecretFileNotASecret(t *testing.T) {
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	// 2 MiB that would pass every other check: a wrong file (a log, a dump).
	if _, err := f.WriteString(strings.Repeat("x", 2<<20)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fifo := filepath.Join(dir, "fifo")
	if err := mkfifo(fifo); err != nil {
		t.Skipf("no FIFO here: %v", err)
	}
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + dir}
	for _, tt := range []struct{ name, path, want string }{
		{"IDEMPROXY_SIGN_SECRET_FILE", "/dev/null", "not a regular file"},
		{"IDEMPROXY_ADMIN_TOKEN_FILE", fifo, "not a regular file"},
		{"IDEMPROXY_STORE_URL_FILE", dir, "not a regular file"},
		{"IDEMPROXY_CLIENT_TOKENS_FILE", huge, "more than"},
		{"IDEMPROXY_KEY_SECRET_FILE", huge, "more than"},
	} {
		_, _, err := loadConfig(append(base, tt.name+"="+tt.path))
		if err == nil || !strings.Contains(err.Error(), tt.name) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s=%s: %v; want a refusal naming the variable that says %q", tt.name, tt.path, err, tt.want)
		}
		if tt.name != "IDEMPROXY_ADMIN_TOKEN_FILE" {
			continue
		}
		var stderr bytes.Buffer
		code := command([]string{"records", "get", "k-1", "--admin", "127.0.0.1:1"}, []string{tt.name + "=" + tt.path}, io.Discard, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("records get with %s=%s: exit %d, %q; want 2 and %q", tt.name, tt.path, code, stderr.String(), tt.want)
		}
	}
	var stderr bytes.Buffer
	code := command([]string{"records", "get", "k-1", "--admin", "127.0.0.1:1"}, []string{"IDEMPROXY_ADMIN_TOKEN_FILE=" + huge}, io.Discard, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "more than") {
		t.Errorf("records get with a huge IDEMPROXY_ADMIN_TOKEN_FILE: exit %d, %q; want 2 and a refusal", code, stderr.String())
	}
}

// An admin token that no Authorization header can carry as it is (HTTP
// drops the white space around a header value) would lock every operator
// out: it stops the start, naming the variable but not the token.
func TestConfigAdminTokenShape(t *testing.T) {
	dir := t.TempDir()
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + dir}
	spaced := filepath.Join(dir, "spaced")
	if err := os.WriteFile(spaced, []byte("file-token-0123 \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"IDEMPROXY_ADMIN_TOKEN= lead-token-0123", "IDEMPROXY_ADMIN_TOKEN=trail-token-0123\t",
		"IDEMPROXY_ADMIN_TOKEN=ctl-\x01-token", "IDEMPROXY_ADMIN_TOKEN_FILE=" + spaced} {
		_, _, err := loadConfig(append(base, v))
		if err == nil || !strings.Contains(err.Error(), "IDEMPROXY_ADMIN_TOKEN") || strings.Contains(err.Error(), "-token") {
			t.Errorf("%q: %v; want refused, naming IDEMPROXY_ADMIN_TOKEN, not quoting the token", v, err)
		}
	}
	if _, set, err := loadConfig(append(base, "IDEMPROXY_ADMIN_TOKEN=inner space is fine")); err != nil || set.adminToken != "inner space is fine" {
		t.Errorf("a token with inner spaces: %v, %q", err, set.adminToken)
	}
}

// A value of white space only is refused, naming the variable (exit 2): an
// empty value is the default, but these once started with a setting nobody
// meant. IDEMPROXY_RETRY_CODES=" " retried no business code (a 409
// payout.funds_maturing stored as final, the payout dropped),
// IDEMPROXY_RETRY_STATUSES=" " no status, IDEMPROXY_SIGN_CANONICAL=" "
// signed a single space (one signature for every request), and
// IDEMPROXY_DATA_DIR=" " kept the records in a directory named " ".
func TestConfigBlankValues(t *testing.T) {
	dir := t.TempDir()
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + dir}
	for _, v := range []string{"IDEMPROXY_RETRY_CODES= ", "IDEMPROXY_RETRY_STATUSES=\t", "IDEMPROXY_SIGN_CANONICAL= ",
		"IDEMPROXY_DATA_DIR=  ", "IDEMPROXY_ROUTES= ", "IDEMPROXY_NONCE_HEADER= ", "IDEMPROXY_SIGN_SECRET_FILE= "} {
		name, _, _ := strings.Cut(v, "=")
		// loadConfig, not command: a value accepted would serve.
		_, _, err := loadConfig(append(base, v))
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "white space") {
			t.Errorf("%q: %v; want refused, naming %s and saying it is white space", v, err, name)
		}
	}
	// Empty is unset: the default applies.
	cfg, _, err := loadConfig(append(base, "IDEMPROXY_RETRY_CODES=", "IDEMPROXY_SIGN_CANONICAL="))
	if err != nil || cfg.RetryCodes == "" || cfg.SignCanonical == "" {
		t.Errorf("empty values: %v, codes %q, template %q; want the defaults", err, cfg.RetryCodes, cfg.SignCanonical)
	}
}

// A key (IDEMPROXY_SIGN_SECRET, IDEMPROXY_KEY_SECRET) that begins or ends
// with white space stops the start, naming the variable, not the key. A
// Kubernetes secret made from a file written by echo ends with a line break;
// set as the variable, it once started and signed with the line break in the
// key, every request then refused by the provider (and, for KEY_SECRET,
// every upstream key other than a replica's reading the same secret from its
// _FILE, whose final line break is dropped). A file's final LF or CRLF is
// still no part of the value.
func TestConfigKeyEdges(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + dir}
	clients := []string{"IDEMPROXY_CLIENT_TOKENS=app=0123456789abcdef"}
	for _, tc := range []struct {
		env  []string
		name string
	}{
		{[]string{"IDEMPROXY_SIGN_SECRET=sign-key-0123\n"}, "IDEMPROXY_SIGN_SECRET"},
		{[]string{"IDEMPROXY_SIGN_SECRET=sign-key-0123\r\n"}, "IDEMPROXY_SIGN_SECRET"},
		{[]string{"IDEMPROXY_SIGN_SECRET= sign-key-0123"}, "IDEMPROXY_SIGN_SECRET"},
		{[]string{"IDEMPROXY_SIGN_SECRET_FILE=" + write("sign-spaced", "sign-key-0123 \n")}, "IDEMPROXY_SIGN_SECRET"},
		{append([]string{"IDEMPROXY_KEY_SECRET=bind-key-0123456789\n"}, clients...), "IDEMPROXY_KEY_SECRET"},
		{append([]string{"IDEMPROXY_KEY_SECRET_FILE=" + write("bind-tab", "\tbind-key-0123456789\n")}, clients...), "IDEMPROXY_KEY_SECRET"},
	} {
		_, _, err := loadConfig(append(base, tc.env...))
		if err == nil {
			t.Errorf("%q accepted, want a refusal", tc.env)
		} else if msg := err.Error(); !strings.Contains(msg, tc.name) || !strings.Contains(msg, "white space") || strings.Contains(msg, "-key-") {
			t.Errorf("%q: message %q does not name %s and the white space, or quotes the key", tc.env, msg, tc.name)
		}
	}
	_, set, err := loadConfig(append(base, "IDEMPROXY_SIGN_SECRET_FILE="+write("sign-crlf", "sign-key-0123\r\n"),
		"IDEMPROXY_KEY_SECRET_FILE="+write("bind-lf", "bind-key-0123456789\n"), clients[0]))
	if err != nil || string(set.sign.Secret) != "sign-key-0123" || string(set.keySecret) != "bind-key-0123456789" {
		t.Errorf("files ending in CRLF and LF: %v, keys %q %q", err, set.sign.Secret, set.keySecret)
	}
	if _, set, err := loadConfig(append(base, "IDEMPROXY_SIGN_SECRET=inner space key")); err != nil || string(set.sign.Secret) != "inner space key" {
		t.Errorf("a key with inner spaces: %v, %q", err, set.sign.Secret)
	}
}

// A secret file that begins with a byte order mark (Notepad, PowerShell's
// Out-File) stops the start naming its _FILE variable: the mark was part of
// the value, a signing key no provider has, an admin token no operator
// types, a client named "\ufeffapp".
func TestConfigSecretFileBOM(t *testing.T) {
	dir := t.TempDir()
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + dir}
	for _, tc := range []struct{ name, content string }{
		{"IDEMPROXY_SIGN_SECRET_FILE", "sign-key-0123\r\n"},
		{"IDEMPROXY_ADMIN_TOKEN_FILE", "admin-key-0123\n"},
		{"IDEMPROXY_CLIENT_TOKENS_FILE", "app=client-key-0123456789\n"},
		{"IDEMPROXY_STATIC_HEADERS_FILE", "X-Public-Id=pub-key-0123\n"},
	} {
		p := filepath.Join(dir, tc.name)
		if err := os.WriteFile(p, []byte("\uFEFF"+tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := loadConfig(append(base, tc.name+"="+p, "IDEMPROXY_KEY_SECRET=key-secret-0123456789"))
		if err == nil {
			t.Errorf("%s with a BOM accepted, want a refusal", tc.name)
		} else if msg := err.Error(); !strings.Contains(msg, tc.name) || !strings.Contains(msg, "byte order mark") || strings.Contains(msg, "-key-") {
			t.Errorf("%s: message %q does not name the variable and the mark, or quotes the value", tc.name, msg)
		}
	}
}

// A setting that is set but does nothing as the others stand is named in a
// WARN line at start (the binary's log), never with its value: a burst
// without a rate once started with no limit and no word, an attempt timeout
// over the budget was cut at the budget, a key secret without client tokens
// bound nothing. Settings that work as set draw no such line.
func TestBinaryWarnsOfSettingsWithoutEffect(t *testing.T) {
	secret := "bind-" + randomHex(t, 12)
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", t.TempDir(),
		"IDEMPROXY_RATE_BURST=20", "IDEMPROXY_RETRY_BUDGET=10s", "IDEMPROXY_ATTEMPT_TIMEOUT=30s",
		"IDEMPROXY_KEY_SECRET="+secret, "IDEMPROXY_CLIENT_HEADER=X-App-Token", "IDEMPROXY_STORE_LEASE=30s",
		"IDEMPROXY_STATUS_PROBE_ROUTES=POST /payments", "IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES=payout.not_found")})
	for name, because := range map[string]string{
		"IDEMPROXY_RATE_BURST":      "IDEMPROXY_RATE_LIMIT is 0",
		"IDEMPROXY_ATTEMPT_TIMEOUT": "IDEMPROXY_RETRY_BUDGET (10s)",
		"IDEMPROXY_KEY_SECRET":      "IDEMPROXY_CLIENT_TOKENS",
		"IDEMPROXY_CLIENT_HEADER":   "IDEMPROXY_CLIENT_TOKENS",
		"IDEMPROXY_STORE_LEASE":     "IDEMPROXY_STORE_URL",
		// Once started without a word: no lookup was ever sent.
		"IDEMPROXY_STATUS_PROBE_ROUTES":          "IDEMPROXY_STATUS_PROBE",
		"IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES": "IDEMPROXY_STATUS_PROBE",
	} {
		line := p.waitLine(t, `"variable":"`+name+`"`)
		if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, "no effect") || !strings.Contains(jsonField(line, "because"), because) {
			t.Errorf("warning for %s = %s; want WARN, no effect, because naming %s", name, line, because)
		}
	}
	if strings.Contains(p.text(), secret) {
		t.Errorf("the key secret is in the log:\n%s", p.text())
	}

	// The same settings where they take effect: no line.
	cfg, _, err := loadConfig([]string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_RATE_LIMIT=5", "IDEMPROXY_RATE_BURST=20",
		"IDEMPROXY_RETRY_BUDGET=1m", "IDEMPROXY_ATTEMPT_TIMEOUT=30s", "IDEMPROXY_CLIENT_TOKENS=app=0123456789abcdef",
		"IDEMPROXY_KEY_SECRET=key-secret-0123456789", "IDEMPROXY_CLIENT_HEADER=X-App-Token",
		"IDEMPROXY_STORE_URL=postgres://u@127.0.0.1:1/db", "IDEMPROXY_STORE_LEASE=30s",
		"IDEMPROXY_STATUS_PROBE=GET /payments/{resp.payment_id}", "IDEMPROXY_STATUS_PROBE_ROUTES=POST /payments",
		"IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES=payment_not_found"})
	if err != nil {
		t.Fatal(err)
	}
	if got := ineffective(cfg, []string{"IDEMPROXY_RATE_BURST=20", "IDEMPROXY_ATTEMPT_TIMEOUT=30s", "IDEMPROXY_KEY_SECRET=key-secret-0123456789",
		"IDEMPROXY_CLIENT_HEADER=X-App-Token", "IDEMPROXY_STORE_LEASE=30s", "IDEMPROXY_STATUS_PROBE_ROUTES=POST /payments",
		"IDEMPROXY_STATUS_PROBE_NOT_FOUND_CODES=payment_not_found"}); len(got) != 0 {
		t.Errorf("settings in effect reported: %v", got)
	}
}

// A SIGN_CANONICAL or SIGN_ENCODING set without SIGN_SECRET (a secret not
// mounted) started without a word and sent every request unsigned, the
// provider's 401 then stored as final. Each is named in a "no effect"
// warning; with the secret, in a variable or its file, they draw none.
func TestConfigSignSettingsWithoutSecret(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sign")
	if err := os.WriteFile(file, []byte("sign-key-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	set := []string{`IDEMPROXY_SIGN_CANONICAL={timestamp}\n{method}\n{path}\n{body_sha256}`, "IDEMPROXY_SIGN_ENCODING=base64",
		"IDEMPROXY_NONCE_HEADER=X-Nonce", "IDEMPROXY_SIGNATURE_HEADER=X-Sig", "IDEMPROXY_TIMESTAMP_HEADER=X-Ts"}
	environ := append([]string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}, set...)
	cfg, _, err := loadConfig(environ)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, n := range ineffective(cfg, environ) {
		got[n.variable] = n.because
	}
	// The header names too: no nonce was sent, though IDEMPROXY_NONCE_HEADER
	// said X-Nonce, without a word.
	for _, name := range []string{"IDEMPROXY_SIGN_CANONICAL", "IDEMPROXY_SIGN_ENCODING", "IDEMPROXY_NONCE_HEADER",
		"IDEMPROXY_SIGNATURE_HEADER", "IDEMPROXY_TIMESTAMP_HEADER"} {
		if !strings.Contains(got[name], "IDEMPROXY_SIGN_SECRET") || !strings.Contains(got[name], "unsigned") {
			t.Errorf("%s without a secret: because %q, want it to name IDEMPROXY_SIGN_SECRET and unsigned requests", name, got[name])
		}
	}
	for _, secret := range []string{"IDEMPROXY_SIGN_SECRET=sign-key-0123", "IDEMPROXY_SIGN_SECRET_FILE=" + file} {
		environ := append(environ, secret)
		cfg, _, err := loadConfig(environ)
		if err != nil {
			t.Fatal(err)
		}
		if got := ineffective(cfg, environ); len(got) != 0 {
			t.Errorf("with %s: %v, want no warning", secret, got)
		}
	}
}

// A CLIENT_TOKENS list separated by something else than the comma once
// started as one client whose token was the rest of the line
// ("token1;b=token2"): no app's token matched and the second client did not
// exist. It stops the start naming the variable, the client and the comma,
// never a token. (loadConfig, not command: a list accepted would serve.)
func TestConfigClientTokenSeparators(t *testing.T) {
	dir := t.TempDir()
	lines := filepath.Join(dir, "tokens")
	if err := os.WriteFile(lines, []byte("app-a=tokenA-0123456789\r\napp-b=tokenB-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_KEY_SECRET=key-secret-0123456789"}
	for _, v := range []string{
		"IDEMPROXY_CLIENT_TOKENS=app-a=tokenA-0123456789;app-b=tokenB-0123456789",
		"IDEMPROXY_CLIENT_TOKENS=app-a=tokenA-0123456789 ; app-b=tokenB-0123456789",
		"IDEMPROXY_CLIENT_TOKENS=app-a=tokenA-0123456789|app-b=tokenB-0123456789",
		"IDEMPROXY_CLIENT_TOKENS=app-a=tokenA-0123456789 app-b=tokenB-0123456789",
		"IDEMPROXY_CLIENT_TOKENS=app-c=tokenC-0123456789,app-a=tokenA-0123456789;app-b=tokenB-0123456789",
		"IDEMPROXY_CLIENT_TOKENS_FILE=" + lines,
	} {
		_, _, err := loadConfig(append(base, v))
		if err == nil {
			t.Errorf("%q accepted, want a refusal", v)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "IDEMPROXY_CLIENT_TOKENS") || !strings.Contains(msg, "(app-a)") ||
			!strings.Contains(msg, "separate the entries with commas") || strings.Contains(msg, "token") && strings.Contains(msg, "-0123456789") {
			t.Errorf("%q: message %q does not name the variable, the client and the comma, or shows a token", v, msg)
		}
	}
}

// A STORE_URL with white space around it (copied with a space or a line
// break) once started with the space in the URL: a trailing one named the
// database "db " or a parameter value with it. It stops the start naming
// the variable, never the password.
func TestConfigStoreURLWhiteSpace(t *testing.T) {
	dir := t.TempDir()
	spaced := filepath.Join(dir, "store-url")
	if err := os.WriteFile(spaced, []byte("postgres://u:pw-secret-1@127.0.0.1:5432/db \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + dir}
	for _, tc := range []struct{ env, name string }{
		{"IDEMPROXY_STORE_URL=postgres://u:pw-secret-1@127.0.0.1:5432/db ", "IDEMPROXY_STORE_URL"},
		{"IDEMPROXY_STORE_URL=postgres://u:pw-secret-1@127.0.0.1:5432/db?sslmode=disable ", "IDEMPROXY_STORE_URL"},
		{"IDEMPROXY_STORE_URL= postgres://u:pw-secret-1@127.0.0.1:5432/db", "IDEMPROXY_STORE_URL"},
		{"IDEMPROXY_STORE_URL=postgres://u:pw-secret-1@127.0.0.1:5432/db\n", "IDEMPROXY_STORE_URL"},
		{"IDEMPROXY_STORE_URL_FILE=" + spaced, "IDEMPROXY_STORE_URL_FILE"},
	} {
		_, _, err := loadConfig(append(base, tc.env))
		if err == nil {
			t.Errorf("%q accepted, want a refusal", tc.env)
		} else if msg := err.Error(); !strings.Contains(msg, tc.name) || !strings.Contains(msg, "white space") || strings.Contains(msg, "pw-secret") {
			t.Errorf("%q: message %q does not name %s and the white space, or shows the password", tc.env, msg, tc.name)
		}
	}
	if _, set, err := loadConfig(append(base, "IDEMPROXY_STORE_URL=postgres://u:pw@127.0.0.1:5432/db")); err != nil || set.storeURL == "" {
		t.Errorf("a URL without white space: %v", err)
	}
}

// The real binary stops with exit status 2 on a STORE_URL with a trailing
// space, and its message names the variable, not the password.
func TestBinaryStoreURLWhiteSpace(t *testing.T) {
	out := startStops(t, 2, "PATH="+os.Getenv("PATH"), "IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1",
		"IDEMPROXY_DATA_DIR="+t.TempDir(), "IDEMPROXY_STORE_URL=postgres://u:pw-secret-2@127.0.0.1:5432/db ")
	if !strings.Contains(out, "IDEMPROXY_STORE_URL") || !strings.Contains(out, "white space") || strings.Contains(out, "pw-secret-2") {
		t.Errorf("output does not name IDEMPROXY_STORE_URL and the white space, or shows the password:\n%s", out)
	}
}

// An UPSTREAM_URL or DATA_DIR with white space around it once started: the
// base path "/v1 " sent every request to /v1%20/…, and "/data " kept the
// records beside the volume, lost with the container. Both stop the start
// naming the variable and the white space; the same values without it
// start.
func TestConfigWhiteSpaceAroundUpstreamAndDataDir(t *testing.T) {
	for _, tc := range []struct{ env, name string }{
		{"IDEMPROXY_UPSTREAM_URL=https://api.example/v1 ", "IDEMPROXY_UPSTREAM_URL"},
		{"IDEMPROXY_UPSTREAM_URL=https://api.example/v1\t", "IDEMPROXY_UPSTREAM_URL"},
		{"IDEMPROXY_UPSTREAM_URL= https://api.example", "IDEMPROXY_UPSTREAM_URL"},
		{"IDEMPROXY_DATA_DIR=/data ", "IDEMPROXY_DATA_DIR"},
		{"IDEMPROXY_DATA_DIR= ./data", "IDEMPROXY_DATA_DIR"},
	} {
		env := []string{"IDEMPROXY_UPSTREAM_URL=https://api.example/v1", tc.env}
		_, _, err := loadConfig(env)
		if err == nil {
			t.Errorf("%q accepted, want a refusal", tc.env)
		} else if msg := err.Error(); !strings.Contains(msg, tc.name) || !strings.Contains(msg, "white space") {
			t.Errorf("%q: message %q does not name %s and the white space", tc.env, msg, tc.name)
		}
	}
	cfg, set, err := loadConfig([]string{"IDEMPROXY_UPSTREAM_URL=https://api.example/v1", "IDEMPROXY_DATA_DIR=/data"})
	if err != nil || set.upstream.Path != "/v1" || cfg.DataDir != "/data" {
		t.Errorf("without white space: path %q, dir %q, %v", set.upstream.Path, cfg.DataDir, err)
	}
}

// The real binary stops with exit status 2 on a DATA_DIR with a trailing
// space, naming the variable, and creates no directory of that name.
func TestBinaryDataDirWhiteSpace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	out := startStops(t, 2, "PATH="+os.Getenv("PATH"), "IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1",
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0", "IDEMPROXY_DATA_DIR="+dir+" ")
	if !strings.Contains(out, "IDEMPROXY_DATA_DIR") || !strings.Contains(out, "white space") {
		t.Errorf("output does not name IDEMPROXY_DATA_DIR and the white space:\n%s", out)
	}
	if _, err := os.Stat(dir + " "); !os.IsNotExist(err) {
		t.Errorf("the directory %q was made (%v)", dir+" ", err)
	}
}

// A SIGN_CANONICAL without a placeholder once started and signed the same
// string for every request: one signature for any method, path, body and
// time. It stops the start naming the variable and the placeholders.
func TestConfigSignCanonicalConstant(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_SIGN_SECRET=sign-key-0123"}
	for _, tmpl := range []string{"static", `\{timestamp\}\n\{body\}`, "POST /v1/payouts"} {
		_, _, err := loadConfig(append(base, "IDEMPROXY_SIGN_CANONICAL="+tmpl))
		if err == nil {
			t.Errorf("SIGN_CANONICAL=%q accepted, want a refusal", tmpl)
			continue
		}
		for _, want := range []string{"IDEMPROXY_SIGN_CANONICAL", "no placeholder", "{timestamp}", "{body_sha256}", "{idempotency_key}"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("SIGN_CANONICAL=%q: message %q does not say %s", tmpl, err, want)
			}
		}
	}
}

// An admin token shorter than 16 characters is named in a WARN line at
// start, never with the token or its length; the start goes on (tests and
// sandboxes use short tokens). One of 16 or more draws no line.
func TestConfigShortAdminToken(t *testing.T) {
	for _, tc := range []struct {
		token string
		warn  bool
	}{{"Zq7xKp1", true}, {"a", true}, {"fifteen-chars-1", true}, {"sixteen-chars-12", false}, {"", false}} {
		var buf bytes.Buffer
		warnShortAdminToken(tc.token, newLogger(&buf, "info", nil))
		got := buf.String()
		if tc.warn != strings.Contains(got, `"variable":"IDEMPROXY_ADMIN_TOKEN"`) {
			t.Errorf("token of %d characters: log %q, want a warning %v", len(tc.token), got, tc.warn)
		}
		// (A one-letter token is in any English line: not looked for.)
		if tc.warn && (!strings.Contains(got, `"level":"WARN"`) || len(tc.token) > 1 && strings.Contains(got, tc.token)) {
			t.Errorf("token of %d characters: %q, want WARN without the token", len(tc.token), got)
		}
	}
}

// The real binary starts with a short admin token and says so at WARN.
func TestBinaryWarnsOfShortAdminToken(t *testing.T) {
	const token = "Zq7xKp1"
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", t.TempDir(), "IDEMPROXY_ADMIN_TOKEN="+token)})
	line := p.waitLine(t, `"msg":"admin token is short"`)
	if !strings.Contains(line, `"level":"WARN"`) || jsonField(line, "variable") != "IDEMPROXY_ADMIN_TOKEN" {
		t.Errorf("warning line %s; want WARN naming IDEMPROXY_ADMIN_TOKEN", line)
	}
	if strings.Contains(p.text(), token) {
		t.Errorf("the admin token is in the log:\n%s", p.text())
	}
}

// A SIGN_CANONICAL of only {timestamp} (or {nonce}, and literal text)
// started without a word, though its signature takes nothing of the request
// and is good for any request in the provider's time window. It is named in
// a WARN line at start (a provider may sign only the time, so it starts);
// a template with any part of the request, or no signing, draws no line.
func TestConfigWarnsOfUnboundSignature(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_NONCE_HEADER=X-Nonce"}
	for _, tc := range []struct {
		env  []string
		warn bool
	}{
		{[]string{"IDEMPROXY_SIGN_SECRET=sign-key-0123", "IDEMPROXY_SIGN_CANONICAL={timestamp}"}, true},
		{[]string{"IDEMPROXY_SIGN_SECRET=sign-key-0123", `IDEMPROXY_SIGN_CANONICAL={timestamp}\n{nonce}\nPOST /v1/payouts`}, true},
		{[]string{"IDEMPROXY_SIGN_SECRET=sign-key-0123"}, false},
		{[]string{"IDEMPROXY_SIGN_SECRET=sign-key-0123", `IDEMPROXY_SIGN_CANONICAL={timestamp}\n{idempotency_key}`}, false},
		{[]string{"IDEMPROXY_SIGN_SECRET=sign-key-0123", `IDEMPROXY_SIGN_CANONICAL={timestamp}{query}`}, false},
		{[]string{"IDEMPROXY_SIGN_CANONICAL={timestamp}"}, false}, // no signing
	} {
		_, set, err := loadConfig(append(base, tc.env...))
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		var buf bytes.Buffer
		warnUnboundSignature(set.sign, newLogger(&buf, "info", nil))
		got := buf.String()
		if tc.warn != strings.Contains(got, `"variable":"IDEMPROXY_SIGN_CANONICAL"`) {
			t.Errorf("%v: log %q, want a warning %v", tc.env, got, tc.warn)
		}
		if tc.warn && (!strings.Contains(got, `"level":"WARN"`) || !strings.Contains(got, "nothing of the request") || strings.Contains(got, "sign-key-0123")) {
			t.Errorf("%v: %q, want WARN saying it signs nothing of the request, without the secret", tc.env, got)
		}
	}
}

// A RATE_LIMIT that gives a token less often than once per RETRY_BUDGET
// (0.005 = one every 200s, budget 2m) started without a word, and once the
// burst was spent a request that found no token ended unsent. It is named
// in a WARN line at start with the interval and the budget; a rate whose
// interval fits the budget draws no line.
func TestConfigWarnsOfSlowRate(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}
	for _, tc := range []struct {
		env  []string
		warn bool
	}{
		{[]string{"IDEMPROXY_RATE_LIMIT=0.005"}, true},
		{[]string{"IDEMPROXY_RATE_LIMIT=0.000278", "IDEMPROXY_RATE_BURST=10"}, true},
		{[]string{"IDEMPROXY_RATE_LIMIT=0.1", "IDEMPROXY_RETRY_BUDGET=5s", "IDEMPROXY_ATTEMPT_TIMEOUT=2s"}, true},
		{[]string{"IDEMPROXY_RATE_LIMIT=0.005", "IDEMPROXY_RETRY_BUDGET=5m"}, false},
		{[]string{"IDEMPROXY_RATE_LIMIT=0.5"}, false},
		{[]string{"IDEMPROXY_RATE_LIMIT=0"}, false},
		{nil, false},
	} {
		cfg, _, err := loadConfig(append(base, tc.env...))
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		var buf bytes.Buffer
		warnSlowRate(cfg, newLogger(&buf, "info", nil))
		got := buf.String()
		if tc.warn != strings.Contains(got, `"variable":"IDEMPROXY_RATE_LIMIT"`) {
			t.Errorf("%v: log %q, want a warning %v", tc.env, got, tc.warn)
		}
		if tc.warn && (!strings.Contains(got, `"level":"WARN"`) || !strings.Contains(got, "IDEMPROXY_RETRY_BUDGET") || !strings.Contains(got, "unsent")) {
			t.Errorf("%v: %q, want WARN naming RETRY_BUDGET and saying requests end unsent", tc.env, got)
		}
	}
}

// The real binary starts with both and says so at WARN.
func TestBinaryWarnsOfUnboundSignatureAndSlowRate(t *testing.T) {
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", t.TempDir(), "IDEMPROXY_SIGN_SECRET=sign-key-0123",
		"IDEMPROXY_SIGN_CANONICAL={timestamp}", "IDEMPROXY_RATE_LIMIT=0.005")})
	for msg, name := range map[string]string{
		"signing template signs nothing of the request":          "IDEMPROXY_SIGN_CANONICAL",
		"rate limit is slower than one request per retry budget": "IDEMPROXY_RATE_LIMIT",
	} {
		line := p.waitLine(t, `"msg":"`+msg+`"`)
		if !strings.Contains(line, `"level":"WARN"`) || jsonField(line, "variable") != name {
			t.Errorf("warning line %s; want WARN naming %s", line, name)
		}
	}
	if strings.Contains(p.text(), "sign-key-0123") {
		t.Errorf("the signing secret is in the log:\n%s", p.text())
	}
}

// A preset without IDEMPROXY_SIGN_SECRET (a secret not mounted, a
// secretKeyRef left out) started without a word and sent every request of a
// provider that wants signatures unsigned, each refused. So did the payouts
// preset without the X-Public-Id the provider wants on every call. Each is
// named in a WARN line at start, never with a secret; with the credentials,
// in a variable or a file, and without a preset, there is none.
func TestConfigWarnsOfPresetWithoutCredentials(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sign")
	if err := os.WriteFile(file, []byte("sign-key-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name := range presets {
		if _, ok := presetCredentials[name]; !ok {
			t.Errorf("preset %s: no presetCredentials entry", name)
		}
	}
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}
	for _, tc := range []struct {
		env  []string
		want []string // the variables warned of
	}{
		{[]string{"IDEMPROXY_PRESET=payments"}, []string{"IDEMPROXY_SIGN_SECRET"}},
		{[]string{"IDEMPROXY_PRESET=cards"}, []string{"IDEMPROXY_SIGN_SECRET"}},
		{[]string{"IDEMPROXY_PRESET=payouts"}, []string{"IDEMPROXY_SIGN_SECRET", "IDEMPROXY_STATIC_HEADERS"}},
		{[]string{"IDEMPROXY_PRESET=payouts", "IDEMPROXY_SIGN_SECRET=sign-key-0123"}, []string{"IDEMPROXY_STATIC_HEADERS"}},
		{[]string{"IDEMPROXY_PRESET=payouts", "IDEMPROXY_SIGN_SECRET=sign-key-0123", "IDEMPROXY_STATIC_HEADERS=X-Other=1"}, []string{"IDEMPROXY_STATIC_HEADERS"}},
		{[]string{"IDEMPROXY_PRESET=payouts", "IDEMPROXY_SIGN_SECRET_FILE=" + file, "IDEMPROXY_STATIC_HEADERS=x-public-id=pub-1"}, nil},
		{[]string{"IDEMPROXY_PRESET=payments", "IDEMPROXY_SIGN_SECRET=sign-key-0123"}, nil},
		{[]string{"IDEMPROXY_PRESET=cards", "IDEMPROXY_SIGN_SECRET_FILE=" + file}, nil},
		{nil, nil}, // no preset: no signing is a choice
	} {
		cfg, set, err := loadConfig(append(base, tc.env...))
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		var buf bytes.Buffer
		warnPresetCredentials(cfg, set, newLogger(&buf, "info", nil))
		got := buf.String()
		for _, name := range []string{"IDEMPROXY_SIGN_SECRET", "IDEMPROXY_STATIC_HEADERS"} {
			want := slices.Contains(tc.want, name)
			if want != strings.Contains(got, `"variable":"`+name+`"`) {
				t.Errorf("%v: log %q, want a warning naming %s: %v", tc.env, got, name, want)
			}
		}
		if len(tc.want) > 0 && (!strings.Contains(got, `"level":"WARN"`) || !strings.Contains(got, "refuse")) {
			t.Errorf("%v: %q, want WARN saying the provider refuses such requests", tc.env, got)
		}
		if strings.Contains(got, "sign-key-0123") {
			t.Errorf("%v: the secret is in the log: %q", tc.env, got)
		}
	}
}

// The real binary starts with a preset and no secret, and says so at WARN.
func TestBinaryWarnsOfPresetWithoutSecret(t *testing.T) {
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", t.TempDir(), "IDEMPROXY_PRESET=payments")})
	line := p.waitLine(t, `"variable":"IDEMPROXY_SIGN_SECRET"`)
	if !strings.Contains(line, `"level":"WARN"`) || jsonField(line, "preset") != "payments" {
		t.Errorf("warning line %s; want WARN naming IDEMPROXY_SIGN_SECRET and the preset", line)
	}
}

// A RATE_LIMIT below one request an hour (the unit is per second) once
// started: after the burst, nearly every request would end unsent, as its
// wait for a token would pass RETRY_BUDGET. It stops the
// start naming the variable and the unit. (loadConfig, not command: a rate
// accepted would serve.)
func TestConfigRateLimitFloor(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}
	for _, env := range [][]string{
		{"IDEMPROXY_RATE_LIMIT=0.0001", "IDEMPROXY_RATE_BURST=100"},
		{"IDEMPROXY_RATE_LIMIT=0.000277"},
		{"IDEMPROXY_RATE_LIMIT=1e-300"},
	} {
		_, _, err := loadConfig(append(base, env...))
		if err == nil || !strings.Contains(err.Error(), "IDEMPROXY_RATE_LIMIT") || !strings.Contains(err.Error(), "one request per hour") ||
			!strings.Contains(err.Error(), "per second") {
			t.Errorf("%v: %v; want refused, naming IDEMPROXY_RATE_LIMIT, the floor and the unit", env, err)
		}
	}
}

// An empty variable resets a preset's value to the default: with
// IDEMPROXY_ROUTES= (a Compose ${ROUTES} with nothing behind it) the payouts
// status lookups were protected, a lookup's 404 stored and replayed. Start
// says so at WARN, naming the variable and the value removed; a variable
// left unset, or set to a value, is no warning.
func TestWarnsOfPresetValueRemovedByEmptyVariable(t *testing.T) {
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}
	for _, tc := range []struct {
		env  []string
		want []string // the variables warned of
	}{
		{[]string{"IDEMPROXY_PRESET=payouts", "IDEMPROXY_ROUTES="}, []string{"IDEMPROXY_ROUTES"}},
		{[]string{"IDEMPROXY_PRESET=payments", "IDEMPROXY_STATUS_PROBE=", "IDEMPROXY_RETRY_STATUSES="}, []string{"IDEMPROXY_RETRY_STATUSES", "IDEMPROXY_STATUS_PROBE"}},
		{[]string{"IDEMPROXY_PRESET=payouts", "IDEMPROXY_ROUTES=POST /v1/payout/info=unprotected"}, nil},
		{[]string{"IDEMPROXY_PRESET=cards"}, nil},
		{[]string{"IDEMPROXY_ROUTES="}, nil},                                 // no preset: empty is the default
		{[]string{"IDEMPROXY_PRESET=cards", "IDEMPROXY_STATUS_PROBE="}, nil}, // not a cards value
	} {
		cfg, _, err := loadConfig(append(base, tc.env...))
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		var buf bytes.Buffer
		warnPresetCleared(cfg, append(base, tc.env...), newLogger(&buf, "info", nil))
		var got []string
		for line := range strings.Lines(buf.String()) {
			if !strings.Contains(line, `"level":"WARN"`) || jsonField(line, "preset") != cfg.Preset {
				t.Errorf("%v: %s; want WARN lines naming the preset", tc.env, line)
			}
			v := jsonField(line, "variable")
			if want := presets[cfg.Preset][strings.TrimPrefix(v, "IDEMPROXY_")]; jsonField(line, "removed") != want {
				t.Errorf("%v: %s; want the removed value %q", tc.env, line, want)
			}
			got = append(got, v)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%v: warned of %v, want %v", tc.env, got, tc.want)
		}
	}
}

// The real binary with the payouts preset and IDEMPROXY_ROUTES= says at
// start that the lookups' routes were removed.
func TestBinaryWarnsOfPresetRoutesRemoved(t *testing.T) {
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", t.TempDir(), "IDEMPROXY_PRESET=payouts", "IDEMPROXY_ROUTES=")})
	line := p.waitLine(t, `"variable":"IDEMPROXY_ROUTES"`)
	if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(jsonField(line, "removed"), "POST /v1/payout/info=unprotected") {
		t.Errorf("warning line %s; want WARN naming IDEMPROXY_ROUTES and the payouts lookups removed", line)
	}
}

// A client token equal to a server secret (the signing secret, the admin
// token, the key secret) once started: the app holding that token then held
// the provider's signing key, the admin API, or what binds every client's
// upstream keys. The start stops naming both variables, never the value;
// distinct values start. (loadConfig, not command: a value accepted would
// serve.)
func TestConfigClientTokenIsServerSecret(t *testing.T) {
	const shared = "shared-value-0123456789"
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("app-a=other-token-0123456,app-b = "+shared+" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_KEY_SECRET=key-secret-0123456789"}
	for _, tc := range []struct {
		env  []string
		want []string // the variables named; none: accepted
	}{
		{[]string{"IDEMPROXY_CLIENT_TOKENS=app=" + shared, "IDEMPROXY_SIGN_SECRET=" + shared},
			[]string{"IDEMPROXY_CLIENT_TOKENS", "IDEMPROXY_SIGN_SECRET"}},
		{[]string{"IDEMPROXY_CLIENT_TOKENS=app=token-of-app-0123456, ops = " + shared, "IDEMPROXY_ADMIN_TOKEN=" + shared},
			[]string{"IDEMPROXY_CLIENT_TOKENS", "IDEMPROXY_ADMIN_TOKEN", "ops"}},
		{[]string{"IDEMPROXY_CLIENT_TOKENS_FILE=" + file, "IDEMPROXY_SIGN_SECRET=" + shared},
			[]string{"IDEMPROXY_CLIENT_TOKENS_FILE", "IDEMPROXY_SIGN_SECRET", "app-b"}},
		{[]string{"IDEMPROXY_CLIENT_TOKENS=app=key-secret-0123456789"},
			[]string{"IDEMPROXY_CLIENT_TOKENS", "IDEMPROXY_KEY_SECRET"}},
		{[]string{"IDEMPROXY_CLIENT_TOKENS=app=token-of-app-0123456", "IDEMPROXY_SIGN_SECRET=" + shared, "IDEMPROXY_ADMIN_TOKEN=admin-token-0123456"}, nil},
	} {
		_, _, err := loadConfig(append(base, tc.env...))
		if tc.want == nil {
			if err != nil {
				t.Errorf("%v: %v, want accepted", tc.env, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%v: accepted, want refused naming %v", tc.env, tc.want)
			continue
		}
		msg := err.Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%v: message %q does not name %s", tc.env, msg, w)
			}
		}
		if strings.Contains(msg, shared) || strings.Contains(msg, "key-secret-0123456789") {
			t.Errorf("%v: the value is in the message: %q", tc.env, msg)
		}
	}
}

// HTTP_PROXY, HTTPS_PROXY, ALL_PROXY (either case) set in the environment
// once started without a word, though the provider's connections never go
// through them: an operator whose egress must pass a proxy saw only failed
// dials, or traffic that bypassed the proxy. Each set one is named in a
// WARN line at start, never its value (a proxy URL may hold credentials);
// none set, or set empty, draws no line.
func TestWarnsOfProxyVariables(t *testing.T) {
	if upstream.NewWire().Proxy != nil {
		t.Fatal("the provider's transport takes a proxy: the warning would be wrong")
	}
	const cred = "http://user:proxy-pass-0123@127.0.0.1:3128"
	var buf bytes.Buffer
	warnProxyVariables([]string{"HTTPS_PROXY=" + cred, "http_proxy=" + cred, "ALL_PROXY=" + cred, "HTTP_PROXY=",
		"NO_PROXY=localhost", "PATH=/bin"}, newLogger(&buf, "info", nil))
	got := buf.String()
	for _, name := range []string{"HTTPS_PROXY", "http_proxy", "ALL_PROXY"} {
		if !strings.Contains(got, `"variable":"`+name+`"`) {
			t.Errorf("no warning naming %s: %q", name, got)
		}
	}
	for _, name := range []string{"HTTP_PROXY", "NO_PROXY", "PATH"} {
		if strings.Contains(got, `"variable":"`+name+`"`) {
			t.Errorf("warning naming %s: %q", name, got)
		}
	}
	if !strings.Contains(got, `"level":"WARN"`) || !strings.Contains(got, "directly") || strings.Contains(got, "proxy-pass-0123") {
		t.Errorf("%q: want WARN saying the provider is reached directly, without the proxy URL", got)
	}
}

// The real binary starts with HTTPS_PROXY set and says so at WARN.
func TestBinaryWarnsOfProxyVariables(t *testing.T) {
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", t.TempDir(), "HTTPS_PROXY=http://user:proxy-pass-0123@127.0.0.1:3128")})
	line := p.waitLine(t, `"variable":"HTTPS_PROXY"`)
	if !strings.Contains(line, `"level":"WARN"`) || strings.Contains(p.text(), "proxy-pass-0123") {
		t.Errorf("warning line %s; want WARN naming HTTPS_PROXY, without its value", line)
	}
}

// A STATIC_HEADERS list written with ; (or |, white space, one entry a line
// in the _FILE) between its entries once started as one header whose value
// ran to the next comma: X-Public-Id=abc;X-Api-Version=2 sent the provider
// the public id "abc;X-Api-Version=2", and every call was refused, its 401
// stored as the order's final answer. It stops the start naming the
// variable and the header, never a value; a parameter such as
// "; charset=utf-8" and an = inside a value are kept. Other bad lists say
// which entry and why (they said only "want a comma list of Name=value").
func TestConfigStaticHeadersSeparators(t *testing.T) {
	lines := filepath.Join(t.TempDir(), "headers")
	if err := os.WriteFile(lines, []byte("X-Public-Id=pub-value-1\nX-Api-Version=2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}
	for _, tc := range []struct {
		v    string
		want []string // in the message
	}{
		{"IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-value-1;X-Api-Version=2", []string{"(X-Public-Id)", "commas"}},
		{"IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-value-1 ; x-api-version=2", []string{"(X-Public-Id)", "commas"}},
		{"IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-value-1|X-Api-Version=2", []string{"(X-Public-Id)", "commas"}},
		{"IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-value-1 Authorization=2", []string{"(X-Public-Id)", "commas"}},
		{"IDEMPROXY_STATIC_HEADERS_FILE=" + lines, []string{"IDEMPROXY_STATIC_HEADERS_FILE", "(X-Public-Id)", "commas"}},
		{"IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-value-1,X-Api-Version=", []string{"entry 2 (X-Api-Version)", "empty value"}},
		{"IDEMPROXY_STATIC_HEADERS=X-Public-Id=pub-value-1,,X-Api-Version=2", []string{"entry 2", "stray comma"}},
	} {
		_, _, err := loadConfig(append(base, tc.v))
		if err == nil {
			t.Errorf("%q accepted, want a refusal", tc.v)
			continue
		}
		msg := err.Error()
		for _, w := range append(tc.want, "IDEMPROXY_STATIC_HEADERS") {
			if !strings.Contains(msg, w) {
				t.Errorf("%q: message %q does not say %q", tc.v, msg, w)
			}
		}
		if strings.Contains(msg, "pub-value-1") {
			t.Errorf("%q: message %q shows a value", tc.v, msg)
		}
	}
	for _, v := range []string{
		"X-Public-Id=pub-value-1,X-Api-Version=2",
		"Accept=application/json; charset=utf-8",
		"X-Api-Key=abc=def",
		"Authorization=Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==",
	} {
		_, set, err := loadConfig(append(base, "IDEMPROXY_STATIC_HEADERS="+v))
		if err != nil {
			t.Errorf("%q refused: %v", v, err)
			continue
		}
		name, value, _ := strings.Cut(strings.Split(v, ",")[0], "=")
		if got := set.sign.StaticHeaders.Get(name); got != value {
			t.Errorf("%q: %s is %q, want %q", v, name, got, value)
		}
	}
}

// An upstream base path with a . or .. segment (written or %-encoded) once
// started, and every request went upstream as /v1/../admin/…: signed with
// that path, resolved by the provider or a gateway to another one. It stops
// the start naming the variable; a segment that only holds dots is kept.
func TestConfigUpstreamDotSegments(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:1/v1/../admin", "http://127.0.0.1:1/v1/%2e%2E/admin", "http://127.0.0.1:1/./v1",
		"http://127.0.0.1:1/v1/..", "https://api.example/v1/./"} {
		_, _, err := loadConfig([]string{"IDEMPROXY_UPSTREAM_URL=" + u})
		if err == nil || !strings.Contains(err.Error(), "IDEMPROXY_UPSTREAM_URL") || !strings.Contains(err.Error(), ". or ..") {
			t.Errorf("%s: %v, want a refusal naming IDEMPROXY_UPSTREAM_URL and the dot segment", u, err)
		}
	}
	for _, u := range []string{"http://127.0.0.1:1/v1.2/pay", "http://127.0.0.1:1/..v1/x...", "http://127.0.0.1:1/v1/", "http://127.0.0.1:1"} {
		if _, _, err := loadConfig([]string{"IDEMPROXY_UPSTREAM_URL=" + u}); err != nil {
			t.Errorf("%s refused: %v", u, err)
		}
	}
}

// A bad value read from a _FILE variable's file is reported under the _FILE
// variable, so that the operator looks in the file; the same value given
// in the variable itself is reported under the variable. The value is not
// shown.
func TestConfigBadValueFromFileNamesTheFileVariable(t *testing.T) {
	dir := t.TempDir()
	base := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_DATA_DIR=" + dir}
	tokens := "IDEMPROXY_CLIENT_TOKENS=app=token-of-app-0123456"
	for _, tc := range []struct {
		name, value string
		extra       []string
	}{
		{"STORE_URL", "mysql://u:pw-secret-3@127.0.0.1/db", nil},
		{"STORE_URL", "postgres://u:pw-secret-3@127.0.0.1/db?sslmode=sometimes", nil},
		{"CLIENT_TOKENS", "app-without-token-pw-secret-3", []string{"IDEMPROXY_KEY_SECRET=key-secret-0123456789"}},
		{"ADMIN_TOKEN", "pw-secret-3\tx", nil},
		{"KEY_SECRET", "pw-secret-3", []string{tokens}},
		{"KEY_SECRET", "", []string{tokens}},
		{"SIGN_SECRET", " pw-secret-3-0123456789", nil},
	} {
		file := filepath.Join(dir, strings.ToLower(tc.name))
		if err := os.WriteFile(file, []byte(tc.value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		variable := "IDEMPROXY_" + tc.name
		_, _, err := loadConfig(append(append(base, tc.extra...), variable+"_FILE="+file))
		if err == nil {
			t.Errorf("%s_FILE holding %q accepted, want a refusal", variable, tc.value)
		} else if msg := err.Error(); !strings.Contains(msg, variable+"_FILE") || strings.Contains(msg, "pw-secret-3") {
			t.Errorf("%s_FILE holding %q: message %q does not name %s_FILE, or shows the value", variable, tc.value, msg, variable)
		}
		if tc.value == "" {
			continue // unset, not bad, without the file
		}
		_, _, err = loadConfig(append(append(base, tc.extra...), variable+"="+tc.value))
		if err == nil {
			t.Errorf("%s=%q accepted, want a refusal", variable, tc.value)
		} else if msg := err.Error(); !strings.Contains(msg, variable) || strings.Contains(msg, variable+"_FILE") {
			t.Errorf("%s=%q: message %q does not name %s alone", variable, tc.value, msg, variable)
		}
	}
}
