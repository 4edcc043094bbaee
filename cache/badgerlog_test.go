package cache

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// captured collects slog records at every level.
type captured struct {
	mu      sync.Mutex
	records []slog.Record
}

func (c *captured) Enabled(context.Context, slog.Level) bool { return true }
func (c *captured) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *captured) WithGroup(string) slog.Handler            { return c }
func (c *captured) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, r)
	return nil
}

func (c *captured) below(level slog.Level) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var msgs []string
	for _, r := range c.records {
		if r.Level < level {
			msgs = append(msgs, r.Message)
		}
	}
	return msgs
}

func TestBadgerLogger(t *testing.T) {
	h := &captured{}
	l := badgerLogger{slog.New(h)}
	l.Debugf("debug %d", 1)
	l.Infof("info %d", 2)
	l.Warningf("warn %d\n", 3)
	l.Errorf("error %d\n", 4)
	want := []struct {
		level slog.Level
		msg   string
	}{{slog.LevelWarn, "warn 3"}, {slog.LevelError, "error 4"}}
	if len(h.records) != len(want) {
		t.Fatalf("%d records, want %d (info and debug dropped)", len(h.records), len(want))
	}
	for i, w := range want {
		r := h.records[i]
		if r.Level != w.level || r.Message != w.msg {
			t.Errorf("record %d = %v %q, want %v %q", i, r.Level, r.Message, w.level, w.msg)
		}
	}
}

// TestQuietStore: opening, writing, GC with nothing to rewrite and closing
// log nothing below warning, and a GC pass ends on ErrNoRewrite without
// logging a failure.
func TestQuietStore(t *testing.T) {
	h := &captured{}
	s, err := Open(Options{Dir: t.TempDir(), SyncWrites: true, GCInterval: time.Hour, Logger: slog.New(h), MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	mustBegin(t, s, store.ID{Key: "k"}, fpA, "o")
	mustComplete(t, s, store.ID{Key: "k"}, "o")
	s.runGC()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if msgs := h.below(slog.LevelWarn); len(msgs) > 0 {
		t.Fatalf("records below warning reached the logger: %q", msgs)
	}
	if n := len(h.records); n != 0 {
		t.Fatalf("%d warnings or errors logged by a healthy store: %v", n, h.records[0].Message)
	}
}
