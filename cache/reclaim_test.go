package cache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// tableBytes is the allocated size of the store's table files.
func tableBytes(t *testing.T, dir string) int64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			continue // deleted by a compaction meanwhile
		}
		n += fi.Size()
	}
	return n
}

// TestReclaimExpired: once every record has expired and none was written
// since, the store drops them and their tables leave the disk; while one
// record is live, or right after a write, nothing is dropped.
func TestReclaimExpired(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s, err := Open(Options{Dir: dir, TTL: time.Minute, Now: c.Now, MemTableSize: 1 << 20,
		ReclaimInterval: -1, PageOutInterval: -1, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	body := []byte(strings.Repeat("e", 2000))
	for i := range 3000 { // 6 MB through a 1 MiB memtable: several tables
		id := store.ID{Key: fmt.Sprint(i)}
		mustBegin(t, s, id, fpA, "o")
		if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	full := tableBytes(t, dir)
	if full < 2<<20 {
		t.Fatalf("only %d bytes of tables after 6 MB of records", full)
	}

	if dropped, err := s.reclaimExpired(); err != nil || dropped {
		t.Fatalf("reclaim with every record live = %v, %v; want nothing dropped", dropped, err)
	}
	c.Advance(30 * time.Second)
	live := store.ID{Key: "late"}
	mustBegin(t, s, live, fpA, "o")
	mustComplete(t, s, live, "o")
	c.Advance(45 * time.Second) // the 3000 have expired, "late" has 15 s left
	if dropped, err := s.reclaimExpired(); err != nil || dropped {
		t.Fatalf("reclaim 45 s after the last write = %v, %v; want nothing dropped", dropped, err)
	}
	if _, err := s.Get(ctx, live); err != nil {
		t.Fatalf("live record after a refused reclaim: %v", err)
	}

	c.Advance(time.Minute) // everything has expired
	dropped, err := s.reclaimExpired()
	if err != nil || !dropped {
		t.Fatalf("reclaim with every record expired = %v, %v; want dropped", dropped, err)
	}
	if after := tableBytes(t, dir); after > full/10 {
		t.Fatalf("tables %d bytes after reclaim, %d before; want most of it gone", after, full)
	}
	if dropped, _ := s.reclaimExpired(); dropped {
		t.Fatal("second reclaim with no write since dropped again")
	}
	id := store.ID{Key: "after"}
	mustBegin(t, s, id, fpA, "o")
	mustComplete(t, s, id, "o")
	if _, err := s.Get(ctx, id); err != nil {
		t.Fatalf("record written after the reclaim: %v", err)
	}
	if _, err := s.Get(ctx, store.ID{Key: "7"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("expired record after reclaim: %v", err)
	}
}
