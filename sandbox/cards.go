package sandbox

import (
	"errors"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"
)

// cards behaves like the cards provider.
type cards struct {
	*core
	secret []byte   // empty means signatures are not checked
	funds  *big.Rat // the account's unreserved funds; nil means no limit

	mu       sync.Mutex
	byKey    map[string]reply     // Idempotency-Key → original operation, forever
	holders  map[string]reply     // external_id → cardholder
	cards    map[string]*card     // card id → card
	inflight flights              // "key:<key>" and "holder:<external_id>"
	signed   map[string]time.Time // X-Signature → when it was accepted (replay protection)
}

// card is an issued card.
type card struct {
	id        string
	status    string // "active" or "closed"
	balance   *big.Rat
	createdAt string
}

// cardView is a card as GET /cards/{id} shows it.
type cardView struct {
	ID        string `json:"id"`
	Status    string `json:"status"`
	Balance   string `json:"balance"`
	CreatedAt string `json:"created_at"`
}

// cardOperation is the provider's operation body: the same id on every repeat.
type cardOperation struct {
	ID         string `json:"id"`
	Kind       string `json:"kind"`   // "issue", "topup" or "close"
	Status     string `json:"status"` // "processing" or "succeeded"
	HoldAmount string `json:"hold_amount"`
	NetAmount  string `json:"net_amount"`
	CreatedAt  string `json:"created_at"`
	CardID     string `json:"card_id,omitempty"` // empty for an issue that failed
}

// cardholder is the body of POST /cardholders.
type cardholder struct {
	ID         string `json:"id"`
	ExternalID string `json:"external_id"`
	Name       string `json:"name,omitempty"`
	CreatedAt  string `json:"created_at"`
}

// holdRate is the reserve per unit of net amount: the provider's example holds
// 57.0464 for a net 50.
var holdRate = big.NewRat(1140928, 1000000)

// Amounts that make a card issue or top-up end in an operation status the
// cards provider names, so that tests (and curl) can produce them. The amount is
// compared as a decimal: "13.130" is AmountFailed too.
const (
	// AmountFailed gives an operation with status "failed": nothing is
	// issued, credited or reserved, and a repeat with its key returns the same
	// failed operation; only a new key tries again.
	AmountFailed = "13.13"
	// AmountNeedsReview gives an operation with status "needs_review": it is
	// carried out (the card is issued or credited) but the provider
	// resolved by hand; never repeat it, wait for the event.
	AmountNeedsReview = "66.66"
)

// newCards returns an empty cards provider with balance as the account's
// funds (zero: no limit).
func newCards(c *core, secret []byte, balance float64) *cards {
	p := &cards{core: c, secret: secret, byKey: map[string]reply{}, holders: map[string]reply{},
		cards: map[string]*card{}, inflight: flights{}, signed: map[string]time.Time{}}
	if balance > 0 {
		p.funds = new(big.Rat).SetFloat64(balance)
	}
	return p
}

// outcome is the operation status an issue or top-up of net amount ends in,
// besides the normal one.
func outcome(net *big.Rat, normal string) string {
	switch decimal(net) {
	case AmountFailed:
		return "failed"
	case AmountNeedsReview:
		return "needs_review"
	}
	return normal
}

// reserve takes the hold for net from the account's funds (p.mu held), or
// returns the provider's refusal: 409 balance_exhausted, nothing reserved.
func (p *cards) reserve(net *big.Rat) (reply, bool) {
	hold := new(big.Rat).Mul(net, holdRate)
	if p.funds == nil {
		return reply{}, true
	}
	if hold.Cmp(p.funds) > 0 {
		return errorReply(http.StatusConflict, "balance_exhausted", "the account balance does not cover the hold of "+decimal(hold)), false
	}
	p.funds.Sub(p.funds, hold)
	return reply{}, true
}

// register adds the provider's endpoints and GET /cards/{id}.
func (p *cards) register(mux *http.ServeMux, wrap func(handler) http.Handler) {
	mux.Handle("POST /cardholders", wrap(p.createHolder))
	mux.Handle("POST /cards", wrap(p.issue))
	mux.Handle("POST /cards/{id}/topup", wrap(p.topup))
	mux.Handle("POST /cards/{id}/close", wrap(p.close))
	mux.Handle("GET /cards/{id}", wrap(p.get))
}

// authenticate checks X-Timestamp and X-Signature when a secret is set. The
// provider asks for a new signature (a new time) on every retry and points
// to its replay protection: a stale signature is refused by the window, and
// one already accepted within it (a request resent whole, or a retry signed
// in the same second as the attempt before it) is refused as a replay,
// 401 signature_reused, before anything runs.
func (p *cards) authenticate(c *call) (reply, bool) {
	if len(p.secret) == 0 {
		return reply{}, true
	}
	now := p.now()
	err := checkTimestampSigned(c, p.secret, now)
	switch {
	case errors.Is(err, errStaleTimestamp):
		return errorReply(http.StatusUnauthorized, "timestamp_out_of_window", err.Error()), false
	case err != nil:
		return errorReply(http.StatusUnauthorized, "invalid_signature", err.Error()), false
	}
	sig := strings.ToLower(c.r.Header.Get("X-Signature"))
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, seen := p.signed[sig]; seen {
		return errorReply(http.StatusUnauthorized, "signature_reused", "this signature was already used; sign the retry anew (new time)"), false
	}
	if len(p.signed) >= 4096 { // forget what the window refuses anyway
		for s, at := range p.signed {
			if now.Sub(at) > 2*signatureWindow {
				delete(p.signed, s)
			}
		}
	}
	p.signed[sig] = now
	return reply{}, true
}

// throttled is the provider's "429 rate_limited".
func (p *cards) throttled(retryAfter int) reply {
	return errorReply(http.StatusTooManyRequests, "rate_limited", "rate limit exceeded").withRetryAfter(retryAfter)
}

// schemaError is the provider's 422: the request does not pass the schema check.
func schemaError(message string) reply {
	return errorReply(http.StatusUnprocessableEntity, "schema_validation_failed", message)
}

// once runs a keyed operation at most once per Idempotency-Key. The provider
// finds the operation by its key and returns it even if the new request's
// body differs, so a known key returns its original operation whatever the
// body or endpoint. A repeat that arrives while the first is executing waits for
// it. Refusals are not stored: the provider says to fix the cause and repeat.
func (p *cards) once(c *call, kind string, run func(Operation, fields) reply) reply {
	if c.key == "" {
		return schemaError("Idempotency-Key header is required")
	}
	p.mu.Lock()
	if err := p.inflight.await(c.r.Context(), &p.mu, "key:"+c.key); err != nil {
		p.mu.Unlock()
		return cancelled()
	}
	if rep, ok := p.byKey[c.key]; ok {
		p.mu.Unlock()
		p.ledger.replay()
		return rep
	}
	end := p.inflight.start(&p.mu, "key:"+c.key)
	p.mu.Unlock()
	defer end()
	f, err := decodeFields(c.body)
	if err != nil {
		return schemaError("body must be a JSON object")
	}
	return run(Operation{Kind: "card." + kind, IdempotencyKey: c.key, OrderID: f.str("order_id")}, f)
}

// commit stores rep as the operation of op's key (p.mu held) and returns it.
func (p *cards) commit(op Operation, rep reply) reply {
	p.byKey[op.IdempotencyKey] = rep
	return rep
}

// operation builds the provider's operation body; hold_amount includes the fee.
func (p *cards) operation(kind, cardID, status string, net *big.Rat) reply {
	hold := new(big.Rat).Mul(net, holdRate)
	return jsonReply(http.StatusOK, cardOperation{ID: p.rng.uuid(), Kind: kind, Status: status,
		HoldAmount: decimal(hold), NetAmount: decimal(net), CreatedAt: p.timestamp(), CardID: cardID})
}

// issue is POST /cards {tariff_id, holder_external_id, amount}.
func (p *cards) issue(c *call) reply {
	return p.once(c, "issue", func(op Operation, f fields) reply {
		_, amount, ok := f.amount("amount")
		if !ok {
			return schemaError("amount must be a positive decimal")
		}
		return p.execute(op, func() (reply, bool) {
			p.mu.Lock()
			defer p.mu.Unlock()
			// The provider's example answers an issue with "processing".
			status := outcome(amount, "processing")
			if status == "failed" {
				return p.commit(op, p.operation("issue", "", status, amount)), true
			}
			if refusal, ok := p.reserve(amount); !ok {
				return refusal, false
			}
			cd := &card{id: p.rng.uuid(), status: "active", balance: amount, createdAt: p.timestamp()}
			p.cards[cd.id] = cd
			return p.commit(op, p.operation("issue", cd.id, status, amount)), true
		})
	})
}

// topup is POST /cards/{id}/topup {amount}.
func (p *cards) topup(c *call) reply {
	return p.once(c, "topup", func(op Operation, f fields) reply {
		_, amount, ok := f.amount("amount")
		if !ok {
			return schemaError("amount must be a positive decimal")
		}
		return p.execute(op, func() (reply, bool) {
			p.mu.Lock()
			defer p.mu.Unlock()
			cd, refusal := p.activeCard(c.r.PathValue("id"))
			if cd == nil {
				return refusal, false
			}
			status := outcome(amount, "succeeded")
			if status == "failed" {
				return p.commit(op, p.operation("topup", cd.id, status, amount)), true
			}
			if refusal, ok := p.reserve(amount); !ok {
				return refusal, false
			}
			cd.balance = new(big.Rat).Add(cd.balance, amount)
			return p.commit(op, p.operation("topup", cd.id, status, amount)), true
		})
	})
}

// close is POST /cards/{id}/close.
func (p *cards) close(c *call) reply {
	return p.once(c, "close", func(op Operation, _ fields) reply {
		return p.execute(op, func() (reply, bool) {
			p.mu.Lock()
			defer p.mu.Unlock()
			cd, refusal := p.activeCard(c.r.PathValue("id"))
			if cd == nil {
				return refusal, false
			}
			cd.status = "closed"
			return p.commit(op, p.operation("close", cd.id, "succeeded", new(big.Rat))), true
		})
	})
}

// activeCard finds an active card (p.mu held), or returns the provider's
// business refusal: 4xx with a code, not to be retried as is.
func (p *cards) activeCard(id string) (*card, reply) {
	cd, ok := p.cards[id]
	switch {
	case !ok:
		return nil, errorReply(http.StatusNotFound, "card_not_found", "no card "+id)
	case cd.status != "active":
		return nil, errorReply(http.StatusConflict, "card_not_active", "card "+id+" is "+cd.status)
	}
	return cd, reply{}
}

// createHolder is POST /cardholders {external_id, name}: idempotent by
// external_id, so the key is optional (the endpoint is idempotent by
// external_id already).
func (p *cards) createHolder(c *call) reply {
	f, err := decodeFields(c.body)
	ext := f.str("external_id")
	if err != nil || ext == "" {
		return schemaError("external_id is required")
	}
	p.mu.Lock()
	if err := p.inflight.await(c.r.Context(), &p.mu, "holder:"+ext); err != nil {
		p.mu.Unlock()
		return cancelled()
	}
	if rep, ok := p.holders[ext]; ok {
		p.mu.Unlock()
		p.ledger.replay()
		return rep
	}
	end := p.inflight.start(&p.mu, "holder:"+ext)
	p.mu.Unlock()
	defer end()
	op := Operation{Kind: "cardholder.create", IdempotencyKey: c.key, OrderID: f.str("order_id")}
	return p.execute(op, func() (reply, bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		rep := jsonReply(http.StatusOK, cardholder{ID: p.rng.uuid(), ExternalID: ext, Name: f.str("name"), CreatedAt: p.timestamp()})
		p.holders[ext] = rep
		return rep, true
	})
}

// get is GET /cards/{id}.
func (p *cards) get(c *call) reply {
	p.mu.Lock()
	defer p.mu.Unlock()
	cd, ok := p.cards[c.r.PathValue("id")]
	if !ok {
		return errorReply(http.StatusNotFound, "card_not_found", "no card "+c.r.PathValue("id"))
	}
	return jsonReply(http.StatusOK, cardView{ID: cd.id, Status: cd.status, Balance: decimal(cd.balance), CreatedAt: cd.createdAt})
}
