package retry

import (
	"errors"
	"net/http"
	"testing"
)

// TestStopEndsTheSequence: Call.Stop ends a protected sequence wherever it
// is (before the first attempt, during an attempt, during a wait) with
// ErrStopped, and no attempt follows it.
func TestStopEndsTheSequence(t *testing.T) {
	arrived := make(chan struct{})
	cases := []struct {
		name         string
		steps        []step
		stopAt       func(h *harness, st *Stop) // arranges when st.Stop is called
		wantAttempts int
	}{
		{"before the first attempt", nil,
			func(_ *harness, st *Stop) { st.Stop() }, 0},
		{"during an attempt", []step{func(p *provider, _ http.ResponseWriter, _ *http.Request) {
			close(arrived)
			<-p.release
		}},
			func(_ *harness, st *Stop) { go func() { <-arrived; st.Stop() }() }, 1},
		{"during the wait after a 503", []step{respond(503, ``)},
			func(h *harness, st *Stop) {
				h.tr.OnAttempt = func(i AttemptInfo) { h.record(i); st.Stop() }
			}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, c.steps...)
			h := newHarness(t, testPolicy())
			var st Stop
			c.stopAt(h, &st)
			resp, rep, err := h.tr.Do(post(t, p.srv.URL), Call{Mode: Protected, Stop: &st})
			if resp != nil || !errors.Is(err, ErrStopped) {
				t.Fatalf("Do = %v, %v; want ErrStopped", resp, err)
			}
			if ex := (*ExhaustedError)(nil); errors.As(err, &ex) {
				t.Errorf("a stopped sequence is not an exhausted budget: %v", err)
			}
			if rep.Attempts != c.wantAttempts || len(p.Arrivals()) != c.wantAttempts {
				t.Errorf("%d attempts reported, %d arrived; want %d", rep.Attempts, len(p.Arrivals()), c.wantAttempts)
			}
		})
	}
}
