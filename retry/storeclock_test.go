package retry

import (
	"errors"
	"testing"
	"time"
)

// A resumed sequence on a shared store (Call.Store: the database's clock,
// here an hour off the Transport's) reports the first send it resumed
// exactly as it was given, whether it ends with an answer or unknown again.
// Carried to the Transport's clock and back, it came back earlier by the
// claim's duration (StoreClock.Since): each resume moved the record's first
// send earlier, and a takeover's, which starts at the record's created_at,
// read 6 ms before it in the admin API.
func TestResumedFirstSendReportedAsKept(t *testing.T) {
	for _, c := range []struct {
		name  string
		steps []step
	}{
		{"answered", []step{process}},
		{"unknown again", []step{respond(503, ``)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, c.steps...)
			pol := testPolicy()
			pol.MaxAttempts = 1
			h := newHarness(t, pol)
			created := h.clock.Now().Add(time.Hour).Truncate(time.Microsecond) // the database's clock
			claimAt := created.Add(2 * time.Minute)
			call := Call{Mode: Protected, Store: &StoreClock{At: claimAt, Since: 6 * time.Millisecond},
				Resume: &Resume{FirstSentAt: created}}
			resp, rep, err := h.tr.Do(post(t, p.srv.URL), call)
			if resp != nil {
				resp.Body.Close()
			}
			var ex *ExhaustedError
			if c.name == "unknown again" {
				if !errors.As(err, &ex) || !ex.Unknown {
					t.Fatalf("Do = %v, want an unknown *ExhaustedError", err)
				}
				if !ex.FirstSentAt.Equal(created) {
					t.Errorf("ExhaustedError.FirstSentAt = %v, want the resumed %v (%v off)", ex.FirstSentAt, created, ex.FirstSentAt.Sub(created))
				}
			} else if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if rep.Attempts != 1 || !rep.FirstSentAt.Equal(created) || rep.SentAnew {
				t.Fatalf("Report: %d attempts, FirstSentAt %v (%v off the resumed one), SentAnew %v; want 1, the resumed %v, false",
					rep.Attempts, rep.FirstSentAt, rep.FirstSentAt.Sub(created), rep.SentAnew, created)
			}
		})
	}
}
