package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
)

// Upstream is the sandbox provider on a loopback port, behind a wire counter.
// Close it to stop serving; Ledger and Wire may be read before or after.
type Upstream struct {
	// URL is the base URL idemproxy is pointed at.
	URL string
	// Config is the sandbox's configuration, secret included.
	Config sandbox.Config

	box  *sandbox.Server
	wire *wireCounter
	srv  *http.Server
	done chan error
}

// WireOrder is what reached the provider for one order_id, faults included.
type WireOrder struct {
	// Requests counts every request the provider received for the order.
	Requests int
	// Keys counts them per Idempotency-Key ("" for none).
	Keys map[string]int
	// Replicas counts them per idemproxy replica that sent them (its
	// replicaHeader; "" for none).
	Replicas map[string]int
}

// replicaHeader names the replica on every upstream request of a chaos run.
const replicaHeader = "X-Chaos-Replica"

// StartUpstream serves a sandbox built from cfg on 127.0.0.1 (a free port).
func StartUpstream(cfg sandbox.Config) (*Upstream, error) {
	box, err := sandbox.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("start upstream: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("start upstream: %w", err)
	}
	u := &Upstream{URL: "http://" + ln.Addr().String(), Config: cfg, box: box,
		wire: &wireCounter{next: box, orders: map[string]*WireOrder{}}, done: make(chan error, 1)}
	u.srv = &http.Server{Handler: u.wire, ReadHeaderTimeout: 10 * time.Second}
	go func() { u.done <- u.srv.Serve(ln) }()
	return u, nil
}

// Close stops the server and waits for the requests it is serving (the slow
// fault ends early when its caller has gone), so that the ledger is complete.
func (u *Upstream) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := u.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, u.srv.Close())
	}
	if serr := <-u.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("close upstream: %w", err)
	}
	return nil
}

// Ledger is the sandbox's ledger, entries included.
func (u *Upstream) Ledger() sandbox.LedgerSnapshot { return u.box.Ledger() }

// Wire returns a copy of what reached the provider, per order_id, and the
// number of requests that carried none (or no JSON body).
func (u *Upstream) Wire() (orders map[string]WireOrder, unattributed int) {
	return u.wire.snapshot()
}

// ProxyEnv is the idemproxy configuration that points at u: the sandbox's
// own ProxyEnv lines with their shell quoting removed and the secret filled
// in, since the binary is started without a shell.
func (u *Upstream) ProxyEnv() ([]string, error) {
	var out []string
	for _, line := range sandbox.ProxyEnv(u.Config, u.URL) {
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("sandbox.ProxyEnv line without '=': %q", line)
		}
		if name == "IDEMPROXY_SIGN_SECRET" {
			// ProxyEnv writes "$SANDBOX_SECRET" so the secret is never printed.
			out = append(out, name+"="+string(u.Config.Secret))
			continue
		}
		v, err := shellUnquote(value)
		if err != nil {
			return nil, fmt.Errorf("sandbox.ProxyEnv %s: %w", name, err)
		}
		out = append(out, name+"="+v)
	}
	return out, nil
}

// shellUnquote undoes POSIX single quoting as sandbox.ProxyEnv writes it: the
// value between single quotes, each quote inside it written as the four
// characters quote, backslash, quote, quote. A bare word is returned as is.
func shellUnquote(s string) (string, error) {
	if !strings.HasPrefix(s, "'") {
		return s, nil
	}
	var b strings.Builder
	for len(s) > 0 {
		switch {
		case strings.HasPrefix(s, `\'`):
			b.WriteByte('\'')
			s = s[2:]
		case strings.HasPrefix(s, "'"):
			end := strings.IndexByte(s[1:], '\'')
			if end < 0 {
				return "", errors.New("unterminated single quote")
			}
			b.WriteString(s[1 : 1+end])
			s = s[end+2:]
		default:
			return "", fmt.Errorf("unexpected %q outside quotes", s[:1])
		}
	}
	return b.String(), nil
}

// wireCounter counts the requests reaching the sandbox per order_id and
// Idempotency-Key before the sandbox decides anything (fault or not).
type wireCounter struct {
	next http.Handler

	mu           sync.Mutex
	orders       map[string]*WireOrder
	unattributed int
}

// ServeHTTP counts a provider request, then hands it on with its body intact.
func (w *wireCounter) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_sandbox/") {
		w.next.ServeHTTP(rw, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body.Close()
	if err != nil {
		http.Error(rw, "read body", http.StatusBadRequest)
		return
	}
	w.count(orderOf(body), r.Header.Get("Idempotency-Key"), r.Header.Get(replicaHeader))
	r.Body = io.NopCloser(bytes.NewReader(body))
	w.next.ServeHTTP(rw, r)
}

func (w *wireCounter) count(order, key, replica string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if order == "" {
		w.unattributed++
		return
	}
	o := w.orders[order]
	if o == nil {
		o = &WireOrder{Keys: map[string]int{}, Replicas: map[string]int{}}
		w.orders[order] = o
	}
	o.Requests++
	o.Keys[key]++
	o.Replicas[replica]++
}

func (w *wireCounter) snapshot() (map[string]WireOrder, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]WireOrder, len(w.orders))
	for id, o := range w.orders {
		keys := make(map[string]int, len(o.Keys))
		for k, n := range o.Keys {
			keys[k] = n
		}
		out[id] = WireOrder{Requests: o.Requests, Keys: keys, Replicas: maps.Clone(o.Replicas)}
	}
	return out, w.unattributed
}

// orderOf is the body's top-level order_id; "" when there is none.
func orderOf(body []byte) string {
	var v struct {
		OrderID string `json:"order_id"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	return v.OrderID
}
