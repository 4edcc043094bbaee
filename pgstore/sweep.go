package pgstore

import (
	"context"
	"time"
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
		n, err := s.sweep(context.Background())
		if err != nil {
			s.opt.Logger.Warn("deleting expired records failed", "deleted", n, "err", err)
		} else if n > 0 {
			s.opt.Logger.Debug("expired records deleted", "count", n)
		}
	})
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
