package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/ratelimit"
)

// throttleChannel is the NOTIFY channel on which a pause reaches the other
// replicas at once.
const throttleChannel = "idemproxy_throttle"

// ThrottleOptions configure Store.Throttle. Zero values have the defaults
// stated.
type ThrottleOptions struct {
	// Name is the provider whose pause and rate the replicas share:
	// replicas in front of different providers on one database use
	// different names. Required.
	Name string
	// Replica names this process in the heartbeat table; "" means the host
	// name, the process id and a random suffix.
	Replica string
	// OnPause, if set, is called with what is left of a pause another
	// replica set, from the goroutine that learnt it: at once through
	// LISTEN, from is that replica; or at a heartbeat, from is "" (a
	// notification missed while the listening connection was down).
	OnPause func(d time.Duration, from string)
	// OnReplicas, if set, is called after every heartbeat with how many
	// replicas of Name are alive, this one included (see heartbeatLoop).
	OnReplicas func(n int)
	// Keying is a digest of this replica's settings that decide an order's
	// key (what makes the key, and what binds it to a client); "" means
	// none, and is not compared. Replicas of one Name whose Keying differs
	// would give one order two keys, each a new operation for the provider.
	Keying string
	// OnKeying, if set, is called after every heartbeat with the live
	// replicas of Name whose Keying differs from this one's (none: nil).
	OnKeying func(others []string)
	// OnProviders, if set, is called after every heartbeat with the other
	// Names (providers) that live replicas on this database give, in order
	// (none: nil). Records are not kept apart by provider: deployments of
	// two providers on one database share them.
	OnProviders func(others []string)
	// Heartbeat is how often this replica writes its heartbeat row and
	// reads the pause; a replica counts as alive for three of them. 0 means
	// 2 s.
	Heartbeat time.Duration
}

// Throttle is the provider-wide throttle (ratelimit.Shared) that replicas
// sharing the database hold together, in the unlogged table
// idemproxy_throttle: a row per provider with the end of its pause, which
// only ever moves later, and the theoretical arrival time of a GCRA token
// bucket. A pause reaches the other replicas through NOTIFY, and at the
// latest at their next heartbeat; nothing is read per attempt. The bucket is
// taken in batches by the Gate, one statement per batch.
//
// Unlogged tables are not written to the WAL, so these writes do not wait
// for a disk flush; a database crash empties them, which at worst ends a
// pause early and forgets the bucket's recent use. Close stops its loops and
// hands the LISTEN connection back; the Store's Close calls it for a
// Throttle still open, since the pool cannot close while it is held.
type Throttle struct {
	s       *Store
	healthy atomic.Bool // the last heartbeat succeeded
	opt     ThrottleOptions
	ctx     context.Context // canceled by Close
	cancel  context.CancelFunc
	loops   sync.WaitGroup
	once    sync.Once
	jitter  func() float64 // in [0, 1), spreads the listener's retries

	bmu    sync.Mutex
	booked time.Time // the bucket's tat as this replica's last Take left it; zero once given back
}

var (
	_ ratelimit.Shared = (*Throttle)(nil)
	_ ratelimit.Giver  = (*Throttle)(nil)
)

// Throttle starts the provider-wide throttle for opt.Name on this store: a
// heartbeat loop and a LISTEN connection, taken from the store's pool.
func (s *Store) Throttle(opt ThrottleOptions) *Throttle {
	if opt.Heartbeat <= 0 {
		opt.Heartbeat = 2 * time.Second
	}
	if opt.Replica == "" {
		opt.Replica = replicaName()
	}
	t := &Throttle{s: s, opt: opt, jitter: mrand.Float64}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	s.throttlesMu.Lock()
	s.throttles = append(s.throttles, t)
	s.throttlesMu.Unlock()
	t.loops.Go(t.heartbeatLoop)
	t.loops.Go(t.listenLoop)
	return t
}

func replicaName() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Close stops the loops and removes this replica's heartbeat row, so that
// the others count one replica fewer at once. It gives up on the row after
// 250 ms, and does not try when the last heartbeat failed: the row stops
// counting after three heartbeats anyway, and shutdown must not wait on a
// database that does not answer.
func (t *Throttle) Close() error {
	t.once.Do(func() {
		t.cancel()
		t.loops.Wait()
		if !t.healthy.Load() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		defer cancel()
		t.s.call(ctx, "heartbeat", nil, func(ctx context.Context) error {
			_, err := t.s.pool.Exec(ctx, `DELETE FROM idemproxy_replicas WHERE replica = $1`, t.opt.Replica)
			return err
		})
	})
	return nil
}

// Pause implements ratelimit.Shared.Pause: the pause ends d from now by the
// database's clock, or later if it already did, and every replica listening
// is told what is left of it.
func (t *Throttle) Pause(ctx context.Context, d time.Duration) error {
	return t.s.call(ctx, "pause", nil, func(ctx context.Context) error {
		return againIfIdleEnded(func() error {
			_, err := t.s.pool.Exec(ctx, `
			INSERT INTO idemproxy_throttle AS t (name, paused_until)
			VALUES (@name::text, now() + @d::bigint * interval '1 microsecond')
			ON CONFLICT (name) DO UPDATE SET paused_until = greatest(t.paused_until, excluded.paused_until)
			RETURNING pg_notify('`+throttleChannel+`', json_build_object('name', t.name, 'from', @from::text,
				'us', (extract(epoch FROM t.paused_until - now()) * 1000000)::bigint)::text)`,
				pgx.NamedArgs{"name": t.opt.Name, "d": micros(d), "from": t.opt.Replica})
			return err
		})
	})
}

// Take implements ratelimit.Shared.Take with one statement: the bucket's
// theoretical arrival time moves n tokens later from now or from where it
// stood, unless the first token would come later than maxWait.
func (t *Throttle) Take(ctx context.Context, n int, perSecond float64, burst int, maxWait time.Duration) (time.Duration, error) {
	if n < 1 || perSecond <= 0 {
		return 0, fmt.Errorf("pgstore: take: %d tokens at %v per second", n, perSecond)
	}
	every := 1e6 / perSecond // microseconds
	span := int64(math.Ceil(float64(n) * every))
	// The first token leaves lead+(1-burst)*every from now.
	limit := micros(max(min(maxWait, time.Hour), 0)) + int64(float64(max(burst, 1)-1)*every)
	var (
		lead int64
		tat  time.Time
	)
	booked := false
	err := t.s.call(ctx, "take", nil, func(ctx context.Context) error {
		err := againIfIdleEnded(func() error {
			return t.s.pool.QueryRow(ctx, `
			INSERT INTO idemproxy_throttle AS t (name, tat) VALUES (@name::text, now() + @span::bigint * interval '1 microsecond')
			ON CONFLICT (name) DO UPDATE SET tat = greatest(t.tat, now()) + @span::bigint * interval '1 microsecond'
				WHERE greatest(t.tat, now()) <= now() + @limit::bigint * interval '1 microsecond'
			RETURNING (extract(epoch FROM t.tat - now()) * 1000000)::bigint - @span::bigint, t.tat`,
				pgx.NamedArgs{"name": t.opt.Name, "span": span, "limit": limit}).Scan(&lead, &tat)
		})
		if errors.Is(err, pgx.ErrNoRows) { // the row is there, but booked too far
			booked, err = true, nil
		}
		return err
	})
	if booked {
		return 0, fmt.Errorf("pgstore: take: the bucket is booked beyond %v: %w", maxWait, ratelimit.ErrDeadline)
	}
	if err != nil {
		return 0, err
	}
	t.bmu.Lock()
	t.booked = tat
	t.bmu.Unlock()
	return time.Duration(max(lead, 0)) * time.Microsecond, nil
}

// Give implements ratelimit.Giver: the last n tokens of this replica's last
// Take go back to the bucket (its theoretical arrival time moves n tokens
// earlier), provided no replica has taken tokens since; otherwise nothing
// changes, as others' tokens were placed after these. It gives back once per
// Take.
func (t *Throttle) Give(ctx context.Context, n int, perSecond float64) error {
	if n < 1 || perSecond <= 0 {
		return nil
	}
	t.bmu.Lock()
	booked := t.booked
	t.booked = time.Time{}
	t.bmu.Unlock()
	if booked.IsZero() {
		return nil
	}
	span := int64(float64(n) * 1e6 / perSecond) // rounded down: never more than was taken
	return t.s.call(ctx, "give", nil, func(ctx context.Context) error {
		return againIfIdleEnded(func() error {
			_, err := t.s.pool.Exec(ctx, `
			UPDATE idemproxy_throttle SET tat = tat - @span::bigint * interval '1 microsecond'
			WHERE name = @name::text AND tat = @booked::timestamptz`,
				pgx.NamedArgs{"name": t.opt.Name, "span": span, "booked": booked})
			return err
		})
	})
}

// pauseLeft is what is left of a throttle row's pause, in microseconds, 0
// when none runs. A row the rate limit created (Take) and no pause has
// touched holds paused_until '-infinity', which PostgreSQL cannot subtract
// from now() (SQLSTATE 22008): read as it stood, every heartbeat failed and
// no listener could start once the bucket's row was there.
const pauseLeft = `(extract(epoch FROM greatest(paused_until, now()) - now()) * 1000000)::bigint`

// heartbeatLoop writes this replica's heartbeat row and reads the live
// replica count and the pause, every Heartbeat until Close.
//
// The count is of the replicas of Name alone: another provider's replicas
// on the same database have their own rate, and counting them would shrink
// this provider's share while the database is down. A row whose provider is
// empty was written by a version before schema 6, which did not name it (a
// rolling upgrade from it): it counts for every provider, as all rows did
// then, so that no share is too large while such a replica runs.
func (t *Throttle) heartbeatLoop() {
	tick := time.NewTicker(t.opt.Heartbeat)
	defer tick.Stop()
	for {
		t.beat()
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (t *Throttle) beat() {
	var n int
	var left *int64
	var others, providers []string
	err := t.s.call(t.ctx, "heartbeat", nil, func(ctx context.Context) error {
		return t.s.pool.QueryRow(ctx, `
			WITH beat AS (
				INSERT INTO idemproxy_replicas (replica, seen_at, provider, keying) VALUES (@replica::text, now(), @name::text, @keying::text)
				ON CONFLICT (replica) DO UPDATE SET seen_at = now(), provider = excluded.provider, keying = excluded.keying
			), gone AS (
				DELETE FROM idemproxy_replicas WHERE seen_at < now() - interval '1 hour'
			)
			SELECT 1 + (SELECT count(*) FROM idemproxy_replicas
					WHERE replica <> @replica::text AND seen_at > now() - @live::bigint * interval '1 microsecond'
					AND provider IN (@name::text, '')),
				(SELECT `+pauseLeft+` FROM idemproxy_throttle WHERE name = @name::text),
				(SELECT array_agg(replica ORDER BY replica) FROM idemproxy_replicas
					WHERE replica <> @replica::text AND seen_at > now() - @live::bigint * interval '1 microsecond'
					AND provider = @name::text AND keying <> '' AND @keying::text <> '' AND keying <> @keying::text),
				(SELECT array_agg(DISTINCT provider ORDER BY provider) FROM idemproxy_replicas
					WHERE replica <> @replica::text AND seen_at > now() - @live::bigint * interval '1 microsecond'
					AND provider <> '' AND provider <> @name::text)`,
			pgx.NamedArgs{"replica": t.opt.Replica, "name": t.opt.Name, "keying": t.opt.Keying,
				"live": micros(3 * t.opt.Heartbeat)}).Scan(&n, &left, &others, &providers)
	})
	t.healthy.Store(err == nil)
	if err != nil {
		if t.ctx.Err() == nil {
			t.s.opt.Logger.Debug("throttle heartbeat failed", "err", err)
		}
		return
	}
	if t.opt.OnReplicas != nil {
		t.opt.OnReplicas(n)
	}
	if t.opt.OnKeying != nil {
		t.opt.OnKeying(others)
	}
	if t.opt.OnProviders != nil {
		t.opt.OnProviders(providers)
	}
	if left != nil && *left > 0 && t.opt.OnPause != nil {
		t.opt.OnPause(time.Duration(*left)*time.Microsecond, "")
	}
}

// The listener's retries: the first comes within listenRetryFirst of the
// connection's loss, and each failed attempt doubles the wait up to
// listenRetryMax, the default heartbeat, so that once the database answers
// again the listener is back within about a heartbeat, not after a backoff
// grown through a long outage. Each wait is drawn between half and all of
// it, so that replicas that lost the database together do not reconnect in
// step. Each attempt ends within the call timeout (see listen).
const (
	listenRetryFirst = 250 * time.Millisecond
	listenRetryMax   = 2 * time.Second
)

// listenRetry is the wait before the next attempt after failures failed
// ones in a row (0 when the connection was just lost); jitter, in [0, 1),
// places it between half and all of the backoff.
func listenRetry(failures int, jitter float64) time.Duration {
	wait := listenRetryMax
	if failures < 8 {
		wait = min(listenRetryFirst<<failures, listenRetryMax)
	}
	return wait/2 + time.Duration(jitter*float64(wait/2))
}

// listenLoop keeps a connection listening for pauses until Close: it
// reconnects at once when the connection's lifetime is over (errRetired), and
// after listenRetry when it breaks or cannot be had.
func (t *Throttle) listenLoop() {
	failures := 0
	for {
		listened, err := t.listen()
		if t.ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRetired) {
			t.s.opt.Logger.Debug("throttle: listening connection retired at its lifetime; listening on another")
			failures = 0
			continue
		}
		if listened {
			failures = 0
		}
		wait := listenRetry(failures, t.jitter())
		failures++
		t.s.opt.Logger.Debug("throttle: not listening for pauses", "err", redact(err), "retry_in", wait.String())
		select {
		case <-t.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// errRetired ends a listening connection whose lifetime in the pool is over.
var errRetired = errors.New("the connection's lifetime is over")

// notice is the payload of a pause notification.
type notice struct {
	Name string `json:"name"`
	From string `json:"from"`
	Us   int64  `json:"us"` // what was left of the pause when it was set
}

// listen takes a connection from the store's pool, listens on it and passes
// pauses on until the connection fails, its lifetime is over (errRetired) or
// Close; listened says whether it got as far as listening. The connection is
// the pool's, held while it listens, so that pool_max_conns bounds every
// connection a replica opens (see minConns), and no longer than the pool
// would keep it (pool_max_conn_lifetime, see retireAt); it is closed at the
// end, never handed back listening.
func (t *Throttle) listen() (listened bool, err error) {
	cctx, cancel := context.WithTimeout(t.ctx, t.s.opt.CallTimeout)
	pooled, err := t.s.pool.Acquire(cctx)
	if err == nil {
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			pooled.Conn().Close(ctx)
			pooled.Release() // closed: the pool drops it
		}()
		err = t.startListening(cctx, pooled.Conn())
	}
	cancel()
	if err != nil {
		return false, err
	}
	conn := pooled.Conn()
	ctx := t.ctx
	if at, ok := retireAt(conn, time.Now()); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(t.ctx, at)
		defer cancel()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if t.ctx.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return true, errRetired
			}
			return true, err
		}
		var p notice
		if json.Unmarshal([]byte(n.Payload), &p) != nil || p.Name != t.opt.Name || p.From == t.opt.Replica || p.Us <= 0 {
			continue
		}
		if t.opt.OnPause != nil {
			t.opt.OnPause(time.Duration(p.Us)*time.Microsecond, p.From)
		}
	}
}

// startListening listens on conn, and then reads the pause: one set from
// LISTEN on comes as a notification, and one set before, while no connection
// listened, is in the row, known at once rather than at the next heartbeat.
// (Each is its own statement: a LISTEN takes effect when its transaction
// commits, so a read in the same transaction could miss a pause set between
// the two.) The read carries listenerMark, so that pg_stat_activity shows a
// session that listens and has read the pause (idle, its last statement
// marked): a pause set from then on comes to it as a notification, naming
// the replica that set it. The read is sent in the simple protocol, one
// message run at once: with pgx's default, a statement is first prepared in
// a round trip of its own, after which the session showed idle with the read
// as its last statement before the read ran, and a pause set in between
// came from the read, not as a notification naming its replica
// (TestThrottlePause failed 4 of 80 runs with -race).
func (t *Throttle) startListening(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "LISTEN "+throttleChannel); err != nil {
		return err
	}
	var left int64
	err := conn.QueryRow(ctx, `SELECT /* `+listenerMark+` */ `+pauseLeft+` FROM idemproxy_throttle WHERE name = $1`,
		pgx.QueryExecModeSimpleProtocol, t.opt.Name).Scan(&left)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	if left > 0 && t.opt.OnPause != nil {
		t.opt.OnPause(time.Duration(left)*time.Microsecond, "")
	}
	return nil
}

// listenerMark is in the statement a listening connection ran last (its
// read of the pause), for pg_stat_activity: a session whose query holds it
// and whose state is idle listens for pauses.
const listenerMark = "idemproxy pause listener"

// retireKey holds, in a connection's CustomData, when its lifetime in the
// pool is over (stampRetire).
const retireKey = "idemproxy.retire"

// stampRetire is the pool's AfterConnect: it notes on each new connection
// when its lifetime is over, as pgxpool reckons it (pool_max_conn_lifetime
// and a random part of pool_max_conn_lifetime_jitter, from its connecting).
// pgxpool retires a connection only when it is handed back or idle, never
// while it is held; the listener, which holds its connection, retires it
// itself at that time (retireAt). A lifetime of 0 or less is none.
func stampRetire(lifetime, jitter time.Duration) func(context.Context, *pgx.Conn) error {
	return func(_ context.Context, c *pgx.Conn) error {
		if lifetime > 0 {
			c.PgConn().CustomData()[retireKey] = time.Now().Add(lifetime + mrand.N(max(jitter, 0)+1))
		}
		return nil
	}
}

// listenMinHold is the least a listener holds a connection before retiring
// it: with a tiny lifetime, the listener would otherwise reconnect in a
// tight loop.
const listenMinHold = time.Second

// retireAt is when the listener gives conn up: at the end of its lifetime in
// the pool, at least listenMinHold after now. A connection without a
// lifetime has none (ok false).
func retireAt(conn *pgx.Conn, now time.Time) (at time.Time, ok bool) {
	at, ok = conn.PgConn().CustomData()[retireKey].(time.Time)
	if !ok {
		return time.Time{}, false
	}
	return later(at, now.Add(listenMinHold)), true
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
