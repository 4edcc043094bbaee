package pgstore

import (
	"context"
	"crypto/tls"
	"errors"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// shouldPing is the pool's check before it hands out an idle connection:
// pgxpool's own (a ping after a second idle), and a ping whenever the server
// has spoken on the connection while it sat idle. A server that ends a
// session (pg_terminate_backend, idle_session_timeout, a fast shutdown)
// sends it a FATAL error and closes it; taken without a ping, such a
// connection failed the next statement with that error, a claim answered
// 503 store_unavailable and /readyz 503 on a database that was fine. The
// ping fails on it, and pgxpool drops it and takes another.
func shouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	return p.IdleDuration > time.Second || serverSpoke(p.Conn)
}

// serverSpoke says whether conn's socket has bytes to read or has been
// closed by the server, without reading anything (one non-blocking peek).
func serverSpoke(conn *pgx.Conn) bool {
	nc := conn.PgConn().Conn()
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if t, ok := nc.(*trackedConn); ok {
		nc = t.Conn
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	return peekPending(sc)
}

// idleEnded says whether err is the server's FATAL 57P05: it ended the
// session for idle_session_timeout while the statement was on its way,
// after shouldPing had looked (the FATAL not yet arrived). The session was
// idle, in no transaction: the statement never ran, and is sent again on
// another connection (pgx closed this one). Each try takes one such
// connection out of the pool; idleEndedTries bounds them.
func idleEnded(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57P05"
}

// readAgain says whether a read that failed with err is sent again on
// another connection: its session was ended while idle (idleEnded), or by
// a DBA's pg_terminate_backend or a fast shutdown (FATAL 57P01) whose
// FATAL reached the connection after shouldPing had looked. A read
// changes nothing, so running it again is safe whatever it had done; a
// server going down fails the next Acquire instead.
func readAgain(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "57P05" || pe.Code == "57P01")
}

// idleEndedTries is how many times a statement is sent again after
// idleEnded: more than a pool's connections last used at about the same
// time are likely to be.
const idleEndedTries = 10

// againIfIdleEnded runs fn, one statement, and runs it again while it fails
// with idleEnded (at most idleEndedTries more times).
func againIfIdleEnded(fn func() error) error {
	err := fn()
	for try := 0; idleEnded(err) && try < idleEndedTries; try++ {
		err = fn()
	}
	return err
}
