package resign

import (
	"context"
	"sync"
	"time"
)

// maxUniqueWaits bounds how many times one attempt waits for the next second
// to get a signature not sent before. With a real clock one wait is enough;
// a clock that does not advance (a test's, or a clock stepped back) must not
// hold the attempt forever: it is then sent as it is.
const maxUniqueWaits = 2

// sentSignatures is the set of signatures sent in the current and the
// previous second, for templates whose signature nothing but the timestamp
// makes new (the timestamp is signed, no nonce). A signature with the
// timestamp of second S can be made only during S, so older ones cannot
// recur and are forgotten.
//
// Why: the cards provider asks that a retry carry a new signature ("new
// time") and refuses one it has seen (its replay protection); the timestamp
// is in whole seconds, so an attempt sent in the same second as the one before
// it, with the same method, path and body, would carry the same signature.
type sentSignatures struct {
	mu        sync.Mutex
	sec       int64               // the second cur holds
	cur, prev map[string]struct{} // signatures of sec and of sec-1
}

// claim records sig, made with the timestamp of second sec, and reports
// whether it was not sent before.
func (u *sentSignatures) claim(sig string, sec int64) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case sec == u.sec+1:
		u.prev, u.cur, u.sec = u.cur, make(map[string]struct{}, len(u.cur)), sec
	case sec > u.sec+1 || sec < u.sec-1: // time passed, or the clock stepped back
		u.prev, u.cur, u.sec = nil, map[string]struct{}{}, sec
	}
	m := u.cur
	if sec == u.sec-1 {
		if u.prev == nil {
			u.prev = map[string]struct{}{}
		}
		m = u.prev
	}
	if _, sent := m[sig]; sent {
		return false
	}
	m[sig] = struct{}{}
	return true
}

// untilNextSecond sleeps until the second after now's, or until ctx ends.
func untilNextSecond(ctx context.Context, now time.Time) error {
	t := time.NewTimer(time.Unix(now.Unix()+1, 0).Sub(now))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
