package chaos

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/sandbox"
)

// maxExamples caps the violations a report describes one by one.
const maxExamples = 10

// Verdict is the judgement of a run. The first seven counts are the promise
// (issue 4) and must all be zero; the rest say what the run went through.
type Verdict struct {
	// DuplicateExecutions counts executions beyond the first, summed over
	// orders: second charges.
	DuplicateExecutions int
	// SucceededNotExecuted counts orders the client saw a 2xx for that the
	// ledger never executed: a payment the app believes in that does not
	// exist.
	SucceededNotExecuted int
	// ExecutedNotLearned counts orders the ledger executed whose 2xx the
	// client never got, though it retried to its limit or stopped on a final
	// answer: money moved and the app does not know.
	ExecutedNotLearned int
	// ReplayMismatches counts 2xx answers whose status or body differ from
	// what the provider produced when the order executed: a replay that is
	// not the original response byte for byte.
	ReplayMismatches int
	// KeyChanges counts orders that reached the provider under more than one
	// Idempotency-Key (or none): the contract's one rule that matters most.
	KeyChanges int
	// WrongKeyAnswers counts proxy answers whose Idempotency-Key header is
	// missing or differs from the one key the order reached the provider
	// under (docs/contract.md: the response always carries the key used).
	WrongKeyAnswers int
	// CrossReplicaDuplicates counts orders executed more than once whose
	// requests came from more than one replica: one key run by two replicas
	// at once, which a shared store must prevent. Part of
	// DuplicateExecutions, named on its own.
	CrossReplicaDuplicates int
	// Refused counts orders the client stopped on a final non-2xx answer
	// (a 4xx): with a well-configured proxy and provider there are none, so
	// one is a conflict or a signing failure.
	Refused int

	// Orders, Succeeded and GaveUp are the client's view: orders sent, orders
	// that got a 2xx, orders that used up MaxTries without one.
	Orders, Succeeded, GaveUp int
	// Executions counts the ledger's executions.
	Executions int
	// Requests counts the client's requests by outcome: "2xx", "2xx
	// replayed", "timeout", "connection", or status and error code.
	Requests map[string]int
	// ClientTries is the distribution of client requests per order.
	ClientTries Histogram
	// UpstreamRequests is the distribution of requests per order that
	// reached the provider, faulted ones included.
	UpstreamRequests Histogram
	// ProxyAttempts is the distribution of the Idemproxy-Attempts header on
	// the client's 2xx answers (the attempts of the sequence that produced
	// the stored response; replays repeat it).
	ProxyAttempts Histogram
	// Faults counts the sandbox's injected faults by kind.
	Faults map[sandbox.FaultKind]int
	// UpstreamTotal counts every request that reached the provider;
	// Unattributed those without an order_id (none expected).
	UpstreamTotal, Unattributed int
	// ProviderReplays and Throttled are the ledger's counts of answers served
	// from a stored operation and of its own rate limit's 429s.
	ProviderReplays, Throttled int
	// Longest is the order that took the most client requests, with each
	// answer and when it was sent, e.g. "chaos-1-0000042: 0s connection,
	// 32ms 2xx replayed".
	Longest string
	// Examples describe up to ten violations, one line each.
	Examples []string
	// Unsent counts orders the client never sent: the run was interrupted
	// (Run's error says why) before their turn. They are not judged.
	Unsent int
}

// Judge compares the ledger and the wire counts with the client's records.
// It must run after the proxy and the sandbox have stopped, so the ledger is
// final.
func Judge(ledger sandbox.LedgerSnapshot, wire map[string]WireOrder, unattributed int, all []Order) Verdict {
	orders := slices.DeleteFunc(slices.Clone(all), func(o Order) bool { return len(o.Answers) == 0 })
	v := Verdict{Orders: len(orders), Unsent: len(all) - len(orders), Executions: ledger.Executions, Requests: map[string]int{},
		ClientTries: Histogram{}, UpstreamRequests: Histogram{}, ProxyAttempts: Histogram{},
		Faults: maps.Clone(ledger.Faults), Unattributed: unattributed,
		ProviderReplays: ledger.Replays, Throttled: ledger.Throttled}
	first := firstExecutions(ledger.Entries)
	for i := range orders {
		v.judgeOrder(&orders[i], ledger.ByOrder[orders[i].ID], first[orders[i].ID])
	}
	v.judgeLedger(ledger, orders)
	v.Longest = longest(orders)
	for _, id := range slices.Sorted(maps.Keys(wire)) {
		w := wire[id]
		v.UpstreamTotal += w.Requests
		v.UpstreamRequests[w.Requests]++
		if _, none := w.Keys[""]; len(w.Keys) > 1 || none {
			v.KeyChanges++
			v.example("order %s reached the provider under %d keys: %v", id, len(w.Keys), w.Keys)
		}
	}
	for i := range orders {
		v.judgeKeys(&orders[i], wire[orders[i].ID])
		if ledger.ByOrder[orders[i].ID] > 1 && len(wire[orders[i].ID].Replicas) > 1 {
			v.CrossReplicaDuplicates++
			v.example("order %s executed %d times, sent by replicas %v", orders[i].ID, ledger.ByOrder[orders[i].ID], wire[orders[i].ID].Replicas)
		}
	}
	v.UpstreamTotal += unattributed
	return v
}

// firstExecutions maps each order_id to its first ledger entry.
func firstExecutions(entries []sandbox.Entry) map[string]sandbox.Entry {
	first := map[string]sandbox.Entry{}
	for _, e := range entries {
		if f, ok := first[e.OrderID]; e.OrderID != "" && (!ok || e.Seq < f.Seq) {
			first[e.OrderID] = e
		}
	}
	return first
}

// judgeOrder checks one order against its execution count and its first
// execution in the ledger.
func (v *Verdict) judgeOrder(o *Order, execs int, orig sandbox.Entry) {
	v.ClientTries[len(o.Answers)]++
	ok := o.Succeeded()
	final := o.Final()
	switch {
	case ok:
		v.Succeeded++
	case retriable(final):
		v.GaveUp++
	default:
		v.Refused++
		v.example("order %s: client stopped on %d %s", o.ID, final.Status, clip(final.Body))
	}
	if execs > 1 {
		v.DuplicateExecutions += execs - 1
		v.example("order %s executed %d times", o.ID, execs)
	}
	if ok && execs == 0 {
		v.SucceededNotExecuted++
		v.example("order %s: client got a 2xx, ledger has no execution", o.ID)
	}
	if !ok && execs > 0 {
		v.ExecutedNotLearned++
		v.example("order %s executed, client never got a 2xx in %d tries (last: %s)", o.ID, len(o.Answers), describe(final))
	}
	for _, a := range o.Answers {
		v.Requests[describe(a)]++
		if !a.OK() {
			continue
		}
		v.ProxyAttempts[a.ProxyAttempts]++
		// The provider's first execution produced orig.Body. A replay from the
		// provider carries the same bytes (plus Idempotent-Replayed), and
		// idemproxy must store and replay exactly what it received. An answer
		// the status probe found is the lookup's (GET /payments/{id}: 200 where
		// the creation said 201): its body must still be the execution's.
		statusDiffers := a.Status != orig.Status && !a.Reconciled
		if execs > 0 && (statusDiffers || !bytes.Equal(a.Body, orig.Body)) {
			v.ReplayMismatches++
			v.example("order %s: answer %d %s differs from the execution's %d %s", o.ID, a.Status, clip(a.Body), orig.Status, clip(orig.Body))
		}
	}
}

// judgeKeys checks that every answer from the proxy names the key the order
// was sent upstream under. Orders that never reached the provider, or reached
// it under several keys (counted as KeyChanges), have no one key to compare.
func (v *Verdict) judgeKeys(o *Order, w WireOrder) {
	if len(w.Keys) != 1 {
		return
	}
	var sent string
	for k := range w.Keys {
		sent = k
	}
	for _, a := range o.Answers {
		if a.Status != 0 && a.Key != sent {
			v.WrongKeyAnswers++
			v.example("order %s: answer %d names key %q, the provider got %q", o.ID, a.Status, a.Key, sent)
		}
	}
}

// judgeLedger counts executions of orders the client never sent (which no
// proxy should invent) as duplicates of nothing: they are second charges too.
func (v *Verdict) judgeLedger(ledger sandbox.LedgerSnapshot, orders []Order) {
	sent := make(map[string]bool, len(orders))
	for _, o := range orders {
		sent[o.ID] = true
	}
	for _, id := range slices.Sorted(maps.Keys(ledger.ByOrder)) {
		if !sent[id] {
			v.DuplicateExecutions += ledger.ByOrder[id]
			v.example("ledger executed order %q that the client never sent", id)
		}
	}
	if n := ledger.Executions - sumValues(ledger.ByOrder); n > 0 {
		v.DuplicateExecutions += n
		v.example("ledger has %d executions without an order_id", n)
	}
}

// Failures names each must-be-zero count that is not zero; empty means the
// promise held.
func (v Verdict) Failures() []string {
	var out []string
	for _, c := range v.mustBeZero() {
		if c.n != 0 {
			out = append(out, fmt.Sprintf("%s: %d", c.name, c.n))
		}
	}
	return out
}

// count is one named figure of a report.
type count struct {
	name string
	n    int
}

func (v Verdict) mustBeZero() []count {
	return []count{
		{"duplicate executions", v.DuplicateExecutions},
		{"succeeded but not executed", v.SucceededNotExecuted},
		{"executed but success never learned", v.ExecutedNotLearned},
		{"replays differing from the original", v.ReplayMismatches},
		{"orders sent upstream under more than one key", v.KeyChanges},
		{"answers naming another key than the one sent", v.WrongKeyAnswers},
		{"orders refused with a final 4xx", v.Refused},
		{"orders executed by two replicas", v.CrossReplicaDuplicates},
	}
}

func (v *Verdict) example(format string, args ...any) {
	if len(v.Examples) < maxExamples {
		v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
	}
}

// longest describes the order with the most answers.
func longest(orders []Order) string {
	if len(orders) == 0 {
		return ""
	}
	o := slices.MaxFunc(orders, func(a, b Order) int { return len(a.Answers) - len(b.Answers) })
	parts := make([]string, len(o.Answers))
	for i, a := range o.Answers {
		parts[i] = a.At.Round(time.Millisecond).String() + " " + describe(a)
	}
	return o.ID + ": " + strings.Join(parts, ", ")
}

// describe names an answer for the request counts: "2xx", "2xx replayed",
// "timeout", "connection", or the status and its error code.
func describe(a Answer) string {
	switch {
	case a.Err != "":
		return a.Err
	case a.OK() && a.Replayed:
		return "2xx replayed"
	case a.OK():
		return "2xx"
	}
	if code := errorCode(a.Body); code != "" {
		return strconv.Itoa(a.Status) + " " + code
	}
	return strconv.Itoa(a.Status)
}

// clip shortens a body for an example line.
func clip(b []byte) string {
	const n = 120
	if len(b) > n {
		return strconv.Quote(string(b[:n])) + "…"
	}
	return strconv.Quote(string(b))
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
