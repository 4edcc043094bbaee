package pgstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestSessionsEndedWhileIdle: the server ends the store's idle sessions
// (a DBA's pg_terminate_backend, idle_session_timeout, a restart's fast
// shutdown) less than a second after their last use, which pgxpool would
// hand out without a ping. The next calls must not fail on them: the
// database is fine. Each pooled connection's next statement failed with
// FATAL 57P01 (or 57P05), answered 503 store_unavailable and /readyz 503
// (with idle_session_timeout 500ms on the role: 1 of 7 orders 503 and 7 of
// 44 readiness checks 503 over 20 s on an otherwise idle replica).
func TestSessionsEndedWhileIdle(t *testing.T) {
	url := pgtest.Database(t)
	ctx := context.Background()
	s := open(t, url, time.Hour)
	admin := session(t, url)
	req := store.Request{Fingerprint: []byte("fp")}
	for round := range 3 {
		// Several connections in the pool, each just used.
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() { s.Get(ctx, store.ID{Key: "warm"}) })
		}
		wg.Wait()
		var ended int
		if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'idemproxy'`).Scan(&ended); err != nil || ended == 0 {
			t.Fatalf("terminating the store's sessions: %d, %v", ended, err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; {
			var left int
			admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'idemproxy'`).Scan(&left)
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d sessions still there 5 s after pg_terminate_backend", left)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := s.Ping(ctx); err != nil {
			t.Errorf("round %d: Ping after %d idle sessions were ended: %v", round, ended, err)
		}
		for i := range 6 {
			id := store.ID{Key: "after-" + string(rune('a'+round)) + string(rune('a'+i))}
			if _, created, err := s.Begin(ctx, id, req, "o", time.Minute); err != nil || !created {
				t.Errorf("round %d: claim %d after %d idle sessions were ended: %v, %v", round, i, ended, created, err)
			}
		}
	}
}

// TestReadSentAgainAfterItsSessionWasTerminated: a read whose session the
// server ends by a DBA's command (FATAL 57P01), here its own statement's
// pg_terminate_backend, is sent again on another connection, as one ended
// for idle_session_timeout is. In CI, TestSessionsEndedWhileIdle's Ping
// failed with 57P01 once: the session's FATAL reached the connection after
// the pool's check had looked, and reads were tried again only on 57P05.
func TestReadSentAgainAfterItsSessionWasTerminated(t *testing.T) {
	url := pgtest.Database(t)
	ctx := context.Background()
	s := open(t, url, time.Hour)
	var pids []uint32
	got, err := read(ctx, s, func(ctx context.Context, conn *pgxpool.Conn) (int, error) {
		pids = append(pids, conn.Conn().PgConn().PID())
		if len(pids) == 1 {
			_, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return 0, err
		}
		var one int
		err := conn.QueryRow(ctx, `SELECT 1`).Scan(&one)
		return one, err
	})
	if err != nil || got != 1 {
		t.Fatalf("read after its session was terminated = %d, %v; want 1 from a second session (sessions %v)", got, err, pids)
	}
	if len(pids) != 2 || pids[0] == pids[1] {
		t.Errorf("sessions used: %v, want two distinct", pids)
	}
}
