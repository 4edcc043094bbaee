package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestReadyzOnHungDatabaseCountsUnavailable: with the database hung (every
// process of the cluster stopped with SIGSTOP) and no traffic, /readyz
// answers 503 once its 2 s bound runs out, and /metrics counts the ping as
// idemproxy_store_errors_total{kind="unavailable",op="ping"}, so that an
// alert on kind="unavailable" fires for a hung database too. A probe whose
// client goes away before the bound is still counted canceled. Before, the
// readiness probe's own deadline was counted canceled, as if its caller had
// left.
func TestReadyzOnHungDatabaseCountsUnavailable(t *testing.T) {
	c, url := pgtest.Own(t, pgtest.Options{})
	up := httptest.NewServer(newDedupProvider())
	defer up.Close()
	p := launch(t, launchSpec{env: sharedEnv(up.URL, url)})
	waitReady(t, "start", p)

	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer c.Thaw()
	start := time.Now()
	if s := getStatus(t, "http://"+p.admin+"/readyz"); s != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the database hung = %d, want 503", s)
	}
	took := time.Since(start)
	if took < 2*time.Second || took > 4*time.Second {
		t.Errorf("/readyz with the database hung answered after %v, want its 2 s bound", took.Round(time.Millisecond))
	}
	const unavailable, canceled = `idemproxy_store_errors_total{kind="unavailable",op="ping"}`,
		`idemproxy_store_errors_total{kind="canceled",op="ping"}`
	m := scrape(t, "http://"+p.admin+"/metrics")
	if m[unavailable] != 1 || m[canceled] != 0 {
		t.Fatalf("after one /readyz on the hung database: %s = %v, %s = %v; want 1 and 0",
			unavailable, m[unavailable], canceled, m[canceled])
	}

	// A probe whose client leaves after 300 ms: the caller went away.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("/readyz answered %d before the client left, with the database hung", resp.StatusCode)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m = scrape(t, "http://"+p.admin+"/metrics")
		if m[canceled] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a /readyz whose client left: %s = %v, want 1", canceled, m[canceled])
		}
	}
	if m[unavailable] != 1 {
		t.Errorf("a /readyz whose client left: %s = %v, want it still 1", unavailable, m[unavailable])
	}
}
