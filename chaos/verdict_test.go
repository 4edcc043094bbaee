package chaos

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/idemproxy/idemproxy/sandbox"
)

// run is a hand-made run for Judge: what the ledger executed, what reached
// the provider, and what the client saw.
type run struct {
	entries []sandbox.Entry
	wire    map[string]WireOrder
	orders  []Order
}

func (r run) judge() Verdict {
	snap := sandbox.LedgerSnapshot{Executions: len(r.entries), ByOrder: map[string]int{}, ByKey: map[string]int{},
		Faults: map[sandbox.FaultKind]int{}, Entries: r.entries}
	for _, e := range r.entries {
		snap.ByOrder[e.OrderID]++
	}
	return Judge(snap, r.wire, 0, r.orders)
}

const (
	bodyA = `{"id":"pay-a","order_id":"A","status":"succeeded"}`
	bodyB = `{"id":"pay-b","order_id":"B","status":"succeeded"}`
)

func entry(seq int, order, key, body string) sandbox.Entry {
	return sandbox.Entry{Operation: sandbox.Operation{Kind: "payment.create", OrderID: order, IdempotencyKey: key},
		Seq: seq, Status: 201, Body: json.RawMessage(body)}
}

func ok(key, body string, replayed bool) Answer {
	return Answer{Status: 201, Key: key, Body: []byte(body), Replayed: replayed, ProxyAttempts: 1}
}

var lost = Answer{Err: "connection"}

// cleanRun is a run that kept the promise: A's first answer was lost and the
// retry got it; B was answered at once.
func cleanRun() run {
	return run{
		entries: []sandbox.Entry{entry(1, "A", "ka", bodyA), entry(2, "B", "kb", bodyB)},
		wire:    map[string]WireOrder{"A": {Requests: 2, Keys: map[string]int{"ka": 2}}, "B": {Requests: 1, Keys: map[string]int{"kb": 1}}},
		orders:  []Order{{ID: "A", Answers: []Answer{lost, ok("ka", bodyA, true)}}, {ID: "B", Answers: []Answer{ok("kb", bodyB, false)}}},
	}
}

func TestJudge(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*run)
		want   func(Verdict) int // the count the mutation must raise to 1
	}{
		{"second charge", func(r *run) { r.entries = append(r.entries, entry(3, "A", "ka2", bodyA)) },
			func(v Verdict) int { return v.DuplicateExecutions }},
		{"executed an order never sent", func(r *run) { r.entries = append(r.entries, entry(3, "Z", "kz", bodyA)) },
			func(v Verdict) int { return v.DuplicateExecutions }},
		{"success the ledger lacks", func(r *run) { r.entries = r.entries[:1] },
			func(v Verdict) int { return v.SucceededNotExecuted }},
		{"executed, client never learned", func(r *run) { r.orders[0].Answers = slices.Repeat([]Answer{lost}, 20) },
			func(v Verdict) int { return v.ExecutedNotLearned }},
		{"replay body differs", func(r *run) { r.orders[0].Answers[1] = ok("ka", bodyA+" ", true) },
			func(v Verdict) int { return v.ReplayMismatches }},
		{"replay status differs", func(r *run) { r.orders[1].Answers[0].Status = 200 },
			func(v Verdict) int { return v.ReplayMismatches }},
		{"another order's answer", func(r *run) { r.orders[1].Answers[0] = ok("kb", bodyA, false) },
			func(v Verdict) int { return v.ReplayMismatches }},
		{"key changed", func(r *run) { r.wire["A"] = WireOrder{Requests: 2, Keys: map[string]int{"ka": 1, "ka2": 1}} },
			func(v Verdict) int { return v.KeyChanges }},
		{"sent without key", func(r *run) { r.wire["B"] = WireOrder{Requests: 1, Keys: map[string]int{"": 1}} },
			func(v Verdict) int { return v.KeyChanges }},
		{"refused", func(r *run) {
			r.orders[1].Answers[0] = Answer{Status: 409, Key: "kb", Body: []byte(`{"error":{"code":"idempotency_conflict"}}`)}
		}, func(v Verdict) int { return v.Refused }},
		{"answer names another key", func(r *run) { r.orders[0].Answers[1].Key = "kz" },
			func(v Verdict) int { return v.WrongKeyAnswers }},
		{"answer names no key", func(r *run) {
			r.orders[1].Answers[0] = Answer{Status: 502, Body: []byte(`{"error":{"code":"upstream_unavailable"}}`)}
			r.orders[1].Answers = append(r.orders[1].Answers, ok("kb", bodyB, false))
		}, func(v Verdict) int { return v.WrongKeyAnswers }},
	}
	if f := cleanRun().judge().Failures(); len(f) != 0 {
		t.Fatalf("clean run fails: %v", f)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := cleanRun()
			c.mutate(&r)
			v := r.judge()
			if got := c.want(v); got != 1 {
				t.Errorf("count = %d, want 1; verdict %+v", got, v)
			}
			if len(v.Failures()) == 0 || len(v.Examples) == 0 {
				t.Errorf("Failures %v, Examples %v: want the violation named", v.Failures(), v.Examples)
			}
		})
	}
}

func TestJudgeCounts(t *testing.T) {
	v := cleanRun().judge()
	if v.Orders != 2 || v.Succeeded != 2 || v.GaveUp != 0 || v.Executions != 2 || v.UpstreamTotal != 3 {
		t.Errorf("orders %d succeeded %d gave up %d executions %d upstream %d; want 2 2 0 2 3",
			v.Orders, v.Succeeded, v.GaveUp, v.Executions, v.UpstreamTotal)
	}
	wantTries := Histogram{1: 1, 2: 1}
	if v.ClientTries[1] != wantTries[1] || v.ClientTries[2] != wantTries[2] || len(v.ClientTries) != 2 {
		t.Errorf("ClientTries = %v, want %v", v.ClientTries, wantTries)
	}
	if v.Requests["2xx"] != 1 || v.Requests["2xx replayed"] != 1 || v.Requests["connection"] != 1 {
		t.Errorf("Requests = %v", v.Requests)
	}
}

// TestJudgeUnsentOrders: a run interrupted before every order was sent (a
// replica that did not come back after its SIGKILL) leaves orders with no
// answer. Judge panicked on them (index -1), hiding Run's error in CI; they
// are counted as unsent and not judged.
func TestJudgeUnsentOrders(t *testing.T) {
	r := cleanRun()
	r.orders = append(r.orders, Order{ID: "C"})
	v := r.judge()
	if v.Unsent != 1 || v.Orders != 2 {
		t.Errorf("unsent %d, judged orders %d; want 1 and 2", v.Unsent, v.Orders)
	}
	clean := cleanRun().judge()
	if v.DuplicateExecutions != clean.DuplicateExecutions || v.ExecutedNotLearned != clean.ExecutedNotLearned ||
		v.Succeeded != clean.Succeeded || v.GaveUp != clean.GaveUp || v.Refused != clean.Refused {
		t.Errorf("an unsent order changed the verdict: %+v, want the clean run's %+v", v, clean)
	}
}
