package cache

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"time"
)

// pageOutCheck is how often the page-out loop reads the process's
// file-backed resident size when PageOutGrowth is on: a pread of
// /proc/self/statm, which the loop keeps open (BenchmarkFileResident). A
// compaction at 100 MiB/s maps 5 MiB of tables in this time.
const pageOutCheck = 50 * time.Millisecond

// pageOutTrigger decides when the store hands its table files' pages back:
// when the process's file-backed resident size has grown by growth over the
// lowest of the checks since the last pass, or the period every after the
// last pass, whichever comes first (docs/design/memory.md). It belongs to
// the page-out loop.
type pageOutTrigger struct {
	every  time.Duration // longest time between passes
	growth int64         // growth in bytes that starts a pass at once; <= 0: none
	last   time.Time     // when the last pass ran
	low    int64         // fewest file-backed resident bytes checked since; MaxInt64: none yet
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

// ran records a pass that ran at now. The next check sets the lowest
// resident size afresh, so the pass needs no read of its own.
func (t *pageOutTrigger) ran(now time.Time) {
	t.last, t.low = now, math.MaxInt64
}

// pageOutLoop runs the page-out loop, checking every check, until Close or
// until the kernel turns out unable to page out. With PageOutGrowth on it
// holds /proc/self/statm open for the loop's life; with it off only the
// period matters and the file is never opened.
func (s *Store) pageOutLoop(check time.Duration) {
	defer s.gcDone.Done()
	defer s.statm.close()
	if s.pageOut.growth > 0 {
		if err := s.statm.open(); err != nil && !s.pageOutFailed(err) {
			return
		}
	}
	s.ticks(check, func() bool {
		err := s.pageOutIfDue(time.Now())
		return err == nil || s.pageOutFailed(err)
	})
}

// pageOutFailed reports whether the page-out loop goes on after err. It
// stops for good only if the kernel cannot page out; any other failure (no
// file descriptor left for /proc at the open-files limit, say) is logged at
// most once a minute and the next tick tries again (opening
// /proc/self/statm too if it is not open), since a store that stopped
// paging out would grow its resident set with the store.
func (s *Store) pageOutFailed(err error) bool {
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

// pageOutIfDue reclaims the table files' resident pages if s.pageOut says
// so at now. It reads the file-backed resident size only when the growth
// trigger is on: with it off, only the period decides.
func (s *Store) pageOutIfDue(now time.Time) error {
	var resident int64
	if s.pageOut.growth > 0 {
		var err error
		if resident, err = s.statm.fileResident(); err != nil {
			return err
		}
	}
	if !s.pageOut.due(now, resident) {
		return nil
	}
	if _, err := s.pageOutTables(); err != nil {
		return err
	}
	s.pageOuts.Add(1)
	s.pageOut.ran(now)
	return nil
}

// PageOuts returns how many times the store has handed the resident pages
// of its table files back to the kernel since Open (docs/design/memory.md);
// always 0 off Linux, in memory, or with PageOutInterval negative.
func (s *Store) PageOuts() uint64 { return s.pageOuts.Load() }
