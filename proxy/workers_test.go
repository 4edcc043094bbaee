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
// own, however many there are, and only max goroutines are kept after.
func TestWorkersBoundWaiting(t *testing.T) {
	w := newWorkers(2)
	var started, release sync.WaitGroup
	release.Add(1)
	for range 5 {
		started.Add(1)
		w.run(func() { started.Done(); release.Wait() })
	}
	started.Wait() // all five run at once: none waited for another
	release.Done()
	waitWaiting(t, w, 2)
	ids := make(chan uint64)
	before := runtime.NumGoroutine()
	w.run(func() { ids <- goroutineID() })
	<-ids
	waitWaiting(t, w, 2)
	if got := w.waiting.Load(); got != 2 {
		t.Errorf("%d goroutines wait, want 2", got)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("%d goroutines after one more function, %d before: it did not run on a kept one", after, before)
	}
}
