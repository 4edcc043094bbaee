package cache

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4/pb"
	"github.com/dgraph-io/badger/v4/table"
	"google.golang.org/protobuf/proto"

	"github.com/idemproxy/idemproxy/store"
)

// closedStore writes n final records in dir and closes the store, which
// flushes them to a table; it returns the table files.
func closedStore(t *testing.T, dir string, n int) []string {
	t.Helper()
	s := openStore(t, dir, newClock(), 0)
	for i := range n {
		id := store.ID{Key: fmt.Sprint(i)}
		mustBegin(t, s, id, fpA, "o")
		mustComplete(t, s, id, "o")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	if len(tables) == 0 {
		t.Fatal("Close wrote no table")
	}
	if logs, _ := filepath.Glob(filepath.Join(dir, "*.mem")); len(logs) > 0 {
		t.Fatalf("write-ahead logs left after Close: %v", logs)
	}
	return tables
}

// appendTorn appends the start of a MANIFEST entry to dir's MANIFEST: its
// length (more than follows) and checksum, and a few bytes.
func appendTorn(t *testing.T, dir string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "MANIFEST"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte{0, 0, 0, 24, 1, 2, 3, 4, 10, 20, 8}); err != nil {
		t.Fatal(err)
	}
}

// A compaction can still run while Close ends, after the memtable was
// flushed and its write-ahead log deleted: Close waits for it. A power loss
// while it appends its change to the MANIFEST leaves the entry cut short,
// its new tables whole but unnamed, and the tables it compacted still named
// and on disk, and no log. Nothing is lost (Badger deletes the new tables
// and keeps the old ones), so the store must open: the contract says a
// directory a power loss leaves always opens.
func TestOpenAfterPowerLossDuringCloseCompaction(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	const n = 50
	tables := closedStore(t, dir, n)
	// The compaction's output: the named table's entries, rewritten whole
	// under a new file id.
	whole, err := os.ReadFile(tables[0])
	if err != nil {
		t.Fatal(err)
	}
	output := filepath.Join(dir, "000900.sst")
	writeFile(t, output, whole)
	appendTorn(t, dir)

	opensWithEveryAnswer(t, dir, n, "Open after a power loss during a compaction at Close")
}

// opensWithEveryAnswer opens dir, which must start (after says when), and
// checks that records 0 to n-1 are each final.
func opensWithEveryAnswer(t *testing.T, dir string, n int, after string) {
	t.Helper()
	s, err := Open(Options{Dir: dir, SyncWrites: true, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("%s: %v", after, err)
	}
	defer s.Close()
	for i := range n {
		rec, err := s.Get(ctx, store.ID{Key: fmt.Sprint(i)})
		if err != nil || rec.State != store.Final {
			t.Fatalf("record %d = %+v, %v; want its final answer", i, rec, err)
		}
	}
}

// refusedKeepingTables opens dir, which must be refused naming the MANIFEST,
// and checks that every one of tables is still on disk after it.
func refusedKeepingTables(t *testing.T, dir string, tables []string) {
	t.Helper()
	_, err := Open(Options{Dir: dir, SyncWrites: true, MinFreeBytes: -1})
	if err == nil || !strings.Contains(err.Error(), "MANIFEST") {
		t.Fatalf("Open = %v; want it refused, naming the MANIFEST", err)
	}
	for _, f := range tables {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("table %s gone after the refused start: %v", f, err)
		}
	}
}

// A MANIFEST cut short after a clean Close that no longer names the table
// Close flushed is still refused: that table holds records no other has.
func TestOpenRefusesManifestThatLostAFlush(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	tables := closedStore(t, dir, 50)
	manifest := filepath.Join(dir, "MANIFEST")
	st, err := os.Stat(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(manifest, st.Size()-1); err != nil {
		t.Fatal(err)
	}
	refusedKeepingTables(t, dir, tables)
}

// The same cut entry with a table the MANIFEST names missing is no state a
// crash leaves (a compacted table is deleted only after the entry that
// replaces it is whole): the start is refused, and the unnamed table, which
// may be all that holds its records, stays on disk.
func TestOpenRefusesCutManifestWithNamedTableMissing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	tables := closedStore(t, dir, 50)
	whole, err := os.ReadFile(tables[0])
	if err != nil {
		t.Fatal(err)
	}
	output := filepath.Join(dir, "000900.sst")
	writeFile(t, output, whole)
	appendTorn(t, dir)
	for _, f := range tables {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(Options{Dir: dir, SyncWrites: true, MinFreeBytes: -1}); err == nil || !strings.Contains(err.Error(), "MANIFEST") {
		t.Fatalf("Open = %v; want it refused, naming the MANIFEST", err)
	}
	if _, err := os.Stat(output); err != nil {
		t.Fatalf("unnamed table gone after the refused start: %v", err)
	}
}

// A MANIFEST cut at an entry's start after a clean Close, so that it is
// whole but no longer names the table Close flushed: Badger started empty
// and deleted the table, every record gone. It is refused as a cut inside
// an entry is, and the table stays.
func TestOpenRefusesManifestCutAtEntryBoundary(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	tables := closedStore(t, dir, 50)
	manifest := filepath.Join(dir, "MANIFEST")
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	last := int64(-1)
	for off := int64(8); off+8 <= int64(len(b)); off += 8 + int64(binary.BigEndian.Uint32(b[off:])) {
		last = off
	}
	if last < 0 {
		t.Fatal("MANIFEST holds no entry")
	}
	if err := os.Truncate(manifest, last); err != nil {
		t.Fatal(err)
	}
	refusedKeepingTables(t, dir, tables)
}

// A crash after a compaction's entry is whole in the MANIFEST but before
// its input tables are removed leaves them on disk, deleted by the
// MANIFEST, with no log if the compaction ran while Close ended. Such a
// table was named once; it is no lost entry, and the store opens.
func TestOpenAfterCrashBeforeCompactedTablesRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	const n = 50
	tables := closedStore(t, dir, n)
	whole, err := os.ReadFile(tables[0])
	if err != nil {
		t.Fatal(err)
	}
	id, ok := table.ParseFileID(tables[0])
	if !ok {
		t.Fatalf("table file %s", tables[0])
	}
	writeFile(t, filepath.Join(dir, "000900.sst"), whole)
	appendManifestEntry(t, dir, &pb.ManifestChangeSet{Changes: []*pb.ManifestChange{
		{Id: 900, Op: pb.ManifestChange_CREATE, Level: 1},
		{Id: id, Op: pb.ManifestChange_DELETE},
	}})

	opensWithEveryAnswer(t, dir, n, "Open after a crash before a compaction removed its input")
}

// appendManifestEntry appends cs to dir's MANIFEST as Badger does: its
// length and CRC-32C, big-endian, then the encoded change set.
func appendManifestEntry(t *testing.T, dir string, cs *pb.ManifestChangeSet) {
	t.Helper()
	b, err := proto.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	var head [8]byte
	binary.BigEndian.PutUint32(head[:4], uint32(len(b)))
	binary.BigEndian.PutUint32(head[4:], crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	f, err := os.OpenFile(filepath.Join(dir, "MANIFEST"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(head[:], b...)); err != nil {
		t.Fatal(err)
	}
}
