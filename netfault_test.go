package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// faultRelay forwards TCP connections from one replica to the database and
// breaks them as a network does:
//   - hole: packets vanish. The connections open then (and any opened until
//     heal) pass nothing ever again, either way, and are never closed: a
//     lost NAT or firewall state. heal lets new connections through.
//   - reset: every open connection is cut at once (RST on both sides).
//   - delay: each direction's bytes wait that long before they are passed.
//   - dropAnswer: the next statement whose bytes hold a marker is passed
//     up to its Sync (so the server runs and commits it), then the
//     connection is cut before any of the server's answer reaches the
//     client.
type faultRelay struct {
	l      net.Listener
	target string

	mu      sync.Mutex
	links   map[*relayLink]bool
	hole    bool
	delay   [2]time.Duration // [up] to the server, [down] to the client
	marker  []byte           // armed dropAnswer
	vanish  bool             // armed: the answer vanishes and the link is black-holed, not cut
	after   []byte           // armed: only on a link that passed these bytes first
	dropped chan struct{}    // closed once an armed dropAnswer cut its connection
	simple  bool             // armed: the marker is in a simple query (COMMIT), not one ended by Sync
	resets  int
}

const (
	up   = 0
	down = 1
)

type relayLink struct {
	ends   [2]*net.TCPConn // [up] the server side, [down] the client side
	dead   bool            // black-holed: passes nothing, never closed
	cutNow bool            // the server's next bytes are dropped and the link cut
	hole   bool            // (with cutNow) black-holed instead
	seen   bool            // the armed after bytes passed
}

func newFaultRelay(t *testing.T, target string) *faultRelay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &faultRelay{l: l, target: target, links: map[*relayLink]bool{}}
	go r.serve()
	t.Cleanup(r.close)
	return r
}

func (r *faultRelay) addr() string { return r.l.Addr().String() }

func (r *faultRelay) serve() {
	for {
		c, err := r.l.Accept()
		if err != nil {
			return
		}
		link := &relayLink{}
		link.ends[down] = c.(*net.TCPConn)
		r.mu.Lock()
		hole := r.hole
		r.mu.Unlock()
		if !hole {
			d, err := net.Dial("tcp", r.target)
			if err != nil {
				c.Close()
				continue
			}
			link.ends[up] = d.(*net.TCPConn)
		}
		r.mu.Lock()
		link.dead = hole || r.hole
		r.links[link] = true
		r.mu.Unlock()
		if link.ends[up] == nil {
			continue // the connection opens, nothing ever answers
		}
		go r.pipe(link, up)
		go r.pipe(link, down)
	}
}

type relayChunk struct {
	at   time.Time
	data []byte
}

// pipe passes bytes towards dir (up: client to server).
func (r *faultRelay) pipe(link *relayLink, dir int) {
	from, to := link.ends[1-dir], link.ends[dir]
	q := make(chan relayChunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := from.Read(buf)
			if n > 0 {
				q <- relayChunk{time.Now(), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		r.mu.Lock()
		d := r.delay[dir]
		r.mu.Unlock()
		if w := time.Until(c.at.Add(d)); w > 0 {
			time.Sleep(w)
		}
		r.mu.Lock()
		if link.dead {
			r.mu.Unlock()
			continue
		}
		if dir == down && link.cutNow && link.hole {
			link.dead = true
			if r.dropped != nil {
				close(r.dropped)
				r.dropped = nil
			}
			r.mu.Unlock()
			continue
		}
		if dir == down && link.cutNow {
			r.cutLocked(link)
			r.mu.Unlock()
			return
		}
		if dir == up && r.after != nil && bytes.Contains(c.data, r.after) {
			link.seen = true
		}
		arm := dir == up && r.marker != nil && (r.after == nil || link.seen) &&
			bytes.Contains(c.data, r.marker) && (bytes.HasSuffix(c.data, []byte{'S', 0, 0, 0, 4}) || r.simple && c.data[0] == 'Q')
		if arm {
			link.cutNow, link.hole = true, r.vanish
			r.marker = nil
		}
		r.mu.Unlock()
		if _, err := to.Write(c.data); err != nil {
			return
		}
	}
	r.mu.Lock()
	dead := link.dead
	r.mu.Unlock()
	if !dead {
		to.CloseWrite()
	}
}

// cutLocked resets both sides of link.
func (r *faultRelay) cutLocked(link *relayLink) {
	for _, c := range link.ends {
		if c != nil {
			c.SetLinger(0)
			c.Close()
		}
	}
	if link.cutNow && r.dropped != nil {
		close(r.dropped)
		r.dropped = nil
	}
	delete(r.links, link)
	r.resets++
}

func (r *faultRelay) blackHole() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hole = true
	for l := range r.links {
		l.dead = true
	}
}

func (r *faultRelay) heal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hole = false
}

func (r *faultRelay) reset() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for l := range r.links {
		if !l.dead {
			r.cutLocked(l)
			n++
		}
	}
	return n
}

func (r *faultRelay) setDelay(dir int, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.delay[dir] = d
}

// dropAnswer arms the cut of the next statement holding marker, and
// returns a channel closed once it is done.
func (r *faultRelay) dropAnswer(marker []byte) <-chan struct{} {
	return r.arm(marker, nil, false)
}

// vanishAfter arms as dropAnswer does, but the statement's answer vanishes
// and its connection is black-holed from then on, never closed.
// Only a link that passed after first is armed (nil: any).
func (r *faultRelay) vanishAfter(marker, after []byte) <-chan struct{} {
	return r.arm(marker, after, true)
}

// dropCommitAfter arms as dropAnswer does, for the COMMIT of the next
// transaction on a link that passed after first (pgx sends it as a simple
// query): the server commits, and the connection is cut before its answer.
func (r *faultRelay) dropCommitAfter(after []byte) <-chan struct{} {
	c := r.arm([]byte("commit"), after, false)
	r.mu.Lock()
	r.simple = true
	r.mu.Unlock()
	return c
}

func (r *faultRelay) arm(marker, after []byte, vanish bool) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.marker, r.after, r.vanish, r.simple = bytes.Clone(marker), bytes.Clone(after), vanish, false
	for l := range r.links {
		l.seen = false // after passed for an earlier arm
	}
	c := make(chan struct{})
	r.dropped = c
	return c
}

func (r *faultRelay) close() {
	r.l.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for l := range r.links {
		l.dead = false
		r.cutLocked(l)
	}
}

// netFault is two replicas on one database, a through a faultRelay, b
// direct, in front of the payments sandbox, whose ledger counts executions
// per order and key.
type netFault struct {
	db    string
	sb    *sandbox.Server
	relay *faultRelay
	a, b  *opsProc
	mu    sync.Mutex
	hook  func(sandbox.Operation)
}

func newNetFault(t *testing.T, extra ...string) *netFault {
	t.Helper()
	n := &netFault{}
	sb, upURL := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderPayments, ExecuteHook: func(op sandbox.Operation) {
		n.mu.Lock()
		h := n.hook
		n.mu.Unlock()
		if h != nil {
			h(op)
		}
	}})
	n.sb, n.db = sb, pgtest.Database(t)
	u, err := url.Parse(n.db)
	if err != nil {
		t.Fatal(err)
	}
	n.relay = newFaultRelay(t, u.Host)
	u.Host = n.relay.addr()
	n.a = launch(t, launchSpec{env: presetEnv(t, "payments", upURL, append([]string{"IDEMPROXY_STORE_URL=" + u.String()}, extra...)...)})
	n.b = launch(t, launchSpec{env: presetEnv(t, "payments", upURL, append([]string{"IDEMPROXY_STORE_URL=" + n.db}, extra...)...)})
	return n
}

func (n *netFault) onExecute(h func(sandbox.Operation)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hook = h
}

// pay posts order id through p.
func (n *netFault) pay(p *opsProc, id string) (reply, error) {
	return trySend("POST", "http://"+p.proxy+"/payments", `{"order_id":"`+id+`","amount":"5.00","currency":"EUR"}`)
}

// once checks that each of ids executed exactly once and that none
// executed twice.
func (n *netFault) once(t *testing.T, ids ...string) {
	t.Helper()
	l := n.sb.Ledger()
	for _, id := range ids {
		if l.ByOrder[id] != 1 {
			t.Errorf("order %s executed %d times, want once", id, l.ByOrder[id])
		}
	}
	if len(l.DuplicateOrders) > 0 {
		t.Errorf("orders executed twice: %v", l.DuplicateOrders)
	}
}

// TestNetFaultCommitAnswerLost: the database commits a statement of
// replica a, and the connection is cut before its answer comes back. A
// final answer so lost: a answers 503 store_unavailable saying the
// operation may have run, and the app's retry on b replays the stored
// answer. A claim so lost: a answers 503 with nothing sent, and the retry on
// b is executed at once (a undoes the claim once its session is gone), not
// refused 409 for a lease nobody runs. Each order executes once, and a
// serves the next order.
func TestNetFaultCommitAnswerLost(t *testing.T) {
	n := newNetFault(t)
	// The final answer's statement: armed as the provider executes.
	cuts := make(chan (<-chan struct{}), 1)
	n.onExecute(func(op sandbox.Operation) {
		if op.OrderID == "lost-final" {
			cuts <- n.relay.dropAnswer([]byte(op.IdempotencyKey))
		}
	})
	ra, err := n.pay(n.a, "lost-final")
	if err != nil || ra.status != http.StatusServiceUnavailable || !strings.Contains(ra.body, `"store_unavailable"`) {
		t.Fatalf("a, its final answer's commit unanswered: %d %s %v, want 503 store_unavailable", ra.status, ra.body, err)
	}
	<-<-cuts
	entries := n.sb.Ledger()
	rb, err := n.pay(n.b, "lost-final")
	if err != nil || rb.status != http.StatusCreated || rb.header.Get("Idempotent-Replayed") != "true" || !strings.Contains(rb.body, `"lost-final"`) {
		t.Fatalf("retry on b: %d replayed=%q %s %v, want the stored answer replayed", rb.status, rb.header.Get("Idempotent-Replayed"), rb.body, err)
	}
	if n.sb.Ledger().Executions != entries.Executions {
		t.Fatal("the replay reached the provider")
	}

	// The claim's statement: its key is the client's.
	n.onExecute(nil)
	cut := n.relay.dropAnswer([]byte("lost-claim-key"))
	ra, err = trySend("POST", "http://"+n.a.proxy+"/payments", `{"order_id":"lost-claim","amount":"5.00","currency":"EUR"}`, "Idempotency-Key", "lost-claim-key")
	if err != nil || ra.status != http.StatusServiceUnavailable || !strings.Contains(ra.body, "nothing was sent") {
		t.Fatalf("a, its claim's commit unanswered: %d %s %v, want 503 store_unavailable, nothing sent", ra.status, ra.body, err)
	}
	<-cut
	began := time.Now()
	rb, err = trySend("POST", "http://"+n.b.proxy+"/payments", `{"order_id":"lost-claim","amount":"5.00","currency":"EUR"}`, "Idempotency-Key", "lost-claim-key")
	if err != nil || rb.status != http.StatusCreated || rb.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry on b after %v: %d %s %v, want 201 executed", time.Since(began), rb.status, rb.body, err)
	}
	if r, err := n.pay(n.a, "after-lost"); err != nil || r.status != http.StatusCreated {
		t.Fatalf("a's next order: %d %s %v, want 201\n%s", r.status, r.body, err, n.a.text())
	}
	n.once(t, "lost-final", "lost-claim", "after-lost")
}

// TestNetFaultBlackHoleDuringAttempt: while the provider holds replica a's
// attempt, every packet between a and the database vanishes (connections
// hang, never closed). a's renewals fail; it stops at the end of the lease
// it knows it holds and answers 409; /readyz on a is 503 throughout. The
// app's retry on b takes the key over once the lease has run out by the
// database's clock and sends it with the same key: the provider executes
// the order once. Once packets pass again (the hung connections stay
// hung), a is ready and serves orders at once.
func TestNetFaultBlackHoleDuringAttempt(t *testing.T) {
	n := newNetFault(t, "IDEMPROXY_STORE_LEASE=2s", "IDEMPROXY_INFLIGHT_WAIT=1m", "IDEMPROXY_ATTEMPT_TIMEOUT=20s")
	if r, err := n.pay(n.a, "hole-0"); err != nil || r.status != http.StatusCreated {
		t.Fatalf("before the fault: %d %s %v", r.status, r.body, err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	n.onExecute(func(op sandbox.Operation) {
		if op.OrderID == "hole-1" {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		}
	})
	fromA := goSend("POST", "http://"+n.a.proxy+"/payments", `{"order_id":"hole-1","amount":"5.00","currency":"EUR"}`)
	<-entered
	n.relay.blackHole()
	ra := <-fromA
	if ra.err != nil || ra.status != http.StatusConflict || !strings.Contains(ra.body, `"idempotency_in_progress"`) {
		t.Fatalf("a, cut off past its lease: %d %s %v, want 409 idempotency_in_progress", ra.status, ra.body, ra.err)
	}
	if s := getStatus(t, "http://"+n.a.admin+"/readyz"); s != http.StatusServiceUnavailable {
		t.Errorf("/readyz on a, cut off from the database = %d, want 503", s)
	}
	fromB := goSend("POST", "http://"+n.b.proxy+"/payments", `{"order_id":"hole-1","amount":"5.00","currency":"EUR"}`)
	time.Sleep(3 * time.Second) // b has taken the key over: its attempt waits behind a's at the provider
	close(release)
	rb := <-fromB
	if rb.err != nil || rb.status != http.StatusCreated || !strings.Contains(rb.body, `"hole-1"`) {
		t.Fatalf("retry on b: %d %s %v, want 201", rb.status, rb.body, rb.err)
	}
	n.relay.heal()
	began := time.Now()
	for getStatus(t, "http://"+n.a.admin+"/readyz") != http.StatusOK {
		if time.Since(began) > 20*time.Second {
			t.Fatalf("/readyz on a not 200 20 s after the network came back\n%s", n.a.text())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := range 3 {
		if r, err := n.pay(n.a, fmt.Sprint("hole-after-", i)); err != nil || r.status != http.StatusCreated {
			t.Fatalf("a after the network came back: %d %s %v, want 201", r.status, r.body, err)
		}
	}
	n.once(t, "hole-0", "hole-1", "hole-after-0", "hole-after-1", "hole-after-2")
}

// TestNetFaultResetStorm: every connection between replica a and the
// database is reset every 100 ms while 200 orders go through both replicas,
// the app retrying each until it gets a 2xx. Each order is executed once,
// and each answer the app got is the one replayed afterwards.
func TestNetFaultResetStorm(t *testing.T) {
	n := newNetFault(t, "IDEMPROXY_STORE_LEASE=3s", "IDEMPROXY_INFLIGHT_WAIT=2s")
	stop := make(chan struct{})
	var storm sync.WaitGroup
	storm.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				n.relay.reset()
			}
		}
	})
	const orders = 200
	paid := make([]reply, orders)
	var wg sync.WaitGroup
	slots := make(chan struct{}, 8)
	for i := range orders {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			for try := range 40 {
				p := n.a
				if try%3 == 2 {
					p = n.b
				}
				if r, err := n.pay(p, fmt.Sprint("storm-", i)); err == nil && r.status/100 == 2 {
					paid[i] = r
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(stop)
	storm.Wait()
	n.relay.mu.Lock()
	resets := n.relay.resets
	n.relay.mu.Unlock()
	t.Logf("%d connections reset", resets)
	ids := make([]string, orders)
	for i, first := range paid {
		ids[i] = fmt.Sprint("storm-", i)
		if first.status == 0 {
			t.Errorf("order %d never answered 2xx", i)
			continue
		}
		r, err := n.pay(n.b, ids[i])
		if err != nil || r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("order %d: the app got %d %s, the replay is %d %s %v", i, first.status, first.body, r.status, r.body, err)
		}
	}
	n.once(t, ids...)
}

// TestNetFaultSlowAnswers: the database's answers to replica a arrive 7 s
// late (past the 5 s call timeout; its statements arrive on time). a's
// /readyz is 503 and its order gets 503 store_unavailable with nothing sent;
// the claim the database committed is undone once a's session is gone, so
// the app's retry on b is executed, once. When answers come on time again,
// a is ready and serves orders.
func TestNetFaultSlowAnswers(t *testing.T) {
	n := newNetFault(t)
	if r, err := n.pay(n.a, "slow-0"); err != nil || r.status != http.StatusCreated {
		t.Fatalf("before the fault: %d %s %v", r.status, r.body, err)
	}
	n.relay.setDelay(down, 7*time.Second)
	if s := getStatus(t, "http://"+n.a.admin+"/readyz"); s != http.StatusServiceUnavailable {
		t.Errorf("/readyz on a, its answers 7 s late = %d, want 503", s)
	}
	before := n.sb.Ledger().Executions
	ra, err := n.pay(n.a, "slow-1")
	if err != nil || ra.status != http.StatusServiceUnavailable || !strings.Contains(ra.body, "nothing was sent") {
		t.Fatalf("a, its answers 7 s late: %d %s %v, want 503 store_unavailable, nothing sent", ra.status, ra.body, err)
	}
	if n.sb.Ledger().Executions != before {
		t.Fatal("a sent the order though it could not claim its key")
	}
	if rb, err := n.pay(n.b, "slow-1"); err != nil || rb.status != http.StatusCreated || rb.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry on b: %d %s %v, want 201 executed", rb.status, rb.body, err)
	}
	n.relay.setDelay(down, 0)
	began := time.Now()
	for getStatus(t, "http://"+n.a.admin+"/readyz") != http.StatusOK {
		if time.Since(began) > 30*time.Second {
			t.Fatalf("/readyz on a not 200 30 s after answers came on time again\n%s", n.a.text())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r, err := n.pay(n.a, "slow-2"); err != nil || r.status != http.StatusCreated {
		t.Fatalf("a after the fault: %d %s %v, want 201", r.status, r.body, err)
	}
	n.once(t, "slow-0", "slow-1", "slow-2")
}

// TestNetFaultOperatorTransactionVanished: an operator marks a record
// reviewed through replica a, and the network between a and the database
// loses every packet once the row is locked (SELECT ... FOR UPDATE), the
// connection never closed. The server kept that session idle in its
// transaction, holding the row, until its TCP keepalive gave up (hours by
// default): on the healthy replica b, the replay of that order and every
// order whose claim or final answer shared a statement with it waited out
// the call timeout and got 503 (22 of 22 requests, one or two of them
// executed by the provider, in two runs). Sessions end a call timeout after they go idle in a
// transaction (pgstore), and b serves them all.
func TestNetFaultOperatorTransactionVanished(t *testing.T) {
	up := httptest.NewServer(newDedupProvider())
	defer up.Close()
	db := pgtest.Database(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	relay := newFaultRelay(t, u.Host)
	u.Host = relay.addr()
	a := launch(t, launchSpec{env: sharedEnv(up.URL, u.String())})
	b := launch(t, launchSpec{env: sharedEnv(up.URL, db)})
	review := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_r","status":"needs_review"}`)
	}))
	defer review.Close()
	// The order whose answer awaits review, stored through a replica of
	// its own in front of a provider that says so.
	c := launch(t, launchSpec{env: sharedEnv(review.URL, db)})
	order := `{"order_id":"review-1","amount":"1"}`
	first := send(t, "POST", "http://"+c.proxy+"/v1/payments", order)
	key := first.header.Get("Idempotency-Key")
	if first.status != http.StatusCreated || key == "" {
		t.Fatalf("the order to review: %d %s", first.status, first.body)
	}

	lost := relay.vanishAfter([]byte(key), []byte("FOR UPDATE"))
	if r := send(t, "POST", "http://"+a.admin+"/admin/v1/records/reviewed", `{"key":"`+key+`"}`); r.status != http.StatusServiceUnavailable {
		t.Fatalf("reviewed through a, its transaction cut off: %d %s, want 503", r.status, r.body)
	}
	<-lost

	var wg sync.WaitGroup
	got := make([]reply, 22)
	for i := range got {
		wg.Go(func() {
			body := order
			if i%4 != 0 {
				body = fmt.Sprintf(`{"order_id":"other-%d","amount":"1"}`, i)
			}
			got[i], _ = trySend("POST", "http://"+b.proxy+"/v1/payments", body)
		})
	}
	wg.Wait()
	failed := 0
	for i, r := range got {
		if r.status != http.StatusCreated {
			failed++
			t.Logf("request %d: %d %s", i, r.status, r.body)
		}
		if i%4 == 0 && r.status == http.StatusCreated && r.body != first.body {
			t.Errorf("replay of the reviewed order: %s, want %s", r.body, first.body)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests on b failed after a's transaction was cut off", failed, len(got))
	}
}
