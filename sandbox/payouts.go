package sandbox

import (
	"errors"
	"math/big"
	"net/http"
	"sync"
)

// payouts behaves like the provider of the payouts-resilient-client seed.
type payouts struct {
	*core
	secret        []byte   // empty means signatures are not checked
	publicID      string   // empty means X-Public-Id is not checked
	balance       *big.Rat // nil means no limit
	maturing      int      // attempts refused per maturing order
	maturingShare float64  // probability that a new order matures

	mu       sync.Mutex
	byOrder  map[string][]byte // order_id → payout body
	byKey    map[string]string // Idempotency-Key → order_id
	holds    map[string]string // order_id → hold code drawn on its first attempt; "" = none
	attempts map[string]int    // order_id → attempts refused so far
	inflight flights           // "key:<key>" and "order:<order_id>" being processed
}

// payout is the object POST /v1/payout and POST /v1/payout/info return.
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

// holdCodes are the seed's retriable 409s for a payout not yet possible.
var holdCodes = [...]string{"payout.funds_maturing", "payout.frozen"}

// newPayouts returns an empty payouts provider for cfg.
func newPayouts(c *core, cfg Config) *payouts {
	p := &payouts{core: c, secret: cfg.Secret, publicID: cfg.PublicID, maturing: cfg.MaturingAttempts,
		maturingShare: orDefault(cfg.MaturingShare, 1), byOrder: map[string][]byte{}, byKey: map[string]string{},
		holds: map[string]string{}, attempts: map[string]int{}, inflight: flights{}}
	if cfg.Balance > 0 {
		p.balance = new(big.Rat).SetFloat64(cfg.Balance)
	}
	return p
}

// register adds POST /v1/payout and POST /v1/payout/info.
func (p *payouts) register(mux *http.ServeMux, wrap func(handler) http.Handler) {
	mux.Handle("POST /v1/payout", wrap(p.create))
	mux.Handle("POST /v1/payout/info", wrap(p.info))
}

// authenticate checks X-Public-Id, X-Timestamp and X-Signature over
// "ts\nMETHOD\npath\nbody"; the Idempotency-Key is not signed (seed: "в
// подпись НЕ входит").
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

// throttled is the seed's quirky 429: no error code, only state and message.
func (p *payouts) throttled(retryAfter int) reply {
	return reply{status: http.StatusTooManyRequests,
		body: []byte(`{"state":1,"message":"rate limit exceeded"}`)}.withRetryAfter(retryAfter)
}

// create is POST /v1/payout {amount, currency, network, address, order_id}.
// In order: a key or order still being processed → 409
// idempotency.in_progress; a known key → its payout with Idempotent-Replayed
// (whatever the body); a known order_id → its payout (the seed's second
// dedup mechanism); then the refusals; then the payout is created. The key
// and order stay in flight until the response is written, slow fault
// included, as a server's idempotency lock would.
func (p *payouts) create(c *call) reply {
	f, err := decodeFields(c.body)
	if err != nil {
		return errorReply(http.StatusBadRequest, "request.invalid_json", "body must be a JSON object")
	}
	op := Operation{Kind: "payout.create", IdempotencyKey: c.key, OrderID: f.str("order_id")}
	end, refusal, ok := p.claim(op, f)
	if !ok {
		return refusal
	}
	rep := p.execute(op, func() (reply, bool) { return p.commit(op, f), true })
	rep.done = end
	return rep
}

// claim decides whether the request may create a payout. When it may, its
// key and order are marked in flight until end is called; otherwise refusal
// is the answer.
func (p *payouts) claim(op Operation, f fields) (end func(), refusal reply, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rep, done := p.existing(op.IdempotencyKey, op.OrderID); done {
		return nil, rep, false
	}
	_, amount, valid := f.amount("amount")
	if !valid {
		return nil, errorReply(http.StatusBadRequest, "request.invalid_amount", "amount must be a positive decimal"), false
	}
	if rep, refused := p.refuse(op.OrderID, amount); refused {
		return nil, rep, false
	}
	return p.inflight.start(&p.mu, keyID(op.IdempotencyKey), "order:"+op.OrderID), reply{}, true
}

// commit creates the payout claim allowed and indexes it by order and key.
func (p *payouts) commit(op Operation, f fields) reply {
	amount, _, _ := f.amount("amount") // claim checked it
	p.mu.Lock()
	defer p.mu.Unlock()
	body := jsonReply(http.StatusOK, payout{ID: p.rng.uuid(), OrderID: op.OrderID, Amount: amount,
		Currency: f.str("currency"), Network: f.str("network"), Address: f.str("address"),
		Status: "processing", CreatedAt: p.timestamp()}).body
	p.byOrder[op.OrderID] = body
	if op.IdempotencyKey != "" {
		p.byKey[op.IdempotencyKey] = op.OrderID
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
func (p *payouts) existing(key, order string) (reply, bool) {
	if p.inflight.busy(keyID(key)) || (order != "" && p.inflight.busy("order:"+order)) {
		// Seed: "409 idempotency.in_progress означает, что запрос с этим
		// ключом прямо сейчас выполняется на сервере".
		return errorReply(http.StatusConflict, "idempotency.in_progress", "a request with this key or order is still being processed"), true
	}
	if known, ok := p.byKey[key]; ok && key != "" {
		p.ledger.replay()
		return reply{status: http.StatusOK, body: p.byOrder[known]}.replayed(), true
	}
	if order == "" {
		return errorReply(http.StatusBadRequest, "request.order_id_required", "order_id is required for payouts"), true
	}
	if body, ok := p.byOrder[order]; ok {
		if key != "" {
			p.byKey[key] = order
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
// payout.not_found ("не создавалась, можно создавать").
func (p *payouts) info(c *call) reply {
	f, err := decodeFields(c.body)
	order := f.str("order_id")
	if err != nil || order == "" {
		return errorReply(http.StatusBadRequest, "request.order_id_required", "order_id is required")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	body, ok := p.byOrder[order]
	if !ok {
		return errorReply(http.StatusNotFound, "payout.not_found", "no payout for order_id "+order)
	}
	return reply{status: http.StatusOK, body: body}
}
