package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// TestWindowLockOutlivedBySlowStore: under a fingerprint window, replica a
// takes the fingerprint's lock to anchor a new operation, and the network
// between a and the database then answers each of its statements about the
// window 4.5 s late (each within the 5 s call timeout). The app's retry on
// b waits for the lock, takes it over once its 10 s lease has run out, and
// anchors the operation in its own, later period under that period's key.
// a decided on past its lock's lease, anchored its own period and sent the
// order under its key too: the provider executed it twice, under two keys.
// a now stops at the end of the lock's lease it knows it holds: 503
// store_unavailable, nothing sent; the order executes once.
func TestWindowLockOutlivedBySlowStore(t *testing.T) {
	sb, upURL := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderPayments})
	db := pgtest.Database(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	relay := newMarkRelay(t, u.Host)
	u.Host = relay.l.Addr().String()
	// A window no longer than the lock's lease: b, past it, is in a later period.
	env := []string{"IDEMPROXY_ROUTES=POST /payments=fingerprint:10s", "IDEMPROXY_INFLIGHT_WAIT=30s"}
	a := launch(t, launchSpec{env: presetEnv(t, "payments", upURL, append([]string{"IDEMPROXY_STORE_URL=" + u.String()}, env...)...)})
	b := launch(t, launchSpec{env: presetEnv(t, "payments", upURL, append([]string{"IDEMPROXY_STORE_URL=" + db}, env...)...)})
	var wg sync.WaitGroup
	for i := range 4 { // a's connections open, their statements prepared
		wg.Go(func() {
			trySend("POST", "http://"+a.proxy+"/payments", fmt.Sprintf(`{"order_id":"warm-%d","amount":"5.00","currency":"EUR"}`, i))
		})
	}
	wg.Wait()

	order := `{"order_id":"fp-1","amount":"5.00","currency":"EUR"}`
	relay.holdAfter("/lock", "fingerprint-window/", 4500*time.Millisecond)
	fromA := goSend("POST", "http://"+a.proxy+"/payments", order)
	time.Sleep(500 * time.Millisecond) // a holds the lock
	rb := send(t, "POST", "http://"+b.proxy+"/payments", order)
	if rb.status != http.StatusCreated {
		t.Fatalf("the retry on b: %d %s, want 201\n%s", rb.status, rb.body, b.text())
	}
	ra := <-fromA
	relay.holdAfter("", "", 0)
	if l := sb.Ledger(); l.ByOrder["fp-1"] != 1 {
		t.Fatalf("order fp-1 executed %d times, under keys %v (a answered %d %s)\n%s", l.ByOrder["fp-1"], l.ByKey, ra.status, ra.body, a.text())
	}
	if ra.err != nil || ra.status != http.StatusServiceUnavailable || !strings.Contains(ra.body, `"store_unavailable"`) || !strings.Contains(ra.body, "nothing was sent") {
		t.Fatalf("a, past its lock's lease: %d %s %v, want 503 store_unavailable, nothing sent", ra.status, ra.body, ra.err)
	}
}

// markRelay forwards TCP connections to a database. Armed (holdAfter), once
// a statement holding trigger has passed, the answer to each statement
// holding marker is held back that long: a network slow for some of one
// replica's statements.
type markRelay struct {
	l       net.Listener
	target  string
	mu      sync.Mutex
	trigger []byte
	marker  []byte
	hold    time.Duration
	on      bool // trigger seen
	conns   []net.Conn
}

func newMarkRelay(t *testing.T, target string) *markRelay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &markRelay{l: l, target: target}
	go r.serve()
	t.Cleanup(func() {
		l.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range r.conns {
			c.Close()
		}
	})
	return r
}

// holdAfter arms the relay (disarms it with an empty marker).
func (r *markRelay) holdAfter(trigger, marker string, hold time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trigger, r.marker, r.hold, r.on = []byte(trigger), []byte(marker), hold, false
}

func (r *markRelay) serve() {
	for {
		c, err := r.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, s)
		r.mu.Unlock()
		holds := make(chan time.Duration, 64) // one per statement sent, for its answer
		go r.up(c, s, holds)
		go r.down(s, c, holds)
	}
}

func (r *markRelay) up(from, to net.Conn, holds chan<- time.Duration) {
	defer to.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			r.mu.Lock()
			if len(r.trigger) > 0 && bytes.Contains(buf[:n], r.trigger) {
				r.on = true
			}
			if r.on && len(r.marker) > 0 && bytes.Contains(buf[:n], r.marker) {
				select {
				case holds <- r.hold:
				default:
				}
			}
			r.mu.Unlock()
			if _, err := to.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *markRelay) down(from, to net.Conn, holds <-chan time.Duration) {
	defer to.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			select {
			case d := <-holds:
				time.Sleep(d)
			default:
			}
			if _, err := to.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
