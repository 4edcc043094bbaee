package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestCutOffReplicaStopsAtLeaseEnd: replica a runs an operation whose
// attempts the provider answers 503, when the network between a and the
// database stalls (b still reaches it). a's lease renewals fail; once the
// lease has run out by the database's clock, the app's retry on b takes the
// key over and b sends it, with the same key. From then on only b may send:
// a stops at the end of the lease it knows it holds, which comes first. It
// went on retrying alongside b until its budget ran out, two attempt
// sequences on one key at once.
func TestCutOffReplicaStopsAtLeaseEnd(t *testing.T) {
	dbURL := pgtest.Database(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	relay := newStallRelay(t, u.Host)
	u.Host = relay.addr()
	prov := &cutProvider{}
	upA := httptest.NewServer(prov.from("a"))
	defer upA.Close()
	upB := httptest.NewServer(prov.from("b"))
	defer upB.Close()
	opts := []string{"IDEMPROXY_STORE_LEASE=1s", "IDEMPROXY_INFLIGHT_WAIT=1m", "IDEMPROXY_RETRY_MAX_ATTEMPTS=20",
		"IDEMPROXY_RETRY_BASE_DELAY=50ms", "IDEMPROXY_RETRY_MAX_DELAY=500ms", "IDEMPROXY_RETRY_BUDGET=30s"}
	a := launch(t, launchSpec{env: sharedEnv(upA.URL, u.String(), opts...)})
	b := launch(t, launchSpec{env: sharedEnv(upB.URL, dbURL, opts...)})

	body := `{"order_id":"cut-1","amount":"5.00"}`
	fromA := make(chan reply, 1)
	go func() {
		r, _ := trySend("POST", "http://"+a.proxy+"/v1/payments", body)
		fromA <- r
	}()
	prov.waitFor("a", 2) // a is retrying
	relay.stall()

	r := send(t, "POST", "http://"+b.proxy+"/v1/payments", body)
	if r.status != http.StatusCreated {
		t.Fatalf("the retry on b = %d %s, want 201\n%s", r.status, r.body, b.text())
	}
	ra := <-fromA // a's sequence is over (its budget at the latest)
	relay.resume()
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if len(prov.keys) != 1 {
		t.Fatalf("keys sent %v, want one", prov.keys)
	}
	// The attempt a had started before its lease's end may still arrive
	// after b's first; no further one may.
	if n := prov.aAfterB; n > 1 {
		t.Fatalf("a sent %d attempts after b had taken the key over (a answered %d %s):\n%s", n, ra.status, ra.body, a.text())
	}
	if ra.status != http.StatusConflict || !strings.Contains(ra.body, `"idempotency_in_progress"`) {
		t.Fatalf("a answered %d %s, want 409 idempotency_in_progress (another replica runs the key)", ra.status, ra.body)
	}
}

// cutProvider answers 503 to replica a and 201 to replica b, and counts a's
// attempts that arrive after b's first.
type cutProvider struct {
	mu      sync.Mutex
	fromA   int
	bSeen   bool
	aAfterB int
	keys    map[string]bool
	waiters []chan struct{}
}

func (p *cutProvider) from(replica string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		p.mu.Lock()
		if p.keys == nil {
			p.keys = map[string]bool{}
		}
		p.keys[r.Header.Get("Idempotency-Key")] = true
		if replica == "b" {
			p.bSeen = true
			p.mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"pay_1"}`)
			return
		}
		p.fromA++
		if p.bSeen {
			p.aAfterB++
		}
		for _, c := range p.waiters {
			select {
			case c <- struct{}{}:
			default:
			}
		}
		p.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	})
}

// waitFor returns once replica a has sent n attempts.
func (p *cutProvider) waitFor(replica string, n int) {
	c := make(chan struct{}, 1)
	p.mu.Lock()
	p.waiters = append(p.waiters, c)
	p.mu.Unlock()
	for {
		p.mu.Lock()
		got := p.fromA
		p.mu.Unlock()
		if got >= n {
			return
		}
		<-c
	}
}

// stallRelay forwards TCP connections to a target until stall: from then
// on nothing more passes either way, as when the network between two hosts
// stops delivering, and the connections stay open. resume lets it pass again.
type stallRelay struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	open   chan struct{} // closed while traffic passes
	conns  []net.Conn
}

func newStallRelay(t *testing.T, target string) *stallRelay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &stallRelay{l: l, target: target, open: make(chan struct{})}
	close(s.open)
	go s.serve()
	t.Cleanup(s.close)
	return s
}

func (s *stallRelay) addr() string { return s.l.Addr().String() }

func (s *stallRelay) serve() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		d, err := net.Dial("tcp", s.target)
		if err != nil {
			c.Close()
			continue
		}
		s.mu.Lock()
		s.conns = append(s.conns, c, d)
		s.mu.Unlock()
		go s.pipe(c, d)
		go s.pipe(d, c)
	}
}

func (s *stallRelay) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			s.mu.Lock()
			open := s.open
			s.mu.Unlock()
			<-open
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			to.Close()
			return
		}
	}
}

func (s *stallRelay) stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open = make(chan struct{})
}

func (s *stallRelay) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.open:
	default:
		close(s.open)
	}
}

func (s *stallRelay) close() {
	s.l.Close()
	s.resume()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}
