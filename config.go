package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/caarlos0/env/v11"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/pgstore"
	"github.com/idemproxy/idemproxy/probe"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/resign"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/routes"
)

// envPrefix is the prefix of every variable (docs/contract.md, Configuration).
const envPrefix = "IDEMPROXY_"

// config is the whole process configuration, read once from the environment by
// loadConfig. The `doc` tags feed the README's table (see TestREADMEVariables).
type config struct {
	UpstreamURL      string        `env:"UPSTREAM_URL,required,notEmpty" doc:"provider base URL (required)"`
	ListenAddr       string        `env:"LISTEN_ADDR" envDefault:":8080" doc:"where legacy apps connect"`
	AdminAddr        string        `env:"ADMIN_ADDR" envDefault:":9090" doc:"health, readiness, metrics; must differ from LISTEN_ADDR"`
	DataDir          string        `env:"DATA_DIR" envDefault:"./data" doc:"Badger directory (/data in the container); unused with STORE_URL"`
	StoreURL         string        `env:"STORE_URL" doc:"postgres:// or postgresql:// URL of a database that replicas share (its pool_max_conns, default 32 and at least 4, bounds each replica's connections); empty = the embedded Badger store in DATA_DIR, one process (secret)"`
	StoreURLFile     string        `env:"STORE_URL_FILE,file" doc:"path of a file holding STORE_URL"`
	StoreLease       time.Duration `env:"STORE_LEASE" envDefault:"20s" doc:"with STORE_URL: how long a replica owns a key it is running, renewed every third of it; a dead replica's keys are resumed by another after it"`
	RecordTTL        time.Duration `env:"RECORD_TTL" envDefault:"72h" doc:"how long final responses are kept; must exceed RETRY_BUDGET + ATTEMPT_TIMEOUT + 10s (records in flight or whose outcome is unknown never expire)"`
	MaxBodyBytes     int64         `env:"MAX_BODY_BYTES" envDefault:"1048576" doc:"request body cap (413 above it); at most 64 MiB; over a quarter of the container's memory limit it is logged at WARN at start (setting may not fit the container's memory): a body near the cap is held with up to two more copies while its key is read"`
	MaxInflight      int64         `env:"MAX_INFLIGHT" envDefault:"0" doc:"requests served at once, from the end of the body to the answer (an unprotected request whose body is streamed, not signed: from arrival); a client still sending a body does not count, nor a repeat waiting for its key in flight; past it 503 overloaded with Retry-After, nothing sent, key left free (repeats of stored orders are still replayed); 0 = three quarters of the client connections ulimit -n allows, at most 1024 (see Sizing limits)"`
	MaxInflightBytes int64         `env:"MAX_INFLIGHT_BYTES" envDefault:"0" doc:"request body bytes held at once, reserved as they arrive (a Content-Length up to 64 KiB before reading); past it 503 overloaded as above; 0 = a quarter of the Go memory limit and at most a tenth of the container's (GOMEMLIMIT set higher included), else 64 MiB; at least MAX_BODY_BYTES"`
	InflightWait     time.Duration `env:"INFLIGHT_WAIT" envDefault:"10s" doc:"how long a repeat waits for the same key in flight before 409 idempotency_in_progress"`
	Protected        string        `env:"PROTECTED_METHODS" envDefault:"POST" doc:"comma list of methods that get keys and records"`
	KeySources       string        `env:"KEY_SOURCES" envDefault:"json:order_id" doc:"comma list of json:<dotted.path>, form:<field>, header:<Name>, query:<name>"`
	MissingKey       string        `env:"MISSING_KEY" envDefault:"reject" doc:"reject, generate or passthrough"`
	Preset           string        `env:"PRESET" doc:"payouts, payments or cards: the signing, retry, route and in-progress settings that provider needs; variables set explicitly win"`
	Routes           string        `env:"ROUTES" doc:"per-endpoint rules separated by ;, each METHOD PATH=POLICY; POLICY is unprotected, key:<sources>, fingerprint:<window> or reject; * matches one path segment; first match wins; unmatched requests follow PROTECTED_METHODS and KEY_SOURCES"`

	InProgressStatus int    `env:"INPROGRESS_STATUS" envDefault:"409" doc:"status of idemproxy's answer while a key is in flight past INFLIGHT_WAIT, always with Retry-After (503 for apps that retry only 5xx)"`
	InProgressCode   string `env:"INPROGRESS_CODE" envDefault:"idempotency_in_progress" doc:"error code of that answer (the payouts provider's is idempotency.in_progress)"`

	SignSecret        string `env:"SIGN_SECRET" doc:"HMAC secret; empty = no signing (secret)"`
	SignSecretFile    string `env:"SIGN_SECRET_FILE,file" doc:"path of a file holding SIGN_SECRET (container secrets)"`
	SignCanonical     string `env:"SIGN_CANONICAL" envDefault:"{timestamp}\\n{method}\\n{path}\\n{body}" doc:"canonical string template; placeholders {timestamp} {nonce} {method} {path} {query} {body} {body_sha256} {idempotency_key}, at least one"`
	SignEncoding      string `env:"SIGN_ENCODING" envDefault:"hex" doc:"hex or base64"`
	SignatureHeader   string `env:"SIGNATURE_HEADER" envDefault:"X-Signature" doc:"signature header name"`
	TimestampHeader   string `env:"TIMESTAMP_HEADER" envDefault:"X-Timestamp" doc:"timestamp header name (unix seconds)"`
	NonceHeader       string `env:"NONCE_HEADER" doc:"nonce header name, e.g. X-Nonce; empty = no nonce"`
	StaticHeaders     string `env:"STATIC_HEADERS" doc:"comma list of Name=value set on every upstream call, e.g. X-Public-Id=abc (secret)"`
	StaticHeadersFile string `env:"STATIC_HEADERS_FILE,file" doc:"path of a file holding STATIC_HEADERS"`

	ClientTokens     string `env:"CLIENT_TOKENS" doc:"comma list of client=token (tokens of 16+ characters; white space around names and tokens is ignored; no client may be named default; names print, and no two differ only in letter case, white space or Unicode form); empty = no client authentication, one tenant for all (secret)"`
	ClientTokensFile string `env:"CLIENT_TOKENS_FILE,file" doc:"path of a file holding CLIENT_TOKENS"`
	AdminToken       string `env:"ADMIN_TOKEN" doc:"bearer token every /admin/ call on the admin port needs (401 otherwise); empty = admin API open; health and metrics never need it (secret)"`
	AdminTokenFile   string `env:"ADMIN_TOKEN_FILE,file" doc:"path of a file holding ADMIN_TOKEN"`
	ClientHeader     string `env:"CLIENT_HEADER" envDefault:"Idemproxy-Client-Token" doc:"request header carrying the client token; removed before forwarding"`
	KeySecret        string `env:"KEY_SECRET" doc:"16+ characters; required with CLIENT_TOKENS: binds every Idempotency-Key sent upstream to its client (HMAC), so no client can compute or claim another's; the same on every replica; an operation in flight or with an unknown outcome keeps the upstream key it was first sent with when it changes (secret)"`
	KeySecretFile    string `env:"KEY_SECRET_FILE,file" doc:"path of a file holding KEY_SECRET"`

	RetryMaxAttempts int           `env:"RETRY_MAX_ATTEMPTS" envDefault:"5" doc:"attempts per request, first included (1-20; dial failures and Retry-After: 0 still wait a backoff)"`
	RetryBaseDelay   time.Duration `env:"RETRY_BASE_DELAY" envDefault:"500ms" doc:"backoff base"`
	RetryMaxDelay    time.Duration `env:"RETRY_MAX_DELAY" envDefault:"60s" doc:"cap per wait, Retry-After included"`
	RetryBudget      time.Duration `env:"RETRY_BUDGET" envDefault:"2m" doc:"total time for one request's attempts (at most 24h)"`
	AttemptTimeout   time.Duration `env:"ATTEMPT_TIMEOUT" envDefault:"30s" doc:"one upstream attempt (at most 24h); RETRY_BUDGET bounds it too"`
	RetryStatuses    string        `env:"RETRY_STATUSES" envDefault:"429,500,502,503,504" doc:"retriable HTTP statuses; an item may be a range such as 500-599"`
	RetryCodes       string        `env:"RETRY_CODES" envDefault:"idempotency.in_progress,idempotency_in_progress,payout.funds_maturing,payout.frozen" doc:"comma list of retriable business codes (letters, digits, . _ - :) at error.code or code in a 4xx JSON body"`
	RateLimit        float64       `env:"RATE_LIMIT" envDefault:"0" doc:"outbound requests per second; 0 = off, else at least 0.000278 (one an hour); with replicas on PostgreSQL, their total"`
	RateBurst        int           `env:"RATE_BURST" envDefault:"1" doc:"outbound burst"`

	StatusProbe          string        `env:"STATUS_PROBE" doc:"provider lookup sent before re-sending an operation whose outcome is unknown: METHOD PATH [BODY] with {idempotency_key}, {req.<dotted.path>}, {resp.<dotted.path>}, e.g. GET /payments/{resp.payment_id}; empty = none"`
	StatusProbeRoutes    string        `env:"STATUS_PROBE_ROUTES" doc:"the operations STATUS_PROBE looks up: METHOD PATH rules separated by ; (* is one path segment, as in ROUTES), e.g. POST /payments; others are re-sent with the same key; empty = every operation"`
	StatusProbeNotFound  string        `env:"STATUS_PROBE_NOT_FOUND_CODES" doc:"comma list of the error codes (at error.code or code of a JSON body) by which the provider answers STATUS_PROBE 404 for an operation it does not have (payouts: payout.not_found); set, only such an answer means not executed, any other 404 (a gateway's, another code) leaves the outcome unknown; empty = any 404 means not executed but an HTML page (a gateway's or load balancer's)"`
	ProviderKeyRetention time.Duration `env:"PROVIDER_KEY_RETENTION" envDefault:"0" doc:"how long the provider keeps idempotency keys (payments: 48h); an unknown operation first sent longer ago is never re-sent blindly; 0 = forever"`

	LogLevel      string        `env:"LOG_LEVEL" envDefault:"info" doc:"debug, info, warn or error"`
	ShutdownGrace time.Duration `env:"SHUTDOWN_GRACE" envDefault:"30s" doc:"how long SIGTERM waits for in-flight operations"`
}

// settings is config parsed into the types the packages take.
type settings struct {
	clients      *proxy.ClientTokens
	clientTokens string // the raw CLIENT_TOKENS, only for log redaction
	keySecret    []byte // binds upstream keys to clients (proxy.Options.KeySecret)
	upstream     *url.URL
	protected    []string
	sources      []idemkey.Source
	missingKey   proxy.MissingKey
	routes       routes.Table
	sign         resign.Config
	policy       retry.Policy
	probe        *probe.Template // nil: no status probe
	probeFor     routes.Table    // the operations the probe is for; no rules: all
	notFound     []string        // the probe's 404 codes that mean "no such operation"
	adminToken   string          // empty: admin API open
	storeURL     string          // empty: Badger
}

// loadConfig reads the environment (environ as from os.Environ) and checks it. Every
// error names the variable at fault.
func loadConfig(environ []string) (config, settings, error) {
	vars := env.ToMap(environ)
	if err := quotedValues(vars); err != nil {
		return config{}, settings{}, err
	}
	if err := blankValues(vars); err != nil {
		return config{}, settings{}, err
	}
	if err := applyPreset(vars); err != nil {
		return config{}, settings{}, err
	}
	if err := secretFilePaths(vars); err != nil {
		return config{}, settings{}, err
	}
	opts := env.Options{Prefix: envPrefix, Environment: vars}
	cfg, err := env.ParseAsWithOptions[config](opts)
	if err != nil {
		return cfg, settings{}, nameVariables(err)
	}
	if err := emptySecretFiles(cfg, vars); err != nil {
		return cfg, settings{}, err
	}
	s, err := cfg.settings()
	return cfg, s, err
}

// quotedValues refuses a setting whose value is wrapped in quotes ("…" or
// '…'). `docker run --env-file` keeps quotes as part of the value
// (IDEMPROXY_SIGN_SECRET="…" in the file), where a shell or a Compose .env
// file strips them: a quoted upstream URL
// stopped the start with only "not a URL", and a quoted signing secret,
// admin token or client token started and was used quotes included, every
// signed request then refused by the provider. Only the variable is named,
// since the value may be a secret.
func quotedValues(vars map[string]string) error {
	var quoted []string
	for _, v := range configVars() {
		val, ok := vars[v.name]
		if ok && len(val) >= 2 && (val[0] == '"' || val[0] == '\'') && val[len(val)-1] == val[0] {
			quoted = append(quoted, v.name)
		}
	}
	if len(quoted) == 0 {
		return nil
	}
	return fmt.Errorf("%s: the value is wrapped in quotes, which would be part of it: "+
		"docker run --env-file keeps quotes as they are written; remove them",
		strings.Join(quoted, ", "))
}

// blankValues refuses a setting whose value is white space only. An empty
// value is taken as unset (the default applies), but one of blanks is not:
// IDEMPROXY_RETRY_CODES=" " started with no retriable code (every 409
// payout.funds_maturing stored as final), IDEMPROXY_RETRY_STATUSES=" " with
// no retriable status, IDEMPROXY_SIGN_CANONICAL=" " signed one space (the
// same signature for every request), IDEMPROXY_DATA_DIR=" " kept the
// records in a directory named by a space; a secret of blanks would be a
// key anyone can guess. Only the variables are named.
func blankValues(vars map[string]string) error {
	var blank []string
	for _, v := range configVars() {
		if val := vars[v.name]; val != "" && strings.TrimSpace(val) == "" {
			blank = append(blank, v.name)
		}
	}
	if len(blank) == 0 {
		return nil
	}
	return fmt.Errorf("%s: the value holds only white space: unset it for the default, or set a value",
		strings.Join(blank, ", "))
}

// maxSecretFile bounds the file a <NAME>_FILE names: more than any secret
// or list of client tokens holds (a variable's value is at most 128 KiB on
// Linux), far less than memory.
const maxSecretFile = 1 << 20

// secretFilePaths checks every <NAME>_FILE of vars with checkSecretFile,
// before the files are read.
func secretFilePaths(vars map[string]string) error {
	for _, v := range configVars() {
		if !slices.Contains(strings.Split(v.opts, ","), "file") || vars[v.name] == "" {
			continue
		}
		if err := checkSecretFile(vars[v.name]); err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
	}
	return nil
}

// checkSecretFile refuses a secret file path that names no regular file, or
// one larger than maxSecretFile. Read as it was, /dev/zero (or any device)
// took memory until the process was killed, a FIFO no one writes to held
// the start for ever, and a file of megabytes (a log, a dump, the wrong
// mount) was taken whole as the secret. A path that cannot be looked at is
// left to the read, whose error says why (not found, permission denied).
func checkSecretFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	if !fi.Mode().IsRegular() {
		what := "not a regular file"
		switch {
		case fi.IsDir():
			what += " but a directory"
		case fi.Mode()&fs.ModeNamedPipe != 0:
			what += " but a named pipe"
		case fi.Mode()&fs.ModeDevice != 0:
			what += " but a device"
		case fi.Mode()&fs.ModeSocket != 0:
			what += " but a socket"
		}
		return fmt.Errorf("%s is %s: want the path of a file that holds the secret", path, what)
	}
	if fi.Size() > maxSecretFile {
		return fmt.Errorf("%s holds %d bytes, more than the %d a secret file may: is it the right file?", path, fi.Size(), maxSecretFile)
	}
	return nil
}

// configVar is one of config's variables, read from its struct tags.
type configVar struct {
	field string            // the Go field
	name  string            // the variable, with envPrefix
	opts  string            // the env tag's options after the name (file, required)
	tag   reflect.StructTag // envDefault, doc
}

// configVars lists config's variables in field order (index i is field i).
func configVars() []configVar {
	t := reflect.TypeFor[config]()
	vars := make([]configVar, t.NumField())
	for i := range vars {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("env"), ",")
		vars[i] = configVar{field: f.Name, name: envPrefix + name, opts: opts, tag: f.Tag}
	}
	return vars
}

// nameVariables rewrites env's parse errors, which name the Go field, so that they
// name the environment variable an operator has to fix.
func nameVariables(err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	vars := map[string]string{}
	for _, v := range configVars() {
		vars[v.field] = v.name
	}
	out := make([]error, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) && vars[pe.Name] != "" {
			e = fmt.Errorf("%s: cannot parse as %s: %w", vars[pe.Name], pe.Type, pe.Err)
		}
		e = denied(e, "read the file", "make it readable for that user (on the host: chown %[1]d, mode 400)")
		out = append(out, e)
	}
	return errors.Join(out...)
}

// emptySecretFiles refuses a <NAME>_FILE variable whose file holds nothing
// but white space. A secret mounted empty (a provisioning slip) would
// otherwise turn its feature off without a word: the admin API open to
// anyone on the admin port, signing or client authentication off, the
// embedded store instead of the database the replicas share.
func emptySecretFiles(cfg config, vars map[string]string) error {
	v := reflect.ValueOf(cfg)
	for i, cv := range configVars() {
		if !slices.Contains(strings.Split(cv.opts, ","), "file") || vars[cv.name] == "" {
			continue
		}
		if strings.TrimSpace(v.Field(i).String()) == "" {
			return fmt.Errorf("%s: the file %s is empty", cv.name, vars[cv.name])
		}
	}
	return nil
}

func bad(name string, err error) error {
	return fmt.Errorf("%s%s: %w", envPrefix, name, err)
}

// setBy names the variable a secret's value came from, for bad: name, or
// name_FILE when file (the _FILE variable's value) is set, so that a bad
// value in a file is looked for in that file.
func setBy(name, file string) string {
	if file != "" {
		return name + "_FILE"
	}
	return name
}

func (c *config) settings() (settings, error) {
	var s settings
	var err error
	if s.upstream, err = parseUpstream(c.UpstreamURL); err != nil {
		return s, bad("UPSTREAM_URL", err)
	}
	if s.sources, err = idemkey.ParseSources(c.KeySources); err != nil {
		return s, bad("KEY_SOURCES", err)
	}
	if s.missingKey, err = proxy.ParseMissingKey(c.MissingKey); err != nil {
		return s, bad("MISSING_KEY", err)
	}
	if s.protected, err = parseMethods(c.Protected); err != nil {
		return s, bad("PROTECTED_METHODS", err)
	}
	if s.routes, err = c.routes(); err != nil {
		return s, bad("ROUTES", err)
	}
	if err := checkInProgress(c.InProgressStatus, c.InProgressCode); err != nil {
		return s, err
	}
	if s.sign, err = c.signConfig(); err != nil {
		return s, err
	}
	if s.clients, s.clientTokens, err = c.clients(headersInUse(s)); err != nil {
		return s, err
	}
	if s.keySecret, err = c.keySecret(s.clients != nil); err != nil {
		return s, err
	}
	if s.policy, err = c.retryPolicy(); err != nil {
		return s, err
	}
	if s.adminToken, err = secret("ADMIN_TOKEN", c.AdminToken, c.AdminTokenFile); err != nil {
		return s, err
	}
	if err := checkBearer(s.adminToken); err != nil {
		return s, bad(setBy("ADMIN_TOKEN", c.AdminTokenFile), err)
	}
	if err := c.checkTokensApart(s); err != nil {
		return s, err
	}
	if c.StatusProbe != "" {
		if s.probe, err = probe.Parse(c.StatusProbe); err != nil {
			return s, bad("STATUS_PROBE", err)
		}
	}
	if s.probeFor, err = probeRoutes(c.StatusProbeRoutes); err != nil {
		return s, bad("STATUS_PROBE_ROUTES", err)
	}
	if s.notFound, err = notFoundCodes(c.StatusProbeNotFound); err != nil {
		return s, bad("STATUS_PROBE_NOT_FOUND_CODES", err)
	}
	if s.storeURL, err = c.storeURL(); err != nil {
		return s, err
	}
	return s, c.checkNumbers()
}

// checkTokensApart refuses a client token (s.clients) equal to a
// server secret: the signing secret, the admin token or the key secret. The
// app given that token would hold the provider's signing key (and sign any
// request itself), the admin API (resolve, renew, discard operations), or
// what binds every client's upstream keys to its client. The message names
// the variables and the client, never the value.
func (c *config) checkTokensApart(s settings) error {
	secrets := []struct{ name, what, val string }{
		{envPrefix + setBy("SIGN_SECRET", c.SignSecretFile), "the provider's signing key", string(s.sign.Secret)},
		{envPrefix + setBy("ADMIN_TOKEN", c.AdminTokenFile), "the admin API", s.adminToken},
		{envPrefix + setBy("KEY_SECRET", c.KeySecretFile), "the secret that binds every client's upstream keys", string(s.keySecret)},
	}
	for _, sec := range secrets {
		if name, ok := s.clients.Holder(sec.val); ok && sec.val != "" {
			return fmt.Errorf("%s: the token of client %s is the value of %s: that app would hold %s; give each its own value",
				envPrefix+setBy("CLIENT_TOKENS", c.ClientTokensFile), name, sec.name, sec.what)
		}
	}
	return nil
}

// notFoundCodes parses STATUS_PROBE_NOT_FOUND_CODES: a comma list of error
// codes. A status ("404 payout.not_found") or a space in one is refused: the
// codes are matched whole, and such an entry would never match.
func notFoundCodes(s string) ([]string, error) {
	var out []string
	for code := range strings.SplitSeq(s, ",") {
		code = strings.TrimSpace(code)
		if code == "" {
			continue
		}
		if strings.ContainsAny(code, " \t\"{}") {
			return nil, fmt.Errorf("%q: want a comma list of error codes as the provider writes them, e.g. payout.not_found", code)
		}
		out = append(out, code)
	}
	return out, nil
}

// probeRoutes parses STATUS_PROBE_ROUTES: ROUTES rules without a policy.
func probeRoutes(s string) (routes.Table, error) {
	var rules []string
	for entry := range strings.SplitSeq(s, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		if strings.Contains(entry, "=") {
			return routes.Table{}, fmt.Errorf("%q: want METHOD PATH, with no =POLICY, e.g. POST /payments", entry)
		}
		rules = append(rules, entry+"=unprotected")
	}
	return routes.Parse(strings.Join(rules, ";"))
}

// routes parses ROUTES. Three fingerprint windows must fit in RECORD_TTL:
// the anchors that tie a window's requests together live that long, and a
// request reads those of the two periods before its own to find an operation
// still in flight or unknown, up to three windows after the anchor was
// written. With a TTL of one window, a retry 1.2 windows after an unknown
// top-up found its anchor expired and was sent under a new key: executed
// twice.
func (c *config) routes() (routes.Table, error) {
	t, err := routes.Parse(c.Routes)
	if err != nil {
		return t, err
	}
	for _, r := range t.Rules() {
		if r.Policy == routes.Fingerprint && r.Window > c.RecordTTL/3 {
			return t, fmt.Errorf("rule %q: window longer than a third of %sRECORD_TTL (%s): the window's records must outlive three windows", r.String(), envPrefix, c.RecordTTL)
		}
	}
	return t, nil
}

// checkInProgress checks the in-progress answer: an error status, and a code
// that reads as one in JSON and in logs.
func checkInProgress(status int, code string) error {
	if status < 400 || status > 599 {
		return bad("INPROGRESS_STATUS", fmt.Errorf("want a 4xx or 5xx status, got %d", status))
	}
	if !isCode(code) {
		return bad("INPROGRESS_CODE", fmt.Errorf("want 1-100 letters, digits and . _ - :, got %q", code))
	}
	return nil
}

// isCode reports an error code as providers write them: 1-100 letters,
// digits and . _ - : (payout.funds_maturing, idempotency_in_progress).
func isCode(code string) bool {
	return code != "" && len(code) <= 100 && !strings.ContainsFunc(code, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-:", r))
	})
}

// checkCodes checks RETRY_CODES item by item. A list written with another
// separator ("payout.funds_maturing; payout.frozen", or spaces) would
// otherwise be one code that no answer carries: every 409
// payout.funds_maturing stored as final, the payout dropped, without a word.
func checkCodes(list string) error {
	for item := range strings.SplitSeq(list, ",") {
		if item = strings.TrimSpace(item); item != "" && !isCode(item) {
			return bad("RETRY_CODES", fmt.Errorf("want a comma list of codes of 1-100 letters, digits and . _ - :, got %q", item))
		}
	}
	return nil
}

func parseUpstream(raw string) (*url.URL, error) {
	// A space after the base path ("https://api.example/v1 ", copied with
	// the URL) parsed and started: every request then went to /v1%20/…,
	// which no provider serves.
	if raw != strings.TrimSpace(raw) {
		return nil, errors.New("begins or ends with white space (copied with the URL?), which would be part of the base path; remove it")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("not a URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("want an absolute http or https URL such as https://api.provider.example")
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, errors.New("must not carry credentials, a query or a fragment")
	}
	// A dot segment went upstream as written, in every request's path and
	// in the signed {path}: a provider or gateway that resolves it serves
	// another path than the one signed, or another API. u.Path is decoded,
	// so %2e%2e is found too.
	for seg := range strings.SplitSeq(u.Path, "/") {
		if seg == "." || seg == ".." {
			return nil, errors.New("the base path holds a . or .. segment, which the provider would resolve to another path " +
				"than the one sent and signed; write the path it means")
		}
	}
	if p := u.Port(); p != "" {
		// url.Parse takes any digits: https://api.example:99999 would start
		// and fail every request at the dial.
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("port %q: want 1 to 65535", p)
		}
	}
	return u, nil
}

func parseMethods(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m == "" || strings.ContainsFunc(m, func(r rune) bool { return r < 'A' || r > 'Z' }) {
			return nil, fmt.Errorf("bad method %q", m)
		}
		out = append(out, m)
	}
	return out, nil
}

// secret returns the value of NAME or NAME_FILE, never both. A value of
// white space only was refused before (blankValues), as an empty file is
// (emptySecretFiles). A file's final line break (LF or CRLF) is no part of
// the value. A value that begins with a byte order mark, which Windows
// editors write at the start of a text file, is refused: the mark would be
// part of the secret (a signing key that no provider has, an admin token no
// operator types, a client named with it).
func secret(name, val, fromFile string) (string, error) {
	if val != "" && fromFile != "" {
		return "", fmt.Errorf("%s%s and %s%s_FILE are both set; use one", envPrefix, name, envPrefix, name)
	}
	v, from := val, envPrefix+name
	if fromFile != "" {
		v, from = strings.TrimRight(fromFile, "\r\n"), envPrefix+name+"_FILE"
	}
	if strings.HasPrefix(v, "\uFEFF") {
		return "", fmt.Errorf("%s: the value begins with a byte order mark (U+FEFF), which an editor adds "+
			"and which would be part of it; save the file as UTF-8 without it", from)
	}
	return v, nil
}

// checkKey refuses a key (SIGN_SECRET, KEY_SECRET) that begins or ends with
// white space, typically the line break of a file the secret was made from
// (kubectl create secret --from-file, then the variable set from the
// secret): the key would hold it, every signature then refused by the
// provider, or every upstream key differing from a replica's that reads the
// same secret from its _FILE. The message does not quote the key.
func checkKey(name, key string) error {
	if key != strings.TrimSpace(key) {
		return bad(name, errors.New("begins or ends with white space (a line break?), which would be part of the key; remove it"))
	}
	return nil
}

func (c *config) signConfig() (resign.Config, error) {
	var sc resign.Config
	key, err := secret("SIGN_SECRET", c.SignSecret, c.SignSecretFile)
	if err != nil {
		return sc, err
	}
	static, err := secret("STATIC_HEADERS", c.StaticHeaders, c.StaticHeadersFile)
	if err != nil {
		return sc, err
	}
	if err := checkKey(setBy("SIGN_SECRET", c.SignSecretFile), key); err != nil {
		return sc, err
	}
	sc.Secret = []byte(key)
	if sc.Template, err = resign.ParseTemplate(c.SignCanonical); err != nil {
		return sc, bad("SIGN_CANONICAL", err)
	}
	// A template of literal text only signs the same string for every
	// request: one signature, valid for any method, path, body and time,
	// which anyone who sees one request can reuse.
	if sc.Template.Constant() {
		return sc, bad("SIGN_CANONICAL", errors.New("holds no placeholder, so every request would get the same signature; "+
			"write the provider's scheme with some of "+resign.Placeholders+" (\\n is a newline)"))
	}
	if c.SignEncoding != "hex" && c.SignEncoding != "base64" {
		return sc, bad("SIGN_ENCODING", fmt.Errorf("want hex or base64, got %q", c.SignEncoding))
	}
	sc.Encoding = c.SignEncoding
	staticVar := setBy("STATIC_HEADERS", c.StaticHeadersFile)
	if err := checkHeaderSeparators(static); err != nil {
		return sc, bad(staticVar, err)
	}
	// The value may hold credentials: ParseStaticHeaders' errors name the
	// entry and its header, never a value.
	if sc.StaticHeaders, err = resign.ParseStaticHeaders(static); err != nil {
		return sc, bad(staticVar, fmt.Errorf("want a comma list of Name=value: %w", err))
	}
	sc.SignatureHeader, sc.TimestampHeader, sc.NonceHeader = c.SignatureHeader, c.TimestampHeader, c.NonceHeader
	// The signer checks how the settings combine ({nonce} without a nonce
	// header, one header name used twice): check now, so that start stops
	// with status 2 naming the variable.
	if _, err := resign.New(sc, nil); err != nil {
		return sc, bad(signVariable(err), err)
	}
	return sc, nil
}

// checkHeaderSeparators refuses a STATIC_HEADERS list whose entries are
// separated by something else than the comma: "X-Public-Id=abc;X-Api-Version=2"
// (or |, white space, one entry a line in the _FILE) was one header,
// X-Public-Id, whose value ran to the next comma: the provider got a public
// id it does not know and refused every call, its 401 stored as the final
// answer of each order. What follows a separator is taken for another entry
// when it reads as Name=value with a name written as header names are, with
// a hyphen or a capital (X-Api-Version, Authorization); a parameter such as
// "; charset=utf-8", or base64 padding, is not one. The message names the
// header and the separator, never a value.
func checkHeaderSeparators(list string) error {
	for i, entry := range strings.Split(list, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if !ok {
			continue // ParseStaticHeaders says: missing "="
		}
		for _, sep := range []string{";", "|", "\n", "\r", "\t", " "} {
			for _, p := range strings.Split(value, sep)[1:] {
				n, v, ok := strings.Cut(strings.TrimSpace(p), "=")
				if ok && strings.Trim(v, "= \t") != "" && headerLike(n) {
					return fmt.Errorf("entry %d (%s): the value holds %q and then another Name=value, which would be part of the value: "+
						"separate the entries with commas (Name=value,Name=value)", i+1, http.CanonicalHeaderKey(strings.TrimSpace(name)), sep)
				}
			}
		}
	}
	return nil
}

// headerLike reports a header field name written as header names are: with
// a hyphen or starting with a capital letter.
func headerLike(name string) bool {
	return resign.CheckHeaderName(name) == nil && (strings.Contains(name, "-") || name[0] >= 'A' && name[0] <= 'Z')
}

// signVariable names the variable behind an error of resign.New, whose text
// names the Config field at fault first (it never holds secret values).
func signVariable(err error) string {
	fields := []struct{ field, name string }{
		{"SignatureHeader", "SIGNATURE_HEADER"},
		{"TimestampHeader", "TIMESTAMP_HEADER"},
		{"NonceHeader", "NONCE_HEADER"},
		{"Template", "SIGN_CANONICAL"},
		{"Encoding", "SIGN_ENCODING"},
		{"StaticHeaders", "STATIC_HEADERS"},
	}
	msg := err.Error()
	name, at := "SIGN_CANONICAL", len(msg)
	for _, f := range fields {
		if i := strings.Index(msg, f.field); i >= 0 && i < at {
			name, at = f.name, i
		}
	}
	return name
}

func (c *config) retryPolicy() (retry.Policy, error) {
	if err := checkCodes(c.RetryCodes); err != nil {
		return retry.Policy{}, err
	}
	p := retry.Policy{
		MaxAttempts:    c.RetryMaxAttempts,
		BaseDelay:      c.RetryBaseDelay,
		MaxDelay:       c.RetryMaxDelay,
		Budget:         c.RetryBudget,
		AttemptTimeout: c.AttemptTimeout,
		Codes:          retry.ParseCodes(c.RetryCodes),
	}
	var err error
	if p.Statuses, err = retry.ParseStatuses(c.RetryStatuses); err != nil {
		return p, bad("RETRY_STATUSES", err)
	}
	return p, nil
}

// lease is how long an in-flight record is owned: longer than any attempt
// sequence (budget plus one attempt that started just before it ran out),
// with a margin for the store's write and the clock. checkNumbers bounds both
// durations by maxSequence, so the sum cannot overflow.
func (c *config) lease() time.Duration {
	return c.RetryBudget + c.AttemptTimeout + 10*time.Second
}

// maxSequence bounds RETRY_BUDGET and ATTEMPT_TIMEOUT: a request held longer
// than a day is not a retry any more, and the bound keeps lease() from
// overflowing (2562047h + 1h once wrapped negative and passed the TTL check).
const maxSequence = 24 * time.Hour

// maxBodyLimit is the largest IDEMPROXY_MAX_BODY_BYTES accepted.
const maxBodyLimit = 64 << 20

// minRateLimit is the smallest IDEMPROXY_RATE_LIMIT accepted but 0 (off):
// one request per hour.
const minRateLimit = 1.0 / 3600

// checkNumbers rejects values that parse but make no sense.
func (c *config) checkNumbers() error {
	checks := []struct {
		name string
		ok   bool
		want string
	}{
		{"RETRY_BUDGET", c.RetryBudget > 0 && c.RetryBudget <= maxSequence, "a positive duration up to " + maxSequence.String()},
		{"ATTEMPT_TIMEOUT", c.AttemptTimeout > 0 && c.AttemptTimeout <= maxSequence, "a positive duration up to " + maxSequence.String()},
		// Bodies are held in memory while their operation runs: a cap in
		// the terabytes is a typo that only an OOM kill would report.
		{"MAX_BODY_BYTES", c.MaxBodyBytes > 0 && c.MaxBodyBytes <= maxBodyLimit, "a positive number of bytes up to 64 MiB (67108864)"},
		{"MAX_INFLIGHT", c.MaxInflight >= 0, "0 (derived) or a positive number of requests"},
		// A body at the cap must fit in the byte bound, or it is refused for ever.
		{"MAX_INFLIGHT_BYTES", c.MaxInflightBytes == 0 || c.MaxInflightBytes >= c.MaxBodyBytes, "0 (derived) or at least MAX_BODY_BYTES"},
		// A final answer kept for less than one attempt sequence could be
		// gone before the app's own blind retries of it are over.
		{"RECORD_TTL", c.RecordTTL > c.lease(), fmt.Sprintf("longer than the in-flight lease, RETRY_BUDGET + ATTEMPT_TIMEOUT + 10s = %s", c.lease())},
		{"INFLIGHT_WAIT", c.InflightWait > 0, "a positive duration"},
		{"STORE_LEASE", c.StoreLease >= time.Second && c.StoreLease < c.RecordTTL, "from 1s to less than RECORD_TTL"},
		{"RETRY_MAX_ATTEMPTS", c.RetryMaxAttempts >= 1 && c.RetryMaxAttempts <= retry.MaxAttemptsLimit, fmt.Sprintf("from 1 to %d", retry.MaxAttemptsLimit)},
		{"RETRY_BASE_DELAY", c.RetryBaseDelay > 0, "a positive duration"},
		{"RETRY_MAX_DELAY", c.RetryMaxDelay >= c.RetryBaseDelay, "at least RETRY_BASE_DELAY"},
		// Below one request an hour the limit is a slip of the unit (it is
		// per second), and once the burst is spent nearly every request
		// would end unsent: a wait for a token that would pass
		// RETRY_BUDGET ends the attempts (ratelimit.ErrDeadline).
		{"RATE_LIMIT", c.RateLimit == 0 || c.RateLimit >= minRateLimit && !math.IsInf(c.RateLimit, 1),
			"0 (off) or a finite rate of at least one request per hour (0.000278; the rate is per second)"},
		{"RATE_BURST", c.RateBurst >= 1, "at least 1"},
		{"PROVIDER_KEY_RETENTION", c.ProviderKeyRetention >= 0, "0 (forever) or a positive duration"},
		{"SHUTDOWN_GRACE", c.ShutdownGrace > 0, "a positive duration"},
		// Checked here, not only when the listener opens: a bad address is a
		// bad setting (status 2, the variable named), not a failed start.
		{"LISTEN_ADDR", listenAddrOK(c.ListenAddr), "an address such as :8080 or 127.0.0.1:8080"},
		{"ADMIN_ADDR", listenAddrOK(c.AdminAddr), "an address such as :9090 or 127.0.0.1:9090"},
		// "/data " started and kept the records in a directory named with
		// the space, beside the volume mounted at /data: gone at the next
		// container, and with them every stored answer the apps replay.
		{"DATA_DIR", c.DataDir != "" && c.DataDir == strings.TrimSpace(c.DataDir),
			"a directory, without white space before or after it (a trailing space would name another directory)"},
	}
	for _, ch := range checks {
		if !ch.ok {
			return bad(ch.name, errors.New("must be "+ch.want))
		}
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return bad("LOG_LEVEL", err)
	}
	if sameListener(c.ListenAddr, c.AdminAddr) {
		return fmt.Errorf("%sLISTEN_ADDR and %sADMIN_ADDR are both %s: the proxy and the admin port need different ports",
			envPrefix, envPrefix, c.ListenAddr)
	}
	return nil
}

// listenAddrOK reports a TCP listen address of the form host:port, host
// optional (all addresses), port a number from 0 to 65535 or a service name
// such as "http". Whether the host resolves, and whether the port is free, is
// known only when the listener opens.
func listenAddrOK(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" || strings.ContainsFunc(host, unicode.IsSpace) {
		return false
	}
	_, err = net.LookupPort("tcp", port)
	return err == nil
}

// sameListener reports two listen addresses that cannot both be bound: the
// same fixed port on the same host, or on a wildcard host (which takes the
// port on every address). Port 0 asks for a free port and never clashes.
func sameListener(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil {
		return a == b
	}
	if pa != pb || pa == "0" {
		return false
	}
	wild := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wild(ha) || wild(hb)
}

// storeOptions are the Badger store's options: durable writes (docs/storage.md: the
// in-flight record is on disk before the first upstream byte) and the cache
// package's memory defaults, sized for a small container (README, Memory).
func storeOptions(cfg config, log *slog.Logger) cache.Options {
	return cache.Options{
		Dir:        cfg.DataDir,
		SyncWrites: true,
		TTL:        cfg.RecordTTL,
		Logger:     log,
	}
}

// storeURL returns STORE_URL (or its _FILE): empty, or a postgres URL.
func (c *config) storeURL() (string, error) {
	raw, err := secret("STORE_URL", c.StoreURL, c.StoreURLFile)
	if err != nil || raw == "" {
		return raw, err
	}
	// White space around the URL (copied from a file or a web page with
	// its line break or a space) would be part of it: a trailing space
	// names another database ("db "), or another parameter value. The URL
	// may hold a password: name the variable, not the content.
	name := setBy("STORE_URL", c.StoreURLFile)
	if raw != strings.TrimSpace(raw) {
		return "", bad(name, errors.New("the URL begins or ends with white space (a space or a line break copied with it?), which would be part of it; remove it"))
	}
	// The host is in the authority, or, for a Unix socket directory, in
	// the query (postgres://user:password@/db?host=/run/postgresql).
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" && u.Query().Get("host") == "" {
		return "", bad(name, errors.New("want a URL such as postgres://user:password@host:5432/db"))
	}
	// url.Parse lowers the scheme; PostgreSQL's clients (libpq, pgx) take
	// only postgres:// or postgresql:// as written, and pgx would read any
	// other spelling as key=value settings ("invalid keyword/value").
	if !strings.HasPrefix(raw, u.Scheme+"://") {
		return "", bad(name, errors.New("the scheme must be postgres:// or postgresql://, in lower case"))
	}
	// Its parameters (sslmode, connect_timeout, pool_max_conns…) are checked
	// here too, so that a bad one stops the start as any bad value does.
	if err := pgstore.CheckURL(raw); err != nil {
		return "", bad(name, err)
	}
	return raw, nil
}

// clients parses client authentication (CLIENT_TOKENS or its _FILE); the raw
// list is returned too, for log redaction. inUse are the headers the token
// header must not be (headersInUse).
func (c *config) clients(inUse []string) (*proxy.ClientTokens, string, error) {
	list, err := secret("CLIENT_TOKENS", c.ClientTokens, c.ClientTokensFile)
	if err != nil {
		return nil, "", err
	}
	if err := checkClientHeader(c.ClientHeader, inUse); err != nil {
		return nil, "", bad("CLIENT_HEADER", err)
	}
	if err := checkTokenSeparators(list); err != nil {
		return nil, "", bad(setBy("CLIENT_TOKENS", c.ClientTokensFile), err)
	}
	ct, err := proxy.ParseClientTokens(c.ClientHeader, list)
	if err != nil {
		return nil, "", bad(setBy("CLIENT_TOKENS", c.ClientTokensFile), err)
	}
	return ct, list, nil
}

// checkTokenSeparators refuses a CLIENT_TOKENS list whose entries are
// separated by something else than the comma: "a=token1;b=token2" (or with
// |, white space, one entry a line in a file) was one client, a, whose
// token was "token1;b=token2", so that neither app's token matched and b
// was no client at all. It looks for what follows a separator in a token
// and reads as another client=token; a token that only ends in = (base64
// padding) is not one. The message names the client, never the token.
func checkTokenSeparators(list string) error {
	for i, entry := range strings.Split(list, ",") {
		name, token, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if !ok {
			continue // ParseClientTokens says: want client=token
		}
		token = strings.TrimSpace(token) // as ParseClientTokens reads it
		for _, sep := range []string{";", "|", "\n", "\r", "\t", " "} {
			parts := strings.Split(token, sep)
			for _, p := range parts[1:] {
				n, t, ok := strings.Cut(strings.TrimSpace(p), "=")
				if ok && strings.TrimSpace(n) != "" && strings.Trim(t, "= \t") != "" {
					return fmt.Errorf("entry %d (%s): the token holds %q and then another client=token: "+
						"separate the entries with commas (client=token,client=token)", i+1, strings.TrimSpace(name), sep)
				}
			}
		}
	}
	return nil
}

// headersInUse are the request headers idemproxy already means something
// by, given the parsed settings: the key's own, the framing and hop-by-hop
// headers, the signing and static headers it sets upstream, and the headers
// the key sources read (the header: entries of KEY_SOURCES and of every key:
// rule of ROUTES, a preset's rules included, as they are the ROUTES in
// effect).
func headersInUse(s settings) []string {
	names := append([]string{idemkey.HeaderName, "X-Idempotency-Key", "Host", "Content-Length", "Content-Type", "Expect",
		s.sign.SignatureHeader, s.sign.TimestampHeader, s.sign.NonceHeader}, proxy.HopHeaders()...)
	for n := range s.sign.StaticHeaders {
		names = append(names, n)
	}
	add := func(srcs []idemkey.Source) {
		for _, src := range srcs {
			if src.Kind == idemkey.Header {
				names = append(names, src.Name)
			}
		}
	}
	add(s.sources)
	for _, r := range s.routes.Rules() {
		add(r.Sources)
	}
	return names
}

// checkClientHeader refuses a client token header that no request can carry
// or that idemproxy already means something by (inUse, headersInUse): the
// token would become the app's Idempotency-Key (echoed in answers and
// logged), or, as a header key source, every order of one app would share
// one key, its token; or idemproxy would remove a header the provider needs.
func checkClientHeader(name string, inUse []string) error {
	if err := resign.CheckHeaderName(name); err != nil {
		return err
	}
	for _, t := range inUse {
		if t != "" && strings.EqualFold(name, t) {
			return fmt.Errorf("%s is already used for another purpose", http.CanonicalHeaderKey(name))
		}
	}
	return nil
}

// secrets returns the configured values that must never reach a log line: the
// client tokens, the signing secret, the admin token and the static header values (credentials
// such as X-Public-Id).
// keySecret reads KEY_SECRET, required when client authentication is on.
// checkBearer refuses an admin token that no Authorization header can carry
// as it is: HTTP drops white space around a header value, and a control
// character cannot be sent. Such a token would lock every operator out.
// The message does not quote the token.
func checkBearer(token string) error {
	if token != strings.TrimSpace(token) {
		return errors.New("begins or ends with white space, which no Authorization header carries")
	}
	if strings.ContainsFunc(token, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return errors.New("holds a control character, which no Authorization header carries")
	}
	return nil
}

func (c *config) keySecret(clients bool) ([]byte, error) {
	v, err := secret("KEY_SECRET", c.KeySecret, c.KeySecretFile)
	switch {
	case err != nil:
		return nil, err
	case !clients:
		return nil, nil // keys go upstream as they are, as before client tokens
	case v == "":
		return nil, bad(setBy("KEY_SECRET", c.KeySecretFile), errors.New("required with IDEMPROXY_CLIENT_TOKENS: it binds each client's upstream keys to that client"))
	case len(v) < 16:
		return nil, bad(setBy("KEY_SECRET", c.KeySecretFile), errors.New("shorter than 16 characters"))
	}
	if err := checkKey(setBy("KEY_SECRET", c.KeySecretFile), v); err != nil {
		return nil, err
	}
	return []byte(v), nil
}

func (s settings) secrets() []string {
	var out []string
	if len(s.keySecret) > 0 {
		out = append(out, string(s.keySecret))
	}
	for _, entry := range strings.Split(s.clientTokens, ",") {
		// The token as ParseClientTokens reads it: without the white space
		// around it ("app-a = token"), or the net would look for the token
		// with it, and miss it.
		if _, token, ok := strings.Cut(entry, "="); ok && strings.TrimSpace(token) != "" {
			out = append(out, strings.TrimSpace(token))
		}
	}
	if len(s.sign.Secret) > 0 {
		out = append(out, string(s.sign.Secret))
	}
	if s.adminToken != "" {
		out = append(out, s.adminToken)
	}
	for _, vals := range s.sign.StaticHeaders {
		out = append(out, vals...)
	}
	if u, err := url.Parse(s.storeURL); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			out = append(out, pw)
		}
	}
	return out
}

// warnUnknownVariables logs the IDEMPROXY_ variables that are no setting,
// with the setting each is closest to: a misspelt IDEMPROXY_ADMIN_TOKEN or
// IDEMPROXY_CLIENT_TOKENS would otherwise leave its feature off without a
// word. They do not stop the start, since deployments set other
// IDEMPROXY_ names for their own tools (IDEMPROXY_IMAGE for compose). Only
// names are logged: a misspelt secret's value is still a secret.
func warnUnknownVariables(environ []string, log *slog.Logger) {
	var known []string
	for _, v := range configVars() {
		known = append(known, v.name)
	}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		// Names are read as written: idemproxy_admin_token is not
		// IDEMPROXY_ADMIN_TOKEN, and is warned of as a misspelling of it.
		upper := strings.ToUpper(name)
		if !strings.HasPrefix(upper, envPrefix) || slices.Contains(known, name) {
			continue
		}
		closest, best := "", 4 // suggest only a name within 3 edits
		for _, k := range known {
			if d := editDistance(upper, k); d < best {
				closest, best = k, d
			}
		}
		if closest != "" {
			log.Warn("unknown variable ignored; a misspelling?", "variable", name, "did_you_mean", closest)
		} else {
			log.Warn("unknown variable ignored", "variable", name)
		}
	}
}

// noEffect is a setting that is set but does nothing as the others stand.
type noEffect struct{ variable, because string }

// ineffective lists the settings of environ that are set but have no
// effect given the rest of the configuration (cfg, as loaded from it). They
// are warned of at start, not refused: each has a documented meaning alone
// (RATE_LIMIT=0 is off, whatever the burst), and turning one feature off
// should not need its companions unset. But an operator who set one meant
// something by it: a burst without a rate is no limit at all, an
// ATTEMPT_TIMEOUT over RETRY_BUDGET is cut at the budget. Names only, never
// values.
func ineffective(cfg config, environ []string) []noEffect {
	vars := env.ToMap(environ)
	set := func(names ...string) bool {
		for _, n := range names {
			if vars[envPrefix+n] != "" {
				return true
			}
		}
		return false
	}
	var out []noEffect
	if set("RATE_BURST") && cfg.RateLimit == 0 {
		out = append(out, noEffect{envPrefix + "RATE_BURST", envPrefix + "RATE_LIMIT is 0: no rate limit, so no burst"})
	}
	if set("ATTEMPT_TIMEOUT") && cfg.AttemptTimeout > cfg.RetryBudget {
		out = append(out, noEffect{envPrefix + "ATTEMPT_TIMEOUT", fmt.Sprintf("longer than %sRETRY_BUDGET (%s), which bounds every attempt too: an attempt ends at the budget", envPrefix, cfg.RetryBudget)})
	}
	clients := cfg.ClientTokens != "" || cfg.ClientTokensFile != ""
	if set("KEY_SECRET", "KEY_SECRET_FILE") && !clients {
		out = append(out, noEffect{envPrefix + "KEY_SECRET", "no " + envPrefix + "CLIENT_TOKENS: keys go upstream as the apps sent or derived them"})
	}
	if set("CLIENT_HEADER") && !clients {
		out = append(out, noEffect{envPrefix + "CLIENT_HEADER", "no " + envPrefix + "CLIENT_TOKENS: no client authentication"})
	}
	// Without a secret nothing is signed: a template, an encoding or a
	// header name set with no secret (one not mounted, a secretKeyRef left
	// out) sent every request unsigned, with no timestamp or nonce either,
	// and the provider's 401 is a final answer, stored.
	if cfg.SignSecret == "" && cfg.SignSecretFile == "" {
		for _, n := range []string{"SIGN_CANONICAL", "SIGN_ENCODING", "NONCE_HEADER", "SIGNATURE_HEADER", "TIMESTAMP_HEADER"} {
			if set(n) {
				out = append(out, noEffect{envPrefix + n, "no " + envPrefix + "SIGN_SECRET: requests go upstream unsigned, without a timestamp or nonce"})
			}
		}
	}
	// cfg.StatusProbe holds a preset's probe too: only a probe turned off
	// (or never set) leaves the routes without a lookup.
	if set("STATUS_PROBE_ROUTES") && cfg.StatusProbe == "" {
		out = append(out, noEffect{envPrefix + "STATUS_PROBE_ROUTES", "no " + envPrefix + "STATUS_PROBE: no lookup is sent; " +
			"an operation whose outcome is unknown is re-sent with the same key"})
	}
	if set("STATUS_PROBE_NOT_FOUND_CODES") && cfg.StatusProbe == "" {
		out = append(out, noEffect{envPrefix + "STATUS_PROBE_NOT_FOUND_CODES", "no " + envPrefix + "STATUS_PROBE: no lookup is sent"})
	}
	if set("STORE_LEASE") && cfg.StoreURL == "" && cfg.StoreURLFile == "" {
		out = append(out, noEffect{envPrefix + "STORE_LEASE", "no " + envPrefix + "STORE_URL: the embedded store has one process, no replica to take over"})
	}
	return out
}

// warnIneffective logs ineffective's settings at WARN.
func warnIneffective(cfg config, environ []string, log *slog.Logger) {
	for _, n := range ineffective(cfg, environ) {
		log.Warn("setting has no effect", "variable", n.variable, "because", n.because)
	}
}

// minAdminToken is the admin token length below which start warns: the
// length CLIENT_TOKENS' tokens and KEY_SECRET must have.
const minAdminToken = 16

// warnShortAdminToken logs at WARN an admin token shorter than
// minAdminToken. The admin API resolves, renews and discards operations,
// which decides whether an order is sent again; a short token is guessed
// by trying, and one under minSecretLen is not even taken out of the log
// lines by the logger's safety net. It does not stop the start: tests and
// sandboxes use short tokens. Neither the token nor its length is logged.
func warnShortAdminToken(token string, log *slog.Logger) {
	if token != "" && len(token) < minAdminToken {
		log.Warn("admin token is short", "variable", envPrefix+"ADMIN_TOKEN",
			"why", fmt.Sprintf("shorter than %d characters: anyone who reaches the admin port may guess it, "+
				"and then resolve, renew or discard operations; use a random token of %d or more", minAdminToken, minAdminToken))
	}
}

// warnOpenAdmin logs at WARN an admin API without a token (ADMIN_TOKEN
// empty) listening where other hosts reach it (ADMIN_ADDR not a loopback
// address: the default :9090, the image's). It started without a word, and
// anyone reaching the admin port could read every stored answer with its
// body (a card provider's may carry card data), resolve an operation whose
// outcome is unknown as not executed (sent again: a second charge if it
// had run), renew orders and discard records. Not a refusal: an empty
// token means an open API. Nothing secret is logged.
func warnOpenAdmin(addr, token string, log *slog.Logger) {
	if token != "" || loopbackAddr(addr) {
		return
	}
	log.Warn("admin API open to whoever reaches the admin port: no admin token", "variable", envPrefix+"ADMIN_TOKEN",
		"admin_addr", addr, "why", "without a token any caller can read stored answers with their bodies, resolve an operation "+
			"whose outcome is unknown as not executed (it is sent again), renew orders and discard records; set "+
			envPrefix+"ADMIN_TOKEN (or _FILE), or listen on 127.0.0.1 ("+envPrefix+"ADMIN_ADDR)")
}

// loopbackAddr reports whether the listen address addr is on a loopback
// address only (127.0.0.0/8, ::1, localhost).
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// requestPlaceholders are the placeholders that take something of the
// request into a signature ({timestamp} and {nonce} take only the moment).
var requestPlaceholders = []string{"method", "path", "query", "body", "body_sha256", "idempotency_key"}

// warnUnboundSignature logs at WARN a signing template that takes nothing
// of the request, only {timestamp} and {nonce} (and literal text): its
// signature is good for any method, path and body sent within the
// provider's time window, by whoever sees one request. It does not stop the
// start: a provider may sign only the time. The template is not logged.
func warnUnboundSignature(sc resign.Config, log *slog.Logger) {
	if len(sc.Secret) == 0 || sc.Template == nil {
		return
	}
	for _, ph := range requestPlaceholders {
		if sc.Template.Uses(ph) {
			return
		}
	}
	log.Warn("signing template signs nothing of the request", "variable", envPrefix+"SIGN_CANONICAL",
		"why", "it holds no {method} {path} {query} {body} {body_sha256} or {idempotency_key}: a signature seen once "+
			"is good for any request within the provider's time window; write the provider's scheme")
}

// presetCredentials are the credentials each preset's provider wants on
// every call and that no preset holds: the signing secret for all three, and
// the payouts provider's X-Public-Id, a static header.
var presetCredentials = map[string]struct {
	secret  bool
	headers []string
}{
	"payouts":  {secret: true, headers: []string{"X-Public-Id"}},
	"payments": {secret: true},
	"cards":    {secret: true},
}

// warnPresetCredentials logs at WARN a preset whose provider's credentials
// are not set: with the preset's signing scheme but no IDEMPROXY_SIGN_SECRET
// (a secret not mounted, a secretKeyRef left out), every request goes
// upstream unsigned and the provider refuses it. It does not stop the
// start: "no secret, no signing" is the variable's documented meaning, and a
// sandbox provider may check no signature. Names only, never values.
func warnPresetCredentials(cfg config, set settings, log *slog.Logger) {
	want, ok := presetCredentials[cfg.Preset]
	if !ok {
		return
	}
	if want.secret && len(set.sign.Secret) == 0 {
		log.Warn("preset's provider needs credentials that are not set", "variable", envPrefix+"SIGN_SECRET", "preset", cfg.Preset,
			"why", "no "+envPrefix+"SIGN_SECRET (or _FILE): requests go upstream unsigned, and the "+cfg.Preset+
				" provider refuses unsigned requests; the preset sets how to sign, never the secret")
	}
	for _, h := range want.headers {
		if _, ok := set.sign.StaticHeaders[http.CanonicalHeaderKey(h)]; !ok {
			log.Warn("preset's provider needs credentials that are not set", "variable", envPrefix+"STATIC_HEADERS", "preset", cfg.Preset,
				"why", fmt.Sprintf("no %s in %sSTATIC_HEADERS (or _FILE): the %s provider refuses a call without it; add %s=<the value it gave you>",
					h, envPrefix, cfg.Preset, h))
		}
	}
}

// warnPresetCleared logs at WARN each variable set empty that removes a
// value the preset would give it. An empty variable is taken as unset and
// its default applies, so IDEMPROXY_ROUTES= (a Compose ${ROUTES} with
// nothing behind it) made the payouts preset's status lookups protected:
// the lookup's 404 for a payout still being created was stored and replayed
// for that order. It does not stop the start: emptying a preset's value is
// the documented way to drop it (IDEMPROXY_STATUS_PROBE= for no probe).
// Presets hold no secret, so the value removed is shown.
func warnPresetCleared(cfg config, environ []string, log *slog.Logger) {
	preset := presets[cfg.Preset]
	if preset == nil {
		return
	}
	vars := env.ToMap(environ)
	for _, k := range slices.Sorted(maps.Keys(preset)) {
		if v, set := vars[envPrefix+k]; set && v == "" {
			log.Warn("empty variable removes the preset's value", "variable", envPrefix+k, "preset", cfg.Preset,
				"removed", preset[k], "why", "an empty variable means its default, not the preset's; "+
					"unset it to keep the preset's value")
		}
	}
}

// warnSlowRate logs at WARN a RATE_LIMIT that gives a token less often
// than once per RETRY_BUDGET: once the burst is spent, a request that finds
// no token cannot get one within its budget and ends at once unsent (502
// upstream_unavailable) instead of waiting. It does not stop the start:
// traffic slower than the rate never waits. Names only.
func warnSlowRate(cfg config, log *slog.Logger) {
	if cfg.RateLimit <= 0 {
		return
	}
	every := time.Duration(float64(time.Second) / cfg.RateLimit)
	if every <= cfg.RetryBudget {
		return
	}
	log.Warn("rate limit is slower than one request per retry budget", "variable", envPrefix+"RATE_LIMIT",
		"why", fmt.Sprintf("one token every %s, longer than %sRETRY_BUDGET (%s): once the burst of %d is spent, "+
			"a request that finds no token ends unsent with 502 upstream_unavailable; raise the rate (it is per second) or the budget",
			every.Round(time.Second), envPrefix, cfg.RetryBudget, cfg.RateBurst))
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// proxyVariables are the variables other HTTP clients take a forward proxy
// from (Go's http.ProxyFromEnvironment, curl), in both cases.
var proxyVariables = []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"}

// warnProxyVariables logs at WARN each forward proxy variable set in
// environ. idemproxy connects to the provider directly, never through them
// (upstream.NewWire takes no proxy): retries tell an attempt that never
// reached the provider (no connection to it) from one it may have received,
// and through a proxy the connection is the proxy's, whose 502 or dropped
// connection may come after the provider took the request. An operator who
// set one for the egress would otherwise see only failed dials, or traffic
// bypassing the proxy, without a word. Names only: a proxy URL may hold
// credentials.
func warnProxyVariables(environ []string, log *slog.Logger) {
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if val != "" && slices.Contains(proxyVariables, name) {
			log.Warn("forward proxy variable ignored", "variable", name,
				"why", "idemproxy connects to the provider ("+envPrefix+"UPSTREAM_URL) directly, never through a forward proxy: "+
					"allow its egress to the provider, or unset the variable")
		}
	}
}
