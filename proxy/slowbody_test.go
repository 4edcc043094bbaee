package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/resign"
	"github.com/idemproxy/idemproxy/retry"
	"github.com/idemproxy/idemproxy/upstream"
)

// slowClient is a client that sends a protected POST's headers and part of
// its body, then stops sending: a client on a slow link, or a hostile one.
type slowClient struct {
	t    *testing.T
	c    net.Conn
	br   *bufio.Reader
	body string
	sent int
}

// stall sends a POST of body whose first sent bytes only are written. It
// asks for 100-continue and waits for it before writing them: net/http
// sends 100 Continue when the handler first reads the body, so once it has
// come the proxy has done all it does at a request's arrival and is reading
// the body that stalls.
func stall(t *testing.T, e *env, body string, sent int) *slowClient {
	t.Helper()
	return stallAt(t, e, "/v1/payments", "", body, sent)
}

// stallAt is stall for a POST to path, with the Idempotency-Key key if it
// is not empty.
func stallAt(t *testing.T, e *env, path, key, body string, sent int) *slowClient {
	t.Helper()
	c, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(2 * time.Minute)) // a hung test fails instead of hanging
	var keyLine string
	if key != "" {
		keyLine = proxy.KeyHeader + ": " + key + "\r\n"
	}
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", path, keyLine, len(body))
	s := &slowClient{t: t, c: c, br: bufio.NewReader(c), body: body, sent: sent}
	line, err := s.br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("a slow client's headers: %q, %v; want 100 Continue", line, err)
	}
	if blank, err := s.br.ReadString('\n'); err != nil || blank != "\r\n" {
		t.Fatalf("after 100 Continue: %q, %v", blank, err)
	}
	if _, err := io.WriteString(c, body[:sent]); err != nil {
		t.Fatal(err)
	}
	return s
}

// finish sends the rest of the body and returns the answer.
func (s *slowClient) finish() answer {
	s.t.Helper()
	written := make(chan error, 1)
	go func() { _, err := io.WriteString(s.c, s.body[s.sent:]); written <- err }()
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil {
		s.t.Fatalf("the slow client's answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := <-written; err != nil {
		s.t.Errorf("the slow client's body was not read whole before its answer: %v", err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

// checkExecutedOnce asserts that a is the provider's 201 for the order,
// fresh, and that the order reached the provider once.
func checkExecutedOnce(t *testing.T, e *env, a answer, orderID string) {
	t.Helper()
	if a.status != http.StatusCreated || a.header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("order %s: %d %s; want the provider's 201", orderID, a.status, a.body)
	}
	e.prov.mu.Lock()
	defer e.prov.mu.Unlock()
	if n := e.prov.requests[orderKey(t, e, orderID)]; n != 1 {
		t.Errorf("order %s reached the provider %d times, want once", orderID, n)
	}
}

// TestSlowBodiesTakeNoRequestSlot: as many clients as IDEMPROXY_MAX_INFLIGHT
// allows that send part of their bodies and stall do not make everyone
// else's requests overloaded (they took a request slot at arrival, and held
// it until the server's read timeout). A request slot is taken once the
// body is read: the bound still refuses a request when the slots are held by
// operations in flight, and a slow client whose body then comes in full is
// refused like any other, nothing sent.
func TestSlowBodiesTakeNoRequestSlot(t *testing.T) {
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) { o.MaxInflight = 2 })
	slow := stall(t, e, orderOf("slow-1", 0), 10)
	stall(t, e, orderOf("slow-2", 0), 10)

	checkExecutedOnce(t, e, e.do(t, http.MethodPost, "/v1/payments", orderOf("normal", 0)), "normal")

	release := park(t, e, orderOf("p1", 0), orderOf("p2", 0))
	defer release()
	checkOverloaded(t, e, e.do(t, http.MethodPost, "/v1/payments", orderOf("past-bound", 0)), orderKey(t, e, "past-bound"))
	checkOverloaded(t, e, slow.finish(), orderKey(t, e, "slow-1"))
}

// TestStalledLargeBodiesHoldWhatTheySent: clients that declare bodies of a
// megabyte, send a kilobyte and stall do not take the byte bound for the
// megabytes they declared (two of them took the whole of a bound of two
// bodies' worth, and every other body was refused overloaded): a declared
// length past 64 KiB is reserved as it arrives. The bound still refuses a
// body when the bytes are held by orders in flight, and a stalled client
// whose body then comes is refused part way, reading its 503 (its body is
// drained, though it asked for 100-continue and got it).
func TestStalledLargeBodiesHoldWhatTheySent(t *testing.T) {
	e := newEnv(t, func(o *proxy.Options, _ *retry.Policy) {
		o.MaxBodyBytes, o.MaxInflightBytes = 1<<20, 2<<20
	})
	slow := stall(t, e, orderOf("stalled-1", 1000<<10), 1<<10)
	stall(t, e, orderOf("stalled-2", 1000<<10), 1<<10)

	checkExecutedOnce(t, e, e.do(t, http.MethodPost, "/v1/payments", orderOf("normal", 600<<10)), "normal")

	// 1800 KiB held at the provider and 128 KiB by the stalled clients'
	// first buffers leave less than 600 KiB of the bound.
	release := park(t, e, orderOf("held-1", 900<<10), orderOf("held-2", 900<<10))
	defer release()
	checkOverloaded(t, e, e.do(t, http.MethodPost, "/v1/payments", orderOf("past-bound", 600<<10)), orderKey(t, e, "past-bound"))
	a := slow.finish()
	checkOverloaded(t, e, a, orderKey(t, e, "stalled-1"))
	if !strings.Contains(string(a.body), "body bytes") {
		t.Errorf("the stalled client's refusal: %s; want the byte bound's", a.body)
	}
}

// signedBodies is an env whose signature covers the body (resign's default
// template) and whose POSTs under /v1/lookup/ are unprotected, with opt
// applied too.
func signedBodies(t *testing.T, opt func(*proxy.Options)) *env {
	return newEnvUpstream(t, func(c *upstream.Config) { c.Sign = resign.Config{Secret: []byte("slow-body-test-secret")} },
		func(o *proxy.Options, _ *retry.Policy) {
			o.SignsBody = true
			o.Routes = mustRoutes(t, "POST /v1/lookup/*=unprotected")
			opt(o)
		})
}

// checkPassedOnce asserts that a is the provider's 201 and that the request
// with the Idempotency-Key key reached the provider once.
func checkPassedOnce(t *testing.T, e *env, a answer, key string) {
	t.Helper()
	if a.status != http.StatusCreated {
		t.Errorf("%s: %d %s; want the provider's 201", key, a.status, a.body)
	}
	e.prov.mu.Lock()
	defer e.prov.mu.Unlock()
	if n := e.prov.requests[key]; n != 1 {
		t.Errorf("%s reached the provider %d times, want once", key, n)
	}
}

// TestSlowUnprotectedSignedBodiesTakeNoRequestSlot: when the signature
// covers the body, nothing of an unprotected request is sent before its body
// is read whole, so clients that stall in such bodies hold no request slot:
// another unprotected request and an order are served. They took a slot at
// arrival, and as many of them as MaxInflight made every other request
// overloaded. The bound still refuses when the slots are held by requests
// at the provider, and a stalled client whose body then comes is refused
// like any other, nothing sent.
func TestSlowUnprotectedSignedBodiesTakeNoRequestSlot(t *testing.T) {
	e := signedBodies(t, func(o *proxy.Options) { o.MaxInflight = 2 })
	slow := stallAt(t, e, "/v1/lookup/stalled-1", "k-stalled-1", orderOf("stalled-1", 0), 10)
	stallAt(t, e, "/v1/lookup/stalled-2", "k-stalled-2", orderOf("stalled-2", 0), 10)

	checkPassedOnce(t, e, e.do(t, http.MethodPost, "/v1/lookup/normal", orderOf("lookup", 0), proxy.KeyHeader, "k-normal"), "k-normal")
	checkExecutedOnce(t, e, e.do(t, http.MethodPost, "/v1/payments", orderOf("normal", 0)), "normal")

	release := park(t, e, orderOf("p1", 0), orderOf("p2", 0))
	defer release()
	checkOverloaded(t, e, e.do(t, http.MethodPost, "/v1/lookup/past-bound", orderOf("lookup", 0), proxy.KeyHeader, "k-past-bound"), "k-past-bound")
	checkOverloaded(t, e, slow.finish(), "k-stalled-1")
}

// TestUnprotectedSignedBodyWithinByteBound: an unprotected body read whole
// for its signature is held within MaxInflightBytes, as a protected one is.
// The signing layer read it past every bound: with the bound's bytes held by
// orders at the provider, a large unprotected body was still read and sent.
// Clients stalled in such bodies hold the bytes they sent, not the lengths
// they declared.
func TestUnprotectedSignedBodyWithinByteBound(t *testing.T) {
	e := signedBodies(t, func(o *proxy.Options) { o.MaxBodyBytes, o.MaxInflightBytes = 1<<20, 2<<20 })
	stallAt(t, e, "/v1/lookup/stalled-1", "k-stalled-1", orderOf("stalled-1", 1000<<10), 1<<10)
	stallAt(t, e, "/v1/lookup/stalled-2", "k-stalled-2", orderOf("stalled-2", 1000<<10), 1<<10)
	checkPassedOnce(t, e, e.do(t, http.MethodPost, "/v1/lookup/normal", orderOf("lookup", 600<<10), proxy.KeyHeader, "k-normal"), "k-normal")

	// 1800 KiB held at the provider and 128 KiB by the stalled clients'
	// first buffers leave less than 600 KiB of the bound.
	release := park(t, e, orderOf("held-1", 900<<10), orderOf("held-2", 900<<10))
	defer release()
	answered := make(chan answer, 1)
	errs := make(chan error, 1)
	go func() {
		a, err := e.send(http.MethodPost, "/v1/lookup/past-bound", orderOf("lookup", 600<<10), proxy.KeyHeader, "k-past-bound")
		if err != nil {
			errs <- err
			return
		}
		answered <- a
	}()
	select {
	case a := <-answered:
		checkOverloaded(t, e, a, "k-past-bound")
		if !strings.Contains(string(a.body), "body bytes") {
			t.Errorf("the refusal: %s; want the byte bound's", a.body)
		}
	case err := <-errs:
		t.Fatal(err)
	case <-e.prov.entered:
		t.Errorf("an unprotected body past the byte bound reached the provider")
	}
}
