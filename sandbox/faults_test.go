package sandbox

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// TestFaults makes each fault certain (probability 1) and checks what the
// caller sees, whether the operation executed, and that the fault was counted.
func TestFaults(t *testing.T) {
	tests := []struct {
		name      string
		faults    Faults
		kind      FaultKind
		executed  int
		dropped   bool
		statuses  []int
		code      string // error.code; "" = not checked
		retryWait string // Retry-After; "" = none expected
	}{
		{name: "drop before processing", faults: Faults{DropBeforeProcessing: 1}, kind: FaultDropBefore, dropped: true},
		{name: "drop after processing", faults: Faults{DropAfterProcessing: 1}, kind: FaultDropAfter, executed: 1, dropped: true},
		{name: "slow after processing", faults: Faults{SlowAfterProcessing: 1}, kind: FaultSlow, executed: 1, statuses: []int{200}},
		{name: "5xx", faults: Faults{Status5xx: 1}, kind: FaultStatus5xx, statuses: []int{500, 502, 503, 504}},
		{name: "rate limited", faults: Faults{RateLimited: 1}, kind: FaultRateLimited, statuses: []int{429}, retryWait: "60"},
		{name: "maintenance", faults: Faults{Maintenance: 1}, kind: FaultMaintenance, statuses: []int{503}, code: "maintenance"},
		{name: "drop before wins over the rest", faults: Faults{DropBeforeProcessing: 1, Maintenance: 1, Status5xx: 1, DropAfterProcessing: 1},
			kind: FaultDropBefore, dropped: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, ts := start(t, Config{Provider: ProviderPayouts, Faults: tt.faults, SlowDelay: time.Millisecond})
			r, err := trySend(context.Background(), ts, "POST", "/v1/payout", payoutBody("payout-1", "25"), nil)
			switch {
			case tt.dropped && err == nil:
				t.Fatalf("got %d %s, want the connection dropped", r.status, r.body)
			case !tt.dropped && err != nil:
				t.Fatalf("request failed: %v", err)
			case !tt.dropped && !slices.Contains(tt.statuses, r.status):
				t.Fatalf("status %d %s, want one of %v", r.status, r.body, tt.statuses)
			case tt.code != "" && r.code() != tt.code:
				t.Fatalf("code %q, want %q", r.code(), tt.code)
			case !tt.dropped && r.header.Get("Retry-After") != tt.retryWait:
				t.Fatalf("Retry-After %q, want %q", r.header.Get("Retry-After"), tt.retryWait)
			}
			l := s.Ledger()
			if l.Executions != tt.executed {
				t.Errorf("executions = %d, want %d", l.Executions, tt.executed)
			}
			for _, k := range faultKinds {
				if want := map[bool]int{true: 1}[k == tt.kind]; l.Faults[k] != want {
					t.Errorf("faults[%s] = %d, want %d", k, l.Faults[k], want)
				}
			}
		})
	}
}

// TestSlowFaultOutlivesTheCaller: the operation runs, the caller gives up
// before the answer, and the execution stands in the ledger.
func TestSlowFaultOutlivesTheCaller(t *testing.T) {
	entered := make(chan struct{})
	s, ts := start(t, Config{Provider: ProviderPayouts, Faults: Faults{SlowAfterProcessing: 1}, SlowDelay: time.Hour,
		ExecuteHook: func(Operation) { close(entered) }})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-entered // the server has the request; now the caller times out
		cancel()
	}()
	if r, err := trySend(ctx, ts, "POST", "/v1/payout", payoutBody("payout-1", "25"), nil); err == nil {
		t.Fatalf("got %d %s, want the caller to give up", r.status, r.body)
	}
	ts.Close() // returns once the held handler has seen the caller leave
	if l := s.Ledger(); l.Executions != 1 || l.Faults[FaultSlow] != 1 {
		t.Fatalf("ledger = %+v, want the payout executed and the slow fault counted", l)
	}
}

// TestThrottledShapePerProvider: the 429 of the RateLimited fault has each
// provider's shape; only payouts omits the error code.
func TestThrottledShapePerProvider(t *testing.T) {
	tests := []struct {
		provider, method, path, body string
	}{
		{ProviderCards, "POST", "/cards", `{"error":{"code":"rate_limited","message":"rate limit exceeded"}}`},
		{ProviderPayments, "POST", "/payments", `{"error":{"code":"rate_limited","message":"rate limit exceeded"}}`},
		{ProviderPayouts, "POST", "/v1/payout", `{"state":1,"message":"rate limit exceeded"}`},
	}
	for _, tt := range tests {
		t.Run(tt.provider, func(t *testing.T) {
			_, ts := start(t, Config{Provider: tt.provider, Faults: Faults{RateLimited: 1}, RetryAfter: 3})
			r := send(t, ts, tt.method, tt.path, `{}`, keyed("k-1"))
			if r.status != 429 || string(r.body) != tt.body || r.header.Get("Retry-After") != "3" {
				t.Fatalf("= %d %v %s, want 429, Retry-After 3, %s", r.status, r.header, r.body, tt.body)
			}
		})
	}
}

// TestFaultsRepeatWithSeed: the same seed and requests give the same run.
func TestFaultsRepeatWithSeed(t *testing.T) {
	faults := Faults{DropBeforeProcessing: 0.2, DropAfterProcessing: 0.2, SlowAfterProcessing: 0.2,
		Status5xx: 0.2, RateLimited: 0.2, Maintenance: 0.2}
	run := func() ([]string, LedgerSnapshot) {
		s, ts := start(t, Config{Provider: ProviderPayments, Faults: faults, SlowDelay: time.Nanosecond, Seed: 42})
		var outcomes []string
		for i := range 30 {
			r, err := trySend(context.Background(), ts, "POST", "/payments", fmt.Sprintf(`{"order_id":"o-%d","amount":"1"}`, i%10), keyed(fmt.Sprint("k-", i%10)))
			if err != nil {
				outcomes = append(outcomes, "dropped")
				continue
			}
			outcomes = append(outcomes, fmt.Sprint(r.status, " ", string(r.body)))
		}
		l := s.Ledger()
		l.Entries = nil
		return outcomes, l
	}
	out1, l1 := run()
	out2, l2 := run()
	if !slices.Equal(out1, out2) || fmt.Sprint(l1) != fmt.Sprint(l2) {
		t.Fatalf("runs differ:\n%v\n%v\n%+v\n%+v", out1, out2, l1, l2)
	}
	total := 0
	for _, n := range l1.Faults {
		total += n
	}
	if total == 0 || l1.Executions == 0 || l1.Executions > 10 {
		t.Fatalf("ledger = %+v, want some faults and at most one execution per key", l1)
	}
}

// TestSandboxRoutesHaveNoFaults: the ledger stays readable whatever faults.
func TestSandboxRoutesHaveNoFaults(t *testing.T) {
	_, ts := start(t, Config{Provider: ProviderCards, Faults: Faults{DropBeforeProcessing: 1, DropAfterProcessing: 1}, RateLimit: 0.001})
	for range 3 {
		if r := send(t, ts, "GET", "/_sandbox/ledger", "", nil); r.status != http.StatusOK {
			t.Fatalf("ledger = %d %s, want 200", r.status, r.body)
		}
	}
}
