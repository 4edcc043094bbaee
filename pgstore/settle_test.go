package pgstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestSettleRedoesFailedParkBeforeClose: a Park that failed while the
// database was down waits to be redone. Settle, which a stopping replica
// calls between its drain and Close, says so while the database stays down
// past its context, and redoes the park once the database answers, within
// its context: the record is unknown with the outcome Park was given before
// the store closes, where Close would have dropped the park.
func TestSettleRedoesFailedParkBeforeClose(t *testing.T) {
	ctx := context.Background()
	c, s, id, _ := claimedThenStopped(t, "drained")
	o := store.Outcome{FirstSentAt: time.Now().Add(-time.Second).Truncate(time.Microsecond).UTC(), Attempts: 1,
		LastError: "status 201 from upstream, but the answer could not be stored", LastBody: []byte(`{"id":"pay_2"}`)}
	if err := s.Park(ctx, id, "o", o); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Park with the database down = %v, want ErrUnavailable", err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err := s.Settle(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 failed") {
		t.Fatalf("Settle with the database down = %v, want 1 failed park left at the deadline", err)
	}

	started := make(chan error, 1)
	go func() { started <- c.Start() }()
	long, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Settle(long); err != nil {
		t.Fatalf("Settle with the database starting = %v, want nil", err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, id)
	if err != nil || rec.State != store.Unknown || !rec.Outcome.FirstSentAt.Equal(o.FirstSentAt) ||
		rec.Outcome.LastError != o.LastError || string(rec.Outcome.LastBody) != string(o.LastBody) {
		t.Fatalf("record after Settle = %+v, %v; want unknown with outcome %+v", rec, err, o)
	}
}
