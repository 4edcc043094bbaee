package sandbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// payments behaves like the payments provider.
type payments struct {
	*core
	secret    []byte        // empty means signatures and nonces are not checked
	retention time.Duration // how long a key is remembered; 0 = forever

	mu       sync.Mutex
	nonces   map[string]bool          // every X-Nonce accepted so far
	byKey    map[string]storedPayment // Idempotency-Key → first response
	byID     map[string][]byte        // payment id → body
	inflight flights                  // Idempotency-Keys executing
}

// storedPayment is the response kept for a key with its body's fingerprint.
type storedPayment struct {
	fingerprint [sha256.Size]byte
	reply       reply
	at          time.Time // when the key was first used
}

// payment is the body of POST /payments and GET /payments/{id}.
type payment struct {
	ID        string `json:"id"`
	OrderID   string `json:"order_id"`
	Amount    string `json:"amount"`
	Currency  string `json:"currency,omitempty"`
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
}

// newPayments returns an empty payments provider.
func newPayments(c *core, secret []byte, retention time.Duration) *payments {
	return &payments{core: c, secret: secret, retention: retention, nonces: map[string]bool{}, byKey: map[string]storedPayment{},
		byID: map[string][]byte{}, inflight: flights{}}
}

// register adds POST /payments and GET /payments/{id} (after a 504 the
// provider tells clients to GET the payment first).
func (p *payments) register(mux *http.ServeMux, wrap func(handler) http.Handler) {
	mux.Handle("POST /payments", wrap(p.create))
	mux.Handle("GET /payments/{id}", wrap(p.get))
}

// authenticate checks X-Timestamp, X-Signature over PaymentsString, then
// X-Nonce, when a secret is set. The nonce is spent only by an authentic
// request, so forged requests cannot burn a client's nonces.
func (p *payments) authenticate(c *call) (reply, bool) {
	if len(p.secret) == 0 {
		return reply{}, true
	}
	h := c.r.Header
	ts, nonce := h.Get("X-Timestamp"), h.Get("X-Nonce")
	if !fresh(ts, p.now()) {
		return errorReply(http.StatusUnauthorized, "timestamp_out_of_window", errStaleTimestamp.Error()), false
	}
	canonical := PaymentsString(c.r.Method, c.r.URL.EscapedPath(), ts, nonce, c.key, c.body)
	if nonce == "" || !validSignature(p.secret, canonical, h.Get("X-Signature")) {
		return errorReply(http.StatusUnauthorized, "invalid_signature", "X-Nonce or X-Signature missing or wrong"), false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nonces[nonce] {
		// An old HTTP request resent whole gets 409 nonce_reused.
		return errorReply(http.StatusConflict, "nonce_reused", "X-Nonce was already used; sign the retry anew"), false
	}
	p.nonces[nonce] = true
	return reply{}, true
}

// throttled is a 429 in the provider's error shape.
func (p *payments) throttled(retryAfter int) reply {
	return errorReply(http.StatusTooManyRequests, "rate_limited", "rate limit exceeded").withRetryAfter(retryAfter)
}

// create is POST /payments {order_id, amount, currency}. Seed: the same key
// and body get the stored response with Idempotent-Replayed: true; the same
// key with another body gets 409 idempotency_conflict. A repeat arriving
// while the first is executing waits for it.
func (p *payments) create(c *call) reply {
	if c.key == "" {
		return errorReply(http.StatusUnprocessableEntity, "idempotency_key_required", "Idempotency-Key header is required on every POST")
	}
	fp := fingerprint(c.body)
	p.mu.Lock()
	if err := p.inflight.await(c.r.Context(), &p.mu, c.key); err != nil {
		p.mu.Unlock()
		return cancelled()
	}
	if st, ok := p.remembered(c.key); ok {
		p.mu.Unlock()
		return p.repeat(st, fp)
	}
	end := p.inflight.start(&p.mu, c.key)
	p.mu.Unlock()
	defer end()
	f, err := decodeFields(c.body)
	amount, _, ok := f.amount("amount")
	if err != nil || f.str("order_id") == "" || !ok {
		return errorReply(http.StatusBadRequest, "validation_error", "order_id and a positive decimal amount are required")
	}
	op := Operation{Kind: "payment.create", IdempotencyKey: c.key, OrderID: f.str("order_id")}
	return p.execute(op, func() (reply, bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		pay := payment{ID: p.rng.uuid(), OrderID: op.OrderID, Amount: amount, Currency: f.str("currency"),
			Status: "succeeded", CreatedAt: p.timestamp()}
		rep := jsonReply(http.StatusCreated, pay)
		p.byKey[c.key] = storedPayment{fingerprint: fp, reply: rep, at: p.now()}
		p.byID[pay.ID] = rep.body
		return rep, true
	})
}

// remembered returns the payment stored for key (p.mu held), forgetting it
// once the retention has passed: after that the key is new again.
func (p *payments) remembered(key string) (storedPayment, bool) {
	st, ok := p.byKey[key]
	if ok && p.retention > 0 && p.now().Sub(st.at) >= p.retention {
		delete(p.byKey, key)
		return storedPayment{}, false
	}
	return st, ok
}

// repeat answers a known key: the stored response, or a conflict when the
// body differs.
func (p *payments) repeat(st storedPayment, fp [sha256.Size]byte) reply {
	if st.fingerprint != fp {
		return errorReply(http.StatusConflict, "idempotency_conflict", "Idempotency-Key was used with another request body")
	}
	p.ledger.replay()
	return st.reply.replayed()
}

// get is GET /payments/{id}.
func (p *payments) get(c *call) reply {
	p.mu.Lock()
	defer p.mu.Unlock()
	body, ok := p.byID[c.r.PathValue("id")]
	if !ok {
		return errorReply(http.StatusNotFound, "payment_not_found", "no payment "+c.r.PathValue("id"))
	}
	return reply{status: http.StatusOK, body: body}
}

// fingerprint identifies a body by its JSON content, so that key order and
// whitespace do not make the same request "another body"; a body that is not
// JSON is taken byte for byte.
func fingerprint(body []byte) [sha256.Size]byte {
	var v any
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if d.Decode(&v) == nil && !d.More() {
		if canonical, err := json.Marshal(v); err == nil {
			return sha256.Sum256(canonical)
		}
	}
	return sha256.Sum256(body)
}
