package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// badgerLogger routes Badger's log to slog, keeping only warnings and
// errors: its info and debug lines (one per compaction, flush and GC step)
// would drown the proxy's own log.
type badgerLogger struct{ log *slog.Logger }

func (l badgerLogger) Errorf(format string, args ...any) {
	l.log.Error(strings.TrimSpace(fmt.Sprintf(format, args...)), "component", "badger")
}

func (l badgerLogger) Warningf(format string, args ...any) {
	l.log.Warn(strings.TrimSpace(fmt.Sprintf(format, args...)), "component", "badger")
}

func (badgerLogger) Infof(string, ...any)  {}
func (badgerLogger) Debugf(string, ...any) {}

// every runs tick in a goroutine every interval until Close, or until tick
// returns false. Close waits for it.
func (s *Store) every(interval time.Duration, tick func() bool) {
	s.gcDone.Add(1)
	go func() {
		defer s.gcDone.Done()
		s.ticks(interval, tick)
	}()
}

// ticks calls tick every interval until Close, or until tick returns false.
func (s *Store) ticks(interval time.Duration, tick func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if !tick() {
				return
			}
		}
	}
}

// gcTick runs value-log GC. Records live in the LSM tree
// (docs/design/durability.md), so GC normally finds nothing to rewrite; it runs
// anyway so that a value log that did grow is reclaimed.
func (s *Store) gcTick() bool {
	s.runGC()
	return true
}

// runGC calls RunValueLogGC until it has nothing more to rewrite (Badger's
// documented usage: one call rewrites at most one file).
func (s *Store) runGC() {
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		err := s.db.RunValueLogGC(0.5)
		if err == nil {
			continue
		}
		if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
			s.log.LogAttrs(context.Background(), slog.LevelWarn, "value-log GC failed",
				slog.String("component", "cache"), slog.String("error", err.Error()))
		}
		return
	}
}
