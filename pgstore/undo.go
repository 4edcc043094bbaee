package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy/store"
)

// A claim whose statement got no answer (the call timed out, the connection
// broke while it ran) fails with store.ErrUnavailable, and its caller is told
// that nothing was written: the proxy answers 503 "nothing was sent, key left
// free", and the app's next try must be able to claim the key. Yet the
// server may still commit it: a server stopped and resumed runs what it had
// received; a commit waiting for its WAL flush or for a synchronous standby
// is not ended by the cancel pgx sends at the timeout (a standby wait ends
// with the transaction committed locally). Such a claim would hold the key
// in flight for a whole lease that nobody runs, and the app's retries would
// get 409 idempotency_in_progress meanwhile.
//
// So the store remembers each claim of a statement that failed that way
// (lostClaim) and undoes it once the server process of the session that
// sent it is gone: past that, the statement has either committed or never
// will. A claim whose caller left while its batch's statement ran (the call
// timed out, or the request's context ended: the caller was told nothing
// was written) is written all the same when that statement then succeeds:
// it is undone at once, its statement having answered (see orphaned). Undoing is the owner's own write, so it touches only a record that
// claim still holds: a new record is deleted (as Abandon does); a record the
// claim took over (an unknown operation resumed, or an in-flight one whose
// lease had run out) is put back to unknown, keeping its outcome, so that
// the next claim resumes it at once with the same key.

// lostClaim is a claim whose statement may have committed unanswered, or
// (abandon) an Abandon that failed: the store deletes the record once the
// database answers again, so that the key is free then rather than only
// when its lease ends; or (park) a Park that failed: the store parks the
// record as unknown with that outcome once the database answers, so that
// what the owner knew of an operation that may have run (its first send,
// the provider's last answer) is kept. Neither waits for its session: both
// are owner writes on the in-flight record, which a second run finds no
// longer in flight, and a record the owner no longer holds (taken over
// meanwhile) is left alone.
type lostClaim struct {
	id      store.ID
	owner   string
	pid     uint32    // the server process of the session that sent it
	since   time.Time // when its statement failed
	abandon bool
	park    *store.Outcome
	// written: a claim its statement wrote after its caller had left (see
	// orphaned), to undo without waiting for a session.
	written bool
}

// deferred says whether c is a failed owner write (an Abandon or a Park)
// rather than a claim that got no answer.
func (c lostClaim) deferred() bool { return c.abandon || c.park != nil }

// waits says whether c is undone only once the session that sent it has
// ended: a claim whose statement got no answer.
func (c lostClaim) waits() bool { return !c.deferred() && !c.written }

const (
	// undoRetry is how often the store tries again to undo lost claims
	// while some are left.
	undoRetry = 200 * time.Millisecond
	// undoAnyway is how long the store waits for the session that sent a
	// lost claim to end before undoing it regardless (its process id may
	// have been reused by another session).
	undoAnyway = 10 * time.Minute
)

// undoClaim undoes owner's claim of a record ($1 tenant, $2 key, $3 owner),
// if the claim holds it: a record it created (fence 1) is deleted, a record
// it took over goes back to unknown. It returns how many of each.
const undoClaim = `WITH gone AS (
	DELETE FROM idemproxy_records WHERE tenant = $1 AND key = $2 AND owner = $3 AND ` + inFlight + ` AND fence = 1
	RETURNING 1
), parked AS (
	UPDATE idemproxy_records SET state = 3, lease_until = NULL, expires_at = NULL
	WHERE tenant = $1 AND key = $2 AND owner = $3 AND ` + inFlight + ` AND fence > 1
	RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM parked)`

// mayHaveRun says whether a statement that failed with err may still commit
// or have committed: the server did not refuse it with an error of its own
// (which aborts its transaction), and it failed after it was sent.
func mayHaveRun(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return false
	}
	return !pgconn.SafeToRetry(err)
}

// releaseLater remembers an Abandon that failed, to be done again.
func (s *Store) releaseLater(id store.ID, owner string) {
	s.lostMu.Lock()
	s.lost = append(s.lost, lostClaim{id: id, owner: owner, since: time.Now(), abandon: true})
	s.lostMu.Unlock()
	select {
	case s.lostKick <- struct{}{}:
	default:
	}
}

// parkLater remembers a Park that failed, to be done again.
func (s *Store) parkLater(id store.ID, owner string, o store.Outcome) {
	o.LastBody = bytes.Clone(o.LastBody) // the caller's buffers are not the store's
	if o.Sent != nil {
		sent := *o.Sent
		sent.Body = bytes.Clone(sent.Body)
		o.Sent = &sent
	}
	s.lostMu.Lock()
	s.lost = append(s.lost, lostClaim{id: id, owner: owner, since: time.Now(), park: &o})
	s.lostMu.Unlock()
	select {
	case s.lostKick <- struct{}{}:
	default:
	}
}

// lose remembers the claims among jobs, sent on the session of server
// process pid by a statement that failed unanswered, to be undone.
func (s *Store) lose(pid uint32, jobs []*job[writeArgs, store.Record]) {
	now := time.Now()
	s.lostMu.Lock()
	for _, j := range jobs {
		if j.in.claim != nil {
			s.lost = append(s.lost, lostClaim{id: j.id, owner: j.in.claim.owner, pid: pid, since: now})
		}
	}
	s.lostMu.Unlock()
	select {
	case s.lostKick <- struct{}{}:
	default:
	}
}

// orphaned remembers the claims among jobs that their round's statement
// wrote after their callers had left (the group's orphaned), to be undone
// at once: each caller was told that nothing was written (the proxy
// answers 503 "key left free"), and its claim would otherwise hold the key
// in flight for a whole lease that nobody runs. The claims of a statement
// that failed unanswered are already remembered by writeBatch (lose).
func (s *Store) orphaned(jobs []*job[writeArgs, store.Record]) {
	now := time.Now()
	n := 0
	s.lostMu.Lock()
	for _, j := range jobs {
		if j.in.claim != nil && j.err == nil && j.found {
			s.lost = append(s.lost, lostClaim{id: j.id, owner: j.in.claim.owner, since: now, written: true})
			n++
		}
	}
	s.lostMu.Unlock()
	if n == 0 {
		return
	}
	select {
	case s.lostKick <- struct{}{}:
	default:
	}
}

// undoLoop undoes lost claims as they come, trying again every undoRetry
// while any is left, until the store closes.
func (s *Store) undoLoop() {
	for {
		select {
		case <-s.stop:
			return
		case <-s.lostKick:
		}
		for s.undoLost(s.bg) > 0 {
			select {
			case <-s.stop:
				return
			case <-time.After(undoRetry):
			}
		}
	}
}

// Settle redoes the owner writes that failed and wait to be redone (a Park
// or an Abandon the database did not answer, see lostClaim) now, and again
// every undoRetry until none is left, or ctx ends with some left, which it
// reports. A replica that stops calls it after its drain and before Close,
// within its shutdown grace: Close drops what is left, and a park dropped
// leaves the record in flight under a replica that is gone, until another
// one's sweep parks it a minute after its lease, with its claim time as
// its first send and without the provider's last answer. Claims whose
// statements got no answer are undone on the way once their sessions have
// ended, but not waited for: their keys are free when their leases end.
func (s *Store) Settle(ctx context.Context) error {
	for {
		s.undoLost(ctx)
		n := s.deferredLeft()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgstore: settle: %d failed parks or releases still to redo: %w", n, ctx.Err())
		case <-time.After(undoRetry):
		}
	}
}

// deferredLeft counts the failed owner writes still to redo.
func (s *Store) deferredLeft() int {
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	n := 0
	for _, c := range s.lost {
		if c.deferred() {
			n++
		}
	}
	return n
}

// undoLost undoes the lost claims whose sessions have ended (or that have
// waited undoAnyway) and returns how many are left.
func (s *Store) undoLost(ctx context.Context) int {
	s.lostMu.Lock()
	pending := slices.Clone(s.lost)
	s.lostMu.Unlock()
	if len(pending) == 0 {
		return 0
	}
	pids := make([]int32, 0, len(pending))
	for _, c := range pending {
		if c.waits() {
			pids = append(pids, int32(c.pid))
		}
	}
	var alive []int32 // the sessions still there; a failed release or park, or a claim written after its caller left, waits for none
	if len(pids) > 0 {
		err := s.call(ctx, "undo", nil, func(ctx context.Context) error {
			rows, _ := s.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE pid = ANY($1::int4[])`, pids)
			var err error
			alive, err = pgx.CollectRows(rows, pgx.RowTo[int32])
			return err
		})
		if err != nil {
			return len(pending)
		}
	}
	var done []lostClaim
	for _, c := range pending {
		if c.waits() && slices.Contains(alive, int32(c.pid)) && time.Since(c.since) < undoAnyway {
			continue
		}
		var deleted, parked int64
		err := s.call(ctx, "undo", &c.id, func(ctx context.Context) error {
			if c.park != nil {
				args := append([]any{[]byte(c.id.Tenant), []byte(c.id.Key), c.owner}, parkArgs(*c.park)...)
				tag, err := s.pool.Exec(ctx, park, args...)
				parked = tag.RowsAffected()
				return err
			}
			if c.abandon {
				tag, err := s.pool.Exec(ctx, abandon, []byte(c.id.Tenant), []byte(c.id.Key), c.owner)
				deleted = tag.RowsAffected()
				return err
			}
			return s.pool.QueryRow(ctx, undoClaim, []byte(c.id.Tenant), []byte(c.id.Key), c.owner).Scan(&deleted, &parked)
		})
		if err != nil {
			s.opt.Logger.Debug("undoing a claim whose statement got no answer failed; trying again", "err", err)
			continue
		}
		switch {
		case c.park != nil && parked > 0:
			s.opt.Logger.Warn("an operation that may have run, whose record could not be parked as unknown, is parked now that the database answers; its next request resumes it with the same key",
				"key", c.id.Key, "last_error", c.park.LastError)
		case c.park != nil:
			// Parked after all, completed, or taken over: the record is
			// someone else's now.
		case c.abandon && deleted > 0:
			s.opt.Logger.Warn("an in-flight record whose release failed is released now that the database answers; the key is free",
				"key", c.id.Key)
		case c.written && deleted+parked > 0:
			s.opt.Logger.Warn("a claim written after its caller had left (timed out or gone) is undone; the key is free",
				"key", c.id.Key, "back_to_unknown", parked > 0)
		case deleted+parked > 0:
			s.opt.Logger.Warn("a claim whose statement got no answer had been written after all; undone, the key is free",
				"key", c.id.Key, "back_to_unknown", parked > 0)
		}
		done = append(done, c)
	}
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	s.lost = slices.DeleteFunc(s.lost, func(c lostClaim) bool {
		return slices.ContainsFunc(done, func(d lostClaim) bool { return d.owner == c.owner && d.id == c.id })
	})
	return len(s.lost)
}
