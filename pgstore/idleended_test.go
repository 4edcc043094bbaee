package pgstore

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// slowReturnProxy listens on loopback and forwards each connection to
// target, passing what the server sends back as late as delay says at the
// time (nanoseconds): what the client sends arrives at once. It returns the
// proxy's host:port.
func slowReturnProxy(t *testing.T, target string, delay *atomic.Int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			open = append(open, client, server)
			mu.Unlock()
			wg.Go(func() {
				io.Copy(server, client)
				server.(*net.TCPConn).CloseWrite()
			})
			type chunk struct {
				at time.Time
				b  []byte
			}
			chunks := make(chan chunk, 1024)
			wg.Go(func() {
				defer close(chunks)
				for {
					buf := make([]byte, 32<<10)
					n, err := server.Read(buf)
					if n > 0 {
						chunks <- chunk{time.Now().Add(time.Duration(delay.Load())), buf[:n]}
					}
					if err != nil {
						return
					}
				}
			})
			wg.Go(func() {
				defer client.Close()
				for c := range chunks {
					time.Sleep(time.Until(c.at))
					if _, err := client.Write(c.b); err != nil {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

// TestSessionEndedIdleJustBeforeAStatement: the server ends a session for
// idle_session_timeout (FATAL 57P05) while the store, not yet having read
// that, sends a statement on it: the pool's check before handing the
// connection out (shouldPing) saw nothing yet. The statement never ran (the
// session was idle, in no transaction), so it is sent again on another
// connection; it failed, and a claim answered 503 store_unavailable (about
// 1 in 667 requests with idle_session_timeout under a second), a final
// answer's write after the provider acted failed too, and so did a read.
// The race is made certain here: what the server sends reaches the store
// 150 ms late, its sessions end after 300 ms idle, and each call comes
// 220 ms after the last answer: the server has ended the session (idle
// 150 + 220 ms) and its FATAL is still on the way (due 300 ms after the
// answer). Statements sent back to back leave the server idle 150 ms, with
// 150 ms to spare for a slow host.
func TestSessionEndedIdleJustBeforeAStatement(t *testing.T) {
	dbURL := pgtest.Database(t)
	ctx := context.Background()
	admin := session(t, dbURL)
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgtest.DatabaseName(dbURL)+` SET idle_session_timeout = '300ms'`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var delay atomic.Int64
	u.Host = slowReturnProxy(t, u.Host, &delay)
	q := u.Query()
	q.Set("pool_max_conns", "4")
	u.RawQuery = q.Encode()
	s, err := Open(ctx, Options{URL: u.String(), TTL: time.Hour, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	// Opened without the delay: its schema check holds one session while
	// it opens another, longer than the timeout with every answer late.
	// On a loaded host it may outlast the timeout even so: Open then puts
	// the schema in place in the background, waited for here.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := s.Get(ctx, store.ID{Key: "schema"})
		if errors.Is(err, store.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("schema not in place 30 s after Open: %v", err)
		}
	}
	delay.Store(int64(150 * time.Millisecond))
	const gap = 220 * time.Millisecond
	req := store.Request{Fingerprint: []byte("fp")}
	var ended atomic.Int64
	count := func(err error) {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "57P05" {
			ended.Add(1)
		}
	}
	// Every call comes gap after the one before it answered.
	if _, err := s.Get(ctx, store.ID{Key: "warm"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("warm-up read: %v", err)
	}
	const rounds = 6
	for i := range rounds {
		id := store.ID{Key: "k" + string(rune('a'+i))}
		time.Sleep(gap)
		if _, created, err := s.Begin(ctx, id, req, "o", time.Minute); err != nil || !created {
			count(err)
			t.Errorf("claim %d: %v, %v", i, created, err)
		}
		time.Sleep(gap)
		if _, err := s.Get(ctx, id); err != nil {
			count(err)
			t.Errorf("read %d: %v", i, err)
		}
		time.Sleep(gap)
		if err := s.Renew(ctx, id, "o", time.Minute); err != nil {
			count(err)
			t.Errorf("lease renewal %d: %v", i, err)
		}
		time.Sleep(gap)
		if err := s.Complete(ctx, id, "o", store.Response{Status: 201, Body: []byte("{}")}, time.Now()); err != nil {
			count(err)
			t.Errorf("final answer %d: %v", i, err)
		}
	}
	if n := ended.Load(); n > 0 {
		t.Errorf("%d of %d calls failed on a session the server had ended while idle (57P05): the statement never ran", n, 4*rounds)
	}

	// The provider-wide throttle's statements alike: a failed take marked
	// the shared bucket down for seconds (each replica pacing alone), a
	// failed pause left the other replicas sending into the provider's
	// pause. Its heartbeat and LISTEN connection take connections of
	// their own; the calls below still meet just-used ones.
	ended.Store(0)
	th := s.Throttle(ThrottleOptions{Name: "p", Heartbeat: time.Hour})
	defer th.Close()
	for i := range rounds {
		time.Sleep(gap)
		if _, err := th.Take(ctx, 1, 1000, 1, time.Minute); err != nil {
			count(err)
			t.Errorf("take %d: %v", i, err)
		}
		time.Sleep(gap)
		if err := th.Give(ctx, 1, 1000); err != nil {
			count(err)
			t.Errorf("give back %d: %v", i, err)
		}
		time.Sleep(gap)
		if err := th.Pause(ctx, time.Millisecond); err != nil {
			count(err)
			t.Errorf("pause %d: %v", i, err)
		}
	}
	if n := ended.Load(); n > 0 {
		t.Errorf("%d of %d throttle calls failed on a session the server had ended while idle (57P05)", n, 3*rounds)
	}
}
