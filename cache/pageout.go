package cache

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"time"
)

// pageOutCheck is how often the page-out loop reads the process's
// file-backed resident size when PageOutGrowth is on: a read of
// /proc/self/statm, 12-23 µs on a loaded 2-core machine
// (BenchmarkFileResident). A compaction at 100 MiB/s maps 5 MiB
// of tables in this time.
const pageOutCheck = 50 * time.Millisecond

// pageOutTrigger decides when the store hands its table files' pages back:
// when the process's file-backed resident size has grown by growth over its
// lowest since the last pass, or the period every after the last pass,
// whichever comes first (docs/design/memory.md). It belongs to the page-out
// loop.
type pageOutTrigger struct {
	every  time.Duration // longest time between passes
	growth int64         // growth in bytes that starts a pass at once; <= 0: none
	last   time.Time     // when the last pass ran
	low    int64         // fewest file-backed resident bytes seen since
}

func newPageOutTrigger(every time.Duration, growth int64, now time.Time) pageOutTrigger {
	return pageOutTrigger{every: every, growth: growth, last: now, low: math.MaxInt64}
}

// due reports whether a pass should run at now, with resident file-backed
// bytes in the process.
func (t *pageOutTrigger) due(now time.Time, resident int64) bool {
	t.low = min(t.low, resident)
	return now.Sub(t.last) >= t.every || t.growth > 0 && resident-t.low >= t.growth
}

// ran records a pass that ended at now with resident file-backed bytes left.
func (t *pageOutTrigger) ran(now time.Time, resident int64) {
	t.last, t.low = now, resident
}

// pageOutTick runs a page-out pass if one is due. It stops the loop for
// good only if the kernel cannot page out; any other failure (no file
// descriptor left for /proc at the open-files limit, say) is logged at most
// once a minute and the next tick tries again, since a store that stopped
// paging out would grow its resident set with the store.
func (s *Store) pageOutTick() bool {
	_, err := s.pageOutIfDue(time.Now())
	if err == nil {
		return true
	}
	if pageOutStops(err) {
		s.log.LogAttrs(context.Background(), slog.LevelWarn, "paging out table files is not supported here; resident memory will grow with the store",
			slog.String("component", "cache"), slog.String("error", err.Error()))
		return false
	}
	if now := time.Now(); now.Sub(s.pageOutWarned) >= time.Minute {
		s.pageOutWarned = now
		s.log.LogAttrs(context.Background(), slog.LevelWarn, "paging out table files failed; trying again",
			slog.String("component", "cache"), slog.String("error", err.Error()))
	}
	return true
}

// pageOutStops reports whether a page-out failure ends the loop: only when
// the kernel cannot do it (no MADV_PAGEOUT, or not Linux).
func pageOutStops(err error) bool { return errors.Is(err, errors.ErrUnsupported) }

// pageOutIfDue reads the file-backed resident size and, if s.pageOut says
// so at now, reclaims the table files' resident pages. It reports whether
// a pass ran.
func (s *Store) pageOutIfDue(now time.Time) (bool, error) {
	resident, err := fileResident()
	if err != nil {
		return false, err
	}
	if !s.pageOut.due(now, resident) {
		return false, nil
	}
	if _, err := s.pageOutTables(); err != nil {
		return false, err
	}
	s.pageOuts.Add(1)
	if resident, err = fileResident(); err != nil {
		return true, err
	}
	s.pageOut.ran(now, resident)
	return true, nil
}

// PageOuts returns how many times the store has handed the resident pages
// of its table files back to the kernel since Open (docs/design/memory.md);
// always 0 off Linux, in memory, or with PageOutInterval negative.
func (s *Store) PageOuts() uint64 { return s.pageOuts.Load() }
