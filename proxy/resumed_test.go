package proxy

import (
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestResumedFirstSend: a record taken over (Fence past 1) with no first
// send resumes with its claim time as the first send, also when its outcome
// holds attempts or an error, so the provider key retention check is not
// skipped; a first send it has is kept, and a fresh claim resumes nothing.
func TestResumedFirstSend(t *testing.T) {
	claimed := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	sent := claimed.Add(time.Minute)
	for _, c := range []struct {
		name string
		rec  store.Record
		want store.Outcome
	}{
		{"fresh claim", store.Record{Fence: 1, CreatedAt: claimed}, store.Outcome{}},
		{"taken over, no outcome", store.Record{Fence: 2, CreatedAt: claimed}, store.Outcome{FirstSentAt: claimed}},
		{"taken over, attempts but no first send", store.Record{Fence: 2, CreatedAt: claimed, Outcome: store.Outcome{Attempts: 2, LastError: "status 500 from upstream"}},
			store.Outcome{FirstSentAt: claimed, Attempts: 2, LastError: "status 500 from upstream"}},
		{"taken over, first send known", store.Record{Fence: 3, CreatedAt: claimed, Outcome: store.Outcome{FirstSentAt: sent, Attempts: 1}},
			store.Outcome{FirstSentAt: sent, Attempts: 1}},
	} {
		got := resumed(c.rec)
		if !got.FirstSentAt.Equal(c.want.FirstSentAt) || got.Attempts != c.want.Attempts || got.LastError != c.want.LastError {
			t.Errorf("%s: resumed = %+v, want %+v", c.name, got, c.want)
		}
	}
}
