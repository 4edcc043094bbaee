package cache

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// TestGroupSyncSharesRounds: while one sync runs, every caller that arrives
// joins the next round, and that one round serves all of them.
func TestGroupSyncSharesRounds(t *testing.T) {
	const waiters = 16
	var rounds atomic.Int32
	entered := make(chan struct{})
	release := make(chan struct{})
	joined := make(chan struct{}, waiters+1)
	g := &groupSync{
		sync: func(uint64) error {
			if rounds.Add(1) == 1 {
				close(entered)
				<-release
			}
			return nil
		},
		joined: func() { joined <- struct{}{} },
	}

	var wg sync.WaitGroup
	wg.Go(func() { g.wait(0) }) // leads round 1 and blocks in it
	<-entered
	<-joined
	for range waiters {
		wg.Go(func() { g.wait(0) })
	}
	for range waiters {
		<-joined
	}
	close(release)
	wg.Wait()
	if got := rounds.Load(); got != 2 {
		t.Fatalf("%d sync rounds for 1+%d callers, want 2", got, waiters)
	}
}

// TestGroupSyncCoversEarlierWrites: wait returns only after a sync that
// started after the caller's write, and that sync was given a timestamp at
// least the caller's.
func TestGroupSyncCoversEarlierWrites(t *testing.T) {
	var written, synced atomic.Int64
	var published atomic.Uint64 // the largest ts a round was given; rounds run one at a time
	g := &groupSync{sync: func(ts uint64) error {
		synced.Store(written.Load())
		published.Store(max(published.Load(), ts))
		return nil
	}}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for range 50 {
				w := written.Add(1)
				if err := g.wait(uint64(w)); err != nil {
					errs <- err
					return
				}
				if s := synced.Load(); s < w {
					errs <- errors.New("wait returned before a sync covered the write")
					return
				}
				if p := published.Load(); p < uint64(w) {
					errs <- errors.New("the round that covered the write was given a timestamp below the caller's")
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestGroupSyncError(t *testing.T) {
	boom := errors.New("fsync: input/output error")
	fail := true
	g := &groupSync{sync: func(uint64) error {
		if fail {
			return boom
		}
		return nil
	}}
	if err := g.wait(0); !errors.Is(err, boom) {
		t.Fatalf("wait = %v, want the sync error", err)
	}
	fail = false
	if err := g.wait(0); err != nil {
		t.Fatalf("wait after recovery = %v", err)
	}
}

// TestGroupSyncLeaderRunsOneRound: a leader returns as soon as its own round
// is done; the round that filled up meanwhile is led by one of its callers.
// (Were the first leader to run the next round too, round 2 below would wait
// for that leader's return forever and the test would time out.)
func TestGroupSyncLeaderRunsOneRound(t *testing.T) {
	var rounds atomic.Int32
	entered := make(chan struct{})
	release := make(chan struct{})
	firstReturned := make(chan struct{})
	joined := make(chan struct{}, 4)
	g := &groupSync{
		sync: func(uint64) error {
			switch rounds.Add(1) {
			case 1:
				close(entered)
				<-release
			case 2:
				<-firstReturned
			}
			return nil
		},
		joined: func() { joined <- struct{}{} },
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		g.wait(0)
		close(firstReturned)
	})
	<-entered
	<-joined
	wg.Go(func() { g.wait(0) })
	<-joined
	close(release)
	wg.Wait()
	if got := rounds.Load(); got != 2 {
		t.Fatalf("%d rounds, want 2", got)
	}
}

// TestGroupSyncLoneWriteLeadsAtOnce: with no round running, wait syncs in
// the caller's own goroutine, every time.
func TestGroupSyncLoneWriteLeadsAtOnce(t *testing.T) {
	var rounds int
	g := &groupSync{sync: func(uint64) error { rounds++; return nil }}
	for i := range 3 {
		if err := g.wait(0); err != nil {
			t.Fatal(err)
		}
		if rounds != i+1 {
			t.Fatalf("after %d lone waits, %d rounds", i+1, rounds)
		}
	}
}

// TestGroupSyncReusesRounds: a finished round is reused once its last
// caller has left, so waiting allocates nothing.
func TestGroupSyncReusesRounds(t *testing.T) {
	var rounds int
	g := &groupSync{sync: func(uint64) error { rounds++; return nil }}
	n := testing.AllocsPerRun(100, func() {
		if err := g.wait(0); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 && !raceEnabled {
		t.Errorf("%v allocations per wait, want 0", n)
	}
	if rounds != 101 { // AllocsPerRun runs the function once more to warm up
		t.Errorf("%d rounds for 101 lone waits, want one each", rounds)
	}
}
