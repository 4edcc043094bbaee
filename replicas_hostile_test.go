package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// leaveAfter writes raw to addr and closes the connection after wait,
// reading nothing: a client that hangs up mid-body, or before its answer.
func leaveAfter(t *testing.T, addr, raw string, wait time.Duration) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return
	}
	io.WriteString(conn, raw)
	time.Sleep(wait)
	conn.Close()
}

// TestReplicasClientsThatLeave: three replicas on one database with
// pool_max_conns=4, in front of the payments sandbox. Clients send orders
// and hang up at random moments: mid-body, while the key is claimed, while
// the provider runs the order (some held 300 ms), and, with the database
// frozen, while the claims' batch statement waits (it ends past its
// callers, and the claims it wrote are undone). Each order is then sent
// again whole through another replica: each gets 201 within 4 s, less than
// the 6 s lease (no key stays claimed for a client that left, no answer
// outside the contract's), each is executed once at the provider, and the
// replicas stay ready with their sessions within their pools. Without
// 42fc41e (claims written for callers that had left were not undone) a
// frozen-… order is still 409 idempotency_in_progress at 4 s.
func TestReplicasClientsThatLeave(t *testing.T) {
	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderPayments, Secret: []byte(sandboxSecret),
		ExecuteHook: func(op sandbox.Operation) {
			if strings.HasPrefix(op.OrderID, "slow-") {
				time.Sleep(300 * time.Millisecond)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(sb)
	defer up.Close()
	c, url := pgtest.Own(t, pgtest.Options{})
	const app = "idemproxy-leave"
	env := presetEnv(t, "payments", up.URL, "IDEMPROXY_STORE_URL="+url+"&pool_max_conns=4&application_name="+app,
		"IDEMPROXY_INFLIGHT_WAIT=1s", "IDEMPROXY_STORE_LEASE=6s")
	var ps []*opsProc
	for range 3 {
		ps = append(ps, launch(t, launchSpec{env: env}))
	}
	order := func(id string) string { return `{"order_id":"` + id + `","amount":"5.00"}` }
	post := func(body string, cut int) string {
		return fmt.Sprintf("POST /payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:cut])
	}
	var ids []string
	var wg sync.WaitGroup
	leave := func(id string, p *opsProc, cut bool, wait time.Duration) {
		ids = append(ids, id)
		body := order(id)
		n := len(body)
		if cut {
			n /= 2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			leaveAfter(t, p.proxy, post(body, n), wait)
		}()
	}
	for i := range 90 {
		kind := "fast"
		if i%3 != 0 {
			kind = "slow"
		}
		leave(fmt.Sprintf("%s-%d", kind, i), ps[i%3], i%4 == 0, time.Duration(rand.IntN(40))*time.Millisecond)
	}
	wg.Wait()

	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		leave(fmt.Sprintf("frozen-%d", i), ps[i%3], false, time.Duration(100+rand.IntN(1500))*time.Millisecond)
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond)
	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	answers := make([]reply, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				a, err := trySend("POST", "http://"+ps[(i+1)%3].proxy+"/payments", order(id))
				if err != nil {
					t.Error(err)
					return
				}
				answers[i] = a
				if a.status == http.StatusConflict && strings.Contains(a.body, `"idempotency_in_progress"`) && time.Since(began) < 4*time.Second {
					time.Sleep(200 * time.Millisecond)
					continue
				}
				return
			}
		}()
	}
	wg.Wait()
	for i, a := range answers {
		if a.status != http.StatusCreated {
			t.Errorf("order %s sent again through another replica: %d %s, want 201", ids[i], a.status, a.body)
		}
	}
	l := sb.Ledger()
	for _, id := range ids {
		if l.ByOrder[id] != 1 {
			t.Errorf("order %s executed %d times, want once", id, l.ByOrder[id])
		}
	}
	for i, p := range ps {
		if s := getStatus(t, "http://"+p.admin+"/readyz"); s != http.StatusOK {
			t.Errorf("replica %d: /readyz %d after the clients left", i, s)
		}
	}
	if all, _ := sessions(t, url, app); all > 3*4 {
		t.Errorf("%d sessions of the three replicas, more than their pools of 4", all)
	}
}
