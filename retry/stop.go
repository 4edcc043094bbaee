package retry

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrStopped is the cause Do wraps when [Call.Stop] ended the sequence.
var ErrStopped = errors.New("retry: sequence stopped")

// Stop ends a protected sequence from another goroutine ([Call.Stop]): the
// attempt, probe or wait in progress is cancelled and no attempt follows, as
// when the caller's context ends, and Do returns [ErrStopped], wrapped. The
// proxy stops an operation whose lease another replica took over. Until
// then it costs the sequence nothing: Stop cancels the contexts the
// sequence makes anyway, so the caller needs no cancellable context of its
// own (and every attempt's context no parent to register with).
//
// The zero value is ready to use. A Stop serves one sequence.
type Stop struct {
	mu      sync.Mutex
	stopped bool
	until   time.Time          // with Until: no attempt or probe starts from then on
	budget  context.CancelFunc // the sequence's budget context, once made
	attempt context.CancelFunc // the attempt's or probe's context in progress
}

// Stop ends the sequence. It may be called at any time, from any goroutine,
// more than once.
func (st *Stop) Stop() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.stopped = true
	if st.budget != nil {
		st.budget()
	}
	if st.attempt != nil {
		st.attempt()
	}
}

// Until sets a time from which no attempt or probe starts, as if Stop had
// been called then (the one in progress goes on until Stop). The proxy sets
// it to the end of the lease it knows it holds, so that an operation whose
// lease renewals cannot reach the store stops sending before another
// replica may take its key over. The time is read on the monotonic clock.
func (st *Stop) Until(t time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.until = t
}

// err is ErrStopped once Stop was called or the time set by Until has come;
// nil for a nil Stop.
func (st *Stop) err() error {
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.stopped || !st.until.IsZero() && !time.Now().Before(st.until) {
		return ErrStopped
	}
	return nil
}

// setBudget and setAttempt record the cancel function of a context the
// sequence now uses (nil: none), cancelling it at once if Stop came first.
// A nil Stop records nothing.
func (st *Stop) setBudget(cancel context.CancelFunc) {
	if st != nil {
		st.set(&st.budget, cancel)
	}
}

func (st *Stop) setAttempt(cancel context.CancelFunc) {
	if st != nil {
		st.set(&st.attempt, cancel)
	}
}

func (st *Stop) set(slot *context.CancelFunc, cancel context.CancelFunc) {
	st.mu.Lock()
	defer st.mu.Unlock()
	*slot = cancel
	if st.stopped && cancel != nil {
		cancel()
	}
}
