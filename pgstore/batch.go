package pgstore

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy/store"
)

// Limits of one batch: rows, and the bytes of what the rows carry (stored
// answers), so that a statement stays small next to the database's limits.
const (
	batchRows  = 64
	batchBytes = 4 << 20
)

// batchInFlight is how many write statements a replica runs at once.
// With one, a request arriving just after a statement was sent waits for it
// to end before its own goes (once for its claim, once for its final
// answer); with two, it waits only when two are running. Measured, two cost
// more server CPU per key and lowered neither the latency at a steady rate
// nor raised throughput: with fsync on, PostgreSQL flushes one commit's WAL
// at a time, so the second statement waits inside the server instead
// (docs/design/postgres-writes.md). The group works with any value; each
// running statement holds a pooled connection.
const batchInFlight = 1

// A round waits a little for more writes while statements run back to back:
// when the statement before it carried at least holdAfter rows and it holds
// fewer than holdRows, it waits up to roundHold for them (group.hold). With
// several replicas on one database, each replica's rounds hold only its own
// requests, about 8 rows at 64 connections over 3 replicas, and each
// statement costs a commit, a WAL flush and a round trip whatever its rows
// (docs/design/postgres-writes.md, "Rounds wait for rows under load"). A lone
// write, or one after the statements stopped, never waits.
const (
	roundHold = 1500 * time.Microsecond
	holdAfter = 4
	holdRows  = 16
)

// leftGrace is how long a statement whose callers have all left may still
// run before it is cancelled (see group).
const leftGrace = time.Second

// group sends the writes of many concurrent callers as one statement per
// round (leader/follower, like group commit): a caller arriving while
// fewer than slots statements run is sent at once, with no timer; callers
// that arrive while slots statements run join the waiting round, which is
// sent as soon as one of them ends. A lone caller's write is therefore one
// statement, as it would be unbatched (docs/design/postgres-writes.md).
//
// A round holds each ID at most once: a caller whose ID is already in a
// waiting round joins a later one, since one statement cannot write a row
// twice. An ID may be in a running statement and in another one sent
// meanwhile: PostgreSQL's row locks order two statements on one row, as they
// do for two replicas, and each row's conditions are read after the other
// statement has committed.
//
// A caller whose context ends before its round starts is left out of the
// statement; once the round has started, its write may or may not be done,
// as when a context ends during any statement: the jobs whose callers left
// are handed to orphaned once the statement has ended, with what it did for
// them, so that a write the caller was told had failed can be undone (a
// claim: see Store.orphaned). A caller whose context ends as its round ends
// gets the round's result. The statement is bound by the
// timeout, not by any one caller's context: a caller that leaves does not
// end it for the others. When the last caller still waiting leaves, the
// statement may run for leftGrace more and is then cancelled: pgx drops the
// connection of a statement it cancels and asks the server to cancel it, so
// that one still waiting for row locks writes nothing for callers that have
// all gone, while one that ends within the grace, as nearly all do, keeps
// its connection (a client that hangs up does not cost the database a new
// connection).
//
// The statement's error is every caller's, but for a batch that PostgreSQL
// refused for the data of a row (SQLSTATE class 22, data exception, or 23,
// integrity constraint violation): it wrote nothing, and each job whose
// caller still waits is sent again in a statement of its own, so that only
// the bad row's caller gets the error.
type group[I, O any] struct {
	// run sends the statement for jobs, which hold distinct IDs, and sets
	// found and out of each job whose row the statement returned. Its ctx
	// ends at the timeout or when every caller of the round has left.
	run func(ctx context.Context, jobs []*job[I, O]) error
	// orphaned, if set, is called after a round with its jobs whose
	// callers left while its statement ran, their found, out and err set.
	orphaned func(jobs []*job[I, O])
	timeout  time.Duration
	slots    int           // statements run at once; 0 means batchInFlight
	grace    time.Duration // leftGrace, or another for tests
	// hold is how long a small round may wait for more rows after a large
	// one (roundHold; 0: never). grow is signalled when a write joins a
	// round, while hold is set.
	hold time.Duration
	grow chan struct{}

	mu       sync.Mutex
	queue    []*round[I, O] // rounds waiting to run, oldest first
	running  int            // goroutines running the queue, each one statement at a time
	last     int            // rows of the statement sent last while statements run back to back
	inflight int            // callers in the running statements (tests)
}

type job[I, O any] struct {
	id    store.ID
	in    I
	size  int
	left  bool // the caller gave up (under group.mu)
	found bool // the statement returned the job's row
	out   O
	err   error // the statement's error, or the job's own (see group)
}

type round[I, O any] struct {
	jobs  []*job[I, O]
	bytes int
	done  chan struct{} // closed when the jobs' results and errors are set

	// Set when the round starts (under group.mu): what ends its statement's
	// context, and how many of its callers still wait for it.
	cancel  context.CancelFunc
	waiting int
}

// do adds a write to the next round that can take it and waits for the
// round's statement or for ctx. found says whether the statement returned
// the write's row.
func (g *group[I, O]) do(ctx context.Context, id store.ID, in I, size int) (out O, found bool, err error) {
	j := &job[I, O]{id: id, in: in, size: size}
	g.mu.Lock()
	r := g.join(j)
	if g.hold > 0 {
		if g.grow == nil {
			g.grow = make(chan struct{}, 1)
		}
		select {
		case g.grow <- struct{}{}:
		default:
		}
	}
	if g.running < g.max() {
		g.running++
		go g.loop()
	}
	g.mu.Unlock()
	select {
	case <-r.done:
		return j.out, j.found, j.err
	case <-ctx.Done():
		g.mu.Lock()
		select {
		case <-r.done: // ended meanwhile: its result is the caller's, not an orphan's
			g.mu.Unlock()
			return j.out, j.found, j.err
		default:
		}
		j.left = true
		if r.cancel != nil { // the round has started: j is in its statement
			r.waiting--
			if r.waiting == 0 {
				time.AfterFunc(g.leftGrace(), r.cancel)
			}
		}
		g.mu.Unlock()
		return out, false, ctx.Err()
	}
}

// alone sends a write in a statement of its own, bound by the caller's
// context: for a write whose arguments the database may refuse (see
// plainText), so that its error stays its own and fails no other caller.
func (g *group[I, O]) alone(ctx context.Context, id store.ID, in I, _ int) (out O, found bool, err error) {
	j := &job[I, O]{id: id, in: in}
	err = g.run(ctx, []*job[I, O]{j})
	return j.out, j.found, err
}

// plainText says whether PostgreSQL takes every string as text: valid UTF-8
// without NUL bytes. A write with other text is sent alone: a batch would
// fail and its rows be sent again one by one (see group), so that a client
// sending such text again and again would multiply the statements.
func plainText(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return false
		}
	}
	return true
}

// join puts j in the first waiting round that has room and does not hold
// its ID, or in a new round at the end. Called with mu held.
func (g *group[I, O]) join(j *job[I, O]) *round[I, O] {
	for _, r := range g.queue {
		if r.takes(j) {
			r.add(j)
			return r
		}
	}
	r := &round[I, O]{done: make(chan struct{})}
	r.add(j)
	g.queue = append(g.queue, r)
	return r
}

func (r *round[I, O]) takes(j *job[I, O]) bool {
	if len(r.jobs) >= batchRows || r.bytes+j.size > batchBytes {
		return false
	}
	for _, o := range r.jobs {
		if o.id == j.id {
			return false
		}
	}
	return true
}

func (r *round[I, O]) add(j *job[I, O]) {
	r.jobs = append(r.jobs, j)
	r.bytes += j.size
}

func (g *group[I, O]) leftGrace() time.Duration {
	if g.grace > 0 {
		return g.grace
	}
	return leftGrace
}

func (g *group[I, O]) max() int {
	if g.slots > 0 {
		return g.slots
	}
	return batchInFlight
}

// loop runs waiting rounds, one after the other, until none is left. Up to
// max loops run at once, each sending the oldest round not yet taken.
func (g *group[I, O]) loop() {
	g.mu.Lock()
	for len(g.queue) > 0 {
		g.waitForRows()
		r := g.queue[0]
		g.queue[0] = nil
		g.queue = g.queue[1:]
		jobs := make([]*job[I, O], 0, len(r.jobs))
		for _, j := range r.jobs {
			if !j.left {
				jobs = append(jobs, j)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
		r.cancel, r.waiting = cancel, len(jobs)
		g.inflight += len(jobs)
		g.last = len(jobs)
		g.mu.Unlock()
		if len(jobs) > 0 {
			g.send(ctx, jobs)
		}
		cancel()
		g.mu.Lock()
		// Its callers stop counting as running before they return, so
		// that waiting never shows a caller that has already returned.
		g.inflight -= len(jobs)
		// The callers that left are known for good once done is closed
		// (do reads it under mu before it leaves).
		var orphans []*job[I, O]
		for _, j := range jobs {
			if j.left {
				orphans = append(orphans, j)
			}
		}
		close(r.done)
		if len(orphans) > 0 && g.orphaned != nil {
			g.mu.Unlock()
			g.orphaned(orphans)
			g.mu.Lock()
		}
	}
	g.running--
	if g.running == 0 {
		g.last = 0 // the statements stopped: the next write is sent at once
	}
	g.mu.Unlock()
}

// waitForRows holds the one waiting round, if it is small after a large
// statement, until it has holdRows rows, another round starts behind it (it
// is full), or hold has passed (see roundHold). Called with mu held; it
// releases mu while it waits.
func (g *group[I, O]) waitForRows() {
	small := func() bool { return len(g.queue) == 1 && len(g.queue[0].jobs) < holdRows }
	if g.hold <= 0 || g.last < holdAfter || !small() || g.grow == nil {
		return
	}
	t := time.NewTimer(g.hold)
	defer t.Stop()
	for small() {
		g.mu.Unlock()
		select {
		case <-g.grow:
			g.mu.Lock()
		case <-t.C:
			g.mu.Lock()
			return
		}
	}
}

// send runs the round's statement for jobs and sets each job's error. A
// batch refused for the data of a row wrote nothing: each job whose caller
// still waits is then sent alone, within the same ctx.
func (g *group[I, O]) send(ctx context.Context, jobs []*job[I, O]) {
	err := g.statement(ctx, jobs)
	if len(jobs) == 1 || !dataError(err) {
		for _, j := range jobs {
			j.err = err
		}
		return
	}
	for _, j := range jobs {
		g.mu.Lock()
		left := j.left
		g.mu.Unlock()
		if left {
			j.err = err // nobody reads it
			continue
		}
		j.err = g.statement(ctx, []*job[I, O]{j})
	}
}

// dataError says whether PostgreSQL refused a statement for the data it was
// given (SQLSTATE class 22 or 23) rather than for its own state.
func dataError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23"))
}

// statement runs one statement for jobs within ctx. A statement that
// PostgreSQL aborted as a deadlock wrote nothing and is sent again: two
// batches on shared rows (from two replicas, or a claim and a final answer)
// may lock them in different orders. So is one whose session the server
// ended while it ran (FATAL 57P01: pg_terminate_backend, a fast shutdown):
// an error the server sends aborts the statement's transaction, and the
// next try takes another connection (none, if the server is going down).
// A commit that may have happened unanswered never comes as the server's
// error (see mayHaveRun). So is one sent on a session the server had just
// ended for idle_session_timeout (see idleEnded).
//
// A panic in the statement's code becomes the error of every caller in it,
// with its stack: the statement runs on the group's goroutine, outside the
// HTTP server's recovery, and its callers must not wait for ever.
func (g *group[I, O]) statement(ctx context.Context, jobs []*job[I, O]) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("pgstore: batch statement panicked: %v\n%s", p, debug.Stack())
		}
	}()
	for try, ended := 1, 0; ; {
		for _, j := range jobs {
			var none O
			j.found, j.out = false, none
		}
		err := g.run(ctx, jobs)
		if idleEnded(err) && ended < idleEndedTries {
			ended++
			continue
		}
		var pe *pgconn.PgError
		if try == 3 || !errors.As(err, &pe) || pe.Code != "40P01" && pe.Code != "57P01" {
			return err
		}
		try++
	}
}

// waiting is how many callers are in the running statements and in the
// rounds waiting to be sent (tests).
func (g *group[I, O]) waiting() (inflight, queued int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.queue {
		for _, j := range r.jobs {
			if !j.left {
				queued++
			}
		}
	}
	return g.inflight, queued
}
