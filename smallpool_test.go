package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// poolProvider executes each Idempotency-Key once and replays it after. An
// order named held-… is held until release is closed (its lease is renewed
// meanwhile); the first request of pause-… gets 429 with Retry-After: 1,
// which executes nothing.
type poolProvider struct {
	mu      sync.Mutex
	execs   map[string]int
	stored  map[string]string
	paused  bool
	held    chan string
	release chan struct{}
	once    sync.Once
}

// Release lets the held executions go; calling it again does nothing.
func (p *poolProvider) Release() { p.once.Do(func() { close(p.release) }) }

func newPoolProvider(held int) *poolProvider {
	return &poolProvider{execs: map[string]int{}, stored: map[string]string{},
		held: make(chan string, held), release: make(chan struct{})}
}

func (p *poolProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	if out, ok := p.stored[key]; ok {
		p.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, out)
		return
	}
	if strings.Contains(string(b), `"pause-`) && !p.paused {
		p.paused = true
		p.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"message":"rate limit exceeded"}`)
		return
	}
	p.mu.Unlock()
	if strings.Contains(string(b), `"held-`) {
		p.held <- key
		<-p.release
	}
	p.mu.Lock()
	out := fmt.Sprintf(`{"id":"pay_%d"}`, len(p.stored)+1)
	p.execs[key]++
	p.stored[key] = out
	p.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, out)
}

// sessions counts the sessions of the database at url under
// application_name app, and how many of them listen for pauses.
func sessions(t *testing.T, url, app string) (all, listening int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'idle' AND query LIKE '%idemproxy pause listener%')
		FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, app).Scan(&all, &listening)
	if err != nil {
		t.Fatal(err)
	}
	return all, listening
}

// TestSmallPoolUnderLoad: two replicas with pool_max_conns=4, the least
// taken, one of whose connections listens for pauses. Under 64 new orders at
// once, 8 of them held at the provider while their leases are renewed and
// repeated on the other replica (the repeats wait), a rate limit (the shared
// bucket) and a 429 with Retry-After (a pause published to the other
// replica), every request gets its answer: 201, each key executed once, the
// repeats replayed; no 503 store_unavailable, since a pool of 4 is enough.
func TestSmallPoolUnderLoad(t *testing.T) {
	url := pgtest.Database(t)
	const app = "idemproxy-smallpool"
	small := url + "&pool_max_conns=4&application_name=" + app
	const held, orders = 8, 64
	prov := newPoolProvider(held)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer prov.Release()
	const lease = 3 * time.Second
	env := sharedEnv(up.URL, small, "IDEMPROXY_RATE_LIMIT=400", "IDEMPROXY_STORE_LEASE="+lease.String(),
		"IDEMPROXY_INFLIGHT_WAIT=2m")
	a := launch(t, launchSpec{env: env})
	b := launch(t, launchSpec{env: env})
	procs := []*opsProc{a, b}
	waitListeners(t, url, 2)

	type sent struct {
		order string
		c     <-chan sentReply
	}
	var first, repeats []sent
	body := func(order string) string { return fmt.Sprintf(`{"order_id":%q,"amount":"1.00"}`, order) }
	for i := range orders {
		order := fmt.Sprintf("new-%d", i)
		switch {
		case i < held:
			order = fmt.Sprintf("held-%d", i)
		case i == held:
			order = "pause-1"
		}
		p := procs[i%2]
		if order == "pause-1" {
			p = a // b is told (below)
		}
		first = append(first, sent{order, goSend("POST", "http://"+p.proxy+"/v1/payments", body(order))})
	}
	for range held {
		<-prov.held // every held order is at the provider
	}
	for i := range held {
		order := fmt.Sprintf("held-%d", i)
		for r := range 3 {
			repeats = append(repeats, sent{order, goSend("POST", "http://"+procs[(i+1+r)%2].proxy+"/v1/payments", body(order))})
		}
	}
	// Leases of the held orders are renewed (every third of the lease)
	// while the repeats wait.
	time.Sleep(2 * lease)
	if all, _ := sessions(t, url, app); all > 2*4 {
		t.Errorf("%d sessions of the two replicas with pool_max_conns=4, want at most 8", all)
	}
	prov.Release()

	answers := map[string]string{}
	for _, s := range first {
		r := <-s.c
		if r.err != nil {
			t.Errorf("%s: %v", s.order, r.err)
			continue
		}
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("%s: %d %s replayed=%q, want 201 executed", s.order, r.status, r.body, r.header.Get("Idempotent-Replayed"))
		}
		answers[s.order] = r.body
	}
	for _, s := range repeats {
		r := <-s.c
		if r.err != nil {
			t.Errorf("repeat of %s: %v", s.order, r.err)
			continue
		}
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.body != answers[s.order] {
			t.Errorf("repeat of %s: %d %s replayed=%q, want 201 replaying %s", s.order, r.status, r.body,
				r.header.Get("Idempotent-Replayed"), answers[s.order])
		}
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if len(prov.execs) != orders {
		t.Errorf("the provider executed %d keys, want %d", len(prov.execs), orders)
	}
	for key, n := range prov.execs {
		if n != 1 {
			t.Errorf("the provider executed %s %d times, want once", key, n)
		}
	}
	if !prov.paused {
		t.Error("the provider never answered 429")
	}
	b.waitLine(t, "provider pause set by another replica")
	if t.Failed() {
		t.Logf("a:\n%s\nb:\n%s", a.text(), b.text())
	}
}

// pauseFrom returns the replica field of the first log line of p saying that
// another replica set a pause through LISTEN (the field names that replica;
// a pause read at a heartbeat has none), or "".
func pauseFrom(t *testing.T, p *opsProc) string {
	t.Helper()
	for _, l := range strings.Split(p.text(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil || !strings.HasPrefix(fmt.Sprint(m["msg"]), "provider pause set by another replica") {
			continue
		}
		if from, _ := m["replica"].(string); from != "" {
			return from
		}
	}
	return ""
}

// TestPauseListenerBackAfterRestart: PostgreSQL restarts (a fast stop, then a
// crash stop, each followed by a start) under two replicas with pool_max_conns=4. Each listens for pauses
// again on a connection of its pool: a 429 with Retry-After on a after the
// restart reaches b through LISTEN (the log names a), and the replicas'
// sessions stay within their pools (the dropped listening connection is not
// kept) after each restart.
func TestPauseListenerBackAfterRestart(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	const app = "idemproxy-restart"
	small := url + "&pool_max_conns=4&application_name=" + app
	prov := newPoolProvider(0)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer close(prov.release)
	env := sharedEnv(up.URL, small, "IDEMPROXY_RATE_LIMIT=100")
	a := launch(t, launchSpec{env: env})
	b := launch(t, launchSpec{env: env})
	waitListeners(t, url, 2)
	for round := range 2 {
		if err := c.Stop(round == 1); err != nil { // fast, then crash

			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		waitReady(t, "the database restarted", a, b)
		waitListeners(t, url, 2)
		for i := range 8 {
			order := fmt.Sprintf(`{"order_id":"after-%d-%d","amount":"1"}`, round, i)
			if r := send(t, "POST", "http://"+[]*opsProc{a, b}[i%2].proxy+"/v1/payments", order); r.status != http.StatusCreated {
				t.Fatalf("after restart %d: %d %s, want 201", round+1, r.status, r.body)
			}
		}
		if all, listening := sessions(t, url, app); all > 2*4 || listening != 2 {
			t.Errorf("after restart %d: %d sessions of the two replicas (%d listening), want at most 8 (2 listening)",
				round+1, all, listening)
		}
	}
	prov.mu.Lock()
	prov.paused = false
	prov.mu.Unlock()
	if r := send(t, "POST", "http://"+a.proxy+"/v1/payments", `{"order_id":"pause-after","amount":"1"}`); r.status != http.StatusCreated {
		t.Fatalf("pause-after: %d %s, want 201 after the pause", r.status, r.body)
	}
	b.waitLine(t, "provider pause set by another replica")
	if from := pauseFrom(t, b); from == "" {
		t.Errorf("b learnt a's pause only at a heartbeat, not through LISTEN:\n%s", b.text())
	}
}

// TestShutdownIdleWithDatabaseHung: SIGTERM to an idle replica whose
// database is hung (every process of the cluster stopped with SIGSTOP), with
// pool_max_conns=4 and one connection held listening for pauses: the store
// closes (its statements waiting on the database are given up, the pool's
// connections cut) and the process exits with status 0 within the grace
// (plus exitMargin).
// Before, the store's Close waited for pgx's cleanup of each cancelled
// statement (a cancel request the hung server never answers, up to 15 s),
// so the process gave up on it after 3 s and exited with status 1.
func TestShutdownIdleWithDatabaseHung(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	up := httptest.NewServer(newDedupProvider())
	defer up.Close()
	const grace = 3 * time.Second
	p := launch(t, launchSpec{env: sharedEnv(up.URL, url+"&pool_max_conns=4", "IDEMPROXY_SHUTDOWN_GRACE="+grace.String(),
		"IDEMPROXY_RATE_LIMIT=50")})
	if r := send(t, "POST", "http://"+p.proxy+"/v1/payments", `{"order_id":"before-hang","amount":"1"}`); r.status != http.StatusCreated {
		t.Fatalf("before the database hangs: %d %s", r.status, r.body)
	}
	waitListeners(t, url, 1)
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer c.Thaw()
	p.terminateWithin(t, grace+exitMargin) // the database hung
	if p.err != nil || !strings.Contains(p.text(), `"msg":"store closed"`) {
		t.Fatalf("exit after SIGTERM with the database hung: %v, want status 0 with the store closed:\n%s", p.err, p.text())
	}
}
