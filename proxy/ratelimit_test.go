package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/ratelimit"
	"github.com/idemproxy/idemproxy/upstream"
)

// Clients that give up while queued for a rate-limit token use none of it:
// at 10 per second, 100 unprotected GETs whose clients hang up after 300 ms,
// then one order. The order is sent within a few tokens' time, not after the
// tokens the 100 had queued for (it waited 9.6 s: a reservation of
// golang.org/x/time/rate gives nothing back once later ones exist, and the
// earliest waiters left first). Real limiter, real clock; the bound is 20
// tokens' time, five times the slack a loaded machine needs here.
func TestRateLimitedClientsThatLeaveUseNoTokens(t *testing.T) {
	const (
		rate     = 10
		leavers  = 100
		patience = 300 * time.Millisecond
	)
	gate := ratelimit.New(rate, 1)
	e := newEnvUpstream(t, func(c *upstream.Config) { c.Gate = gate })
	var gaveUp atomic.Int32
	var wg sync.WaitGroup
	for i := range leavers {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/payments/p%d", e.srv.URL, i), nil)
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				gaveUp.Add(1)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	// Tokens came every 100 ms while they waited: a handful were answered.
	total, _ := e.prov.counts()
	if most := int(patience*rate/time.Second) + 1 + 5; total > most || int(gaveUp.Load()) < leavers-most {
		t.Fatalf("%d GETs reached the provider and %d clients gave up; want at most %d and the rest", total, gaveUp.Load(), most)
	}
	time.Sleep(50 * time.Millisecond) // the proxy sees the hang-ups

	start := time.Now()
	a := e.do(t, "POST", "/v1/payments", order)
	took := time.Since(start)
	if a.status != http.StatusCreated {
		t.Fatalf("order answered %d %s, want 201", a.status, a.body)
	}
	if bound := 20 * time.Second / rate; took > bound {
		t.Errorf("the order took %v after %d clients left the queue, want at most %v (%d tokens at %d per second): the leavers' tokens were not given back",
			took.Round(time.Millisecond), gaveUp.Load(), bound, 20, rate)
	}
	t.Logf("%d GETs answered, %d clients gave up; the order took %v", total, gaveUp.Load(), took.Round(time.Millisecond))
}
