package main

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// At the connection bound, clients idle between requests (keep-alive) are
// closed so that a new client is served at once instead of waiting for an
// idle timeout; busy connections are never closed.
func TestConnLimiterClosesIdleAtTheBound(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := newConnLimiter(ln, 2)
	busy := make(chan struct{})
	srv := &http.Server{ConnState: cl.ConnState, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/busy" {
			<-busy
		}
		io.WriteString(w, "ok")
	})}
	go srv.Serve(cl)
	defer srv.Close()
	url := "http://" + ln.Addr().String()
	get := func(c *http.Client, path string) error {
		resp, err := c.Get(url + path)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	newClient := func() *http.Client {
		return &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	}
	// Two keep-alive clients fill the bound and stay idle.
	for range 2 {
		if err := get(newClient(), "/"); err != nil {
			t.Fatal(err)
		}
	}
	// A third is served: an idle one made room.
	if err := get(newClient(), "/"); err != nil {
		t.Fatalf("new client at the bound: %v", err)
	}
	// One busy connection and one idle: a new client still gets the idle
	// one's slot, and the busy request completes.
	done := make(chan error, 1)
	go func() { done <- get(newClient(), "/busy") }()
	for {
		cl.mu.Lock()
		open, idle := cl.open, len(cl.idle)
		cl.mu.Unlock()
		if open == 2 && idle == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling a state, not timing
	}
	if err := get(newClient(), "/"); err != nil {
		t.Fatalf("new client next to a busy one: %v", err)
	}
	close(busy)
	if err := <-done; err != nil {
		t.Errorf("the busy request: %v", err)
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.open > 2 {
		t.Errorf("%d connections open, bound 2", cl.open)
	}
	if cl.evicted < 2 {
		t.Errorf("%d idle connections closed, want at least 2", cl.evicted)
	}
}
