package sandbox

import (
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// Operation names one execution: what ExecuteHook receives and what the
// ledger records.
type Operation struct {
	// Kind is "cardholder.create", "card.issue", "card.topup", "card.close",
	// "payment.create" or "payout.create".
	Kind string `json:"kind"`
	// IdempotencyKey is the request's Idempotency-Key; empty when absent.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// OrderID is the body's top-level "order_id"; empty when absent.
	OrderID string `json:"order_id,omitempty"`
}

// Entry is one executed operation.
type Entry struct {
	Operation
	// Seq numbers entries from 1 in the order they were recorded.
	Seq int `json:"seq"`
	// At is Config.Now when the operation was recorded.
	At time.Time `json:"at"`
	// Status and Body are the response the operation produced, whether or
	// not the client received it.
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

// LedgerSnapshot is the ledger at one moment. Maps are never nil.
type LedgerSnapshot struct {
	// Provider is Config.Provider.
	Provider string `json:"provider"`
	// Executions counts operations that actually executed.
	Executions int `json:"executions"`
	// ByOrder counts executions per order_id (only those with one).
	ByOrder map[string]int `json:"by_order"`
	// ByKey counts executions per Idempotency-Key (only those with one).
	ByKey map[string]int `json:"by_key"`
	// DuplicateOrders lists, sorted, the order_ids executed more than once:
	// the double charges a chaos test is looking for.
	DuplicateOrders []string `json:"duplicate_orders"`
	// Replays counts answers served from a stored operation instead of
	// executing: key replays and deduplication hits.
	Replays int `json:"replays"`
	// Throttled counts 429s from the provider's own rate limit.
	Throttled int `json:"throttled"`
	// Faults counts injected faults by kind; every kind is present.
	Faults map[FaultKind]int `json:"faults"`
	// Entries are the executions in order; only with full=1 over HTTP.
	Entries []Entry `json:"entries,omitempty"`
}

// ledger records executions and counts replays, throttling and faults.
type ledger struct {
	mu        sync.Mutex
	entries   []Entry
	replays   int
	throttled int
	faults    map[FaultKind]int
}

// newLedger returns an empty ledger.
func newLedger() *ledger {
	return &ledger{faults: map[FaultKind]int{}}
}

// record appends an executed operation and the reply it produced.
func (l *ledger) record(op Operation, at time.Time, rep reply) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, Entry{
		Operation: op,
		Seq:       len(l.entries) + 1,
		At:        at,
		Status:    rep.status,
		Body:      json.RawMessage(slices.Clone(rep.body)),
	})
}

// replay counts an answer served without executing.
func (l *ledger) replay() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.replays++
}

// throttle counts a 429 from the provider's own rate limit.
func (l *ledger) throttle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.throttled++
}

// fault counts an injected fault.
func (l *ledger) fault(kind FaultKind) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.faults[kind]++
}

// snapshot copies the ledger; entries only when full.
func (l *ledger) snapshot(provider string, full bool) LedgerSnapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	snap := LedgerSnapshot{
		Provider:        provider,
		Executions:      len(l.entries),
		ByOrder:         map[string]int{},
		ByKey:           map[string]int{},
		DuplicateOrders: []string{},
		Replays:         l.replays,
		Throttled:       l.throttled,
		Faults:          map[FaultKind]int{},
	}
	for _, k := range faultKinds {
		snap.Faults[k] = l.faults[k]
	}
	for _, e := range l.entries {
		if e.OrderID != "" {
			snap.ByOrder[e.OrderID]++
		}
		if e.IdempotencyKey != "" {
			snap.ByKey[e.IdempotencyKey]++
		}
	}
	for order, n := range snap.ByOrder {
		if n > 1 {
			snap.DuplicateOrders = append(snap.DuplicateOrders, order)
		}
	}
	slices.Sort(snap.DuplicateOrders)
	if full {
		snap.Entries = slices.Clone(l.entries)
	}
	return snap
}
