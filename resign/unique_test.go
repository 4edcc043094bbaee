package resign_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/resign"
)

// recordSigned is a Next that keeps the signed headers and answers 503.
type recordSigned struct {
	mu   sync.Mutex
	sent []http.Header
}

func (r *recordSigned) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	r.mu.Lock()
	r.sent = append(r.sent, req.Header.Clone())
	r.mu.Unlock()
	return &http.Response{StatusCode: 503, Body: http.NoBody, Request: req}, nil
}

// TestRetryNeverResendsASignature: without a nonce (the cards and payouts
// schemes, {timestamp}\n{method}\n{path}\n{body}), the timestamp is all that
// makes a retry's signature new ("a new signature, new time", the cards
// provider asks), and it is in whole seconds. Attempts of one request sent
// at once, as a retry after an immediate 503 with a short backoff is, each
// carry a signature not sent before: the later ones wait for the next
// second. Another request in the same second is not held.
func TestRetryNeverResendsASignature(t *testing.T) {
	next := &recordSigned{}
	tr := mustNew(t, resign.Config{Secret: []byte("cards-secret"),
		Template: mustTemplate(t, `{timestamp}\n{method}\n{path}\n{body}`)}, next)
	// Start just after a second began, so the three sends below fall in one
	// second unless the signer holds them.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
	start := time.Now()
	for range 3 {
		resp, err := tr.RoundTrip(post(t, "http://cards.test/cards", `{"amount":"50"}`, "k-1"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	other, err := tr.RoundTrip(post(t, "http://cards.test/cards/c-1/topup", `{"amount":"5"}`, "k-2"))
	if err != nil {
		t.Fatal(err)
	}
	other.Body.Close()
	took := time.Since(start)
	sigs, stamps := map[string]bool{}, map[string]bool{}
	for _, h := range next.sent[:3] {
		sigs[h.Get("X-Signature")] = true
		stamps[h.Get("X-Timestamp")] = true
	}
	if len(sigs) != 3 || len(stamps) != 3 {
		t.Errorf("three attempts of one request carried %d signatures, %d timestamps (%v); want a new one each",
			len(sigs), len(stamps), next.sent[:3])
	}
	if took > 2800*time.Millisecond {
		t.Errorf("four requests took %v: the other request was held too", took)
	}
	if last := next.sent[3].Get("X-Timestamp"); last != next.sent[2].Get("X-Timestamp") {
		t.Errorf("the other request was sent at %s, want at once (%s)", last, next.sent[2].Get("X-Timestamp"))
	}

	// A nonce makes every signature new: nothing waits.
	nonced := mustNew(t, resign.Config{Secret: []byte("s"), NonceHeader: "X-Nonce",
		Template: mustTemplate(t, `{method}\n{path}\n{timestamp}\n{nonce}\n{idempotency_key}\n{body_sha256}`)}, next)
	start = time.Now()
	for range 3 {
		resp, err := nonced.RoundTrip(post(t, "http://payments.test/payments", `{"order_id":"o"}`, "k-3"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("three nonced attempts took %v, want no wait", took)
	}

	// An attempt whose caller leaves while it waits is not sent.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	next.mu.Lock()
	before := len(next.sent)
	next.mu.Unlock()
	for range 2 {
		req := post(t, "http://cards.test/cards/c-2/close", ``, "k-4").WithContext(ctx)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			continue
		}
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "new timestamp") {
			t.Errorf("error %v, want the wait for a new timestamp cut by the caller's context", err)
		}
	}
	next.mu.Lock()
	if n := len(next.sent) - before; n != 1 {
		t.Errorf("%d attempts sent, want 1 (the second's caller left while it waited)", n)
	}
	next.mu.Unlock()
}
