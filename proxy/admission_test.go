package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/store"
)

// park holds the provider and starts orders that wait there; the
// returned func releases them and checks their answers.
func park(t *testing.T, e *env, bodies ...string) (release func()) {
	t.Helper()
	hold := make(chan struct{})
	e.prov.set(func(p *provider) { p.hold, p.entered = hold, make(chan string, len(bodies)+1) })
	errs := make(chan error, len(bodies))
	for _, b := range bodies {
		go func() {
			a, err := sendBelowBound(e, b)
			if err == nil && a.status != http.StatusCreated {
				err = fmt.Errorf("parked order: status %d %s", a.status, a.body)
			}
			errs <- err
		}()
	}
	for range bodies {
		select {
		case <-e.prov.entered:
		case err := <-errs:
			close(hold)
			t.Fatalf("an order to park was answered without reaching the provider: %v", err)
		}
	}
	return func() {
		close(hold)
		for range bodies {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
}

// sendBelowBound POSTs body and sends it again while it is refused
// overloaded, as an app does after Retry-After: a request gives its slot and
// body bytes back only after its answer has reached the client, so a
// request sent right after an answer can still meet the bound that answer's
// request held. The tries are bounded (10,000, a millisecond apart, far
// more than a handler needs to return once its answer is out, even under
// the race detector on a loaded machine), so a bound that is never given
// back fails the test instead of hanging it. Tests expecting the refusal
// use e.do.
func sendBelowBound(e *env, body string) (answer, error) {
	for i := 0; ; i++ {
		a, err := e.send(http.MethodPost, "/v1/payments", body)
		if err != nil || a.status != http.StatusServiceUnavailable || !strings.Contains(string(a.body), `"overloaded"`) || i == 10000 {
			return a, err
		}
		time.Sleep(time.Millisecond)
	}
}

func orderOf(id string, pad int) string {
	return `{"order_id":"` + id + `","amount":"10.00","note":"` + strings.Repeat("x", pad) + `"}`
}

// checkOverloaded asserts the refusal: 503 overloaded with Retry-After, the
// provider never saw the key and no record holds it.
func checkOverloaded(t *testing.T, e *env, a answer, key string) {
	t.Helper()
	if a.status != http.StatusServiceUnavailable || errorCode(t, a) != "overloaded" || a.header.Get("Retry-After") == "" {
		t.Fatalf("got %d %s Retry-After %q; want 503 overloaded with Retry-After", a.status, a.body, a.header.Get("Retry-After"))
	}
	if _, err := e.store.Get(context.Background(), store.ID{Tenant: proxy.DefaultTenant, Key: key}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("record for the refused order: %v; want none (the key left free)", err)
	}
	e.prov.mu.Lock()
	defer e.prov.mu.Unlock()
	if n := e.prov.requests[key]; n != 0 {
		t.Errorf("the provider saw the refused order %d times", n)
	}
}

// orderKey is the key idemproxy derives for an order id.
func orderKey(t *testing.T, e *env, orderID string) string {
	t.Helper()
	k, err := e.h.OrderKeys(http.MethodPost, "/v1/payments", orderID, proxy.DefaultTenant, 1)
	if err != nil {
		t.Fatal(err)
	}
	return k[0]
}

func TestOverloadPastMaxInflight(t *testing.T) {
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.MaxInflight = 2 })
	if a := e.do(t, http.MethodPost, "/v1/payments", orderOf("stored", 0)); a.status != http.StatusCreated {
		t.Fatalf("first order: %d %s", a.status, a.body)
	}
	release := park(t, e, orderOf("p1", 0), orderOf("p2", 0))

	a := e.do(t, http.MethodPost, "/v1/payments", orderOf("third", 0))
	checkOverloaded(t, e, a, orderKey(t, e, "third"))
	if a := e.do(t, http.MethodGet, "/v1/payments/1", ""); a.status != http.StatusServiceUnavailable || errorCode(t, a) != "overloaded" {
		t.Errorf("unprotected GET past the bound: %d %s, want 503 overloaded", a.status, a.body)
	}
	// A repeat of a stored order costs a store read and sends nothing: it
	// is replayed even at the bound.
	if a := e.do(t, http.MethodPost, "/v1/payments", orderOf("stored", 0)); a.status != http.StatusCreated || a.header.Get(proxy.ReplayedHeader) != "true" {
		t.Errorf("replay at the bound: %d %s, want the stored 201 replayed", a.status, a.body)
	}
	release()
	if a, err := sendBelowBound(e, orderOf("third", 0)); err != nil || a.status != http.StatusCreated || a.header.Get(proxy.ReplayedHeader) != "" {
		t.Errorf("the refused order, sent again once below the bound: %d %s, want executed (201)", a.status, a.body)
	}
}

func TestOverloadPastMaxInflightBytes(t *testing.T) {
	const big = 600 << 10
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.MaxBodyBytes, o.MaxInflightBytes = 1<<20, 1<<20
	})
	release := park(t, e, orderOf("held", big))

	a := e.do(t, http.MethodPost, "/v1/payments", orderOf("declared", big))
	checkOverloaded(t, e, a, orderKey(t, e, "declared"))
	// A chunked body has no declared length: reserved as it arrives.
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/payments", io.MultiReader(strings.NewReader(orderOf("chunked", big))) /* no Len: sent chunked */)
	req.ContentLength = -1
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(proxy.KeyHeader, "chunked-key")
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkOverloaded(t, e, answer{resp.StatusCode, resp.Header, b}, "chunked-key")
	// A small order still fits next to the held one: it reaches the provider.
	small := make(chan answer, 1)
	go func() { a, _ := sendBelowBound(e, orderOf("small", 100)); small <- a }()
	if k := <-e.prov.entered; k != orderKey(t, e, "small") {
		t.Errorf("the provider saw %q, want the small order's key", k)
	}
	release()
	if a := <-small; a.status != http.StatusCreated {
		t.Errorf("small order below the byte bound: %d %s", a.status, a.body)
	}
	if a, err := sendBelowBound(e, orderOf("declared", big)); err != nil || a.status != http.StatusCreated {
		t.Errorf("the refused order, sent again once the bytes were free: %d %s %v", a.status, a.body, err)
	}
}
