package main

// The operator's subcommands: they call a running idemproxy's admin API, so
// that a person can look at records without curl. Output is for people, or
// JSON with --json for scripts.

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
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
	token := envValue(environ, envPrefix+"ADMIN_TOKEN")
	if file := envValue(environ, envPrefix+"ADMIN_TOKEN_FILE"); file != "" && token == "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%sADMIN_TOKEN_FILE: %w", envPrefix, err)
		}
		token = strings.TrimRight(string(b), "\r\n")
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

// errAPI is an error answer of the admin API.
type errAPI struct {
	status        int
	code, message string
}

func (e *errAPI) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.message) }

// do calls the API and returns the answer's body, or an *errAPI.
func (c *adminClient) do(method, path string, query url.Values, body io.Reader) ([]byte, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		json.Unmarshal(b, &e)
		return nil, &errAPI{resp.StatusCode, e.Error.Code, e.Error.Message}
	}
	return b, nil
}

// records runs `idemproxy records get KEY`.
func records(args, environ []string, stdout, stderr io.Writer) int {
	usage := "usage: idemproxy records get KEY [--client C] [--body] [--json] [--admin ADDR]"
	if len(args) == 0 || args[0] != "get" {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("records get", flag.ContinueOnError)
	fs.SetOutput(stderr)
	client := fs.String("client", "", "client (tenant) of the record, with client tokens on")
	body := fs.Bool("body", false, "show the stored answer's body")
	asJSON := fs.Bool("json", false, "print the record as JSON")
	admin := fs.String("admin", "", "admin address (default IDEMPROXY_ADMIN_ADDR)")
	key, flags := splitPositional(args[1:])
	if err := fs.Parse(flags); err != nil || key == "" {
		fmt.Fprintln(stderr, usage)
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
	b, err := c.do(http.MethodGet, "/admin/v1/records/"+url.PathEscape(key), q, nil)
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

// splitPositional takes the first argument that is not a flag out of args,
// so that `get KEY --json` and `get --json KEY` both work.
func splitPositional(args []string) (string, []string) {
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
			if !strings.Contains(a, "=") && takesValue(a) && i+1 < len(args) {
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
	if rec.Status != 0 {
		line("status", fmt.Sprint(rec.Status))
	}
	if rec.NeedsReview {
		line("needs review", "yes: never retried; the provider reports the outcome")
	}
	if rec.Reconciled {
		line("reconciled", "yes: the answer is the status probe's")
	}
	line("attempts", fmt.Sprint(rec.Attempts))
	line("created at", rec.CreatedAt.Format(time.RFC3339))
	if rec.FirstSentAt != nil {
		line("first sent at", rec.FirstSentAt.Format(time.RFC3339))
	}
	if rec.LeaseUntil != nil {
		line("lease until", rec.LeaseUntil.Format(time.RFC3339))
	}
	line("last error", rec.LastError)
	tw.Flush()
	switch {
	case len(rec.Body) > 0:
		fmt.Fprintf(w, "body:\n%s\n", rec.Body)
	case rec.BodyText != "":
		fmt.Fprintf(w, "body:\n%s\n", rec.BodyText)
	}
}
