package cache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/fb"
	"github.com/dgraph-io/badger/v4/pb"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
	"google.golang.org/protobuf/proto"
)

// checkTables verifies the footer and index checksum of every table file the
// MANIFEST in dir references, before Badger sees them. Badger v4.9.6 opens
// tables in goroutines of its own (newLevelsController), and a damaged footer
// there either panics (slice bounds, seen with a garbage .sst) or reaches
// y.Check, which calls log.Fatalf: neither can be recovered by the caller of
// badger.Open, so a corrupt directory would kill the process instead of
// failing Open.
//
// Only referenced tables are checked. A SIGKILL (or a SIGBUS on a full disk)
// during a memtable flush or a compaction leaves a table file that was never
// finished; Badger adds a table to the MANIFEST only after the table is
// written and synced, and at open it deletes every table the MANIFEST does
// not name (revertToManifest). Checking such an orphan would refuse a store
// Badger opens whole. A MANIFEST that is missing or does not parse is left
// to badger.Open, which creates or refuses it with an error.
//
// The check mirrors table.initIndex: the last 4 bytes hold the checksum
// length, before them the checksum (protobuf), before it the index length
// and before that the index (a flatbuffer), whose checksum must match and
// whose block offsets must lie inside the file. That catches garbage, zeroed
// and truncated tables. Data blocks are not read (that would read the whole
// store at every start): a table damaged only inside its blocks still gets
// past this check, and Badger may then crash on reading them.
func checkTables(dir string, bopts badger.Options) error {
	if err := removeEmptyLogs(dir); err != nil {
		return err
	}
	mr := readManifest(dir, bopts)
	if err := checkManifestWhole(dir, mr); err != nil {
		return err
	}
	ids, ok := manifestTables(mr)
	if !ok {
		return nil
	}
	for _, id := range ids {
		path := table.NewFilename(id, dir)
		if err := checkTable(path); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // badger.Open reports a missing table itself
			}
			return fmt.Errorf("table %s is damaged: %w", path, err)
		}
	}
	return nil
}

// removeEmptyLogs deletes the empty write-ahead (*.mem) and value-log
// (*.vlog) files in dir. Badger creates such a file and then sizes it with
// ftruncate; a kill between the two leaves it at 0 bytes, and Badger v4.9.6
// then refuses the directory ("while opening memtables ... Create a new
// file": ristretto's OpenMmapFile reports an empty file as z.NewFile, which
// openMemTables and valueLog.open treat as an error). An empty file holds
// no entry, so removing it loses nothing.
func removeEmptyLogs(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".mem") && !strings.HasSuffix(name, ".vlog") {
			continue
		}
		if fi, err := e.Info(); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove empty log file: %w", err)
		}
	}
	return nil
}

// checkManifestWhole refuses a directory whose MANIFEST lost table entries
// that no crash can lose, before Badger opens it: Badger would start from
// what is left and delete every table file the MANIFEST no longer names
// (revertToManifest), so every record in them would be gone without a word.
//
//   - No MANIFEST, but table files: Badger creates the MANIFEST before any
//     table and replaces it only by rename, so it is never missing once a
//     table exists. Badger would start empty.
//   - A MANIFEST that ends in a partial entry (cut short) while table files it
//     does not name, with entries newer than those it names, exist and no
//     write-ahead log (*.mem) does. A crash can cut
//     the last entry short (a power loss during its append), but Badger adds
//     a table to the MANIFEST while the log it was flushed from, or the
//     tables it was compacted from, are still there; and a store that was
//     running always has a log, which only a clean Close deletes, after
//     syncing the MANIFEST. Without a log the store was closed cleanly, so
//     the MANIFEST was cut short after that: those tables hold records found
//     nowhere else.
//
// Only unnamed tables that hold newer entries than every named one count
// (newerThanNamed): a flush's table, whose records are found nowhere else.
// A compaction's tables hold entries of the tables it compacted, which stay
// named and on disk until its entry is whole; and a compaction can still
// run while Close ends, after the last log was deleted, so a power loss
// during its append leaves exactly that: a cut entry, its tables unnamed,
// no log, and nothing lost.
//
// A MANIFEST cut at an entry boundary, or cut short while a log exists, is
// not caught: it looks like what a crash leaves.
func checkManifestWhole(dir string, mr manifestRead) error {
	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil || len(tables) == 0 {
		return err
	}
	if mr.missing {
		return fmt.Errorf("%s is missing but table files (*.sst) are there (%d): the store would start empty and delete them, "+
			"losing every record in them; restore the directory from a backup, or move it aside to start empty", badger.ManifestFilename, len(tables))
	}
	if !mr.ok || mr.end >= mr.size {
		return nil // damage badger.Open refuses or reports itself, or a whole MANIFEST
	}
	m := mr.m
	logs, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil || len(logs) > 0 {
		return err
	}
	var unnamed []string
	for _, path := range tables {
		if id, ok := table.ParseFileID(path); ok {
			if _, named := m.Tables[id]; !named {
				unnamed = append(unnamed, filepath.Base(path))
			}
		}
	}
	if len(unnamed) == 0 || !newerThanNamed(dir, m, unnamed) {
		return nil
	}
	return fmt.Errorf("%s is cut short (%d of its %d bytes are whole) and no longer names table files of a store "+
		"that was closed cleanly: the store would delete them, losing every record in them; restore the directory from a backup, "+
		"or move it aside to start empty (unnamed: %s)", badger.ManifestFilename, mr.end, mr.size, strings.Join(unnamed, ", "))
}

// newerThanNamed reports whether one of the unnamed tables (file names in
// dir) holds an entry newer than every table the MANIFEST m names that is
// on disk: its index's largest version is above theirs. Versions are commit
// timestamps, which only grow, so a flush's table holds the newest entries,
// while a compaction writes only versions of the tables it compacted. A
// table whose index cannot be read is not counted: Badger names a table
// only once it is written whole, so such a table was never named. A named
// table that is missing or cannot be read makes the answer yes: nothing
// says what it held, and a crash never leaves one so (a compacted table is
// deleted only after the entry that replaces it is whole).
func newerThanNamed(dir string, m badger.Manifest, unnamed []string) bool {
	var named uint64
	for id := range m.Tables {
		v, err := tableMaxVersion(table.NewFilename(id, dir))
		if err != nil { // missing too: Badger would delete the unnamed ones, then fail
			return true
		}
		named = max(named, v)
	}
	for _, name := range unnamed {
		if v, err := tableMaxVersion(filepath.Join(dir, name)); err == nil && v > named {
			return true
		}
	}
	return false
}

// tableMaxVersion returns the largest version of the entries of the table
// at path, from its verified index.
func tableMaxVersion(path string) (v uint64, err error) {
	index, _, err := readIndex(path)
	if err != nil {
		return 0, err
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("index does not parse: %v", p)
		}
	}()
	return fb.GetRootAsTableIndex(index, 0).MaxVersion(), nil
}

// manifestRead is dir's MANIFEST as Badger's own replay reads it, read
// once for every check at start.
type manifestRead struct {
	m         badger.Manifest
	end, size int64 // the bytes of its whole entries; the file's size
	missing   bool  // there is no MANIFEST
	ok        bool  // it was opened and replayed
}

func readManifest(dir string, bopts badger.Options) manifestRead {
	f, err := os.Open(filepath.Join(dir, badger.ManifestFilename))
	if err != nil {
		return manifestRead{missing: errors.Is(err, fs.ErrNotExist)}
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return manifestRead{}
	}
	m, end, err := badger.ReplayManifestFile(f, bopts.ExternalMagicVersion, bopts)
	if err != nil {
		return manifestRead{}
	}
	return manifestRead{m: m, end: end, size: st.Size(), ok: true}
}

// manifestTables returns the ids of the tables the MANIFEST references; ok
// is false when there is no MANIFEST or Badger could not read it.
func manifestTables(mr manifestRead) (ids []uint64, ok bool) {
	if !mr.ok {
		return nil, false
	}
	for id := range mr.m.Tables {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, true
}

func checkTable(path string) error {
	index, dataEnd, err := readIndex(path)
	if err != nil {
		return err
	}
	return checkBlockOffsets(index, dataEnd)
}

// readIndex reads the index of the table at path, verified against its
// checksum, and where the index starts (the end of the data blocks).
func readIndex(path string) (index []byte, dataEnd int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	pos := st.Size()
	chkLen, err := readU32(f, &pos)
	if err != nil {
		return nil, 0, fmt.Errorf("checksum length: %w", err)
	}
	chkBytes, err := readBack(f, &pos, int64(chkLen))
	if err != nil {
		return nil, 0, fmt.Errorf("checksum: %w", err)
	}
	if len(chkBytes) == 0 {
		return nil, 0, errors.New("checksum is empty")
	}
	var chk pb.Checksum
	if err := proto.Unmarshal(chkBytes, &chk); err != nil {
		return nil, 0, fmt.Errorf("checksum: %w", err)
	}
	if chk.Algo != pb.Checksum_CRC32C && chk.Algo != pb.Checksum_XXHash64 {
		return nil, 0, fmt.Errorf("unknown checksum algorithm %d", chk.Algo)
	}
	indexLen, err := readU32(f, &pos)
	if err != nil {
		return nil, 0, fmt.Errorf("index length: %w", err)
	}
	index, err = readBack(f, &pos, int64(indexLen))
	if err != nil {
		return nil, 0, fmt.Errorf("index: %w", err)
	}
	if len(index) == 0 {
		return nil, 0, errors.New("index is empty")
	}
	if err := y.VerifyChecksum(index, &chk); err != nil {
		return nil, 0, fmt.Errorf("index: %w", err)
	}
	return index, pos, nil
}

// checkBlockOffsets parses the (checksum-verified) flatbuffer index and
// checks that it lists at least one block and that every block lies before
// the index, which starts at dataEnd. A parse panic here is in the caller's
// goroutine and becomes an error.
func checkBlockOffsets(index []byte, dataEnd int64) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("index does not parse: %v", p)
		}
	}()
	ti := fb.GetRootAsTableIndex(index, 0)
	n := ti.OffsetsLength()
	if n == 0 {
		return errors.New("index lists no blocks")
	}
	var bo fb.BlockOffset
	for i := range n {
		if !ti.Offsets(&bo, i) || int64(bo.Offset())+int64(bo.Len()) > dataEnd || bo.Len() < 8 {
			return fmt.Errorf("block %d at %d+%d lies outside the data", i, bo.Offset(), bo.Len())
		}
	}
	return nil
}

var errOutside = errors.New("length points outside the file")

// readU32 reads the big-endian uint32 that ends at *pos and moves *pos back.
func readU32(f io.ReaderAt, pos *int64) (uint32, error) {
	b, err := readBack(f, pos, 4)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b), nil
}

// readBack reads the n bytes that end at *pos and moves *pos back by n.
func readBack(f io.ReaderAt, pos *int64, n int64) ([]byte, error) {
	if n < 0 || n > *pos {
		return nil, errOutside
	}
	*pos -= n
	b := make([]byte, n)
	if _, err := f.ReadAt(b, *pos); err != nil {
		return nil, err
	}
	return b, nil
}
