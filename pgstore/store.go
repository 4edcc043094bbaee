// Package pgstore is the record store shared by replicas: the store contract
// (package store) on PostgreSQL through pgx. The database is the only
// authority: its clock measures leases and TTLs, and first sends are kept by
// it (the proxy ties them to the claim's now(), see retry.StoreClock), and
// one statement claims a key, so any number of idemproxy processes may share
// one database.
//
// Records are written with synchronous_commit on: a nil error means the
// write survives a database crash. The provider-wide throttle state (see
// Throttle) lives in an unlogged table and may be lost in a database crash,
// which at worst ends a pause early.
package pgstore

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/store"
)

// Options configure Open. Zero values have the defaults stated.
type Options struct {
	// URL is the postgres:// or postgresql:// connection URL. Required.
	URL string
	// TTL is the lifetime of records, counted from their last write by the
	// database's clock. 0 keeps records forever.
	TTL time.Duration
	// CallTimeout bounds every call to the database, the wait for a pooled
	// connection included. 0 means 5 s.
	CallTimeout time.Duration
	// MaxRecordBytes bounds a stored response's body and encoded headers
	// together; Complete fails with store.ErrTooLarge above it. 0 means 1 MiB.
	MaxRecordBytes int64
	// MaxConns is the connection pool's size, unless the URL gives
	// pool_max_conns. 0 means 32. It bounds every connection the store
	// opens, the Throttle's included; below 4, Open fails (see minConns).
	MaxConns int32
	// SweepInterval is how often expired records are deleted. 0 means one
	// minute; negative disables the sweep.
	SweepInterval time.Duration
	// SweepBatch is how many expired records one DELETE removes. 0 means 1000.
	SweepBatch int
	// OrphanAfter is how long past its lease's end an in-flight record that
	// no request took over waits before a sweep parks it as Unknown (see
	// parkOrphans). 0 means one minute.
	OrphanAfter time.Duration
	// OnOrphansParked, if set, is told how many such records a sweep
	// parked (for the crash metric).
	OnOrphansParked func(n int)
	// AnalyzeInterval is how often the store checks whether the records
	// table has doubled since PostgreSQL last measured it, and then
	// measures it (see analyzeIfGrown). 0 means 2 s; negative disables it.
	AnalyzeInterval time.Duration
	// Logger receives the background loops' failures; nil discards them.
	Logger *slog.Logger
}

// Store is the PostgreSQL record store. It is safe for concurrent use by
// goroutines and by processes sharing the database. Open creates it; Close
// releases its connections.
type Store struct {
	pool   *pgxpool.Pool
	opt    Options
	ready  atomic.Bool // the schema is in place
	closed atomic.Bool
	// refused counts the statements the database refused for lack of disk
	// space (SQLSTATE 53100) or for want of a privilege (42501: a grant
	// revoked while running) since a Ping's probe write last passed; 0:
	// none. Until a probe passes the database does not take writes, and
	// only a probe that passed clears it, and only if no refusal came
	// while it ran (see ping).
	refused atomic.Uint64
	stop    chan struct{}
	loops   sync.WaitGroup
	once    sync.Once
	// bg is the context of the background loops' calls, cancelled by
	// Close: on a database that does not answer, a call would otherwise
	// run out its timeout before Close could go on.
	bg     context.Context
	stopBg context.CancelFunc
	// conns are the connections the pool has open (see cutConns).
	conns *connSet

	// Claims and final answers of concurrent requests share statements:
	// one statement, and so one commit, per round for both (see writeBatch).
	writes *group[writeArgs, store.Record]

	// Throttles started on the store, closed by Close before the pool
	// (each holds a pooled connection while it listens).
	throttlesMu sync.Mutex
	throttles   []*Throttle

	// Claims whose statements got no answer, to undo (see lostClaim).
	lostMu   sync.Mutex
	lost     []lostClaim
	lostKick chan struct{}
}

var _ store.Store = (*Store)(nil)

// Open connects to the database and creates or upgrades the schema. A
// database that cannot be reached yet does not fail Open: every call answers
// store.ErrUnavailable until the schema is in place, retried in the
// background. A database that refuses (bad credentials, missing database,
// missing privileges, a newer schema) fails Open.
func Open(ctx context.Context, opt Options) (*Store, error) {
	opt = withDefaults(opt)
	cfg, settings, err := poolConfig(opt)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connection URL: %w", redact(err))
	}
	for _, name := range []string{"lock_timeout", "statement_timeout"} {
		if d, ok := pgDuration(settings[name]); ok && d > 0 && d < opt.CallTimeout {
			opt.Logger.Warn(fmt.Sprintf("the store URL gives %s=%s (%v), shorter than the %v every store call may take: "+
				"a write it cancels after the provider acted is answered 503 store_unavailable for an operation that ran, "+
				"and a schema check it cancels at start keeps the replica not ready; leave it out (0: the call timeout bounds every statement)",
				name, settings[name], d, opt.CallTimeout))
		}
	}
	conns := &connSet{open: map[*trackedConn]struct{}{}}
	cfg.ConnConfig.DialFunc = conns.dial(cfg.ConnConfig.DialFunc)
	settle, stamp := cfg.AfterConnect, stampRetire(cfg.MaxConnLifetime, cfg.MaxConnLifetimeJitter)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if err := settle(ctx, c); err != nil {
			return err
		}
		return stamp(ctx, c)
	}
	cfg.ShouldPing = shouldPing
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", redact(err))
	}
	s := &Store{pool: pool, opt: opt, stop: make(chan struct{}), lostKick: make(chan struct{}, 1), conns: conns}
	s.bg, s.stopBg = context.WithCancel(context.Background())
	s.writes = &group[writeArgs, store.Record]{run: s.writeBatch, orphaned: s.orphaned, timeout: opt.CallTimeout, hold: roundHold}
	// A caller that gives up (a signal during the start) is not held by a
	// database that does not answer: the connections are cut at once (the
	// schema's unlock and pgx's cancel request would each wait on it), and
	// Open fails with ctx's error, not as a refusal.
	cut := context.AfterFunc(ctx, func() { conns.cut() })
	err = s.migrate(ctx)
	if !cut() {
		s.stopBg()
		pool.Close()
		return nil, fmt.Errorf("pgstore: schema: %w", ctx.Err())
	}
	switch {
	case err == nil:
	case errors.Is(err, errTablesBusy):
		opt.Logger.Warn("schema upgrade waits for replicas of the older build to leave its tables free; retrying in the background", "err", err)
		s.loops.Go(s.migrateLoop)
	case refused(err):
		s.stopBg()
		pool.Close()
		return nil, fmt.Errorf("pgstore: schema: %w", err)
	default:
		opt.Logger.Warn("database unreachable at start; retrying in the background", "err", redact(err))
		s.loops.Go(s.migrateLoop)
	}
	s.loops.Go(s.undoLoop)
	if opt.SweepInterval > 0 {
		s.loops.Go(s.sweepLoop)
	}
	if opt.AnalyzeInterval > 0 {
		s.loops.Go(s.analyzeLoop)
	}
	return s, nil
}

// minConns is the least pool size Open takes: the connections a replica
// uses at once by design, each for a flow that should not wait for another's
// statement to end (every wait for a pooled connection counts against the
// call timeout). The throttle's LISTEN connection, held for as long as it
// listens (up to the pool's connection lifetime, then replaced); the batched
// write statement (batchInFlight, one at a time); the reads and a request's
// other writes (Get, Renew, Park, Abandon, List); and the short background
// statements (the throttle's heartbeat and buckets, the sweep, the ANALYZE
// check, the undoing of lost claims), which run every few seconds and share
// one.
const minConns = 1 + batchInFlight + 1 + 1

// poolConfig is the pool Open makes for opt. What the URL says is honoured:
// pool_max_conns (else opt.MaxConns), pgxpool's other pool_ parameters
// (Open sets none of them), application_name (else "idemproxy", so that a
// DBA sees the sessions), and a connect_timeout shorter than the call
// timeout (a longer one could not act: every call, a connect included, ends
// at the call timeout). The session's settings (sessionSettings, returned
// by name) are made by the pool's AfterConnect; two are idemproxy's whatever
// the URL says. A pool smaller than minConns is refused, and so are settings
// pgxpool cannot run with (checkPool).
func poolConfig(opt Options) (*pgxpool.Config, map[string]string, error) {
	// Whether the URL gives pool_max_conns is read from the connection's
	// parse: pgxpool's takes it out, and puts its own default in its place.
	conn, err := pgconn.ParseConfig(opt.URL)
	if err != nil {
		return nil, nil, err
	}
	size := opt.MaxConns
	if v, given := conn.RuntimeParams["pool_max_conns"]; given {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return nil, nil, errors.New("pool_max_conns is not a whole number")
		}
		size = int32(n)
	}
	if size < minConns { // before pgxpool, whose error for 0 names nothing
		return nil, nil, fmt.Errorf("pool_max_conns=%d is below %d, the connections a replica uses at once "+
			"(one listening for provider pauses, one for the batched writes, one for reads, one for the heartbeat and the sweep)",
			size, minConns)
	}
	cfg, err := pgxpool.ParseConfig(opt.URL)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = size
	if t := cfg.ConnConfig.ConnectTimeout; t <= 0 || t > opt.CallTimeout {
		cfg.ConnConfig.ConnectTimeout = opt.CallTimeout
	}
	params := cfg.ConnConfig.RuntimeParams
	if params["application_name"] == "" {
		params["application_name"] = "idemproxy"
	}
	settings := sessionSettings(opt, params)
	// The settings are made with SET once a connection is open, not sent
	// in its startup packet: PgBouncer refuses a connection whose packet
	// has any of them (unsupported startup parameter), or drops them
	// unseen when told to ignore them, which left records written with
	// the server's synchronous_commit and the role's timeouts
	// (TestPgBouncerSessionSettings). One round trip per new connection.
	for name := range settings {
		delete(params, name)
	}
	cfg.AfterConnect = applySettings(settings)
	return cfg, settings, checkPool(cfg)
}

// sessionSettings are the settings every session of the store runs with,
// by name: the URL's value where the URL may give one (taken out of
// params, the startup parameters), else idemproxy's.
func sessionSettings(opt Options, params map[string]string) map[string]string {
	set := map[string]string{}
	// Records are durable before a call returns, whatever the server's
	// default or the URL (an answer lost in a database crash means the
	// app's retry pays twice).
	set["synchronous_commit"] = "on"
	// A statement is planned once per connection and again after each
	// ANALYZE of its tables, not on every run: under the default, a
	// statement of a few keys looks cheaper planned for its own arguments
	// and is planned anew each time, which cost more than a third of the
	// database's CPU (docs/design/postgres-writes.md). A plan made while
	// the table was small is replaced once it has grown (analyzeIfGrown),
	// and the statements are written so that the plan that fits any
	// arguments is the one wanted (inFlight, listBatch).
	set["plan_cache_mode"] = "force_generic_plan"
	// Every call is bounded by the call timeout (its statement cancelled
	// there), so a write waits for a row another session holds within it.
	// A lock_timeout or statement_timeout a DBA set on the role or the
	// database (ALTER ROLE ... SET) shorter than such a wait made the final
	// answer's write fail after the provider had acted, and the app got 503
	// for an operation that ran. The URL may still give them.
	for _, name := range []string{"lock_timeout", "statement_timeout"} {
		set[name] = "0"
		if v, given := params[name]; given {
			set[name] = v
		}
	}
	// A session whose client the network lost mid-transaction (packets
	// vanishing, the connection never closed) is ended by the server, and
	// its row locks freed, a call timeout after its last statement: no gap
	// inside idemproxy's own transactions is longer, as a call ends there.
	// Left to the server's TCP keepalive (hours by default), an operator's
	// change (SELECT ... FOR UPDATE, then the write) cut so held its record's
	// row: every claim of that key from any replica, a replay included,
	// waited out its call timeout and failed, with every other claim and
	// final answer batched in its statement (TestVanishedTransactionFreesItsRow).
	set["idle_in_transaction_session_timeout"] = strconv.FormatInt(max(opt.CallTimeout.Milliseconds(), 1), 10)
	if v, given := params["idle_in_transaction_session_timeout"]; given {
		set["idle_in_transaction_session_timeout"] = v
	}
	return set
}

// pgDuration reads a PostgreSQL time setting as the server does: a number
// with a unit (us, ms, s, min, h, d), or without one in milliseconds. ok is
// false for anything else, which the server refuses itself.
func pgDuration(v string) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	i := strings.IndexFunc(v, func(r rune) bool { return (r < '0' || r > '9') && r != '.' && r != '-' && r != '+' })
	num, unit := v, "ms"
	if i >= 0 {
		num, unit = v[:i], strings.TrimSpace(v[i:])
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	scale := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second,
		"min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[unit]
	if scale == 0 {
		return 0, false
	}
	if f*float64(scale) > float64(math.MaxInt64) {
		return math.MaxInt64, true
	}
	return time.Duration(f * float64(scale)), true
}

// applySettings is the pool's AfterConnect: it makes settings the new
// session's, in one round trip (one simple-protocol query). It first drops
// any prepared statement the session holds: behind PgBouncer in session
// mode with server_reset_query empty, a server connection comes with those
// of its last client, whose names pgx's statement cache would use again.
//
// The query runs under the role's own statement_timeout until it changes
// it, so it turns that off first and sets its own value last: a short one
// set on the role (ALTER ROLE ... SET statement_timeout = '1ms') otherwise
// cancelled the query now and then, and the call that opened the
// connection failed with it, a final answer's write included. What is left
// of that window (the query's parse and its first SET) is covered by
// trying again: a cancelled query changed nothing.
func applySettings(settings map[string]string) func(context.Context, *pgx.Conn) error {
	names := slices.Sorted(maps.Keys(settings))
	var sql strings.Builder
	sql.WriteString("SET statement_timeout = 0; DEALLOCATE ALL;")
	for _, name := range names {
		if name != "statement_timeout" {
			fmt.Fprintf(&sql, " SET %s = %s;", name, quoteLiteral(settings[name]))
		}
	}
	if v, ok := settings["statement_timeout"]; ok {
		fmt.Fprintf(&sql, " SET statement_timeout = %s;", quoteLiteral(v))
	}
	query := sql.String()
	return func(ctx context.Context, c *pgx.Conn) error {
		var err error
		for range settingsTries {
			if _, err = c.PgConn().Exec(ctx, query).ReadAll(); !isCanceled(err) || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("session settings: %w", err)
		}
		return nil
	}
}

// settingsTries bounds how often applySettings runs its query when the
// role's statement_timeout cancels it.
const settingsTries = 5

// isCanceled says whether err is the server's query_canceled (a statement
// timeout, or a cancel request).
func isCanceled(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014"
}

// quoteLiteral quotes v as an SQL string literal (standard_conforming_strings
// on, PostgreSQL's default since 9.1).
func quoteLiteral(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// checkPool refuses the pool settings idemproxy cannot work with. Its
// errors name the parameter and never hold the URL.
func checkPool(cfg *pgxpool.Config) error {
	switch {
	case cfg.MinConns > cfg.MaxConns:
		return fmt.Errorf("pool_min_conns=%d is above the pool's size, pool_max_conns=%d", cfg.MinConns, cfg.MaxConns)
	case cfg.MinIdleConns > cfg.MaxConns:
		return fmt.Errorf("pool_min_idle_conns=%d is above the pool's size, pool_max_conns=%d", cfg.MinIdleConns, cfg.MaxConns)
	case cfg.HealthCheckPeriod <= 0:
		// pgxpool's health check would panic on its ticker.
		return fmt.Errorf("pool_health_check_period=%v is not positive", cfg.HealthCheckPeriod)
	}
	return nil
}

// CheckURL reports whether Open would take url as a connection URL: its
// form and its parameters (sslmode, connect_timeout, pool_max_conns…), and
// the pool they make (checkPool). It connects to nothing. The error never
// holds the URL's password.
func CheckURL(raw string) error {
	_, _, err := poolConfig(withDefaults(Options{URL: raw}))
	if err == nil {
		return nil
	}
	// What is wrong (sslmode is invalid, say), unless its text could hold
	// the password: a URL that does not parse as one is quoted whole.
	var pe *pgconn.ParseConfigError
	if inner := errors.Unwrap(err); errors.As(err, &pe) && inner != nil && !strings.Contains(inner.Error(), "://") {
		if u, perr := url.Parse(raw); perr == nil {
			if pw, _ := u.User.Password(); pw == "" || !strings.Contains(inner.Error(), pw) {
				return fmt.Errorf("connection URL: %w: %w", redact(err), inner)
			}
		}
	}
	return fmt.Errorf("connection URL: %w", redact(err))
}

// Migrated says whether the schema is in place: false while the database
// has not been reached since Open (calls answer store.ErrUnavailable).
func (s *Store) Migrated() bool { return s.ready.Load() }

func withDefaults(o Options) Options {
	if o.CallTimeout <= 0 {
		o.CallTimeout = 5 * time.Second
	}
	if o.MaxRecordBytes <= 0 {
		o.MaxRecordBytes = 1 << 20
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 32
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = time.Minute
	}
	if o.SweepBatch <= 0 {
		o.SweepBatch = 1000
	}
	if o.OrphanAfter <= 0 {
		o.OrphanAfter = time.Minute
	}
	if o.AnalyzeInterval == 0 {
		o.AnalyzeInterval = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func (s *Store) migrate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 4*s.opt.CallTimeout)
	defer cancel()
	if err := migrate(ctx, s.pool, s.opt.CallTimeout); err != nil {
		return err
	}
	s.ready.Store(true)
	return nil
}

// migrateLoop retries the schema until it is in place or the store closes.
func (s *Store) migrateLoop() {
	for wait := time.Second; ; wait = min(2*wait, 15*time.Second) {
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
		err := s.migrate(s.bg)
		if err == nil {
			s.opt.Logger.Info("database reachable; schema in place")
			return
		}
		if s.bg.Err() != nil { // closed meanwhile
			return
		}
		if refused(err) {
			// Reached, but it refuses (a wrong password, a missing
			// database or grant, a newer schema): what Open would have
			// failed with. Retried, since a person may fix it.
			s.opt.Logger.Error("the database answers but refuses: not ready until this is fixed", "err", redact(err))
			continue
		}
		if errors.Is(err, errTablesBusy) {
			s.opt.Logger.Warn("schema upgrade still waits for its tables", "err", err)
			continue
		}
		s.opt.Logger.Warn("database still unreachable", "err", redact(err))
	}
}

// refused says whether err is the database's answer rather than a failure to
// reach it: retrying will not help.
func refused(err error) bool {
	if tlsRefused(err) || errors.Is(err, errSessionNotKept) {
		return true
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return !errors.Is(err, context.DeadlineExceeded) && !pgconn.SafeToRetry(err) && !isNetwork(err)
	}
	if pe.Code == "08P01" && strings.HasPrefix(pe.Message, "unsupported startup parameter") {
		// PgBouncer's refusal of a parameter the URL gives (it forwards
		// only a few, unless told to ignore the others).
		return true
	}
	switch pe.Code[:2] {
	case "08", "57", "53", "58": // connection, shutdown, resources, system
		return false
	}
	return true
}

// tlsRefused says whether err is a TLS failure that no retry mends, though
// it comes as a failure to connect: the server does not offer TLS where
// sslmode requires it, or its certificate fails the verification sslmode
// asks for (verify-ca, verify-full). Every way of connecting must have
// failed so: under sslmode=prefer (the default) a server without TLS refuses
// it and the connection is tried again without, and that attempt's failure
// (the server starting up, out of connections) is what counts.
func tlsRefused(err error) bool {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		if joined, ok := errors.Unwrap(ce).(interface{ Unwrap() []error }); ok {
			each := joined.Unwrap()
			for _, e := range each {
				if !tlsFailure(e) {
					return false
				}
			}
			return len(each) > 0
		}
	}
	return tlsFailure(err)
}

// tlsFailure says whether err is one TLS failure tlsRefused counts.
func tlsFailure(err error) bool {
	var (
		verify    *tls.CertificateVerificationError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &authority) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		strings.Contains(err.Error(), "server refused TLS connection") // pgconn has no sentinel for it
}

// isNetwork says whether err is a failure to reach the database or to keep
// its connection: refused to connect, timed out, or dropped mid-statement
// (the server going down for a restart or a failover, a proxy between them
// going away: EOF, a reset, pgconn's closed connection). A connection
// dropped while the start's first statements ran was taken for a refusal,
// and the replica exited at start instead of retrying.
func isNetwork(err error) bool {
	var (
		ce *pgconn.ConnectError
		ne net.Error
	)
	return errors.As(err, &ce) || pgconn.Timeout(err) || errors.As(err, &ne) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// redact drops a connection error's text that may carry the URL's password.
func redact(err error) error {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return fmt.Errorf("cannot connect to %s:%d: %w", ce.Config.Host, ce.Config.Port, errors.Unwrap(ce))
	}
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("the URL cannot be parsed")
	}
	return err
}

// Close stops the background loops and closes the pool; later calls fail
// with store.ErrClosed. On a database that does not answer, it returns
// within about closeWait: calls still waiting on it then fail.
func (s *Store) Close() error { return s.CloseBy(time.Time{}) }

// CloseBy is Close within a deadline (zero: none): the throttles, loops and
// connections are given closeWait to end in order, or less, three quarters
// of the time left to the deadline, before the connections still open are
// cut (see cutConns); what is left of it is for the pool to let go of them.
// A hung database then holds neither the throttles' last statements nor
// the pool's close past the deadline (the process's shutdown grace).
func (s *Store) CloseBy(deadline time.Time) error {
	s.once.Do(func() {
		now := time.Now()
		wait := closeWait
		if !deadline.IsZero() {
			wait = min(wait, deadline.Sub(now)*3/4)
		}
		cut := time.AfterFunc(max(wait, 0), func() { s.cutConns(wait) })
		defer cut.Stop()
		s.throttlesMu.Lock()
		throttles := s.throttles
		s.throttlesMu.Unlock()
		for _, t := range throttles {
			t.Close()
		}
		s.closed.Store(true)
		close(s.stop)
		s.stopBg()
		s.loops.Wait()
		s.lostMu.Lock()
		if n := len(s.lost); n > 0 {
			s.opt.Logger.Warn("closing with in-flight records still to release (failed releases, claims whose statements got no answer): their keys are free once their leases end",
				"records", n)
		}
		s.lostMu.Unlock()
		s.pool.Close()
	})
	return nil
}

// closeWait is how long Close lets the throttles, the loops and the pool
// close their connections in order (each told the session ends) before it
// cuts those still open.
const closeWait = time.Second

// cutConns cuts every connection still open and refuses new ones, once
// Close has waited wait for them. On a database that does not answer, the
// pool's Close would wait for the statements still running (up to the call
// timeout) and then up to 15 s for each connection pgx dropped after
// cancelling a statement: pgx sends the server a cancel request on a
// connection of its own and waits for the server to close it, which a hung
// server never does. Cut, a connection fails at once, and so does a cancel
// request's.
func (s *Store) cutConns(wait time.Duration) {
	if n := s.conns.cut(); n > 0 {
		s.opt.Logger.Warn("database connections not closed in order within the wait; cut", "connections", n, "wait", wait.String())
	}
}

// connSet holds the connections the pool opens, its cancel requests'
// included, so that Close can cut them (see cutConns).
type connSet struct {
	mu   sync.Mutex
	open map[*trackedConn]struct{}
	done bool // cut: no new connection
}

type trackedConn struct {
	net.Conn
	set *connSet
}

func (c *trackedConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.open, c)
	c.set.mu.Unlock()
	return c.Conn.Close()
}

// dial wraps the pool's dial function: the connections it makes are held in
// the set; once cut, it makes none.
func (cs *connSet) dial(next pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cs.mu.Lock()
		done := cs.done
		cs.mu.Unlock()
		if done {
			return nil, errors.New("the store is closed")
		}
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := &trackedConn{Conn: conn, set: cs}
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.done {
			conn.Close()
			return nil, errors.New("the store is closed")
		}
		cs.open[c] = struct{}{}
		return c, nil
	}
}

// cut closes every connection still open and refuses new ones; it returns
// how many it closed.
func (cs *connSet) cut() int {
	cs.mu.Lock()
	cs.done = true
	open := make([]*trackedConn, 0, len(cs.open))
	for c := range cs.open {
		open = append(open, c)
	}
	cs.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
	return len(open)
}

// MaxBodyBytes implements store.Store.
func (s *Store) MaxBodyBytes() int64 { return s.opt.MaxRecordBytes - 64<<10 }

// call runs fn with the call timeout, after the checks every call makes, and
// translates its error.
func (s *Store) call(ctx context.Context, op string, id *store.ID, fn func(ctx context.Context) error) error {
	if s.closed.Load() {
		return fmt.Errorf("pgstore: %s: %w", op, store.ErrClosed)
	}
	if id != nil && id.Key == "" {
		return fmt.Errorf("pgstore: %s: empty idempotency key", op)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	if !s.ready.Load() {
		return fmt.Errorf("pgstore: %s: %w: schema not in place yet (the database was unreachable at start, or an upgrade waits for its tables)", op, store.ErrUnavailable)
	}
	cctx, cancel := context.WithTimeout(ctx, s.opt.CallTimeout)
	defer cancel()
	err := fn(cctx)
	for wait := serverFullWait; err != nil && serverFull(err) && s.pool.Stat().TotalConns() > 0; wait = min(2*wait, serverFullWaitMax) {
		// The pool's new connection was refused, nothing sent: the call
		// waits for one of the pool's own, as it does when the pool is at
		// its size, within the call timeout. (A pool with none fails at
		// once, as when the database cannot be reached.)
		if !s.waitPooled(cctx, wait) {
			break
		}
		err = fn(cctx)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotOwner), errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrTooLarge),
		errors.Is(err, store.ErrNotFinal), errors.Is(err, store.ErrBadCursor), errors.Is(err, store.ErrNotUnknown),
		errors.Is(err, store.ErrNoReview), errors.Is(err, store.ErrUnreadable), errors.Is(err, store.ErrSuperseded),
		errors.Is(err, store.ErrReadable):
		return fmt.Errorf("pgstore: %s: %w", op, err)
	case s.closed.Load():
		return fmt.Errorf("pgstore: %s: %w", op, store.ErrClosed)
	case ctx.Err() != nil: // the caller gave up; the database may be fine
		return fmt.Errorf("pgstore: %s: %w", op, ctx.Err())
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "53100" {
		s.refused.Add(1)
		return fmt.Errorf("pgstore: %s: %w: %w", op, store.ErrNoSpace, err)
	}
	if errors.As(err, &pe) && pe.Code == "42501" {
		s.refused.Add(1)
	}
	return fmt.Errorf("pgstore: %s: %w: %w", op, store.ErrUnavailable, redact(err))
}

// serverFullWait and serverFullWaitMax bound how long a call whose new
// connection the server refused for lack of slots waits, doubling, for one of
// the pool's connections to be free before it tries again (which connects
// again if none is).
const (
	serverFullWait    = 25 * time.Millisecond
	serverFullWaitMax = 500 * time.Millisecond
)

// serverFull says whether err is the server refusing a new connection
// because its connection slots are taken (53300: max_connections, or the
// slots reserved for superusers): the statement was never sent.
func serverFull(err error) bool {
	var ce *pgconn.ConnectError
	var pe *pgconn.PgError
	return errors.As(err, &ce) && errors.As(err, &pe) && pe.Code == "53300"
}

// waitPooled waits until the pool has an idle connection, or for wait at
// most; false if ctx ends first. It polls the pool's counts: other clients
// holding the server's slots, each new connection the pool tried would be
// another session the server starts only to refuse it.
func (s *Store) waitPooled(ctx context.Context, wait time.Duration) bool {
	until := time.Now().Add(wait)
	for s.pool.Stat().IdleConns() == 0 && time.Now().Before(until) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Millisecond):
		}
	}
	return ctx.Err() == nil
}

// Durations go to SQL as microseconds.
func micros(d time.Duration) int64 { return d.Microseconds() }

const (
	// live is the condition of a record that has not expired. Only a final
	// record expires (store.Store): a version before 2ed6020 and 603e260
	// wrote in-flight and unknown records with an expires_at, and replicas
	// of it may still share the database, so theirs count as live whatever
	// their expires_at says, as in expired.
	live = `(state <> 2 OR expires_at IS NULL OR expires_at > now())`
	// expired is the condition of a record of alias r that has expired:
	// a final one past its expires_at.
	expired = `(r.state = 2 AND r.expires_at <= now())`
	// openDecodes is the condition that an in-flight or unknown record of
	// alias r reads (scanRecord): a claim takes over no other, so that a
	// request for a record that does not read is refused with nothing sent,
	// as it is when its record is read (store.ErrUnreadable), instead of
	// resuming an operation from what a damaged row says of it.
	openDecodes = `(r.header IS NULL AND r.fence >= 0 AND isfinite(r.created_at)
	AND coalesce(isfinite(r.lease_until), true) AND coalesce(isfinite(r.first_sent_at), true) AND coalesce(isfinite(r.expires_at), true))`
	// columns are what readRecord scans.
	// The last, now(), is the database's clock at the read
	// (store.Record.ReadAt): the lease clock LeaseUntil is judged by.
	columns = `state, fingerprint, owner, fence, lease_until, created_at, first_sent_at, attempts, last_error, status, header, body, tenant, key, superseded,
		method, path, upstream_key, expires_at, last_body, reviewed, ` + sentColumns + `, now()`
	// sentColumns are the request as first sent (store.Outcome.Sent): a
	// flag saying whether one is kept, then its body and headers.
	sentColumns = `sent_body IS NOT NULL AS sent_kept, sent_body, sent_type, sent_encoding`
)

// claims is Begin's one statement, for a batch of keys (see group): insert,
// or take over an expired record or the same request's record whose lease
// ran out or whose outcome is unknown, if it reads (openDecodes). An
// expired record counts as missing: everything is reset (an expired record
// was never superseded, and is no longer reviewed). A takeover keeps the
// upstream key the record was claimed with (store.Store.Begin), unless it
// has none (a record written before the store kept it) or no method (a
// window anchor). Each row's conditions are the row's own, so a batch
// claims exactly what one statement per key would. An in-flight record
// never expires (store.InFlight): its expires_at is NULL. The arrays are one
// element per key: $1 tenant, $2 key, $3 fingerprint, $4 owner, $5 lease in
// microseconds, $6 method, $7 path, $8 upstream key.
// Parameters are positional here and in the other writes of a request (pgx
// rewrites a statement with named ones on every call).
const claims = `
INSERT INTO idemproxy_records AS r (tenant, key, state, fingerprint, owner, fence, lease_until, created_at, expires_at,
	method, path, upstream_key)
SELECT v.tenant, v.key, 1, v.fingerprint, v.owner, 1, now() + v.lease * interval '1 microsecond', now(), NULL,
	v.method, v.path, v.upstream_key
FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[])
	AS v(tenant, key, fingerprint, owner, lease, method, path, upstream_key)
ON CONFLICT (tenant, key) DO UPDATE SET
	state = 1, owner = excluded.owner, lease_until = excluded.lease_until, expires_at = excluded.expires_at,
	fingerprint = excluded.fingerprint, status = 0, header = NULL, body = NULL, reviewed = false,
	method = excluded.method, path = excluded.path,
	upstream_key  = CASE WHEN ` + expired + ` OR r.upstream_key = '' OR r.method = '' THEN excluded.upstream_key ELSE r.upstream_key END,
	last_body     = CASE WHEN ` + expired + ` THEN NULL  ELSE r.last_body     END,
	sent_body     = CASE WHEN ` + expired + ` THEN NULL  ELSE r.sent_body     END,
	sent_type     = CASE WHEN ` + expired + ` THEN NULL  ELSE r.sent_type     END,
	sent_encoding = CASE WHEN ` + expired + ` THEN NULL  ELSE r.sent_encoding END,
	fence         = CASE WHEN ` + expired + ` THEN 1     ELSE r.fence + 1     END,
	created_at    = CASE WHEN ` + expired + ` THEN now() ELSE r.created_at    END,
	first_sent_at = CASE WHEN ` + expired + ` THEN NULL  ELSE r.first_sent_at END,
	attempts      = CASE WHEN ` + expired + ` THEN 0     ELSE r.attempts      END,
	last_error    = CASE WHEN ` + expired + ` THEN ''    ELSE r.last_error    END
WHERE ` + expired + `
	OR r.fingerprint = excluded.fingerprint AND (r.state = 3 OR r.state = 1 AND r.lease_until <= now()) AND ` + openDecodes + `
RETURNING tenant, key, fence, lease_until, created_at, expires_at, first_sent_at, attempts, last_error, last_body, upstream_key,
	` + sentColumns + `, now()`

// writeArgs is one key's part of a round: a claim or a final answer.
type writeArgs struct {
	claim    *claimArgs
	complete *completeArgs
}

// claimArgs is one key's part of a batch of claims.
type claimArgs struct {
	req   store.Request
	owner string
	lease time.Duration
}

// Begin implements store.Store.Begin with one INSERT … ON CONFLICT DO UPDATE,
// shared with concurrent calls (see claims); when it claims nothing, a read
// returns the record that stopped it.
func (s *Store) Begin(ctx context.Context, id store.ID, req store.Request, owner string, lease time.Duration) (store.Record, bool, error) {
	if owner == "" || lease <= 0 {
		return store.Record{}, false, fmt.Errorf("pgstore: begin: empty owner or lease %v not positive", lease)
	}
	if len(req.Fingerprint) == 0 {
		return store.Record{}, false, errors.New("pgstore: begin: empty request fingerprint")
	}
	var rec store.Record
	var created bool
	claim := s.writes.do
	if !plainText(owner, req.Method, req.Path, req.UpstreamKey) {
		claim = s.writes.alone
	}
	in := writeArgs{claim: &claimArgs{req: req, owner: owner, lease: lease}}
	err := s.call(ctx, "begin", &id, func(ctx context.Context) error {
		// The read and the claim are separate statements: a record that is
		// deleted or expires between them is claimed on the next round.
		for range 10 {
			r, claimed, err := claim(ctx, id, in, 0)
			if err != nil {
				if writesRefused(err) {
					// Nothing was claimed, but the records still read: one
					// that no claim would take is returned as when the
					// database takes writes, so that a stored answer is
					// replayed and a conflict or a wait is one.
					if r, gerr := s.get(ctx, id); gerr == nil && !claimable(r, req.Fingerprint) {
						rec = r
						return nil
					}
				}
				return err
			}
			if claimed {
				rec, created = r, true
				return nil
			}
			r, err = s.get(ctx, id)
			if err == nil {
				rec = r
				return nil
			}
			if !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		return errors.New("the record kept changing under ten claims")
	})
	return rec, created, err
}

// writesRefused says whether err is the database refusing a write it was
// sent, having written nothing, while it still answers reads: a read-only
// session (a standby, or default_transaction_read_only), a full disk, or a
// grant revoked.
func writesRefused(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "25006", "53100", "42501": // read_only_sql_transaction, disk_full, insufficient_privilege
		return true
	}
	return false
}

// claimable says whether Begin's claim for a request of fingerprint fp
// would take r, as read (the claims statement's condition): the same
// request's record whose outcome is unknown or whose lease has run out by
// the database's clock. An expired record reads as missing.
func claimable(r store.Record, fp []byte) bool {
	if !bytes.Equal(r.Fingerprint, fp) {
		return false
	}
	return r.State == store.Unknown || r.State == store.InFlight && !r.LeaseLive(r.ReadAt)
}

// writeBatch sends one statement for the jobs of a round, claims and final
// answers together, and hands each claim the record its row says it claimed
// and each final answer whether its row was written. One statement is one
// commit, so a round costs one WAL flush whatever it holds.
//
// A statement of claims that fails unanswered may still commit: its claims
// are undone once the session that sent it has ended (see lostClaim).
func (s *Store) writeBatch(ctx context.Context, jobs []*job[writeArgs, store.Record]) (err error) {
	sortJobs(jobs)
	nc := 0 // claims; the other jobs are final answers
	for _, j := range jobs {
		if j.in.claim != nil {
			nc++
		}
	}
	nf := len(jobs) - nc
	c, f := newClaimCols(nc), newCompleteCols(nf)
	for _, j := range jobs {
		if j.in.claim != nil {
			c.add(j.id, j.in.claim)
		} else {
			f.add(j.id, j.in.complete)
		}
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err // nothing was sent
	}
	defer conn.Release()
	if nc > 0 {
		defer func() {
			if err != nil && mayHaveRun(err) {
				s.lose(conn.Conn().PgConn().PID(), jobs)
			}
		}()
	}
	var rows pgx.Rows
	switch {
	case nf == 0:
		rows, err = conn.Query(ctx, claims, c.args()...)
	case nc == 0:
		rows, err = conn.Query(ctx, completes, f.args()...)
	default:
		rows, err = conn.Query(ctx, both, append(c.args(), f.args()...)...)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	// Rows are (claim, tenant, key, what a claim returns) in the statement
	// of both, (tenant, key) of final answers alone, and the rest of claims.
	var claim bool
	var tenant, key []byte
	var r store.Record
	var lease, sent, expires *time.Time
	var rs sentRow
	dest := []any{&claim, &tenant, &key, &r.Fence, &lease, &r.CreatedAt, &expires, &sent,
		&r.Outcome.Attempts, &r.Outcome.LastError, &r.Outcome.LastBody, &r.UpstreamKey,
		&rs.kept, &rs.body, &rs.typ, &rs.encoding, &r.ReadAt}
	switch {
	case nc == 0:
		dest = dest[1:3]
	case nf == 0:
		dest = dest[1:]
	}
	for rows.Next() {
		claim, r = nf == 0, store.Record{}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		j := findJob(jobs, tenant, key, claim)
		if j == nil {
			return errors.New("the write returned a key it was not asked for")
		}
		j.found = true
		if !claim {
			continue
		}
		// Only what the claim did not set from its arguments came back (a
		// claimed record has no response, and a final or superseded one is
		// never claimed), and the upstream key, which a takeover keeps.
		in := j.in.claim
		r.ID, r.State, r.Owner = j.id, store.InFlight, in.owner
		r.Fingerprint = bytes.Clone(in.req.Fingerprint)
		r.Method, r.Path = in.req.Method, in.req.Path
		settleTimes(&r, lease, sent, expires)
		r.Outcome.Sent = rs.sent()
		j.out = r
	}
	return rows.Err()
}

// claimCols are the claims statement's arrays, one element per key (see
// columns.go for their types).
type claimCols struct {
	tenants, keys, fps          byteaColumn
	owners, methods, paths, ups textColumn
	leases                      int8Column
}

func newClaimCols(n int) claimCols {
	return claimCols{tenants: make([][]byte, 0, n), keys: make([][]byte, 0, n), fps: make([][]byte, 0, n),
		owners: make([]string, 0, n), methods: make([]string, 0, n), paths: make([]string, 0, n), ups: make([]string, 0, n),
		leases: make([]int64, 0, n)}
}

// args are the claims statement's arguments, $1 to $8.
func (c *claimCols) args() []any {
	return []any{c.tenants, c.keys, c.fps, c.owners, c.leases, c.methods, c.paths, c.ups}
}

func (c *claimCols) add(id store.ID, a *claimArgs) {
	c.tenants, c.keys, c.fps = append(c.tenants, []byte(id.Tenant)), append(c.keys, []byte(id.Key)), append(c.fps, a.req.Fingerprint)
	c.owners, c.leases = append(c.owners, a.owner), append(c.leases, micros(a.lease))
	c.methods, c.paths, c.ups = append(c.methods, a.req.Method), append(c.paths, a.req.Path), append(c.ups, a.req.UpstreamKey)
}

// completeCols are the final answers statement's arrays, one element per
// key (see columns.go for their types).
type completeCols struct {
	tenants, keys, headers, bodies byteaColumn
	owners                         textColumn
	statuses                       int4Column
	sents                          timestamptzColumn
	ttls                           int8Column
}

func newCompleteCols(n int) completeCols {
	return completeCols{tenants: make([][]byte, 0, n), keys: make([][]byte, 0, n), headers: make([][]byte, 0, n),
		bodies: make([][]byte, 0, n), owners: make([]string, 0, n), statuses: make([]int32, 0, n), sents: make([]*time.Time, 0, n),
		ttls: make([]int64, 0, n)}
}

// args are the final answers statement's arguments, $1 to $8 (see
// completesFrom).
func (f *completeCols) args() []any {
	return []any{f.tenants, f.keys, f.owners, f.statuses, f.headers, f.bodies, f.sents, f.ttls}
}

func (f *completeCols) add(id store.ID, a *completeArgs) {
	f.tenants, f.keys, f.owners = append(f.tenants, []byte(id.Tenant)), append(f.keys, []byte(id.Key)), append(f.owners, a.owner)
	f.statuses, f.headers, f.bodies = append(f.statuses, a.status), append(f.headers, a.header), append(f.bodies, a.body)
	f.sents, f.ttls = append(f.sents, a.sent), append(f.ttls, a.ttl)
}

// sortJobs orders a batch by tenant and key, the order of the table's
// primary key (bytea compares as Go strings do), so that claims statements
// lock shared rows in one order. A round of both kinds locks its claims'
// rows before its final answers', and a final answers statement in the
// order of its join plan, so two replicas' rounds may still deadlock on
// shared rows: PostgreSQL aborts one, which is sent again (group.statement).
func sortJobs[I, O any](jobs []*job[I, O]) {
	slices.SortFunc(jobs, func(a, b *job[I, O]) int {
		if c := strings.Compare(a.id.Tenant, b.id.Tenant); c != 0 {
			return c
		}
		return strings.Compare(a.id.Key, b.id.Key)
	})
}

// findJob is the claim (or, with claim false, the final answer) of a
// returned row's tenant and key, or nil.
func findJob(jobs []*job[writeArgs, store.Record], tenant, key []byte, claim bool) *job[writeArgs, store.Record] {
	for _, j := range jobs {
		if j.id.Tenant == string(tenant) && j.id.Key == string(key) && (j.in.claim != nil) == claim {
			return j
		}
	}
	return nil
}

// Get implements store.Store.Get.
func (s *Store) Get(ctx context.Context, id store.ID) (store.Record, error) {
	var rec store.Record
	err := s.call(ctx, "get", &id, func(ctx context.Context) (err error) {
		rec, err = s.get(ctx, id)
		return err
	})
	return rec, err
}

func (s *Store) get(ctx context.Context, id store.ID) (store.Record, error) {
	return read(ctx, s, func(ctx context.Context, conn *pgxpool.Conn) (store.Record, error) {
		return readRecord(conn.QueryRow(ctx,
			`SELECT `+columns+` FROM idemproxy_records WHERE tenant = $1 AND key = $2 AND `+live,
			[]byte(id.Tenant), []byte(id.Key)))
	})
}

// read runs a read statement for a caller (fn, on a pooled connection) so
// that a caller who leaves mid-statement costs no connection: fn runs on a
// goroutine of its own, under ctx's values but not its end, bounded by the
// call timeout from now (and by Close), and read returns as soon as ctx
// ends, fn's result then going unread. The connection is acquired within
// ctx: a caller who leaves before one is free runs nothing. Run under the
// caller's context, pgx cancels a statement whose context ends and drops
// its connection (it cannot tell what the server still sends on it), and
// the pool opens a new session for the next read: a client hanging up while
// its request polls a key in flight, as hundreds may at once, made the
// database fork a backend for each (200 waiters leaving reads held behind a
// lock opened 200 new sessions on a pool of 8). Left to end, a read ends in
// a few milliseconds, or at the call timeout on a database that does not
// answer, when pgx cancels it as before.
func read[T any](ctx context.Context, s *Store, fn func(ctx context.Context, conn *pgxpool.Conn) (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	deadline := time.Now().Add(s.opt.CallTimeout)
	done := make(chan result, 1)
	go func() {
		sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		defer cancel()
		defer context.AfterFunc(s.bg, cancel)() // Close ends it
		var r result
		for try := 0; try == 0 || readAgain(r.err) && try <= idleEndedTries; try++ {
			conn, err := s.pool.Acquire(ctx)
			if err != nil {
				// A new session the server ended while idle before its
				// settings (applySettings) reached it is tried again
				// like a statement's: nothing ran on it.
				r = result{err: err}
				continue
			}
			v, err := fn(sctx, conn)
			conn.Release()
			r = result{v, err}
		}
		done <- r
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var none T
		return none, ctx.Err()
	}
}

// inFlight is the check that a row found by its key is in flight, written
// so that the planner cannot serve it from the open-records index
// (idemproxy_records_open), only from the primary key. When its statistics
// say few records are open, the planner would otherwise read every entry of
// that index and filter by key, and the index keeps the entries of every
// record finished since the last vacuum: a final answer's cost then grows
// with the records written (in a benchmark, 2,000 to 3,000 entries read for
// each statement of a few keys). The other plan that reads more than the
// keys' rows, a whole-table scan kept from when the table was small, is
// what analyzeIfGrown ends.
const inFlight = `state + 0 = 1`

// owned is the condition of owner's live in-flight record: $1 is the
// tenant, $2 the key, $3 the owner (see ownerWrite).
const owned = `tenant = $1 AND key = $2 AND owner = $3 AND ` + inFlight + ` AND ` + live

// completesFrom is Complete's one statement, for a batch of keys (see
// group): each row becomes final only if it is still its caller's live
// in-flight record, as owned says for one. The arrays are one element per
// key, from $<first> on: tenant, key, owner, status, header, body, first
// send (NULL keeps the kept one; least ignores NULLs), and the record's TTL
// in microseconds, 0 for none (see expiry): a final record expires that
// long after it is written. It returns the keys it wrote.
func completesFrom(first int) string {
	return fmt.Sprintf(`
UPDATE idemproxy_records AS t SET state = 2, lease_until = NULL,
	status = v.status, header = v.header, body = v.body, last_body = NULL,
	sent_body = NULL, sent_type = NULL, sent_encoding = NULL,
	expires_at = CASE WHEN v.ttl = 0 THEN NULL ELSE now() + v.ttl * interval '1 microsecond' END,
	first_sent_at = least(t.first_sent_at, v.sent)
FROM unnest($%[1]d::bytea[], $%[2]d::bytea[], $%[3]d::text[], $%[4]d::integer[], $%[5]d::bytea[], $%[6]d::bytea[], $%[7]d::timestamptz[],
	$%[8]d::bigint[])
	AS v(tenant, key, owner, status, header, body, sent, ttl)
WHERE t.tenant = v.tenant AND t.key = v.key AND t.owner = v.owner AND t.`+inFlight+`
RETURNING t.tenant, t.key`, first, first+1, first+2, first+3, first+4, first+5, first+6, first+7)
}

// expiry is the TTL in microseconds a write gives rec (store.Record.Expires):
// the store's, or 0 for none.
func (s *Store) expiry(rec *store.Record) int64 {
	if !rec.Expires() {
		return 0
	}
	return micros(s.opt.TTL)
}

// The statements of a round (see writeBatch): claims alone, final answers
// alone, or both in one statement. In both, each part writes distinct rows
// (a round holds each key once), and the rows of both come back, the final
// answers' with placeholders for what only a claim returns.
var (
	completes = completesFrom(1)
	both      = `WITH c AS (` + claims + `), f AS (` + completesFrom(9) + `)
SELECT true, tenant, key, fence, lease_until, created_at, expires_at, first_sent_at, attempts, last_error, last_body, upstream_key,
	sent_kept, sent_body, sent_type, sent_encoding, now() FROM c
UNION ALL
SELECT false, tenant, key, 0, NULL, now(), NULL, NULL, 0, '', NULL, '', false, NULL, NULL, NULL, now() FROM f`
)

// completeArgs is one key's part of a batch of final answers.
type completeArgs struct {
	owner  string
	status int32
	header []byte
	body   []byte
	sent   *time.Time // nil: not sent in this sequence (NULL)
	ttl    int64      // microseconds; 0: never expires
}

// Complete implements store.Store.Complete with one UPDATE, shared with
// concurrent calls (see completes).
func (s *Store) Complete(ctx context.Context, id store.ID, owner string, resp store.Response, sent time.Time) error {
	header := headerJSON(resp.Header)
	n := int64(len(header) + len(resp.Body))
	if n > s.opt.MaxRecordBytes {
		return fmt.Errorf("pgstore: complete: %w: %d bytes, limit %d", store.ErrTooLarge, n, s.opt.MaxRecordBytes)
	}
	if resp.Status < 0 || resp.Status > math.MaxInt32 {
		return fmt.Errorf("pgstore: complete: status %d out of range", resp.Status)
	}
	final := store.Record{State: store.Final, Response: resp} // what the row becomes
	in := writeArgs{complete: &completeArgs{owner: owner, status: int32(resp.Status), header: header, body: nonNil(resp.Body),
		ttl: s.expiry(&final)}}
	if !sent.IsZero() {
		in.complete.sent = &sent
	}
	complete := s.writes.do
	if !plainText(owner) {
		complete = s.writes.alone
	}
	return s.call(ctx, "complete", &id, func(ctx context.Context) error {
		_, written, err := complete(ctx, id, in, int(n))
		if err == nil && !written {
			return store.ErrNotOwner
		}
		return err
	})
}

// abandon deletes owner's in-flight record ($1 tenant, $2 key, $3 owner).
const abandon = `DELETE FROM idemproxy_records WHERE ` + owned

// Abandon implements store.Store.Abandon. One that fails for any reason
// but ErrNotOwner is done again in the background once the database
// answers (see lostClaim): the caller has given the key up, and waiting for
// its lease to end would keep the app's retries out meanwhile.
func (s *Store) Abandon(ctx context.Context, id store.ID, owner string) error {
	err := s.ownerWrite(ctx, "abandon", id, owner, abandon)
	if err != nil && !errors.Is(err, store.ErrNotOwner) && !errors.Is(err, store.ErrClosed) && id.Key != "" {
		s.releaseLater(id, owner)
	}
	return err
}

// Renew implements store.Store.Renew.
func (s *Store) Renew(ctx context.Context, id store.ID, owner string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("pgstore: renew: lease %v is not positive", lease)
	}
	return s.ownerWrite(ctx, "renew", id, owner, `UPDATE idemproxy_records SET
		lease_until = now() + $4 * interval '1 microsecond', expires_at = NULL WHERE `+owned, micros(lease))
}

// park turns owner's in-flight record into an unknown one ($1 tenant, $2
// key, $3 owner; parkArgs gives the rest). An unknown record never expires
// (store.Unknown): forgotten, its operation would be sent again as a new one.
const park = `UPDATE idemproxy_records SET state = 3, lease_until = NULL,
	first_sent_at = CASE WHEN first_sent_at IS NULL OR $8::boolean AND $4::timestamptz IS NOT NULL THEN $4::timestamptz
		ELSE least(first_sent_at, $4::timestamptz) END,
	attempts = attempts + $5, last_error = $6,
	last_body = CASE WHEN $8::boolean THEN $7::bytea ELSE coalesce($7::bytea, last_body) END,
	sent_type = CASE WHEN sent_body IS NULL THEN $10::text ELSE sent_type END,
	sent_encoding = CASE WHEN sent_body IS NULL THEN $11::text ELSE sent_encoding END,
	sent_body = coalesce(sent_body, $9::bytea),
	expires_at = NULL WHERE ` + owned

// parkArgs are park's $4 on for o: the first send, attempts, last error,
// last body, whether the first send and the last body replace the kept
// ones (store.Outcome.SentAnew), and the request as sent, kept only if the
// record keeps none (NULL body: none).
func parkArgs(o store.Outcome) []any {
	var sent *time.Time
	if !o.FirstSentAt.IsZero() {
		sent = &o.FirstSentAt
	}
	var lastBody []byte // NULL keeps the earlier answer's body (see store.Outcome.Merge)
	if len(o.LastBody) > 0 {
		lastBody = o.LastBody
	}
	var sentBody []byte
	var sentType, sentEncoding string
	if o.Sent != nil {
		sentBody, sentType, sentEncoding = nonNil(o.Sent.Body), o.Sent.ContentType, o.Sent.ContentEncoding
	}
	return []any{sent, o.Attempts, o.LastError, lastBody, o.SentAnew, sentBody, sentType, sentEncoding}
}

// sentRow is sentColumns as scanned.
type sentRow struct {
	kept          bool
	body          []byte
	typ, encoding *string
}

// sent is the store.Sent the row keeps, nil if none.
func (r sentRow) sent() *store.Sent {
	if !r.kept {
		return nil
	}
	s := &store.Sent{Body: r.body}
	if len(s.Body) == 0 {
		s.Body = nil
	}
	if r.typ != nil {
		s.ContentType = *r.typ
	}
	if r.encoding != nil {
		s.ContentEncoding = *r.encoding
	}
	return s
}

// Park implements store.Store.Park. One that fails for any reason but
// ErrNotOwner is done again in the background once the database answers
// (see lostClaim), as long as owner still holds the record then: the
// operation may have run, and left in flight it would be listed among the
// running ones until its lease ends, with what its owner knew of it lost.
// A replica that stops redoes them before it closes the store (Settle); a
// Park after Close (store.ErrClosed: an operation still running when the
// shutdown grace ended) is not, as no process is left to redo it: another
// replica's sweep parks the record after its lease.
func (s *Store) Park(ctx context.Context, id store.ID, owner string, o store.Outcome) error {
	err := s.ownerWrite(ctx, "park", id, owner, park, parkArgs(o)...)
	if err != nil && !errors.Is(err, store.ErrNotOwner) && !errors.Is(err, store.ErrClosed) && id.Key != "" && owner != "" {
		s.parkLater(id, owner, o)
	}
	return err
}

// ownerWrite runs a write on owner's in-flight record (sql's condition is
// owned; $4 on are more, the TTL first if it sets the expiry); no row means
// store.ErrNotOwner.
func (s *Store) ownerWrite(ctx context.Context, op string, id store.ID, owner, sql string, more ...any) error {
	args := append([]any{[]byte(id.Tenant), []byte(id.Key), owner}, more...)
	return s.call(ctx, op, &id, func(ctx context.Context) error {
		tag, err := s.pool.Exec(ctx, sql, args...)
		for try := 0; idleEnded(err) && try < idleEndedTries; try++ {
			tag, err = s.pool.Exec(ctx, sql, args...) // it never ran
		}
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return store.ErrNotOwner
		}
		return nil
	})
}

// Ping implements store.Store.Ping: the database answers and accepts writes:
// it is not a standby left read-only by a failover, nor a primary whose
// sessions are read-only (default_transaction_read_only, which some managed
// databases turn on when their disk fills), nor one that refused a write for
// lack of disk space or for want of a privilege, until a probe write
// (probeWrite) passes again.
//
// Its statements run as a read's (see read): a caller that leaves (a
// readiness probe whose deadline ends on a slow database) is answered at
// once, while the statements run on within the call timeout and their
// connection goes back to the pool. Run under the caller's context, pgx
// cancelled them and dropped the connection: each timed-out probe cost the
// database a session and the pool a reconnect.
func (s *Store) Ping(ctx context.Context) error {
	return s.call(ctx, "ping", nil, func(ctx context.Context) error {
		_, err := read(ctx, s, s.ping)
		return err
	})
}

// ping is Ping's statements on conn. A refusal (see Store.refused) is
// cleared only by a probe that passed, and only if no other came while it
// ran: a probe that fails, or whose caller left, or that ends at the call
// timeout, leaves it as it was, so that Ping keeps failing while the
// database refuses claims. (Cleared first and set again by the probe's
// failure, a probe whose caller left before it failed lost it, and every
// later Ping passed without a probe while claims were refused.)
func (s *Store) ping(ctx context.Context, conn *pgxpool.Conn) (struct{}, error) {
	var none struct{}
	var standby, readOnly bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'`).
		Scan(&standby, &readOnly); err != nil {
		return none, err
	}
	if standby {
		return none, errors.New("the database is a read-only standby")
	}
	if readOnly {
		return none, errors.New("the database's sessions are read-only (default_transaction_read_only)")
	}
	refused := s.refused.Load()
	if refused == 0 {
		return none, nil
	}
	if err := probeWrite(ctx, conn); err != nil {
		return none, err
	}
	s.refused.CompareAndSwap(refused, 0)
	return none, nil
}

// probeWrite inserts a full batch of claim-like rows (batchRows, under
// random keys shaped like derived ones, so that their index entries land
// where claims' do) and rolls them back: it fails as claims would on a
// database that has no disk space for them (53100, which counts as a
// refusal again), or where idemproxy's user lacks a privilege a claim needs
// (42501, likewise: INSERT, and UPDATE and SELECT, which ON CONFLICT DO
// UPDATE ... WHERE needs). Ping runs it only once a write was refused so:
// reads and the read-only checks still pass then, while every claim is
// refused.
//
// Its keys are random UUIDs made of md5 and random(), not gen_random_uuid(),
// which is in PostgreSQL's core only from 13: on 12 (the oldest the README
// supports) the probe failed in every check, and a replica refused once
// stayed not ready (TestPingProbeNeedsNoFunctionAfter12).
//
// A batch and not one row: on a full disk the table's pages keep a little
// room (rows of refused batches and probes rolled back, records the sweep
// deleted), enough for a row now and then but not for a batch, whose
// statement fails whole. A probe of one row under one key passed in nearly
// every check whose claims were refused so, and /readyz said ready. A batch
// fits only where a batch of claims does: in room the pages have for it
// (what a vacuum gave back), or in pages the database can add again. Its
// rows, rolled back, take up their room until pruned or vacuumed, as a
// refused batch's do.
func probeWrite(ctx context.Context, conn *pgxpool.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `INSERT INTO idemproxy_records AS r (tenant, key, state, fingerprint, owner, fence, lease_until, created_at,
			method, path, upstream_key)
		SELECT ''::bytea, convert_to(u::text, 'UTF8'), 1, sha256(uuid_send(u)), 'readiness probe', 1, now(), now(),
			'POST', '/idemproxy/readiness-probe', u::text
		FROM (SELECT md5(random()::text || clock_timestamp()::text || g::text)::uuid FROM generate_series(1, $1) AS g) AS v(u)
		ON CONFLICT (tenant, key) DO UPDATE SET owner = excluded.owner WHERE r.state = 1`, batchRows)
	return err
}

// settleTimes puts a scanned row's times into r in UTC (NULL stays the zero
// time) and an empty last body as nil, as both stores give them.
func settleTimes(r *store.Record, lease, sent, expires *time.Time) {
	r.CreatedAt, r.ReadAt = r.CreatedAt.UTC(), r.ReadAt.UTC()
	if lease != nil {
		r.LeaseUntil = lease.UTC()
	}
	if sent != nil {
		r.Outcome.FirstSentAt = sent.UTC()
	}
	if expires != nil {
		r.ExpiresAt = expires.UTC()
	}
	if len(r.Outcome.LastBody) == 0 {
		r.Outcome.LastBody = nil
	}
}

// readRecord scans one row of columns; no row is store.ErrNotFound, and a
// row that does not decode (see scanRecord) an error that wraps
// store.ErrUnreadable.
func readRecord(row pgx.Row) (store.Record, error) {
	r, err := scanRecord(row)
	if err == nil && r.Unreadable != nil {
		return store.Record{}, r.Unreadable.Err
	}
	return r, err
}

// scanRecord scans one row of columns; no row is store.ErrNotFound. A row
// that scans but does not decode is returned with Record.Unreadable set and
// only ID, State and ExpiresAt (when it reads) filled in, as List shows it:
// a state this version does not know (a newer version's), a header that
// is not JSON headers, a header on an in-flight or unknown record (which
// holds no answer: a claim and a park leave it NULL), a time Go cannot hold
// (infinity), or a negative fence. Every column is scanned into a type that
// takes any value of its SQL type, so that such a row fails neither the
// scan nor the rows after it. Its Unreadable.StoreKey is its List cursor.
func scanRecord(row pgx.Row) (store.Record, error) {
	var r store.Record
	var state int16
	var fence int64
	var lease, created, sent, expires, read pgtype.Timestamptz
	var header, tenant, key []byte
	var rs sentRow
	err := row.Scan(&state, &r.Fingerprint, &r.Owner, &fence, &lease, &created, &sent,
		&r.Outcome.Attempts, &r.Outcome.LastError, &r.Response.Status, &header, &r.Response.Body,
		&tenant, &key, &r.Superseded, &r.Method, &r.Path, &r.UpstreamKey, &expires, &r.Outcome.LastBody, &r.Reviewed,
		&rs.kept, &rs.body, &rs.typ, &rs.encoding, &read)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Record{}, store.ErrNotFound
	}
	if err != nil {
		return store.Record{}, err
	}
	r.State = store.State(state)
	r.ID = store.ID{Tenant: string(tenant), Key: string(key)}
	var bad []string
	if state < int16(store.InFlight) || state > int16(store.Unknown) {
		bad = append(bad, fmt.Sprintf("state %d is not one this version knows (in flight 1, final 2, unknown 3)", state))
		r.State = store.State(max(0, min(state, 255)))
	}
	if fence < 0 {
		bad = append(bad, fmt.Sprintf("fence %d is negative", fence))
	}
	r.Fence = uint64(fence)
	for _, c := range []struct {
		name string
		ts   pgtype.Timestamptz
		to   *time.Time
	}{{"lease_until", lease, &r.LeaseUntil}, {"created_at", created, &r.CreatedAt},
		{"first_sent_at", sent, &r.Outcome.FirstSentAt}, {"expires_at", expires, &r.ExpiresAt}} {
		switch {
		case !c.ts.Valid: // NULL: the zero time
		case c.ts.InfinityModifier != pgtype.Finite:
			bad = append(bad, c.name+" is "+c.ts.InfinityModifier.String())
		default:
			*c.to = c.ts.Time.UTC()
		}
	}
	if !created.Valid {
		bad = append(bad, "created_at is NULL")
	}
	r.Response.Header = http.Header{}
	switch {
	case header == nil:
	case r.State == store.InFlight || r.State == store.Unknown:
		bad = append(bad, fmt.Sprintf("the record is %s but holds an answer's header", r.State))
	case len(header) > 0:
		if err := json.Unmarshal(header, &r.Response.Header); err != nil {
			bad = append(bad, fmt.Sprintf("header: %v", err))
		}
	}
	if len(bad) > 0 {
		return store.Record{ID: r.ID, State: r.State, ExpiresAt: r.ExpiresAt, Unreadable: &store.Unreadable{
			StoreKey: encodeCursor(r.ID),
			Err:      fmt.Errorf("%w: %s", store.ErrUnreadable, strings.Join(bad, "; ")),
		}}, nil
	}
	if len(r.Response.Body) == 0 {
		r.Response.Body = nil
	}
	if len(r.Outcome.LastBody) == 0 {
		r.Outcome.LastBody = nil
	}
	r.Outcome.Sent = rs.sent()
	if read.Valid && read.InfinityModifier == pgtype.Finite {
		r.ReadAt = read.Time.UTC()
	}
	return r, nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
