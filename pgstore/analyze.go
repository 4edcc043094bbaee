package pgstore

import "context"

// analyzeIfGrown has PostgreSQL measure the records table again (ANALYZE)
// when the table has grown to twice the size the planner last measured, and
// to 16 pages or more. It says whether it did.
//
// A connection keeps the plan of each statement it runs (see Open). A plan
// made while the table held a few rows scans the whole table for every
// final answer, and it stays until the table is measured again, which is
// what makes PostgreSQL plan anew. Autovacuum measures a table at most once
// a minute, and while a table is young it can grow a hundredfold in that
// time. Once the table is large, doubling takes long and autovacuum has
// measured it long before, so this does nothing. A table shrunk by expiry
// and then filled again is measured as it grows again.
//
// Only the table's or the database's owner may ANALYZE (PostgreSQL would
// skip it with a warning in its log, every time): a user with only the
// grants the tables need leaves the measuring to autovacuum.
//
// When another ANALYZE or a vacuum holds the table (another replica's, or
// autovacuum's), this one is skipped rather than waiting: the other
// measures the table too.
func (s *Store) analyzeIfGrown(ctx context.Context) (bool, error) {
	var grown bool
	err := s.call(ctx, "analyze", nil, func(ctx context.Context) error {
		err := s.pool.QueryRow(ctx, `SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint >= greatest(2 * c.relpages, 16)
				AND (pg_has_role(c.relowner, 'MEMBER') OR pg_has_role(d.datdba, 'MEMBER'))
			FROM pg_class c, pg_database d
			WHERE c.oid = 'idemproxy_records'::regclass AND d.datname = current_database()`).Scan(&grown)
		if err != nil || !grown {
			return err
		}
		_, err = s.pool.Exec(ctx, `ANALYZE (SKIP_LOCKED) idemproxy_records`)
		return err
	})
	return grown && err == nil, err
}

func (s *Store) analyzeLoop() {
	s.every(s.opt.AnalyzeInterval, func() {
		if did, err := s.analyzeIfGrown(s.bg); err != nil {
			s.opt.Logger.Debug("measuring the records table for the planner failed", "err", err)
		} else if did {
			s.opt.Logger.Debug("records table measured for the planner after it doubled")
		}
	})
}
