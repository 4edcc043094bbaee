package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// arrivalLog is a provider that records when each request arrives, by order.
type arrivalLog struct {
	mu    sync.Mutex
	at    []time.Time
	order []string
}

func (l *arrivalLog) record(r *http.Request) (time.Time, string) {
	now := time.Now()
	var body struct {
		Order string `json:"order_id"`
	}
	json.NewDecoder(r.Body).Decode(&body)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at = append(l.at, now)
	l.order = append(l.order, body.Order)
	return now, body.Order
}

// postAll sends each order to its replica at once and fails the test unless
// every answer is 201.
func postAll(t *testing.T, targets []string, orders []string) {
	t.Helper()
	var wg sync.WaitGroup
	for i, order := range orders {
		wg.Go(func() {
			resp, err := http.Post("http://"+targets[i%len(targets)]+"/v1/payouts", "application/json",
				strings.NewReader(fmt.Sprintf(`{"order_id":%q}`, order)))
			if err != nil {
				t.Errorf("%s: %v", order, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("%s: %d %s, want 201", order, resp.StatusCode, b)
			}
		})
	}
	wg.Wait()
}

// A 429 with Retry-After on one replica pauses all three: once the others
// report the pause, no replica sends anything to the provider until it is
// over, the replica that got the 429 included (the provider records when each
// request arrives; none may arrive inside the pause). After it, every order
// is sent and answered.
func TestSharedPauseAcrossReplicas(t *testing.T) {
	url := pgtest.Database(t)
	const pause = 3 * time.Second
	// The pause ends pause after the replica read the 429, which is after
	// the provider wrote it; the margin covers only the rounding of the
	// database's microseconds.
	const margin = 20 * time.Millisecond
	var log arrivalLog
	var pausedAt time.Time
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now, order := log.record(r)
		log.mu.Lock()
		first := order == "pauses-everyone" && pausedAt.IsZero()
		if first {
			pausedAt = now
		}
		log.mu.Unlock()
		if first {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"state":1,"message":"rate limit exceeded"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, order)
	}))
	defer up.Close()
	env := sharedEnv(up.URL, url)
	a := launch(t, launchSpec{env: env})
	b := launch(t, launchSpec{env: env})
	c := launch(t, launchSpec{env: env})
	// The fast path is under test: every replica listens before the 429.
	waitListeners(t, url, 3)

	first := make(chan struct{})
	go func() { postAll(t, []string{a.proxy}, []string{"pauses-everyone"}); close(first) }()
	a.waitLine(t, "provider asked to pause")
	b.waitLine(t, "provider pause set by another replica")
	c.waitLine(t, "provider pause set by another replica")
	var orders []string
	for i := range 12 {
		orders = append(orders, fmt.Sprintf("during-pause-%d", i))
	}
	postAll(t, []string{a.proxy, b.proxy, c.proxy}, orders)
	<-first

	log.mu.Lock()
	defer log.mu.Unlock()
	end := pausedAt.Add(pause - margin)
	for i, at := range log.at {
		if log.order[i] == "pauses-everyone" && at.Equal(pausedAt) {
			continue
		}
		if at.Before(end) {
			t.Errorf("%s arrived %v after the 429, inside the %v pause", log.order[i], at.Sub(pausedAt).Round(time.Millisecond), pause)
		}
	}
	if want := 1 + 1 + len(orders); len(log.at) != want {
		t.Errorf("the provider saw %d requests, want %d (the 429, its retry, and one per order)", len(log.at), want)
	}
}

// waitListeners waits until n sessions on the database at url listen for
// pauses.
func waitListeners(t *testing.T, url string, n int) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		var got int
		err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle' AND query LIKE '%idemproxy pause listener%'`).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d replicas listening for pauses after a minute, want %d", got, n)
		}
	}
}

// rateReplicas starts two replicas on the database at url sharing a rate
// limit of rate a second (burst 1), in front of a provider that records
// when each request reached it.
func rateReplicas(t *testing.T, url string, rate int) (log *arrivalLog, a, b *opsProc) {
	t.Helper()
	log = &arrivalLog{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.record(r)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	env := sharedEnv(up.URL, url, fmt.Sprintf("IDEMPROXY_RATE_LIMIT=%d", rate), "IDEMPROXY_RATE_BURST=1")
	return log, launch(t, launchSpec{env: env}), launch(t, launchSpec{env: env})
}

// mostWithin is the most arrivals of at (sorted) within any one window.
func mostWithin(at []time.Time, window time.Duration) int {
	most, j := 0, 0
	for i := range at {
		for at[i].Sub(at[j]) >= window {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// sharedRateBound is how many requests two replicas sharing rate may send
// in two seconds: two seconds of tokens, the burst of 1, and half a second
// of tokens as tolerance (see TestSharedRateLimit).
func sharedRateBound(rate int) int { return 2*rate + 1 + rate/2 }

// IDEMPROXY_RATE_LIMIT is the provider's total: two replicas with a rate of
// 40 per second, both busy, together send at most 40 in any one-second
// window (plus the burst of 1 and a tolerance), not 80.
func TestSharedRateLimit(t *testing.T) {
	url := pgtest.Database(t)
	const rate, orders = 40, 160
	log, a, b := rateReplicas(t, url, rate)
	var names []string
	for i := range orders {
		names = append(names, fmt.Sprintf("rate-%d", i))
	}
	postAll(t, []string{a.proxy, b.proxy}, names)

	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.at) != orders {
		t.Fatalf("the provider saw %d requests, want %d", len(log.at), orders)
	}
	at := slices.Clone(log.at)
	slices.SortFunc(at, func(x, y time.Time) int { return x.Compare(y) })
	// Leased tokens may leave up to 100 ms after their time; each replica
	// places its tokens by its own reading of the database's answer, late
	// by its round trip; loopback delivery on a busy machine may bunch a
	// few more. So the check is over two seconds, where that slip is a
	// smaller share, with half a second of tokens as tolerance: one bucket
	// per replica would send about twice the rate, 160 in two seconds.
	const tolerance = rate / 2
	most := mostWithin(at, 2*time.Second)
	if limit := sharedRateBound(rate); most > limit {
		t.Errorf("%d requests reached the provider within two seconds, want at most %d (rate %d shared by both replicas)", most, limit, rate)
	}
	// Over the whole run the slips do not add up: the orders after the
	// first burst took at least (orders-burst-tolerance)/rate. Two buckets
	// would take half that.
	if took, least := at[len(at)-1].Sub(at[0]), time.Duration(orders-1-tolerance)*time.Second/rate; took < least {
		t.Errorf("%d requests took %v, want at least %v at a total rate of %d", orders, took.Round(time.Millisecond), least, rate)
	}
	t.Logf("%d requests in %v; at most %d in two seconds", orders, at[len(at)-1].Sub(at[0]).Round(time.Millisecond), most)
	for _, p := range []*opsProc{a, b} {
		// With the database up, a replica pacing alone sends its share on
		// top of the other's whole rate. A Take that only timed out (a
		// slow round trip on a loaded host) no longer does that.
		if strings.Contains(p.text(), "provider throttle in the database unreachable") {
			t.Errorf("a replica paced alone with the database up, on top of the other's shared bucket:\n%s", p.text())
		}
		if strings.Contains(p.text(), "provider throttle in the database slow to answer") {
			t.Logf("a replica waited for a slow round trip to the database")
		}
	}
}

// Two replicas sharing a rate of 40 per second, the bucket's row locked for
// 1.3 s (a database slow to answer, as a replica starved of CPU also sees
// it): replica a's orders arrive during the lock, b's when it goes. a's Take
// times out; a waits for the database instead of pacing alone at its half
// of the rate for 5 s while b takes the whole rate from the database. In
// any two seconds at most as many reach the provider as TestSharedRateLimit
// allows (pacing alone on top: about 1.5 times the rate).
func TestSharedRateLimitSlowDatabase(t *testing.T) {
	url := pgtest.Database(t)
	const rate, orders = 40, 100
	log, a, b := rateReplicas(t, url, rate)
	postAll(t, []string{a.proxy, b.proxy}, []string{"first-a", "first-b"}) // the bucket's row, a connection each
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM idemproxy_throttle FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, p := range []*opsProc{a, b} {
		var names []string
		for i := range orders {
			names = append(names, fmt.Sprintf("slow-%s-%d", p.proxy, i))
		}
		if p == b {
			time.Sleep(1300 * time.Millisecond)
			if err := tx.Rollback(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		wg.Go(func() { postAll(t, []string{p.proxy}, names) })
	}
	wg.Wait()
	for _, p := range []*opsProc{a, b} {
		if strings.Contains(p.text(), "provider throttle in the database unreachable") {
			t.Errorf("a replica paced alone with the database up, on top of the other's shared bucket")
		}
	}

	log.mu.Lock()
	defer log.mu.Unlock()
	at := slices.Clone(log.at)
	slices.SortFunc(at, func(x, y time.Time) int { return x.Compare(y) })
	most := mostWithin(at, 2*time.Second)
	if limit := sharedRateBound(rate); most > limit { // TestSharedRateLimit's bound and tolerance
		t.Errorf("%d requests reached the provider within two seconds, want at most %d (rate %d shared by both replicas)", most, limit, rate)
	}
	t.Logf("%d requests in %v; at most %d in two seconds", len(at), at[len(at)-1].Sub(at[0]).Round(time.Millisecond), most)
}

// SIGTERM with the database hung (every PostgreSQL process stopped with
// SIGSTOP: connections stay open and nothing answers) while an operation is
// at the provider: the process exits within the shutdown grace (plus
// exitMargin), whatever its store, throttle and heartbeat calls are waiting
// for, the store's close included. Before, the close began when the grace
// ended and cut the connections a second later: exit 4.0 s after SIGTERM.
func TestShutdownWithDatabaseHung(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	prov := newHeldProvider(1)
	up := httptest.NewServer(prov)
	defer up.Close()
	const grace = 3 * time.Second
	p := launch(t, launchSpec{env: sharedEnv(up.URL, url, "IDEMPROXY_SHUTDOWN_GRACE="+grace.String(),
		"IDEMPROXY_RATE_LIMIT=50")})
	go func() {
		resp, err := http.Post("http://"+p.proxy+"/v1/payments", "application/json", strings.NewReader(`{"order_id":"hung-1"}`))
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-prov.entered // claimed in the database, now at the provider
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer c.Thaw()
	// The answer comes during the drain, a second after SIGTERM: storing it
	// waits on the hung database.
	time.AfterFunc(time.Second, func() { close(prov.release) })
	took, err := p.terminateWithin(t, grace+exitMargin)
	t.Logf("exited %v after SIGTERM (grace %v): %v", took.Round(time.Millisecond), grace, err)
}

// Two deployments on one database in front of different providers: a 429
// with Retry-After from the cards provider pauses the cards deployment only.
// The payouts deployment hears no pause and its orders reach its provider
// inside the cards pause (which is long, so that this is an order of events
// and not a measure of speed).
func TestPauseStaysWithItsProvider(t *testing.T) {
	url := pgtest.Database(t)
	const pause = 10 * time.Second
	var cardsLog, payoutsLog arrivalLog
	var pausedAt time.Time
	cardsUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now, order := cardsLog.record(r)
		cardsLog.mu.Lock()
		first := pausedAt.IsZero()
		if first {
			pausedAt = now
		}
		cardsLog.mu.Unlock()
		if first {
			w.Header().Set("Retry-After", fmt.Sprint(int(pause/time.Second)))
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"state":1,"message":"rate limit exceeded"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, order)
	}))
	defer cardsUp.Close()
	payoutsUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, order := payoutsLog.record(r)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, order)
	}))
	defer payoutsUp.Close()
	cards := launch(t, launchSpec{env: sharedEnv(cardsUp.URL, url)})
	payouts := launch(t, launchSpec{env: sharedEnv(payoutsUp.URL, url)})
	// Both listen before the 429: a pause shared by mistake would reach
	// the payouts deployment at once.
	waitListeners(t, url, 2)

	first := make(chan struct{})
	go func() { postAll(t, []string{cards.proxy}, []string{"pauses-cards"}); close(first) }()
	cards.waitLine(t, "provider asked to pause")
	var orders []string
	for i := range 4 {
		orders = append(orders, fmt.Sprintf("payout-%d", i))
	}
	postAll(t, []string{payouts.proxy}, orders)
	<-first

	cardsLog.mu.Lock()
	end := pausedAt.Add(pause)
	if len(cardsLog.at) != 2 || cardsLog.at[1].Before(end.Add(-20*time.Millisecond)) {
		t.Errorf("the cards provider saw requests at %v, want the 429 and its retry after the %v pause", cardsLog.at, pause)
	}
	cardsLog.mu.Unlock()
	payoutsLog.mu.Lock()
	defer payoutsLog.mu.Unlock()
	if len(payoutsLog.at) != len(orders) {
		t.Errorf("the payouts provider saw %d requests, want %d", len(payoutsLog.at), len(orders))
	}
	for i, at := range payoutsLog.at {
		if !at.Before(end) {
			t.Errorf("%s reached the payouts provider %v after the cards provider's 429, not inside its %v pause",
				payoutsLog.order[i], at.Sub(pausedAt).Round(time.Millisecond), pause)
		}
	}
	if strings.Contains(payouts.text(), "provider pause set by another replica") {
		t.Errorf("the payouts deployment took the cards provider's pause:\n%s", payouts.text())
	}
}
