package pgstore

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
)

// TestShortURLTimeoutsWarned: a lock_timeout or statement_timeout the store
// URL gives is the session's (TestURLTimeoutsKept), and one shorter than the
// call timeout cancels what the call would have waited for: a final answer's
// write after the provider acted (503 for an operation that ran), or the
// schema check at start. statement_timeout=1 (meant as seconds; PostgreSQL
// reads milliseconds) kept a replica not ready for ever, its log saying only
// "database unreachable at start" and "database still unreachable". Open
// now names the setting at start; one at or above the call timeout, or none,
// is not named.
func TestShortURLTimeoutsWarned(t *testing.T) {
	url := pgtest.Database(t)
	for query, want := range map[string]string{
		"&statement_timeout=1":   "statement_timeout=1 (1ms)",
		"&lock_timeout=2s":       "lock_timeout=2s (2s)",
		"&statement_timeout=10s": "",
		"&lock_timeout=0":        "",
		"":                       "",
	} {
		var logs bytes.Buffer
		s, err := Open(context.Background(), Options{URL: url + query, SweepInterval: -1, AnalyzeInterval: -1,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatalf("URL %q: Open: %v", query, err)
		}
		s.Close()
		warned := strings.Contains(logs.String(), "shorter than the 5s every store call may take")
		if want == "" && warned {
			t.Errorf("URL %q: a timeout named:\n%s", query, logs.String())
		}
		if want != "" && (!warned || !strings.Contains(logs.String(), want)) {
			t.Errorf("URL %q: no WARN naming %s at start:\n%s", query, want, logs.String())
		}
	}
}

func TestPGDuration(t *testing.T) {
	for v, want := range map[string]time.Duration{"5": 5 * time.Millisecond, "5s": 5 * time.Second, "1.5s": 1500 * time.Millisecond,
		"100 ms": 100 * time.Millisecond, "2min": 2 * time.Minute, "1h": time.Hour, "1d": 24 * time.Hour, "250us": 250 * time.Microsecond, "0": 0} {
		if d, ok := pgDuration(v); !ok || d != want {
			t.Errorf("pgDuration(%q) = %v, %v; want %v", v, d, ok, want)
		}
	}
	for _, v := range []string{"", "abc", "5 years", "s"} {
		if d, ok := pgDuration(v); ok {
			t.Errorf("pgDuration(%q) = %v, want not ok", v, d)
		}
	}
}
