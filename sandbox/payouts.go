package sandbox

import (
	"errors"
	"math/big"
	"net/http"
	"sync"
)

// payouts behaves like the payouts provider.
type payouts struct {
	*core
	secret        []byte   // empty means signatures are not checked
	publicID      string   // empty means X-Public-Id is not checked
	balance       *big.Rat // nil means no limit
	maturing      int      // attempts refused per maturing order
	maturingShare float64  // probability that a new order matures

	mu       sync.Mutex
	payouts  book
	payments book
	holds    map[string]string // order_id → hold code drawn on its first attempt; "" = none
	attempts map[string]int    // order_id → attempts refused so far
	inflight flights           // "key:<key>" and "order:<order_id>" being processed
}

// book holds one kind of object the payouts API creates, deduplicated by
// Idempotency-Key and by order_id: payouts, and the payments that the
// payouts provider looks up with /v1/payment/info.
type book struct {
	kind    string            // "payout" or "payment", as in the error codes
	byOrder map[string][]byte // order_id → object body
	byKey   map[string]string // Idempotency-Key → order_id
}

func newBook(kind string) book {
	return book{kind: kind, byOrder: map[string][]byte{}, byKey: map[string]string{}}
}

// payout is the object POST /v1/payout and POST /v1/payout/info return; a
// payment (POST /v1/payment, /v1/payment/info) has the same shape.
type payout struct {
	ID        string `json:"id"`
	OrderID   string `json:"order_id"`
	Amount    string `json:"amount"`
	Currency  string `json:"currency,omitempty"`
	Network   string `json:"network,omitempty"`
	Address   string `json:"address,omitempty"`
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
}

// holdCodes are the provider's retriable 409s for a payout not yet possible.
var holdCodes = [...]string{"payout.funds_maturing", "payout.frozen"}

// newPayouts returns an empty payouts provider for cfg.
func newPayouts(c *core, cfg Config) *payouts {
	p := &payouts{core: c, secret: cfg.Secret, publicID: cfg.PublicID, maturing: cfg.MaturingAttempts,
		maturingShare: orDefault(cfg.MaturingShare, 1), payouts: newBook("payout"), payments: newBook("payment"),
		holds: map[string]string{}, attempts: map[string]int{}, inflight: flights{}}
	if cfg.Balance > 0 {
		p.balance = new(big.Rat).SetFloat64(cfg.Balance)
	}
	return p
}

// register adds POST /v1/payout and POST /v1/payout/info, and the payments
// the provider documents beside them: POST /v1/payment and
// POST /v1/payment/info.
func (p *payouts) register(mux *http.ServeMux, wrap func(handler) http.Handler) {
	mux.Handle("POST /v1/payout", wrap(func(c *call) reply { return p.create(&p.payouts, c) }))
	mux.Handle("POST /v1/payout/info", wrap(func(c *call) reply { return p.info(&p.payouts, c) }))
	mux.Handle("POST /v1/payment", wrap(func(c *call) reply { return p.create(&p.payments, c) }))
	mux.Handle("POST /v1/payment/info", wrap(func(c *call) reply { return p.info(&p.payments, c) }))
}

// authenticate checks X-Public-Id, X-Timestamp and X-Signature over
// "ts\nMETHOD\npath\nbody"; the Idempotency-Key is not signed (the
// provider says so explicitly).
func (p *payouts) authenticate(c *call) (reply, bool) {
	if p.publicID != "" && c.r.Header.Get("X-Public-Id") != p.publicID {
		return errorReply(http.StatusUnauthorized, "auth.invalid_public_id", "X-Public-Id missing or unknown"), false
	}
	if len(p.secret) == 0 {
		return reply{}, true
	}
	err := checkTimestampSigned(c, p.secret, p.now())
	switch {
	case errors.Is(err, errStaleTimestamp):
		return errorReply(http.StatusUnauthorized, "auth.timestamp_expired", err.Error()), false
	case err != nil:
		return errorReply(http.StatusUnauthorized, "auth.invalid_signature", err.Error()), false
	}
	return reply{}, true
}

// throttled is the provider's quirky 429: no error code, only state and message.
func (p *payouts) throttled(retryAfter int) reply {
	return reply{status: http.StatusTooManyRequests,
		body: []byte(`{"state":1,"message":"rate limit exceeded"}`)}.withRetryAfter(retryAfter)
}

// create is POST /v1/payout {amount, currency, network, address, order_id}.
// In order: a key or order still being processed → 409
// idempotency.in_progress; a known key → its payout with Idempotent-Replayed
// (whatever the body); a known order_id → its payout (the provider's second
// dedup mechanism); then the refusals; then the payout is created. The key
// and order stay in flight until the response is written, slow fault
// included, as a server's idempotency lock would.
//
// POST /v1/payment creates a payment the same way, without the payout-only
// refusals (balance, maturing funds).
func (p *payouts) create(b *book, c *call) reply {
	f, err := decodeFields(c.body)
	if err != nil {
		return errorReply(http.StatusBadRequest, "request.invalid_json", "body must be a JSON object")
	}
	op := Operation{Kind: b.kind + ".create", IdempotencyKey: c.key, OrderID: f.str("order_id")}
	end, refusal, ok := p.claim(b, op, f)
	if !ok {
		return refusal
	}
	rep := p.execute(op, func() (reply, bool) { return p.commit(b, op, f), true })
	rep.done = end
	return rep
}

// claim decides whether the request may create a payout. When it may, its
// key and order are marked in flight until end is called; otherwise refusal
// is the answer.
func (p *payouts) claim(b *book, op Operation, f fields) (end func(), refusal reply, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rep, done := p.existing(b, op.IdempotencyKey, op.OrderID); done {
		return nil, rep, false
	}
	_, amount, valid := f.amount("amount")
	if !valid {
		return nil, errorReply(http.StatusBadRequest, "request.invalid_amount", "amount must be a positive decimal"), false
	}
	if b == &p.payouts {
		if rep, refused := p.refuse(op.OrderID, amount); refused {
			return nil, rep, false
		}
	}
	return p.inflight.start(&p.mu, keyID(op.IdempotencyKey), orderID(b, op.OrderID)), reply{}, true
}

// orderID is the in-flight id of an order of b.
func orderID(b *book, order string) string {
	return b.kind + ":" + order
}

// commit creates the payout claim allowed and indexes it by order and key.
func (p *payouts) commit(b *book, op Operation, f fields) reply {
	amount, _, _ := f.amount("amount") // claim checked it
	p.mu.Lock()
	defer p.mu.Unlock()
	body := jsonReply(http.StatusOK, payout{ID: p.rng.uuid(), OrderID: op.OrderID, Amount: amount,
		Currency: f.str("currency"), Network: f.str("network"), Address: f.str("address"),
		Status: "processing", CreatedAt: p.timestamp()}).body
	b.byOrder[op.OrderID] = body
	if op.IdempotencyKey != "" {
		b.byKey[op.IdempotencyKey] = op.OrderID
	}
	return reply{status: http.StatusOK, body: body}
}

// keyID is the in-flight id of an Idempotency-Key; "" when there is none.
func keyID(key string) string {
	if key == "" {
		return ""
	}
	return "key:" + key
}

// existing answers a request that must not create anything new (p.mu held):
// in progress, a known key, a missing order_id or a known order.
func (p *payouts) existing(b *book, key, order string) (reply, bool) {
	if p.inflight.busy(keyID(key)) || (order != "" && p.inflight.busy(orderID(b, order))) {
		// 409 idempotency.in_progress: a request with this key is being
		// executed on the server right now.
		return errorReply(http.StatusConflict, "idempotency.in_progress", "a request with this key or order is still being processed"), true
	}
	if known, ok := b.byKey[key]; ok && key != "" {
		p.ledger.replay()
		return reply{status: http.StatusOK, body: b.byOrder[known]}.replayed(), true
	}
	if order == "" {
		return errorReply(http.StatusBadRequest, "request.order_id_required", "order_id is required for "+b.kind+"s"), true
	}
	if body, ok := b.byOrder[order]; ok {
		if key != "" {
			b.byKey[key] = order
		}
		p.ledger.replay()
		return reply{status: http.StatusOK, body: body}, true
	}
	return reply{}, false
}

// refuse applies the business refusals (p.mu held): insufficient funds is
// final; maturing and frozen pass after Config.MaturingAttempts attempts.
func (p *payouts) refuse(order string, amount *big.Rat) (reply, bool) {
	if p.balance != nil && amount.Cmp(p.balance) > 0 {
		return errorReply(http.StatusConflict, "payout.insufficient_funds", "amount exceeds the available balance"), true
	}
	if code := p.hold(order); code != "" {
		return errorReply(http.StatusConflict, code, "funds are not available yet; retry later"), true
	}
	return reply{}, false
}

// hold returns the 409 code this attempt of order gets, or "" when it may
// proceed. Whether an order matures, and with which code, is drawn once, on
// its first attempt.
func (p *payouts) hold(order string) string {
	if p.maturing == 0 {
		return ""
	}
	code, drawn := p.holds[order]
	if !drawn {
		if p.rng.hit(p.maturingShare) {
			code = holdCodes[p.rng.IntN(len(holdCodes))]
		}
		p.holds[order] = code
	}
	if code == "" || p.attempts[order] >= p.maturing {
		return ""
	}
	p.attempts[order]++
	return code
}

// info is POST /v1/payout/info {order_id}: the payout, or 404
// payout.not_found (never created, may be created); the same for
// /v1/payment/info, with payment.not_found.
func (p *payouts) info(b *book, c *call) reply {
	f, err := decodeFields(c.body)
	order := f.str("order_id")
	if err != nil || order == "" {
		return errorReply(http.StatusBadRequest, "request.order_id_required", "order_id is required")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	body, ok := b.byOrder[order]
	if !ok {
		return errorReply(http.StatusNotFound, b.kind+".not_found", "no "+b.kind+" for order_id "+order)
	}
	return reply{status: http.StatusOK, body: body}
}
