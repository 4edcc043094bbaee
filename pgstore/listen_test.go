package pgstore

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// listenFailures counts the pause listener's failures in a store's log: the
// Debug records of the throttle that carry an error.
type listenFailures struct{ n atomic.Int64 }

func (*listenFailures) Enabled(context.Context, slog.Level) bool { return true }
func (*listenFailures) WithAttrs([]slog.Attr) slog.Handler       { panic("not used") }
func (*listenFailures) WithGroup(string) slog.Handler            { panic("not used") }

func (f *listenFailures) Handle(_ context.Context, r slog.Record) error {
	if r.Level != slog.LevelDebug || !strings.HasPrefix(r.Message, "throttle: ") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			f.n.Add(1)
			return false
		}
		return true
	})
	return nil
}

// The listener's waits between attempts stay within a heartbeat (2 s)
// however many attempts failed, and are spread between half and all of the
// backoff.
func TestListenRetryBounded(t *testing.T) {
	for _, c := range []struct {
		failures    int
		jitter      float64
		least, most time.Duration
	}{
		{0, 0, 125 * time.Millisecond, 125 * time.Millisecond},
		{0, 0.999, 249 * time.Millisecond, 250 * time.Millisecond},
		{1, 0, 250 * time.Millisecond, 250 * time.Millisecond},
		{3, 0, time.Second, time.Second},
		{3, 0.999, 1990 * time.Millisecond, 2 * time.Second},
		{10, 0.5, 1500 * time.Millisecond, 1500 * time.Millisecond},
		{1000, 0.999, 1990 * time.Millisecond, 2 * time.Second},
	} {
		if got := listenRetry(c.failures, c.jitter); got < c.least || got > c.most {
			t.Errorf("listenRetry(%d, %v) = %v, want %v to %v", c.failures, c.jitter, got, c.least, c.most)
		}
	}
}

// After an outage long enough for the listener to have failed five times
// in a row, a pause set as soon as the database is back reaches the other
// replica within 5 s (heartbeats an hour apart: only the listener, back and
// reading the pause or notified of it, can bring it). Before, the listener
// had backed off to 15 s by then, and came back up to 15 s after the
// database did.
func TestThrottleListenerBackSoonAfterOutage(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	failures := &listenFailures{}
	sb, err := Open(context.Background(), Options{URL: url, SweepInterval: -1, AnalyzeInterval: -1, Logger: slog.New(failures)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	got := newPauses()
	beat := make(chan int, 1)
	throttle(t, sb, ThrottleOptions{Name: "p", Replica: "replica-b", Heartbeat: time.Hour, OnPause: got.on,
		OnReplicas: func(n int) { beat <- n }})
	a := throttle(t, open(t, url, 0), ThrottleOptions{Name: "p", Replica: "replica-a", Heartbeat: time.Hour})
	waitListening(t, sb, 2)
	waitBeat(t, beat) // the next is an hour later
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	for failures.n.Load() < 5 {
		if time.Since(down) > time.Minute {
			t.Fatalf("%d listener failures logged in a minute with the database down, want 5", failures.n.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("5 listener failures logged %v into the outage", time.Since(down).Round(time.Millisecond))
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	if err := a.Pause(context.Background(), time.Minute); err != nil {
		t.Fatalf("Pause with the database back: %v", err)
	}
	select {
	case d := <-got.c:
		t.Logf("pause heard %v after the database was back (%v left)", time.Since(up).Round(time.Millisecond), d)
		if d <= 0 || d > time.Minute {
			t.Errorf("pause heard with %v left, want up to 1m", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no pause heard within 5s of the database's return (outage %v, %d listener failures)",
			up.Sub(down).Round(time.Millisecond), failures.n.Load())
	}
}

// A listener's connection is given up and replaced when its lifetime in the
// pool (pool_max_conn_lifetime=2s) is over, as the pool does with the
// others, and the new one reads the pause: one written behind the
// listeners' back (no NOTIFY, heartbeats an hour apart) is heard after the
// replacement. Throughout, the replica's sessions stay within its pool
// (pool_max_conns=4), one of them listening. Before, the listening session
// was kept for ever and the pause never heard.
func TestThrottleListenerRetiresAtLifetime(t *testing.T) {
	url := pgtest.Database(t)
	const app, lifetime = "idemproxy-lifetime", 2 * time.Second
	s := open(t, url+"&pool_max_conns=4&pool_max_conn_lifetime="+lifetime.String()+"&application_name="+app, 0)
	got := newPauses()
	beat := make(chan int, 1)
	throttle(t, s, ThrottleOptions{Name: "p", Replica: "replica-b", Heartbeat: time.Hour, OnPause: got.on,
		OnReplicas: func(n int) { beat <- n }})
	waitBeat(t, beat) // before the pause is written; the next is an hour later
	ctx := context.Background()
	admin := session(t, url)
	// listener returns the listening session's pid (0 for none) and age,
	// and how many sessions the replica has.
	listener := func() (pid int32, age time.Duration, all int) {
		t.Helper()
		var listening int
		var us *int64
		var p *int32
		err := admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'idle' AND query LIKE '%`+listenerMark+`%'),
				min(pid) FILTER (WHERE state = 'idle' AND query LIKE '%`+listenerMark+`%'),
				(extract(epoch FROM now() - min(backend_start) FILTER (WHERE state = 'idle' AND query LIKE '%`+listenerMark+`%')) * 1000000)::bigint
			FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, app).Scan(&all, &listening, &p, &us)
		if err != nil {
			t.Fatal(err)
		}
		if listening > 1 {
			t.Errorf("%d sessions listening, want 1", listening)
		}
		if p != nil {
			pid, age = *p, time.Duration(*us)*time.Microsecond
		}
		return pid, age, all
	}
	var first int32
	for deadline := time.Now().Add(time.Minute); first == 0; time.Sleep(10 * time.Millisecond) {
		if first, _, _ = listener(); first == 0 && time.Now().After(deadline) {
			t.Fatal("no session listening within a minute")
		}
	}
	if _, err := admin.Exec(ctx, `INSERT INTO idemproxy_throttle (name, paused_until) VALUES ('p', now() + interval '1 minute')
		ON CONFLICT (name) DO UPDATE SET paused_until = excluded.paused_until`); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	pids := map[int32]bool{first: true}
	var oldest time.Duration
	most := 0
	watch := func() {
		pid, age, all := listener()
		if pid != 0 {
			pids[pid] = true
			oldest = max(oldest, age)
		}
		most = max(most, all)
	}
	heard := false
	// Two replacements at least, the pause heard after the first.
	for deadline := time.Now().Add(30 * time.Second); !heard || len(pids) < 3; {
		select {
		case d := <-got.c:
			if !heard {
				t.Logf("pause written behind the listeners' back heard %v later (%v left)", time.Since(written).Round(time.Millisecond), d)
			}
			heard = true
			got.mu.Lock()
			if from := got.got[len(got.got)-1]; from != "" {
				t.Errorf("pause heard from %q, want \"\" (read by the new listener, no NOTIFY was sent)", from)
			}
			got.mu.Unlock()
		case <-time.After(50 * time.Millisecond):
			watch()
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: pause heard %v, %d listening sessions seen (want 3: two replacements), the oldest %v old",
				heard, len(pids), oldest.Round(time.Millisecond))
		}
	}
	watch()
	t.Logf("%d listening sessions seen in %v, the oldest %v old; at most %d sessions of the replica",
		len(pids), time.Since(written).Round(time.Millisecond), oldest.Round(time.Millisecond), most)
	if oldest > lifetime+8*time.Second {
		t.Errorf("a listening session %v old, want about the lifetime %v", oldest, lifetime)
	}
	if most > 4 {
		t.Errorf("%d sessions of the replica, want at most pool_max_conns=4", most)
	}
}
