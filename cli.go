package main

// The operator's subcommands: they call a running idemproxy's admin API, so
// that a person can look at records without curl. Output is for people, or
// JSON with --json for scripts.

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemproxy/idemproxy/adminapi"
)

// adminClient calls one idemproxy's admin API.
type adminClient struct {
	base  string // http://host:port
	token string
	http  *http.Client
}

// newAdminClient finds the admin API from --admin (or IDEMPROXY_ADMIN_ADDR)
// and the token from IDEMPROXY_ADMIN_TOKEN or IDEMPROXY_ADMIN_TOKEN_FILE.
func newAdminClient(addr string, environ []string) (*adminClient, error) {
	if addr == "" {
		addr = lookupEnv(environ, "AdminAddr")
	}
	base := addr
	if !strings.Contains(addr, "://") {
		u, err := readyURL(addr)
		if err != nil {
			return nil, err
		}
		base = strings.TrimSuffix(u, "/readyz")
	}
	// As the server reads it (config.go, secret): both set is refused, not
	// one of them silently preferred.
	var fromFile string
	if file := envValue(environ, envPrefix+"ADMIN_TOKEN_FILE"); file != "" {
		if err := checkSecretFile(file); err != nil {
			return nil, fmt.Errorf("%sADMIN_TOKEN_FILE: %w", envPrefix, err)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%sADMIN_TOKEN_FILE: %w", envPrefix, err)
		}
		if strings.TrimSpace(string(b)) == "" {
			return nil, fmt.Errorf("%sADMIN_TOKEN_FILE: %s holds no token", envPrefix, file)
		}
		fromFile = string(b)
	}
	token, err := secret("ADMIN_TOKEN", envValue(environ, envPrefix+"ADMIN_TOKEN"), fromFile)
	if err != nil {
		return nil, err
	}
	// No proxy from HTTP_PROXY: the admin port is the operator's own.
	return &adminClient{base: strings.TrimSuffix(base, "/"), token: token,
		http: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}}, nil
}

func envValue(environ []string, name string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// errAPI is an error answer of the admin API; hint, when not empty, says
// what the operator can do about it.
type errAPI struct {
	status        int
	code, message string
	hint          string
}

func (e *errAPI) Error() string {
	s := fmt.Sprintf("%d %s: %s", e.status, e.code, e.message)
	if e.hint != "" {
		s += "; " + e.hint
	}
	return s
}

// addrHint is what to check when the admin API cannot be reached;
// otherHint when something else answers at its address.
const (
	addrHint  = "is idemproxy running, and is " + envPrefix + "ADMIN_ADDR (or --admin) its admin address?"
	otherHint = "is " + envPrefix + "ADMIN_ADDR (or --admin) idemproxy's admin address, not its proxy address?"
)

// do calls the API and returns the answer's body, or an *errAPI.
//
// With a token, the address is first asked without it whether it is the
// admin API (every answer of its listener carries adminapi.Header): the
// proxy's address given for it by mistake would pass the token on to the
// provider, a third party, with the request. It asks /healthz, which takes
// no token: the API refuses a call without one and logs it as a call
// refused for its token, which every command then left in the log.
func (c *adminClient) do(method, path string, query url.Values, body io.Reader) ([]byte, error) {
	if c.token != "" {
		if _, _, err := c.send(http.MethodGet, "/healthz", nil, nil, false); err != nil {
			return nil, err
		}
	}
	resp, b, err := c.send(method, path, query, body, true)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		return nil, c.apiError(resp, b)
	}
	return b, nil
}

// send makes one call, with the token when withToken, and returns the
// answer and its body; an answer that is not the admin API's is an error,
// whatever its status.
func (c *adminClient) send(method, path string, query url.Values, body io.Reader, withToken bool) (*http.Response, []byte, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		return nil, nil, err
	}
	if withToken && c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is said below, once
		}
		// A change connected but unanswered (the instance died or hung
		// after the request reached it) may have been made.
		var op *net.OpError
		if method != http.MethodGet && !(errors.As(err, &op) && op.Op == "dial") {
			return nil, nil, fmt.Errorf("no answer from the admin API at %s: %w; the call may have been made: look the record or order up before repeating it", c.base, err)
		}
		return nil, nil, fmt.Errorf("cannot reach the admin API at %s: %w; %s", c.base, err, addrHint)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the answer of %s: %w", c.base, err)
	}
	// A 200 from the provider behind the proxy's address is no record.
	if resp.Header.Get(adminapi.Header) == "" {
		return nil, nil, fmt.Errorf("unexpected answer from %s: %s, not the admin API's; %s", c.base, resp.Status, otherHint)
	}
	return resp, b, nil
}

// apiError is the error for an answer with status 300 or more: the admin
// API's own JSON error, with a hint for a refused token, or a note that
// something else answered.
func (c *adminClient) apiError(resp *http.Response, b []byte) error {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error.Code == "" {
		return fmt.Errorf("unexpected answer from %s: %s, not the admin API's; %s", c.base, resp.Status, otherHint)
	}
	out := &errAPI{status: resp.StatusCode, code: e.Error.Code, message: e.Error.Message}
	if resp.StatusCode == http.StatusUnauthorized {
		out.hint = "the token from " + envPrefix + "ADMIN_TOKEN (or _FILE) was refused: is it this instance's?"
		if c.token == "" {
			out.hint = "set " + envPrefix + "ADMIN_TOKEN (or " + envPrefix + "ADMIN_TOKEN_FILE) to the instance's admin token"
		}
	}
	return out
}

// The operator commands' usage lines.
const (
	recordsGetUsage  = "idemproxy records get KEY [--client C] [--body] [--json] [--admin ADDR]"
	recordsListUsage = "idemproxy records list --state in_flight|unknown|needs_review [--client C] [--limit N] [--cursor C] [--body] [--json] [--admin ADDR]"
	ordersUsage      = "idemproxy orders get|renew --method POST --path /cards --value F-1 [--client C] [--json] [--admin ADDR]"
	// recordsResolveUsage is one line, like the others, for the help test.
	recordsResolveUsage  = "idemproxy records resolve KEY --outcome not_executed|executed [--status N] [--body B] [--header 'Name: value']... [--client C] [--json] [--admin ADDR]"
	recordsReviewedUsage = "idemproxy records reviewed KEY [--client C] [--json] [--admin ADDR]"
	recordsDiscardUsage  = "idemproxy records discard KEY [--client C] [--json] [--admin ADDR]"
)

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}

// parseFlags parses args into fs. Asked for help (-h, --help), it prints
// usage and the flags to stdout and returns (0, false); on a bad flag, the
// error and the same to stderr, and (2, false).
func parseFlags(fs *flag.FlagSet, args []string, usage string, stdout, stderr io.Writer) (int, bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printUsage(stdout, fs, usage)
		return 0, false
	case err != nil:
		fmt.Fprintf(stderr, "idemproxy %s: %v\n", fs.Name(), err)
		printUsage(stderr, fs, usage)
		return 2, false
	}
	return 0, true
}

// printUsage writes usage and fs's flags to w.
func printUsage(w io.Writer, fs *flag.FlagSet, usage string) {
	fmt.Fprintln(w, "usage: "+usage)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// records runs `idemproxy records get KEY`, `idemproxy records list`,
// `idemproxy records resolve`, `idemproxy records reviewed` and
// `idemproxy records discard`.
func records(args, environ []string, stdout, stderr io.Writer) int {
	usage := "usage: " + recordsGetUsage + "\n       " + recordsListUsage + "\n       " + recordsResolveUsage +
		"\n       " + recordsReviewedUsage + "\n       " + recordsDiscardUsage
	switch {
	case len(args) > 0 && args[0] == "list":
		return recordsList(args[1:], environ, stdout, stderr)
	case len(args) > 0 && args[0] == "resolve":
		return recordsResolve(args[1:], environ, stdout, stderr)
	case len(args) > 0 && args[0] == "reviewed":
		return recordsReviewed(args[1:], environ, stdout, stderr)
	case len(args) > 0 && args[0] == "discard":
		return recordsDiscard(args[1:], environ, stdout, stderr)
	case len(args) > 0 && isHelp(args[0]):
		fmt.Fprintln(stdout, usage)
		return 0
	case len(args) == 0 || args[0] != "get":
		fmt.Fprintln(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("records get", flag.ContinueOnError)
	client := fs.String("client", "", "client (tenant) of the record; required with client tokens on")
	body := fs.Bool("body", false, "show the stored answer's body")
	asJSON := fs.Bool("json", false, "print the record as JSON")
	admin := fs.String("admin", "", "admin address (default IDEMPROXY_ADMIN_ADDR)")
	key, flags := splitPositional(args[1:])
	if code, ok := parseFlags(fs, flags, recordsGetUsage, stdout, stderr); !ok {
		return code
	}
	if key == "" {
		printUsage(stderr, fs, recordsGetUsage)
		return 2
	}
	c, err := newAdminClient(*admin, environ)
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records:", err)
		return 2
	}
	q := url.Values{}
	if *client != "" {
		q.Set("client", *client)
	}
	if *body {
		q.Set("body", "1")
	}
	b, err := c.do(http.MethodGet, "/admin/v1/records/"+keySegment(key), q, nil)
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records get:", err)
		return 1
	}
	if *asJSON {
		stdout.Write(b)
		return 0
	}
	var rec adminapi.Record
	if err := json.Unmarshal(b, &rec); err != nil {
		fmt.Fprintln(stderr, "idemproxy records get: unexpected answer:", err)
		return 1
	}
	printRecord(stdout, rec)
	return 0
}

// keySegment is key as one segment of a call's path. PathEscape leaves the
// dots of "." and ".." as they are, and the admin listener would resolve
// them as dot-segments (records get . asked for the listing).
func keySegment(key string) string {
	if key == "." || key == ".." {
		return strings.Repeat("%2E", len(key))
	}
	return url.PathEscape(key)
}

// splitPositional takes the first argument that is not a flag out of args,
// so that `get KEY --json` and `get --json KEY` both work. valued names
// flags of the command that take a value besides takesValue's.
func splitPositional(args []string, valued ...string) (string, []string) {
	var rest []string
	pos := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if pos == "" && i+1 < len(args) {
				pos = args[i+1]
			}
			return pos, rest
		case strings.HasPrefix(a, "-"):
			rest = append(rest, a)
			if !strings.Contains(a, "=") && (takesValue(a) || slices.Contains(valued, strings.TrimLeft(a, "-"))) && i+1 < len(args) {
				i++
				rest = append(rest, args[i])
			}
		case pos == "":
			pos = a
		default:
			rest = append(rest, a)
		}
	}
	return pos, rest
}

// takesValue names the flags that take a value.
func takesValue(flag string) bool {
	switch strings.TrimLeft(flag, "-") {
	case "client", "admin", "state", "limit", "cursor":
		return true
	}
	return false
}

// printRecord writes rec for a person, one field a line.
func printRecord(w io.Writer, rec adminapi.Record) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	line := func(name, value string) {
		if value != "" {
			fmt.Fprintf(tw, "%s\t%s\n", name, value)
		}
	}
	line("key", rec.Key)
	line("upstream key", rec.UpstreamKey)
	line("client", rec.Client)
	line("state", rec.State)
	line("request", strings.TrimSpace(rec.Method+" "+rec.Path))
	if rec.Status != 0 {
		line("status", fmt.Sprint(rec.Status))
	}
	switch {
	case rec.NeedsReview && rec.Reviewed:
		line("needs review", "reviewed: an operator marked it settled (records reviewed); it expires like any answer")
	case rec.NeedsReview:
		line("needs review", "yes: never retried, kept until an operator marks it settled (records reviewed)")
	}
	if rec.Reconciled {
		// The mark says the outcome was unknown and then settled; the
		// record does not say by whom (the probe or records resolve).
		line("reconciled", "yes: settled after the outcome was unknown, by the status probe or an operator's records resolve")
	}
	if rec.Superseded {
		line("renewed", "yes: the order's requests now go under its next key generation (orders get)")
	}
	line("attempts", fmt.Sprint(rec.Attempts))
	line("created at", rec.CreatedAt.Format(time.RFC3339))
	if rec.FirstSentAt != nil {
		line("first sent at", rec.FirstSentAt.Format(time.RFC3339))
	}
	if rec.LeaseUntil != nil {
		line("lease until", rec.LeaseUntil.Format(time.RFC3339))
	}
	if rec.ExpiresAt != nil {
		line("expires at", rec.ExpiresAt.Format(time.RFC3339))
	} else {
		line("expires at", "never")
	}
	line("last error", rec.LastError)
	tw.Flush()
	if len(rec.Body) > 0 {
		fmt.Fprintf(w, "body:\n%s\n", bodyText(rec.Body))
	}
}

// bodyText is a record's body as the API shows it, for a person: a body
// that is not JSON is shown as it was, not as a JSON string.
func bodyText(b json.RawMessage) []byte {
	var text string
	if json.Unmarshal(b, &text) == nil {
		return []byte(text)
	}
	return b
}

// recordsList runs `idemproxy records list --state S [--limit N] [--cursor C]`.
func recordsList(args, environ []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("records list", flag.ContinueOnError)
	state := fs.String("state", "", "in_flight, unknown or needs_review")
	limit := fs.Int("limit", 100, "records per page (1-1000)")
	cursor := fs.String("cursor", "", "next_cursor of the previous page")
	client := fs.String("client", "", "list this client's (tenant's) records only; default every client's")
	body := fs.Bool("body", false, "include stored answers' bodies")
	asJSON := fs.Bool("json", false, "print the page as JSON")
	admin := fs.String("admin", "", "admin address (default IDEMPROXY_ADMIN_ADDR)")
	if code, ok := parseFlags(fs, args, recordsListUsage, stdout, stderr); !ok {
		return code
	}
	if *state == "" || fs.NArg() > 0 {
		printUsage(stderr, fs, recordsListUsage)
		return 2
	}
	c, err := newAdminClient(*admin, environ)
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records list:", err)
		return 2
	}
	q := url.Values{"state": {*state}, "limit": {strconv.Itoa(*limit)}}
	if *cursor != "" {
		q.Set("cursor", *cursor)
	}
	if *client != "" {
		q.Set("client", *client)
	}
	if *body {
		q.Set("body", "1")
	}
	b, err := c.do(http.MethodGet, "/admin/v1/records", q, nil)
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records list:", err)
		return 1
	}
	if *asJSON {
		stdout.Write(b)
		return 0
	}
	var page struct {
		Records    []adminapi.Record `json:"records"`
		NextCursor string            `json:"next_cursor"`
	}
	if err := json.Unmarshal(b, &page); err != nil {
		fmt.Fprintln(stderr, "idemproxy records list: unexpected answer:", err)
		return 1
	}
	// A page comes empty with a cursor when the API's time for it ran out
	// before it found a record (needs_review among every final answer):
	// "0 records" would read as nothing to settle. The next page is asked
	// for until one has records or the listing ends.
	for len(page.Records) == 0 && page.NextCursor != "" {
		q.Set("cursor", page.NextCursor)
		if b, err = c.do(http.MethodGet, "/admin/v1/records", q, nil); err != nil {
			fmt.Fprintln(stderr, "idemproxy records list:", err)
			return 1
		}
		page.NextCursor = ""
		if err := json.Unmarshal(b, &page); err != nil {
			fmt.Fprintln(stderr, "idemproxy records list: unexpected answer:", err)
			return 1
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tCLIENT\tSTATE\tREQUEST\tSTATUS\tATTEMPTS\tFIRST SENT\tLAST ERROR")
	unreadable := 0
	for _, r := range page.Records {
		sent, status, req := "-", "-", "-"
		if r.FirstSentAt != nil {
			sent = r.FirstSentAt.Format(time.RFC3339)
		}
		if r.Status != 0 {
			status = strconv.Itoa(r.Status)
		}
		if r.Method != "" {
			req = r.Method + " " + r.Path
		}
		if r.State == adminapi.StateUnreadable {
			// Nothing but its key is known: not even that nothing was sent.
			key, client := r.Key, r.Client
			if key == "" {
				key, client = "store key "+r.StoreKey, "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t-\t-\t?\t?\tits value cannot be read: %s\n", key, client, r.State, r.StoredState, r.Reason)
			unreadable++
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Key, r.Client, r.State, req, status, r.Attempts, sent, r.LastError)
	}
	tw.Flush()
	if unreadable > 0 {
		fmt.Fprintf(stdout, "\n%d records cannot be read (a newer version's, after a downgrade, or damaged): their operations may have reached the provider, "+
			"and requests with their keys get 503 store_unavailable with nothing sent. Start the newer version again, or settle each operation with the provider.\n", unreadable)
	}
	for _, r := range page.Records {
		if len(r.Body) > 0 {
			fmt.Fprintf(stdout, "\nbody of %s:\n%s\n", r.Key, bodyText(r.Body))
		}
	}
	fmt.Fprintf(stdout, "%d records", len(page.Records))
	if page.NextCursor != "" {
		fmt.Fprintf(stdout, "; more with --cursor %s", page.NextCursor)
	}
	fmt.Fprintln(stdout)
	return 0
}

// orders runs `idemproxy orders get|renew --method M --path P --value V [--client C]`.
func orders(args, environ []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprintln(stdout, "usage: "+ordersUsage)
		return 0
	}
	if len(args) == 0 || (args[0] != "get" && args[0] != "renew") {
		fmt.Fprintln(stderr, "usage: "+ordersUsage)
		return 2
	}
	fs := flag.NewFlagSet("orders "+args[0], flag.ContinueOnError)
	method := fs.String("method", "POST", "the order's request method")
	path := fs.String("path", "", "the order's request path, e.g. /cards")
	value := fs.String("value", "", "the value of its key source, e.g. the order_id")
	client := fs.String("client", "", "client (tenant) of the order; required with client tokens on")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	admin := fs.String("admin", "", "admin address (default IDEMPROXY_ADMIN_ADDR)")
	if code, ok := parseFlags(fs, args[1:], ordersUsage, stdout, stderr); !ok {
		return code
	}
	if *path == "" || *value == "" || fs.NArg() > 0 {
		printUsage(stderr, fs, ordersUsage)
		return 2
	}
	c, err := newAdminClient(*admin, environ)
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy orders:", err)
		return 2
	}
	var b []byte
	if args[0] == "get" {
		q := url.Values{"method": {*method}, "path": {*path}, "value": {*value}}
		if *client != "" {
			q.Set("client", *client)
		}
		b, err = c.do(http.MethodGet, "/admin/v1/orders", q, nil)
	} else {
		in, _ := json.Marshal(map[string]string{"method": *method, "path": *path, "value": *value, "client": *client})
		b, err = c.do(http.MethodPost, "/admin/v1/orders/renew", nil, bytes.NewReader(in))
	}
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy orders %s: %v\n", args[0], err)
		return 1
	}
	if *asJSON {
		stdout.Write(b)
		return 0
	}
	var o adminapi.Order
	if err := json.Unmarshal(b, &o); err != nil {
		fmt.Fprintf(stderr, "idemproxy orders %s: unexpected answer: %v\n", args[0], err)
		return 1
	}
	if args[0] == "renew" {
		fmt.Fprintf(stdout, "renewed: the next request for this order uses key %s (generation %d)\n", o.Key, o.Generation)
		return 0
	}
	fmt.Fprintf(stdout, "key         %s\ngeneration  %d\n", o.Key, o.Generation)
	if o.Record == nil {
		fmt.Fprintln(stdout, "record      none: nothing sent under this key yet")
		return 0
	}
	printRecord(stdout, *o.Record)
	return 0
}

// headerFlags collects repeated --header 'Name: value' flags.
type headerFlags map[string]string

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return errors.New("want 'Name: value'")
	}
	h[strings.TrimSpace(name)] = strings.TrimSpace(value)
	return nil
}

// recordsResolve runs `idemproxy records resolve KEY --outcome O`: an
// operator's verdict on an operation whose outcome is unknown, after
// checking with the provider (POST /admin/v1/records/resolve).
func recordsResolve(args, environ []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("records resolve", flag.ContinueOnError)
	outcome := fs.String("outcome", "", "not_executed (the provider has no such operation: the next request sends it again, same key) or executed (it happened: --status and --body are its answer, replayed to the next request)")
	status := fs.Int("status", 0, "executed: the provider's status for the operation, 2xx or 4xx")
	body := fs.String("body", "", "executed: the provider's answer body; JSON is stored as given, anything else as text")
	headers := headerFlags{}
	fs.Var(headers, "header", "executed: a header of the answer, 'Name: value' (repeatable; Content-Type defaults to application/json, text/plain for a --body that is not JSON)")
	client := fs.String("client", "", "client (tenant) of the record; required with client tokens on")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	admin := fs.String("admin", "", "admin address (default IDEMPROXY_ADMIN_ADDR)")
	key, flags := splitPositional(args, "outcome", "status", "body", "header")
	if code, ok := parseFlags(fs, flags, recordsResolveUsage, stdout, stderr); !ok {
		return code
	}
	if key == "" || *outcome == "" {
		printUsage(stderr, fs, recordsResolveUsage)
		return 2
	}
	in := map[string]any{"key": key, "client": *client, "outcome": *outcome}
	if *status != 0 {
		in["status"] = *status
	}
	if *body != "" {
		if json.Valid([]byte(*body)) {
			in["body"] = json.RawMessage(*body)
		} else {
			in["body"] = *body
		}
	}
	if len(headers) > 0 {
		in["headers"] = headers
	}
	c, err := newAdminClient(*admin, environ)
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records resolve:", err)
		return 2
	}
	req, _ := json.Marshal(in)
	b, err := c.do(http.MethodPost, "/admin/v1/records/resolve", nil, bytes.NewReader(req))
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records resolve:", err)
		return 1
	}
	if *asJSON {
		stdout.Write(b)
		return 0
	}
	var out adminapi.Resolved
	if err := json.Unmarshal(b, &out); err != nil {
		fmt.Fprintln(stderr, "idemproxy records resolve: unexpected answer:", err)
		return 1
	}
	if out.Record == nil {
		fmt.Fprintf(stdout, "resolved as not executed: the next request with key %s is sent to the provider again, with the same key\n", out.Key)
		return 0
	}
	fmt.Fprintf(stdout, "resolved as executed: the next request with key %s gets this answer, and nothing is sent\n", out.Key)
	printRecord(stdout, *out.Record)
	return 0
}

// recordsReviewed runs `idemproxy records reviewed KEY`: an operator says
// that an operation whose answer was needs_review is settled, after the
// provider's event (POST /admin/v1/records/reviewed).
func recordsReviewed(args, environ []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("records reviewed", flag.ContinueOnError)
	client := fs.String("client", "", "client (tenant) of the record; required with client tokens on")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	admin := fs.String("admin", "", "admin address (default IDEMPROXY_ADMIN_ADDR)")
	key, flags := splitPositional(args)
	if code, ok := parseFlags(fs, flags, recordsReviewedUsage, stdout, stderr); !ok {
		return code
	}
	if key == "" {
		printUsage(stderr, fs, recordsReviewedUsage)
		return 2
	}
	c, err := newAdminClient(*admin, environ)
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records reviewed:", err)
		return 2
	}
	req, _ := json.Marshal(map[string]string{"key": key, "client": *client})
	b, err := c.do(http.MethodPost, "/admin/v1/records/reviewed", nil, bytes.NewReader(req))
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records reviewed:", err)
		return 1
	}
	if *asJSON {
		stdout.Write(b)
		return 0
	}
	var out adminapi.Reviewed
	if err := json.Unmarshal(b, &out); err != nil {
		fmt.Fprintln(stderr, "idemproxy records reviewed: unexpected answer:", err)
		return 1
	}
	fmt.Fprintf(stdout, "marked reviewed: key %s is no longer listed as needs_review; its answer is still replayed until it expires\n", out.Key)
	printRecord(stdout, out.Record)
	return 0
}

// recordsDiscard runs `idemproxy records discard KEY`: an operator removes a
// record whose stored value cannot be read, after settling its operation
// with the provider (POST /admin/v1/records/discard).
func recordsDiscard(args, environ []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("records discard", flag.ContinueOnError)
	client := fs.String("client", "", "client (tenant) of the record; required with client tokens on")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	admin := fs.String("admin", "", "admin address (default IDEMPROXY_ADMIN_ADDR)")
	key, flags := splitPositional(args)
	if code, ok := parseFlags(fs, flags, recordsDiscardUsage, stdout, stderr); !ok {
		return code
	}
	if key == "" {
		printUsage(stderr, fs, recordsDiscardUsage)
		return 2
	}
	c, err := newAdminClient(*admin, environ)
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records discard:", err)
		return 2
	}
	req, _ := json.Marshal(map[string]string{"key": key, "client": *client})
	b, err := c.do(http.MethodPost, "/admin/v1/records/discard", nil, bytes.NewReader(req))
	if err != nil {
		fmt.Fprintln(stderr, "idemproxy records discard:", err)
		return 1
	}
	if *asJSON {
		stdout.Write(b)
		return 0
	}
	var out adminapi.Discarded
	if err := json.Unmarshal(b, &out); err != nil {
		fmt.Fprintln(stderr, "idemproxy records discard: unexpected answer:", err)
		return 1
	}
	fmt.Fprintf(stdout, "discarded: the record of key %s (stored state %s) could not be read (%s); "+
		"the next request with this key is sent to the provider as a new operation, with the same key\n",
		out.Key, out.Record.StoredState, out.Record.Reason)
	return 0
}
