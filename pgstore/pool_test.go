package pgstore

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// withQuery returns raw with the query parameters kv (name, value, …) set.
func withQuery(t *testing.T, raw string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// TestPoolMaxConnsBoundsTheReplica: with pool_max_conns=4 in the URL, a
// store under concurrent load (claims, final answers, reads, renewals,
// bucket takes) with its throttle listening, its heartbeat, sweep and
// ANALYZE check running, never has more than 4 sessions in
// pg_stat_activity, counted by the application_name the URL gives. The
// URL's pool_max_conns was overwritten by the default of 32, and the
// listening connection came on top of the pool.
func TestPoolMaxConnsBoundsTheReplica(t *testing.T) {
	dbURL := pgtest.Database(t)
	name := fmt.Sprintf("idemproxy-pool-%d", time.Now().UnixNano())
	ctx := context.Background()
	s, err := Open(ctx, Options{URL: withQuery(t, dbURL, "pool_max_conns", "4", "application_name", name),
		SweepInterval: 5 * time.Millisecond, AnalyzeInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	th := s.Throttle(ThrottleOptions{Name: "https://provider.test", Heartbeat: 5 * time.Millisecond})
	defer th.Close()

	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	sessions := func() (all, listening int) {
		t.Helper()
		if err := admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE query LIKE '%`+listenerMark+`%')
			FROM pg_stat_activity WHERE application_name = $1`, name).Scan(&all, &listening); err != nil {
			t.Fatal(err)
		}
		return all, listening
	}
	// The throttle listens before the load starts, so that every sample
	// below counts its connection.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if _, l := sessions(); l == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the throttle's LISTEN session, under the URL's application_name, did not appear within a minute")
		}
	}

	const workers, keys = 32, 15
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for k := range keys {
				if err := poolLoad(ctx, s, th, fmt.Sprintf("w%d-k%d", w, k)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	peak, samples := 0, 0
	for sampling := true; sampling; {
		select {
		case <-done:
			sampling = false
		default:
		}
		all, listening := sessions()
		samples++
		peak = max(peak, all)
		if all > 4 || listening != 1 {
			t.Errorf("%d sessions of the replica (%d listening) with pool_max_conns=4, want at most 4 (1 listening)", all, listening)
			break
		}
	}
	<-done
	close(errs)
	for err := range errs {
		t.Errorf("under load: %v", err)
	}
	if got := s.pool.Stat().MaxConns(); got != 4 {
		t.Errorf("pool size %d, want pool_max_conns=4", got)
	}
	if peak < 2 {
		t.Errorf("at most %d sessions seen over %d samples: the load did not use the pool", peak, samples)
	}
	t.Logf("peak %d sessions over %d samples", peak, samples)
}

// poolLoad runs one key's calls: a claim, a read, a renewal, a bucket take
// and the final answer.
func poolLoad(ctx context.Context, s *Store, th *Throttle, key string) error {
	id := store.ID{Tenant: "t", Key: key}
	if _, created, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/p"}, "o", time.Minute); err != nil || !created {
		return fmt.Errorf("begin %s: created %v, %v", key, created, err)
	}
	if _, err := s.Get(ctx, id); err != nil {
		return fmt.Errorf("get %s: %w", key, err)
	}
	if err := s.Renew(ctx, id, "o", time.Minute); err != nil {
		return fmt.Errorf("renew %s: %w", key, err)
	}
	if _, err := th.Take(ctx, 1, 1e6, 1000, time.Minute); err != nil {
		return fmt.Errorf("take: %w", err)
	}
	if err := s.Complete(ctx, id, "o", store.Response{Status: 201, Body: []byte("ok")}, time.Time{}); err != nil {
		return fmt.Errorf("complete %s: %w", key, err)
	}
	return nil
}

// TestPoolURLParameters: what Open makes of the URL's pool and connection
// parameters, and what CheckURL refuses (naming the parameter, never the
// password). It connects to nothing.
func TestPoolURLParameters(t *testing.T) {
	const base = "postgres://u:Pw-secret-9@127.0.0.1:5432/db"
	ok := []struct {
		query       string
		maxConns    int32
		minConns    int32
		connTimeout time.Duration
		appName     string
		lifetime    time.Duration
	}{
		{"", 32, 0, 5 * time.Second, "idemproxy", time.Hour},
		{"?pool_max_conns=8", 8, 0, 5 * time.Second, "idemproxy", time.Hour},
		{"?pool_max_conns=4&pool_min_conns=4", 4, 4, 5 * time.Second, "idemproxy", time.Hour},
		{"?pool_min_conns=2&pool_max_conn_lifetime=10m", 32, 2, 5 * time.Second, "idemproxy", 10 * time.Minute},
		{"?connect_timeout=2", 32, 0, 2 * time.Second, "idemproxy", time.Hour},
		{"?connect_timeout=60", 32, 0, 5 * time.Second, "idemproxy", time.Hour},
		{"?connect_timeout=0", 32, 0, 5 * time.Second, "idemproxy", time.Hour},
		{"?application_name=payments-eu", 32, 0, 5 * time.Second, "payments-eu", time.Hour},
	}
	for _, c := range ok {
		t.Run("takes"+c.query, func(t *testing.T) {
			if err := CheckURL(base + c.query); err != nil {
				t.Fatalf("CheckURL: %v", err)
			}
			cfg, set, err := poolConfig(withDefaults(Options{URL: base + c.query}))
			if err != nil {
				t.Fatal(err)
			}
			rp := cfg.ConnConfig.RuntimeParams
			if cfg.MaxConns != c.maxConns || cfg.MinConns != c.minConns || cfg.ConnConfig.ConnectTimeout != c.connTimeout ||
				rp["application_name"] != c.appName || cfg.MaxConnLifetime != c.lifetime {
				t.Errorf("max %d min %d connect timeout %v application_name %q lifetime %v; want %d %d %v %q %v",
					cfg.MaxConns, cfg.MinConns, cfg.ConnConfig.ConnectTimeout, rp["application_name"], cfg.MaxConnLifetime,
					c.maxConns, c.minConns, c.connTimeout, c.appName, c.lifetime)
			}
			if set["synchronous_commit"] != "on" || set["plan_cache_mode"] != "force_generic_plan" {
				t.Errorf("session settings %v, want synchronous_commit on and plan_cache_mode force_generic_plan", set)
			}
		})
	}
	// The URL cannot lower durability: synchronous_commit stays on.
	cfg, set, err := poolConfig(withDefaults(Options{URL: base + "?synchronous_commit=off"}))
	if _, sent := cfg.ConnConfig.RuntimeParams["synchronous_commit"]; err != nil || set["synchronous_commit"] != "on" || sent {
		t.Errorf("synchronous_commit=off in the URL: session %v, startup %v, %v; want on, set after connecting", set, cfg.ConnConfig.RuntimeParams, err)
	}

	refused := []struct{ query, want string }{
		{"?pool_max_conns=3", "pool_max_conns=3 is below 4"},
		{"?pool_max_conns=1", "pool_max_conns=1 is below 4"},
		{"?pool_max_conns=0", "pool_max_conns=0 is below 4"},
		{"?pool_max_conns=many", "pool_max_conns is not a whole number"},
		{"?pool_max_conns=8&pool_min_conns=9", "pool_min_conns=9 is above the pool's size, pool_max_conns=8"},
		{"?pool_min_conns=33", "pool_min_conns=33 is above the pool's size, pool_max_conns=32"},
		{"?pool_max_conns=4&pool_min_idle_conns=5", "pool_min_idle_conns=5 is above the pool's size, pool_max_conns=4"},
		{"?pool_health_check_period=0s", "pool_health_check_period=0s is not positive"},
	}
	for _, c := range refused {
		t.Run("refuses"+c.query, func(t *testing.T) {
			err := CheckURL(base + c.query)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("CheckURL = %v, want an error saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), "Pw-secret-9") {
				t.Errorf("the error shows the password: %v", err)
			}
			if _, err := Open(context.Background(), Options{URL: base + c.query}); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Open = %v, want an error saying %q", err, c.want)
			}
		})
	}
}
