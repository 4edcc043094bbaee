package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/metrics"
	"github.com/idemproxy/idemproxy/pgstore"
	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// idemproxy_unknown_oldest_seconds on a replica whose clock is an hour
// ahead of the database's: the oldest unknown operation, first sent a minute
// ago by the database's clock, is a minute old. The first send is a time of
// the database's clock (the key retention check counts by it), and the gauge
// took it from this host's clock: it said 3,660 s.
func TestUnknownOldestCountedByDatabaseClock(t *testing.T) {
	ctx := context.Background()
	s, err := pgstore.Open(ctx, pgstore.Options{URL: pgtest.Database(t), SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := store.ID{Key: "skewed-unknown"}
	rec, _, err := s.Begin(ctx, id, store.Request{Fingerprint: make([]byte, 32), Method: "POST", Path: "/payments"}, "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if rec.ReadAt.IsZero() {
		t.Fatal("the claim carries no database time (ReadAt)")
	}
	const age = time.Minute
	if err := s.Park(ctx, id, "o", store.Outcome{FirstSentAt: rec.ReadAt.Add(-age), Attempts: 1, LastError: "timeout after send"}); err != nil {
		t.Fatal(err)
	}

	ahead := func() time.Time { return time.Now().Add(time.Hour) }
	m := metrics.New("test")
	m.UnknownOperations(countUnknown(s, slog.New(slog.NewTextHandler(io.Discard, nil)), ahead, unknownScanBound(s)), ahead)
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got float64
	found := false
	for _, f := range families {
		if f.GetName() == "idemproxy_unknown_oldest_seconds" {
			got, found = f.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	if !found {
		t.Fatal("idemproxy_unknown_oldest_seconds not exported")
	}
	// A minute, plus the test's own time since the claim (generously).
	if got < age.Seconds() || got > age.Seconds()+30 {
		t.Fatalf("idemproxy_unknown_oldest_seconds = %.1f on a replica an hour ahead, want about %.0f (the database's count)", got, age.Seconds())
	}
}
