package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// dedupProvider executes each Idempotency-Key once and replays it after, as
// the payment providers do; it counts executions and requests per key. While
// down is set it answers nothing useful (the test checks nothing was sent).
type dedupProvider struct {
	mu     sync.Mutex
	execs  map[string]int
	seen   map[string]int
	stored map[string]string
}

func newDedupProvider() *dedupProvider {
	return &dedupProvider{execs: map[string]int{}, seen: map[string]int{}, stored: map[string]string{}}
}

func (p *dedupProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen[key]++
	out, ok := p.stored[key]
	if ok {
		w.Header().Set("Idempotent-Replayed", "true")
	} else {
		p.execs[key]++
		out = fmt.Sprintf(`{"id":"pay_%d"}`, len(p.stored)+1)
		p.stored[key] = out
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, out)
}

func (p *dedupProvider) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, v := range p.seen {
		n += v
	}
	return n
}

// sharedEnv is the environment of a replica on the database at url.
func sharedEnv(upstream, url string, extra ...string) []string {
	return append([]string{
		"PATH=/usr/bin:/bin",
		"IDEMPROXY_UPSTREAM_URL=" + upstream,
		"IDEMPROXY_STORE_URL=" + url,
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0",
		"IDEMPROXY_ADMIN_ADDR=127.0.0.1:0",
	}, extra...)
}

// TestReplicasShareAStore runs two replicas on one PostgreSQL database: an
// answer stored through one is replayed by the other; with the database
// stopped, a new request gets 503 store_unavailable with nothing sent and
// /readyz is 503; once it is back, both work again without a restart.
func TestReplicasShareAStore(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	prov := newDedupProvider()
	up := httptest.NewServer(prov)
	defer up.Close()
	env := sharedEnv(up.URL, url)
	a := launch(t, launchSpec{env: env})
	b := launch(t, launchSpec{env: env})

	order := `{"order_id":"shared-1","amount":"10.00"}`
	first := send(t, "POST", "http://"+a.proxy+"/v1/payments", order)
	second := send(t, "POST", "http://"+b.proxy+"/v1/payments", order)
	if first.status != 201 || second.status != 201 || second.header.Get("Idempotent-Replayed") != "true" || second.body != first.body {
		t.Fatalf("through a: %d %q; through b: %d %q replayed=%q; want b to replay a's answer",
			first.status, first.body, second.status, second.body, second.header.Get("Idempotent-Replayed"))
	}

	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	before := prov.total()
	down := send(t, "POST", "http://"+a.proxy+"/v1/payments", `{"order_id":"shared-2","amount":"1"}`)
	if down.status != http.StatusServiceUnavailable || !strings.Contains(down.body, `"store_unavailable"`) {
		t.Fatalf("with the database down: %d %s, want 503 store_unavailable", down.status, down.body)
	}
	if prov.total() != before {
		t.Fatal("a request was sent upstream while the database was down")
	}
	if s := getStatus(t, "http://"+b.admin+"/readyz"); s != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the database down = %d, want 503", s)
	}

	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, "the database came back", a, b)
	again := send(t, "POST", "http://"+b.proxy+"/v1/payments", `{"order_id":"shared-2","amount":"1"}`)
	if again.status != 201 {
		t.Fatalf("after the database came back: %d %s, want 201", again.status, again.body)
	}
	replay := send(t, "POST", "http://"+b.proxy+"/v1/payments", order)
	if replay.body != first.body || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("answer stored before the restart: %d %q, want the replay of %q", replay.status, replay.body, first.body)
	}
}

// TestTakeoverAfterReplicaKilled: a replica is SIGKILLed while the provider
// holds its attempt. The app's retry goes to another replica, which waits for
// the dead replica's lease to run out, takes the key over and sends it again
// with the SAME key: the provider executes the order exactly once.
func TestTakeoverAfterReplicaKilled(t *testing.T) {
	url := pgtest.Database(t)
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	env := sharedEnv(up.URL, url, "IDEMPROXY_STORE_LEASE=2s", "IDEMPROXY_INFLIGHT_WAIT=1m")
	a := launch(t, launchSpec{env: env})
	b := launch(t, launchSpec{env: env})
	body := `{"order_id":"takeover-1","amount":"42.00"}`
	go func() {
		resp, err := http.Post("http://"+a.proxy+"/v1/payments", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
	}()
	key := <-prov.entered // replica a's attempt is at the provider
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	close(prov.release) // the provider executes; the answer has nobody to go to

	r := send(t, "POST", "http://"+b.proxy+"/v1/payments", body)
	if r.status != http.StatusCreated || r.header.Get("Idempotency-Key") != key {
		t.Fatalf("retry on the other replica = %d %s key=%q, want 201 under %q\n%s", r.status, r.body, r.header.Get("Idempotency-Key"), key, b.text())
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs[key] != 1 || len(prov.execs) != 1 || prov.seen[key] != 2 {
		t.Fatalf("executions %v, requests %v; want one execution and two requests, all under %q", prov.execs, prov.seen, key)
	}
}

// TestRetryAfterHungDatabase: the database hangs (every process stopped, as
// a paused VM or a stuck volume does) while a replica claims a new key. The
// app gets 503 store_unavailable in the JSON error format with nothing sent
// upstream, /readyz is 503 and /healthz 200 on both replicas. Once the
// database runs again, the app's retry of the same order on the other
// replica is executed (once), not answered 409 idempotency_in_progress: the
// claim the hung server ran when it woke up is undone, since the replica
// told the app that nothing was written and the key was free.
func TestRetryAfterHungDatabase(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	prov := newDedupProvider()
	up := httptest.NewServer(prov)
	defer up.Close()
	env := sharedEnv(up.URL, url, "IDEMPROXY_INFLIGHT_WAIT=5s")
	a := launch(t, launchSpec{env: env})
	b := launch(t, launchSpec{env: env})
	// A recent request, so that the claim below goes out on an open
	// connection instead of waiting for a new one.
	if r := send(t, "POST", "http://"+a.proxy+"/v1/payments", `{"order_id":"hung-0","amount":"1"}`); r.status != http.StatusCreated {
		t.Fatalf("before the database hangs: %d %s", r.status, r.body)
	}

	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	frozen := true
	defer func() {
		if frozen {
			c.Thaw()
		}
	}()
	before := prov.total()
	order := `{"order_id":"hung-1","amount":"5.00"}`
	down := send(t, "POST", "http://"+a.proxy+"/v1/payments", order)
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal([]byte(down.body), &e); err != nil || down.status != http.StatusServiceUnavailable ||
		e.Error.Code != "store_unavailable" || down.header.Get("Content-Type") != "application/json" {
		t.Fatalf("with the database hung: %d %s %q, want 503 store_unavailable as JSON", down.status, down.header.Get("Content-Type"), down.body)
	}
	key := down.header.Get("Idempotency-Key")
	for _, p := range []*opsProc{a, b} {
		if s := getStatus(t, "http://"+p.admin+"/readyz"); s != http.StatusServiceUnavailable {
			t.Errorf("/readyz with the database hung = %d, want 503", s)
		}
		if s := getStatus(t, "http://"+p.admin+"/healthz"); s != http.StatusOK {
			t.Errorf("/healthz with the database hung = %d, want 200", s)
		}
	}
	if n := prov.total(); n != before {
		t.Fatalf("%d requests went upstream while the database was hung", n-before)
	}

	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}
	frozen = false
	waitReady(t, "the database woke", a, b)
	again := send(t, "POST", "http://"+b.proxy+"/v1/payments", order)
	if again.status != http.StatusCreated || again.header.Get("Idempotency-Key") != key || again.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the database woke: %d %s key=%q replayed=%q, want 201 executed under %q\n%s",
			again.status, again.body, again.header.Get("Idempotency-Key"), again.header.Get("Idempotent-Replayed"), key, a.text())
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs[key] != 1 || prov.seen[key] != 1 {
		t.Fatalf("provider executed %q %d times in %d requests, want once", key, prov.execs[key], prov.seen[key])
	}
}

// TestSameKeyOnReplicasAtOnce: while replica a runs an order (the provider
// holds it), the same order on replica b waits and then gets a's answer as a
// replay; on replica c, whose IDEMPROXY_INFLIGHT_WAIT is 1 s, it gets 409
// idempotency_in_progress with Retry-After once the wait is over, and the
// same order with another body gets 409 idempotency_conflict. The provider
// sees one request.
func TestSameKeyOnReplicasAtOnce(t *testing.T) {
	url := pgtest.Database(t)
	prov := newHeldProvider(2)
	up := httptest.NewServer(prov)
	defer up.Close()
	defer prov.Release()
	a := launch(t, launchSpec{env: sharedEnv(up.URL, url, "IDEMPROXY_INFLIGHT_WAIT=1m")})
	b := launch(t, launchSpec{env: sharedEnv(up.URL, url, "IDEMPROXY_INFLIGHT_WAIT=1m")})
	c := launch(t, launchSpec{env: sharedEnv(up.URL, url, "IDEMPROXY_INFLIGHT_WAIT=1s")})
	order := `{"order_id":"once-1","amount":"7.00"}`

	ra := goSend("POST", "http://"+a.proxy+"/v1/payments", order)
	key := <-prov.entered
	rb := goSend("POST", "http://"+b.proxy+"/v1/payments", order)

	began := time.Now()
	busy := send(t, "POST", "http://"+c.proxy+"/v1/payments", order)
	waited := time.Since(began)
	if busy.status != http.StatusConflict || !strings.Contains(busy.body, `"idempotency_in_progress"`) ||
		busy.header.Get("Idempotency-Key") != key {
		t.Fatalf("on c while a runs it: %d %s key=%q, want 409 idempotency_in_progress under %q", busy.status, busy.body, busy.header.Get("Idempotency-Key"), key)
	}
	if ra, err := strconv.Atoi(busy.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("409 idempotency_in_progress Retry-After = %q, want whole seconds, at least 1", busy.header.Get("Retry-After"))
	}
	if waited < 900*time.Millisecond {
		t.Errorf("c answered 409 after %v, before its 1 s wait was over", waited)
	}
	other := send(t, "POST", "http://"+c.proxy+"/v1/payments", `{"order_id":"once-1","amount":"8.00"}`)
	if other.status != http.StatusConflict || !strings.Contains(other.body, `"idempotency_conflict"`) {
		t.Fatalf("other body on c while a runs it: %d %s, want 409 idempotency_conflict", other.status, other.body)
	}

	prov.Release()
	first, second := <-ra, <-rb
	if first.err != nil || second.err != nil {
		t.Fatal(first.err, second.err)
	}
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("on a: %d %s replayed=%q, want 201 executed", first.status, first.body, first.header.Get("Idempotent-Replayed"))
	}
	if second.status != http.StatusCreated || second.body != first.body || second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("on b after waiting: %d %s replayed=%q, want a's answer %s replayed", second.status, second.body,
			second.header.Get("Idempotent-Replayed"), first.body)
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if prov.execs[key] != 1 || prov.seen[key] != 1 || len(prov.seen) != 1 {
		t.Fatalf("provider requests %v, executions %v; want one request under %q", prov.seen, prov.execs, key)
	}
}

// waitReady waits up to a minute for every one of procs to answer /readyz
// with 200, after what happened (for the failure's message).
func waitReady(t *testing.T, after string, procs ...*opsProc) {
	t.Helper()
	for _, p := range procs {
		deadline := time.Now().Add(time.Minute)
		for getStatus(t, "http://"+p.admin+"/readyz") != http.StatusOK {
			if time.Now().After(deadline) {
				t.Fatalf("/readyz not 200 a minute after %s:\n%s", after, p.text())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
