package proxy

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// goroutineID is the calling goroutine's number, as its stack trace shows it.
func goroutineID() uint64 {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// waitWaiting waits until n of w's goroutines wait for a function (a
// minute at most, a bound for a broken pool, not a measure).
func waitWaiting(t *testing.T, w *workers, n int32) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); w.waiting.Load() != n; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines wait for a function, want %d", w.waiting.Load(), n)
		}
	}
}

// TestWorkersKeepGoroutines: a function after another runs on the
// goroutine the first ran on, whose stack has grown already, not on a new
// one.
func TestWorkersKeepGoroutines(t *testing.T) {
	w := newWorkers(2)
	ids := make(chan uint64)
	w.run(func() { ids <- goroutineID() })
	first := <-ids
	waitWaiting(t, w, 1)
	w.run(func() { ids <- goroutineID() })
	if second := <-ids; second != first {
		t.Errorf("second function ran on goroutine %d, want the first's, %d", second, first)
	}
}

// TestWorkersBoundWaiting: functions run at once, each on a goroutine of its
// own, however many there are; after, only max goroutines are kept (the
// others end), and the next function runs on one of those kept.
func TestWorkersBoundWaiting(t *testing.T) {
	w := newWorkers(2)
	base := runtime.NumGoroutine()
	var started, release sync.WaitGroup
	release.Add(1)
	ran := make(chan uint64, 5)
	for range 5 {
		started.Add(1)
		w.run(func() { ran <- goroutineID(); started.Done(); release.Wait() })
	}
	started.Wait() // all five run at once: none waited for another
	five := map[uint64]bool{}
	for range 5 {
		five[<-ran] = true
	}
	release.Done()
	waitWaiting(t, w, 2)
	for deadline := time.Now().Add(time.Minute); runtime.NumGoroutine() > base+2; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines a minute after the five functions ended, want %d (2 kept)", runtime.NumGoroutine(), base+2)
		}
	}
	w.run(func() { ran <- goroutineID() })
	if id := <-ran; !five[id] {
		t.Errorf("the next function ran on goroutine %d, not on one of the five kept (%v)", id, five)
	}
	waitWaiting(t, w, 2)
}
