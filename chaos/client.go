package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Answer is what one client request got.
type Answer struct {
	// Status is the HTTP status; 0 when no response came (see Err).
	Status int
	// Err is "timeout" or "connection" when no complete response came.
	Err string
	// Body is the response body (at most 64 KiB).
	Body []byte
	// Key is the Idempotency-Key header idemproxy answered with.
	Key string
	// Replayed is true when the answer said Idempotent-Replayed: true.
	Replayed bool
	// Reconciled is true when the answer is the status probe's lookup of the
	// operation (Idemproxy-Reconciled: true), not the operation's own.
	Reconciled bool
	// ProxyAttempts is the Idemproxy-Attempts header; 0 when absent.
	ProxyAttempts int
	// At is when the request was sent, from the order's first request.
	At time.Duration
}

// OK reports a 2xx answer: the legacy app's "payment done".
func (a Answer) OK() bool { return a.Status >= 200 && a.Status < 300 }

// Order is what the client knows about one order after it stopped trying.
type Order struct {
	// ID is the order_id it sent.
	ID string
	// Answers are the client's requests' results, in order; never empty.
	Answers []Answer
}

// Succeeded reports whether any answer was a 2xx.
func (o *Order) Succeeded() bool {
	for _, a := range o.Answers {
		if a.OK() {
			return true
		}
	}
	return false
}

// Final is the last answer.
func (o *Order) Final() Answer { return o.Answers[len(o.Answers)-1] }

// Client is the legacy application: it POSTs one JSON body per order with an
// order_id and no Idempotency-Key, gives up on a request after Timeout, and
// retries blindly on a fresh connection after a timeout, a connection error,
// a 5xx or a 409 idempotency_in_progress (idempotency.in_progress, the payouts
// provider's, which its preset makes idemproxy answer), until a 2xx, another
// answer, or MaxTries requests.
type Client struct {
	// Target is idemproxy's base URL, e.g. "http://127.0.0.1:8080".
	Target string
	// Targets, when set, are the base URLs of several replicas: each try
	// goes to one of them at random, as behind a load balancer.
	Targets []string
	// Path is the provider route the client posts to, e.g. "/payments".
	Path string
	// Body returns the request body of an order; it must contain order_id.
	Body func(orderID string) []byte
	// Timeout bounds one request, as http.Client.Timeout does.
	Timeout time.Duration
	// MaxTries is the limit of requests per order, the first included.
	MaxTries int
}

// worker is one of the client's concurrent senders.
type worker struct {
	c    *Client
	rng  *rand.Rand
	pool *http.Client // keep-alive connections for first tries, as old code has
}

// PayAll pays every order with n concurrent workers and returns their
// records in the order of ids. done, if not nil, is called after each order
// (from the worker goroutines). It stops early only when ctx ends.
func (c *Client) PayAll(ctx context.Context, ids []string, n int, seed int64, done func()) []Order {
	out := make([]Order, len(ids))
	next := make(chan int)
	var wg sync.WaitGroup
	for i := range n {
		w := &worker{c: c, rng: rand.New(rand.NewPCG(uint64(seed), uint64(i))),
			pool: &http.Client{Timeout: c.Timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.pool.CloseIdleConnections()
			for j := range next {
				out[j] = w.pay(ctx, ids[j])
				if done != nil {
					done()
				}
			}
		}()
	}
	for j := range ids {
		if ctx.Err() != nil {
			break
		}
		next <- j
	}
	close(next)
	wg.Wait()
	return out
}

// pay sends the order until it is settled or the tries run out.
func (w *worker) pay(ctx context.Context, id string) Order {
	o := Order{ID: id}
	body := w.c.Body(id)
	start := time.Now()
	for try := range w.c.MaxTries {
		if try > 0 && sleepCtx(ctx, w.backoff(try)) != nil {
			break
		}
		at := time.Since(start)
		a := w.send(ctx, body, try == 0)
		a.At = at
		o.Answers = append(o.Answers, a)
		if !retriable(a) {
			break
		}
	}
	if len(o.Answers) == 0 {
		o.Answers = append(o.Answers, Answer{Err: "connection"}) // ctx ended before the first try
	}
	return o
}

// backoff is the pause before try n (n >= 1): 20 ms doubling to 800 ms, with
// jitter, so a proxy restart costs a few tries and 20 tries span about 15 s,
// far more than a restart takes.
func (w *worker) backoff(n int) time.Duration {
	d := min(20*time.Millisecond<<min(n-1, 6), 800*time.Millisecond)
	return d/2 + time.Duration(w.rng.Int64N(int64(d/2)+1))
}

// send makes one request: first tries on the pooled client, retries on a
// brand-new transport without keep-alive, i.e. a fresh connection.
func (w *worker) send(ctx context.Context, body []byte, first bool) Answer {
	hc := w.pool
	if !first {
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		hc = &http.Client{Timeout: w.c.Timeout, Transport: tr}
	}
	target := w.c.Target
	if len(w.c.Targets) > 0 {
		target = w.c.Targets[w.rng.IntN(len(w.c.Targets))]
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+w.c.Path, bytes.NewReader(body))
	if err != nil {
		panic(fmt.Sprintf("chaos: build request: %v", err)) // Target and Path are ours
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return Answer{Err: errKind(err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Answer{Err: errKind(err)} // the answer was cut: the app saw nothing
	}
	n, _ := strconv.Atoi(resp.Header.Get("Idemproxy-Attempts"))
	return Answer{Status: resp.StatusCode, Body: b, Key: resp.Header.Get("Idempotency-Key"),
		Replayed: resp.Header.Get("Idempotent-Replayed") == "true", ProxyAttempts: n,
		Reconciled: resp.Header.Get("Idemproxy-Reconciled") == "true"}
}

// errKind names a failed request the way the app sees it.
func errKind(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return "connection"
}

// retriable is the legacy app's blind rule: no answer, a 5xx, or "still in
// progress" means "send it again".
func retriable(a Answer) bool {
	switch {
	case a.Status == 0, a.Status >= 500:
		return true
	case a.Status == http.StatusConflict:
		code := errorCode(a.Body)
		return code == "idempotency_in_progress" || code == "idempotency.in_progress"
	}
	return false
}

// errorCode is error.code of a JSON error body; "" when there is none.
func errorCode(body []byte) string {
	var v struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	return v.Error.Code
}
