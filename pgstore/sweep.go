package pgstore

import (
	"context"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// maxSweepBatches bounds one sweep, so that a large backlog is worked off
// over several intervals instead of in one long burst.
const maxSweepBatches = 100

// sweep deletes expired records in batches of SweepBatch. Rows another
// replica's sweep has locked are skipped, so replicas sweeping at once do
// not wait for each other. It returns how many records it deleted.
func (s *Store) sweep(ctx context.Context) (int64, error) {
	var total int64
	for range maxSweepBatches {
		var n int64
		err := s.call(ctx, "sweep", nil, func(ctx context.Context) error {
			tag, err := s.pool.Exec(ctx, `DELETE FROM idemproxy_records r USING (
				SELECT tenant, key FROM idemproxy_records WHERE expires_at <= now() AND state = 2
				LIMIT $1 FOR UPDATE SKIP LOCKED) old
				WHERE r.tenant = old.tenant AND r.key = old.key AND `+expired, s.opt.SweepBatch)
			n = tag.RowsAffected()
			return err
		})
		total += n
		if err != nil || n < int64(s.opt.SweepBatch) {
			return total, err
		}
	}
	return total, nil
}

func (s *Store) sweepLoop() {
	s.every(s.opt.SweepInterval, func() {
		n, err := s.sweep(s.bg)
		if s.bg.Err() != nil { // closed meanwhile
			return
		}
		if err != nil {
			s.opt.Logger.Warn("deleting expired records failed", "deleted", n, "err", err)
		} else if n > 0 {
			s.opt.Logger.Debug("expired records deleted", "count", n)
		}
		n, err = s.parkOrphans(s.bg)
		if n > 0 && s.opt.OnOrphansParked != nil {
			s.opt.OnOrphansParked(int(n))
		}
		if err != nil && s.bg.Err() == nil {
			s.opt.Logger.Warn("parking the operations of stopped replicas failed", "parked", n, "err", err)
		}
	})
}

// replicaStopped is the LastError of an operation parked by parkOrphans.
const replicaStopped = "the replica running the operation stopped renewing its lease mid-operation; an attempt may have reached the provider"

// parkOrphans does for the in-flight records of replicas that stopped what
// the embedded store does at start for those of its dead process
// (cache.Store.ReleaseInFlight): a record whose lease ended more than
// Options.OrphanAfter ago, with no request having taken it over, becomes
// Unknown, so that operators find it among the operations whose outcome is
// unknown instead of among those running. Its first send is the claim time
// unless an earlier sequence left one, the earliest it may have been. A
// fingerprint-window anchor is deleted instead: nothing was sent for it.
// A record that does not read (openDecodes) is left in flight as it is, as
// the embedded store leaves one: parked, it would take a first send from a
// damaged row (and a newer version's record from what this one knows of
// it); it stays listed as unreadable, and requests for it are refused.
//
// Nothing changes for the app: its next request takes an Unknown record
// over with the same key as it would the in-flight one, after the status
// probe and the key retention check. A replica that is still running the
// operation (cut off from the database for longer than its lease and the
// grace) can no longer complete it; its answer is then the next request's,
// resumed with the same key, as after any takeover.
//
// It returns how many records it parked.
func (s *Store) parkOrphans(ctx context.Context) (int64, error) {
	orphan := `state = 1 AND lease_until < now() - $1 * interval '1 microsecond'`
	anchor := `substring(key from 1 for $2) = $3`
	prefix := []byte(store.WindowAnchorPrefix)
	var total int64
	for range maxSweepBatches {
		var n int64
		err := s.call(ctx, "park orphans", nil, func(ctx context.Context) error {
			if _, err := s.pool.Exec(ctx, `DELETE FROM idemproxy_records WHERE `+orphan+` AND `+anchor,
				micros(s.opt.OrphanAfter), len(prefix), prefix); err != nil {
				return err
			}
			rows, err := s.pool.Query(ctx, `UPDATE idemproxy_records r SET state = 3, lease_until = NULL, expires_at = NULL,
				first_sent_at = coalesce(r.first_sent_at, r.created_at), last_error = $4
				FROM (SELECT tenant, key FROM idemproxy_records r WHERE `+orphan+` AND NOT `+anchor+` AND `+openDecodes+`
					LIMIT $5 FOR UPDATE SKIP LOCKED) o
				WHERE r.tenant = o.tenant AND r.key = o.key AND r.`+orphan+`
				RETURNING r.tenant, r.key, r.owner, r.created_at`,
				micros(s.opt.OrphanAfter), len(prefix), prefix, replicaStopped, s.opt.SweepBatch)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var tenant, key []byte
				var owner string
				var created time.Time
				if err := rows.Scan(&tenant, &key, &owner, &created); err != nil {
					return err
				}
				n++
				s.opt.Logger.Warn("operation of a stopped replica parked as unknown: its next request resumes it with the same key",
					"client", string(tenant), "key", string(key), "owner", owner, "created_at", created)
			}
			return rows.Err()
		})
		total += n
		if err != nil || n < int64(s.opt.SweepBatch) {
			return total, err
		}
	}
	return total, nil
}

// every calls fn every d until the store is closed.
func (s *Store) every(d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		fn()
	}
}
