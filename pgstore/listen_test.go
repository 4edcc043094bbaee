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
	throttle(t, sb, ThrottleOptions{Name: "p", Replica: "replica-b", Heartbeat: time.Hour, OnPause: got.on})
	a := throttle(t, open(t, url, 0), ThrottleOptions{Name: "p", Replica: "replica-a", Heartbeat: time.Hour})
	waitListening(t, sb, 2)
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
