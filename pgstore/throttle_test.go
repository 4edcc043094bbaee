package pgstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/fakeclock"
	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/ratelimit"
)

// pauses collects what a Throttle's OnPause reports.
type pauses struct {
	mu  sync.Mutex
	got []string
	c   chan time.Duration
}

func newPauses() *pauses { return &pauses{c: make(chan time.Duration, 16)} }

func (p *pauses) on(d time.Duration, from string) {
	p.mu.Lock()
	p.got = append(p.got, from)
	p.mu.Unlock()
	p.c <- d
}

func throttle(t *testing.T, s *Store, opt ThrottleOptions) *Throttle {
	t.Helper()
	th := s.Throttle(opt)
	t.Cleanup(func() { th.Close() })
	return th
}

// Take books the shared bucket with GCRA: the lead is where the schedule
// stood, it moves by n tokens per Take whichever replica takes them, and a
// Take whose first token would come after maxWait books nothing.
func TestThrottleTake(t *testing.T) {
	url := pgtest.Database(t)
	s := open(t, url, 0)
	a := throttle(t, s, ThrottleOptions{Name: "https://provider.test", Heartbeat: time.Hour})
	b := throttle(t, open(t, url, 0), ThrottleOptions{Name: "https://provider.test", Heartbeat: time.Hour})
	other := throttle(t, s, ThrottleOptions{Name: "https://other.test", Heartbeat: time.Hour})
	ctx := context.Background()
	const rate, every = 10, 100 * time.Millisecond // per second, and per token
	take := func(th *Throttle, n int, maxWait time.Duration) (time.Duration, error) {
		t.Helper()
		return th.Take(ctx, n, rate, 1, maxWait)
	}
	start := time.Now()
	// within says lead is want less the time since start (the database's
	// clock moves on between the calls), never more.
	within := func(what string, lead, want time.Duration) {
		t.Helper()
		if lead > want || lead < want-time.Since(start) {
			t.Errorf("%s: lead %v, want %v less at most the %v elapsed", what, lead, want, time.Since(start))
		}
	}
	if lead, err := take(a, 1, time.Hour); err != nil || lead != 0 {
		t.Fatalf("first Take = %v, %v; want lead 0 on a new bucket", lead, err)
	}
	lead, err := take(a, 5, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	within("after 1 token", lead, every)
	lead, err = take(b, 1, time.Hour) // the other replica sees a's six tokens
	if err != nil {
		t.Fatal(err)
	}
	within("after 6 tokens, from the other replica", lead, 6*every)
	if _, err := take(b, 1, 100*time.Millisecond); !errors.Is(err, ratelimit.ErrDeadline) {
		t.Errorf("Take beyond maxWait = %v, want ErrDeadline", err)
	}
	lead, err = take(a, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	within("after 7 tokens (the refused Take booked none)", lead, 7*every)
	if lead, err := take(other, 1, time.Hour); err != nil || lead != 0 {
		t.Errorf("another provider's bucket = %v, %v; want its own, lead 0", lead, err)
	}
}

// A pause set through one replica reaches the other at once through
// NOTIFY, with what is left of it and the name of the replica that set it; a
// shorter pause never cuts it short.
func TestThrottlePause(t *testing.T) {
	url := pgtest.Database(t)
	a := throttle(t, open(t, url, 0), ThrottleOptions{Name: "p", Replica: "replica-a", Heartbeat: time.Hour})
	got := newPauses()
	sb := open(t, url, 0)
	beat := make(chan int, 1)
	throttle(t, sb, ThrottleOptions{Name: "p", Replica: "replica-b", Heartbeat: time.Hour, OnPause: got.on,
		OnReplicas: func(n int) { beat <- n }})
	// Both listen before the pause, and b's first heartbeat (the next is
	// an hour later) has read the pause row before it: only NOTIFY can
	// bring it.
	waitListening(t, sb, 2)
	waitBeat(t, beat)
	ctx := context.Background()
	start := time.Now()
	if err := a.Pause(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	d := <-got.c
	if d > 3*time.Second || d < 3*time.Second-time.Since(start) {
		t.Errorf("pause received %v, want 3s less at most the %v elapsed", d, time.Since(start))
	}
	got.mu.Lock()
	if got.got[0] != "replica-a" {
		t.Errorf("pause from %q, want replica-a", got.got[0])
	}
	got.mu.Unlock()
	if err := a.Pause(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if d := <-got.c; d < 3*time.Second-time.Since(start) {
		t.Errorf("after a shorter pause, %v left; want the longer one kept", d)
	}
}

// waitBeat waits for a Throttle's first heartbeat, reported on beat by its
// OnReplicas.
func waitBeat(t *testing.T, beat <-chan int) {
	t.Helper()
	select {
	case <-beat:
	case <-time.After(time.Minute):
		t.Fatal("no heartbeat within a minute")
	}
}

// listening selects, in pg_stat_activity, the sessions listening for pauses
// that have read the pause (see startListening). A session whose last query
// was waitListening's own holds the mark too: idle in the pool once the
// store has two connections, it was counted as a listener.
const listening = `state = 'idle' AND query LIKE '%` + listenerMark + `%' AND query NOT LIKE '%pg_stat_activity%'`

// waitListening waits until n sessions listen for pauses.
func waitListening(t *testing.T, s *Store, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		var got int
		err := s.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND `+listening).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions listening after a minute, want %d", got, n)
		}
	}
}

// Heartbeats count the live replicas; one that closes stops counting at
// once. A pause missed by the listener is found at the next heartbeat.
func TestThrottleHeartbeat(t *testing.T) {
	url := pgtest.Database(t)
	counts := make(chan int, 64)
	s := open(t, url, 0)
	missed := newPauses()
	throttle(t, s, ThrottleOptions{Name: "p", Heartbeat: 50 * time.Millisecond, OnPause: missed.on,
		OnReplicas: func(n int) {
			select {
			case counts <- n:
			default:
			}
		}})
	waitCount := func(want int) {
		t.Helper()
		for n := range counts {
			if n == want {
				return
			}
		}
	}
	waitCount(1)
	b := s.Throttle(ThrottleOptions{Name: "p", Heartbeat: 50 * time.Millisecond})
	waitCount(2)
	b.Close()
	waitCount(1)
	// Written behind the listeners' back: only a heartbeat can find it.
	if _, err := s.pool.Exec(context.Background(),
		`UPDATE idemproxy_throttle SET paused_until = now() + interval '10 seconds' WHERE name = 'p'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(context.Background(),
		`INSERT INTO idemproxy_throttle (name, paused_until) VALUES ('p', now() + interval '10 seconds') ON CONFLICT DO NOTHING`); err != nil {
		t.Fatal(err)
	}
	if d := <-missed.c; d <= 0 || d > 10*time.Second {
		t.Errorf("heartbeat found a pause of %v, want up to 10s", d)
	}
	missed.mu.Lock()
	defer missed.mu.Unlock()
	if missed.got[0] != "" {
		t.Errorf("a pause found by a heartbeat names %q, want \"\"", missed.got[0])
	}
}

// waitsWithDatabaseDown puts gate on th, checks that a wait with the
// database up is none, stops c, and returns the waits of four attempts
// with the database down (each must be paced, not an error).
func waitsWithDatabaseDown(t *testing.T, gate *ratelimit.Gate, th *Throttle, c *pgtest.Cluster) []time.Duration {
	t.Helper()
	gate.Shared = th
	if w, err := gate.Wait(context.Background()); err != nil || w != 0 {
		t.Fatalf("Wait with the database up = %v, %v; want 0, nil", w, err)
	}
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	var waits []time.Duration
	for range 4 {
		w, err := gate.Wait(context.Background())
		if err != nil {
			t.Fatalf("Wait with the database down: %v", err)
		}
		waits = append(waits, w)
	}
	return waits
}

// A Gate on the throttle of a database that stops: the first wait finds the
// database gone (an error, not a hang), reports it, and paces with the local
// share, the rate and burst divided by the two replicas the heartbeats
// counted; the database is not asked again for each attempt.
func TestThrottleGateFallsBackWhenDatabaseStops(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	clock := fakeclock.New(time.Now())
	gate := ratelimit.New(10, 4)
	gate.Now, gate.Sleep = clock.Now, clock.Sleep
	counted := make(chan int, 64)
	s := open(t, url, 0)
	th := throttle(t, s, ThrottleOptions{Name: "p", Heartbeat: 50 * time.Millisecond, OnReplicas: func(n int) {
		gate.SetReplicas(n)
		select {
		case counted <- n:
		default:
		}
	}})
	throttle(t, open(t, url, 0), ThrottleOptions{Name: "p", Heartbeat: 50 * time.Millisecond})
	for n := range counted {
		if n == 2 {
			break
		}
	}
	var failures []error
	gate.OnSharedError = func(err error) { failures = append(failures, err) }
	waits := waitsWithDatabaseDown(t, gate, th, c)
	// 10 per second and burst 4 over 2 replicas: 5 per second, burst 2.
	if want := []time.Duration{0, 0, 200 * time.Millisecond, 200 * time.Millisecond}; !slices.Equal(waits, want) {
		t.Errorf("waits with the database down = %v, want %v", waits, want)
	}
	if len(failures) != 1 {
		t.Errorf("%d failures reported, want 1 (the database is not asked again at once): %v", len(failures), failures)
	}
}

// Attempts on the shared bucket whose callers hang up while queued leave the
// tokens leased for them to the next attempt of this replica: 30 attempts at
// 10 per second that all leave after 300 ms, then one more, which leaves
// within a few tokens' time. Each queued attempt took its own leased token,
// dropped when it left, so the next one took new tokens behind all of theirs
// (2.6 s). Real database and clock; the bound is 10 tokens' time.
func TestThrottleGateLeaversKeepTokensHere(t *testing.T) {
	url := pgtest.Database(t)
	const rate, leavers = 10, 30
	gate := ratelimit.New(rate, 1)
	gate.Shared = throttle(t, open(t, url, 0), ThrottleOptions{Name: "p", Heartbeat: time.Hour})
	if _, err := gate.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		left int
	)
	for range leavers {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer time.AfterFunc(300*time.Millisecond, cancel).Stop()
			_, err := gate.Wait(ctx)
			if errors.Is(err, context.Canceled) {
				mu.Lock()
				left++
				mu.Unlock()
			} else if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if left < leavers-5 {
		t.Fatalf("%d of %d attempts left, want all but the few whose tokens came", left, leavers)
	}
	start := time.Now()
	if _, err := gate.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if took, bound := time.Since(start), 10*time.Second/rate; took > bound {
		t.Errorf("the next attempt waited %v after %d left, want at most %v", took.Round(time.Millisecond), left, bound)
	}
}

// The tokens a replica leased for attempts whose callers hung up while
// queued go back to the shared bucket once its line is empty, so that another
// replica does not wait for them: 30 attempts on one replica at 10 per second
// that all leave after 300 ms, then one attempt on another replica, which
// leaves within a few tokens' time. The bucket stayed booked for the 30
// (still 2.3 s ahead half a second later) and the other replica waited
// 2.3 s. Given back only if no replica took tokens in between, so the
// other one waits for it, half a second at most (a round trip is needed).
func TestThrottleGateLeaversGiveTokensBack(t *testing.T) {
	url := pgtest.Database(t)
	const rate, leavers = 10, 30
	s := open(t, url, 0)
	a := ratelimit.New(rate, 1)
	a.Shared = throttle(t, s, ThrottleOptions{Name: "p", Heartbeat: time.Hour})
	a.OnSharedError = func(err error) { t.Log(err) }
	b := ratelimit.New(rate, 1)
	b.Shared = throttle(t, open(t, url, 0), ThrottleOptions{Name: "p", Heartbeat: time.Hour})
	if _, err := a.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range leavers {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer time.AfterFunc(300*time.Millisecond, cancel).Stop()
			if _, err := a.Wait(ctx); err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var ahead time.Duration
	for deadline := time.Now().Add(500 * time.Millisecond); ; time.Sleep(10 * time.Millisecond) {
		var us int64
		if err := s.pool.QueryRow(t.Context(), `SELECT (extract(epoch FROM tat - now()) * 1000000)::bigint
			FROM idemproxy_throttle WHERE name = 'p'`).Scan(&us); err != nil {
			t.Fatal(err)
		}
		if ahead = time.Duration(us) * time.Microsecond; ahead < 300*time.Millisecond || time.Now().After(deadline) {
			break
		}
	}
	start := time.Now()
	if _, err := b.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if took, bound := time.Since(start), 10*time.Second/rate; took > bound {
		t.Errorf("the other replica waited %v (the bucket booked %v ahead), want at most %v", took.Round(time.Millisecond), ahead.Round(time.Millisecond), bound)
	}

}

// A throttle row the rate limit created, never paused, holds paused_until
// '-infinity': a replica starting then still beats (and counts the
// replicas), listens, and hears the next pause at once.
func TestThrottleBucketRowNeverPaused(t *testing.T) {
	url := pgtest.Database(t)
	beatA := make(chan int, 1)
	a := throttle(t, open(t, url, 0), ThrottleOptions{Name: "p", Replica: "replica-a", Heartbeat: time.Hour,
		OnReplicas: func(n int) { beatA <- n }})
	waitBeat(t, beatA) // a's row is there before b counts the replicas
	ctx := context.Background()
	if _, err := a.Take(ctx, 1, 10, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	var never bool
	if err := a.s.pool.QueryRow(ctx, `SELECT paused_until = '-infinity' FROM idemproxy_throttle WHERE name = 'p'`).Scan(&never); err != nil || !never {
		t.Fatalf("the bucket's row: paused_until is -infinity %v (%v), want true: this test needs it", never, err)
	}
	got := newPauses()
	sb := open(t, url, 0)
	beat := make(chan int, 1)
	throttle(t, sb, ThrottleOptions{Name: "p", Replica: "replica-b", Heartbeat: time.Hour, OnPause: got.on,
		OnReplicas: func(n int) { beat <- n }})
	select {
	case n := <-beat:
		if n != 2 {
			t.Errorf("replica-b's first heartbeat counts %d replicas, want 2", n)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("replica-b's first heartbeat did not succeed within 15 s of its start")
	}
	select {
	case d := <-got.c:
		t.Fatalf("a pause of %v reported before any was set", d)
	default:
	}
	waitListening(t, sb, 2)
	if err := a.Pause(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got.c:
	case <-time.After(15 * time.Second):
		t.Fatal("replica-b did not hear the pause within 15 s")
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	if got.got[0] != "replica-a" {
		t.Errorf("pause from %q, want replica-a (by NOTIFY)", got.got[0])
	}
}

// Each heartbeat tells a replica which live replicas of its provider have
// other key settings (Keying): not those of another provider, nor those
// whose settings are the same, nor one that gives none.
func TestThrottleKeying(t *testing.T) {
	url := pgtest.Database(t)
	s := open(t, url, 0)
	seen := make(chan []string, 64)
	throttle(t, s, ThrottleOptions{Name: "p", Replica: "a", Keying: "k1", Heartbeat: 50 * time.Millisecond,
		OnKeying: func(others []string) {
			select {
			case seen <- others:
			default:
			}
		}})
	for _, o := range []ThrottleOptions{
		{Name: "p", Replica: "b", Keying: "k2"}, // differs
		{Name: "p", Replica: "c", Keying: "k1"}, // the same
		{Name: "p", Replica: "d"},               // gives none
		{Name: "q", Replica: "e", Keying: "k3"}, // another provider
	} {
		o.Heartbeat = 50 * time.Millisecond
		throttle(t, s, o)
	}
	deadline := time.After(30 * time.Second)
	for {
		select {
		case others := <-seen:
			if len(others) == 0 {
				continue // a heartbeat before b's first
			}
			if !slices.Equal(others, []string{"b"}) {
				t.Fatalf("replicas with other key settings = %q, want [b]", others)
			}
			return
		case <-deadline:
			t.Fatal("no heartbeat reported replica b's other key settings")
		}
	}
}

// Two deployments on one database in front of different providers (cards
// and payouts): each counts only its own replicas, a row of a version that
// did not name its provider (before schema 6) for both; a pause set by a
// cards replica reaches the other cards replica and no payouts replica.
func TestThrottleProvidersApart(t *testing.T) {
	url := pgtest.Database(t)
	s := open(t, url, 0)
	const cards, payouts = "https://cards.test/v1", "https://payouts.test"
	// Each throttle beats once (the next is an hour later), after the ones
	// started before it: its count is of the rows there by then.
	start := func(name, replica string, got *pauses) (*Throttle, int) {
		t.Helper()
		beat := make(chan int, 1)
		opt := ThrottleOptions{Name: name, Replica: replica, Heartbeat: time.Hour,
			OnReplicas: func(n int) { beat <- n }}
		if got != nil {
			opt.OnPause = got.on
		}
		th := throttle(t, s, opt)
		select {
		case n := <-beat:
			return th, n
		case <-time.After(time.Minute):
			t.Fatalf("%s: no heartbeat within a minute", replica)
			return nil, 0
		}
	}
	cardsA, _ := start(cards, "cards-a", nil)
	payoutsGot := newPauses()
	_, n := start(payouts, "payouts-a", payoutsGot)
	if n != 1 {
		t.Errorf("payouts-a counts %d replicas, want 1 (cards-a is another provider's)", n)
	}
	cardsGot := newPauses()
	_, n = start(cards, "cards-b", cardsGot)
	if n != 2 {
		t.Errorf("cards-b counts %d replicas, want 2 (payouts-a is another provider's)", n)
	}
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx,
		`INSERT INTO idemproxy_replicas (replica, seen_at) VALUES ('before-schema-6', now())`); err != nil {
		t.Fatal(err)
	}
	payoutsB, n := start(payouts, "payouts-b", nil)
	if n != 3 {
		t.Errorf("payouts-b counts %d replicas, want 3 (payouts-a, itself and the row naming no provider)", n)
	}
	_, n = start(cards, "cards-c", nil)
	if n != 4 {
		t.Errorf("cards-c counts %d replicas, want 4 (cards-a, cards-b, itself and the row naming no provider)", n)
	}

	waitListening(t, s, 5)
	if err := cardsA.Pause(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cardsGot.c:
	case <-time.After(time.Minute):
		t.Fatal("cards-b did not hear cards-a's pause within a minute")
	}
	// Notifications reach a listener in the order they were sent: the
	// first pause payouts-a hears must be payouts-b's, sent after cards'.
	if err := payoutsB.Pause(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-payoutsGot.c:
		if d > time.Second {
			t.Errorf("payouts-a heard a pause of %v, want payouts-b's of at most 1s (not cards' 30s)", d)
		}
	case <-time.After(time.Minute):
		t.Fatal("payouts-a did not hear payouts-b's pause within a minute")
	}
	payoutsGot.mu.Lock()
	if !slices.Equal(payoutsGot.got, []string{"payouts-b"}) {
		t.Errorf("payouts-a heard pauses from %q, want [payouts-b] only", payoutsGot.got)
	}
	payoutsGot.mu.Unlock()
	var left time.Duration
	if err := s.pool.QueryRow(ctx, `SELECT `+pauseLeft+` * interval '1 microsecond' FROM idemproxy_throttle WHERE name = $1`,
		payouts).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left > time.Second {
		t.Errorf("payouts' row is paused for %v, want at most payouts-b's 1s", left)
	}
}

// A Gate whose database stops paces with the share of its own provider's
// replicas, even though another provider's replicas beat on the same
// database: with two cards replicas and two payouts replicas, the cards
// rate is halved, not quartered.
func TestThrottleGateShareIsTheProvidersOwn(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	s := open(t, url, 0)
	beat := func(name, replica string, on func(int)) *Throttle {
		t.Helper()
		beats := make(chan int, 1)
		th := throttle(t, s, ThrottleOptions{Name: name, Replica: replica, Heartbeat: time.Hour,
			OnReplicas: func(n int) {
				if on != nil {
					on(n)
				}
				beats <- n
			}})
		waitBeat(t, beats)
		return th
	}
	beat("https://payouts.test", "payouts-a", nil)
	beat("https://payouts.test", "payouts-b", nil)
	beat("https://cards.test", "cards-b", nil)
	clock := fakeclock.New(time.Now())
	gate := ratelimit.New(10, 4)
	gate.Now, gate.Sleep = clock.Now, clock.Sleep
	counted := 0
	th := beat("https://cards.test", "cards-a", func(n int) { counted = n; gate.SetReplicas(n) })
	if counted != 2 {
		t.Errorf("cards-a counts %d replicas, want 2", counted)
	}
	waits := waitsWithDatabaseDown(t, gate, th, c)
	// 10 per second and burst 4 over the 2 cards replicas: 5 per second,
	// burst 2 (over all 4 replicas it would be 2.5 per second, burst 1).
	if want := []time.Duration{0, 0, 200 * time.Millisecond, 200 * time.Millisecond}; !slices.Equal(waits, want) {
		t.Errorf("waits with the database down = %v, want %v", waits, want)
	}
}

// Each heartbeat tells a replica which other providers' live replicas use
// its database (records are shared between them), each named once: not its
// own provider's, nor a row that gives no provider.
func TestThrottleOtherProviders(t *testing.T) {
	url := pgtest.Database(t)
	s := open(t, url, 0)
	seen := make(chan []string, 64)
	throttle(t, s, ThrottleOptions{Name: "cards", Replica: "a", Heartbeat: 50 * time.Millisecond,
		OnProviders: func(others []string) {
			select {
			case seen <- others:
			default:
			}
		}})
	for _, o := range []ThrottleOptions{
		{Name: "cards", Replica: "b"},   // the same provider
		{Name: "payouts", Replica: "c"}, // another
		{Name: "payouts", Replica: "d"}, // the same other, named once
		{Name: "refunds", Replica: "e"}, // a third
	} {
		o.Heartbeat = 50 * time.Millisecond
		throttle(t, s, o)
	}
	deadline := time.After(30 * time.Second)
	for {
		select {
		case others := <-seen:
			if len(others) < 2 {
				continue // a heartbeat before the others' first
			}
			if !slices.Equal(others, []string{"payouts", "refunds"}) {
				t.Fatalf("other providers = %q, want [payouts refunds]", others)
			}
			return
		case <-deadline:
			t.Fatal("no heartbeat reported the other providers payouts and refunds")
		}
	}
}

// A Take held up past the Gate's call timeout (here the bucket's row locked
// by another session for 1.3 s: a slow database, as a replica starved of CPU
// also sees it) does not make that replica pace alone with its share while
// the other replica takes the whole rate from the database: two replicas at
// 20 per second, the first with attempts waiting through the lock, the
// second with attempts from when it goes, together let at most the rate out
// in the two seconds after (plus the burst, the 100 ms a leased token may be
// late, and two for round trips). Pacing alone on top of the shared bucket
// let out about 1.5 times the rate.
func TestThrottleGateSlowTakeKeepsTotal(t *testing.T) {
	url := pgtest.Database(t)
	const rate, window = 20, 2 * time.Second
	gates := make([]*ratelimit.Gate, 2)
	for i := range gates {
		g := ratelimit.New(rate, 1)
		g.Shared = throttle(t, open(t, url, 0), ThrottleOptions{Name: "p", Heartbeat: time.Hour})
		g.SetReplicas(2)
		g.OnSharedError = func(err error) { t.Logf("replica %d paces alone: %v", i, err) }
		if _, err := g.Wait(context.Background()); err != nil { // the row, and a connection each
			t.Fatal(err)
		}
		gates[i] = g
	}
	ctx := context.Background()
	lock, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM idemproxy_throttle WHERE name = 'p' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		left []time.Time
		wg   sync.WaitGroup
	)
	stop := time.Now().Add(1300*time.Millisecond + window)
	unlocked := make(chan struct{})
	for i, g := range gates {
		wg.Go(func() {
			if i == 1 {
				<-unlocked // only the first replica's Take is held up
			}
			for time.Now().Before(stop) {
				if _, err := g.Wait(ctx); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				left = append(left, time.Now())
				mu.Unlock()
			}
		})
	}
	time.Sleep(1300 * time.Millisecond)
	released := time.Now()
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	close(unlocked)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, at := range left {
		if !at.Before(released) && at.Before(released.Add(window)) {
			n++
		}
	}
	if limit := int(rate*(window+100*time.Millisecond)/time.Second) + 1 + 2; n > limit {
		t.Errorf("%d attempts left in the %v after the lock went, want at most %d at a total rate of %d", n, window, limit, rate)
	}
	t.Logf("%d attempts left in the %v after the lock went (%d in all)", n, window, len(left))
}
