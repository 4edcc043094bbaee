package cache

import (
	"bufio"
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
	"github.com/dgraph-io/badger/v4/options"
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
// and truncated tables.
//
// Then every data block is read and its own checksum verified
// (checkBlocks), which reads the whole LSM tree at every start. Badger
// never surfaces a damaged block as an error: with its default
// NoVerification it parses the garbage (a key read as another, so a stored
// order is "not found" and sent upstream again, or a record that does not
// decode); with OnBlockRead a block that fails its checksum ends the table's
// iterator, and every lookup (levelHandler.get), iteration and compaction
// takes that end as the table's end, so a Get says "not found" for every
// key of the block, and the next compaction writes the table out without
// the rest of its keys and deletes it (measured: 486 of 500 records gone
// for good after one L0 compaction). A damaged table must therefore never
// reach Badger; refusing the directory keeps every file as it was.
func checkTables(dir string, bopts badger.Options) error {
	if err := checkLogHeaders(dir); err != nil {
		return err
	}
	if err := checkWALs(dir, bopts.MemTableSize); err != nil {
		return err
	}
	if err := checkHeldWALs(dir); err != nil {
		return err
	}
	if err := removeEmptyLogs(dir); err != nil {
		return err
	}
	if err := checkKeyRegistry(dir); err != nil {
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
	var br blockReader
	for _, id := range ids {
		path := table.NewFilename(id, dir)
		tm := mr.m.Tables[id]
		// The store writes tables uncompressed and unencrypted; a block of
		// another kind would need decoding before its checksum is checked.
		plain := tm.Compression == options.None && tm.KeyID == 0
		if err := checkTable(path, plain, &br); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				// Badger would say "file does not exist for table N".
				return fmt.Errorf("table %s is missing: the MANIFEST names it; the store is not opened, so that none of "+
					"its records is lost or sent again, and nothing in the directory was changed: restore the "+
					"directory from a backup", path)
			}
			if errors.Is(err, fs.ErrPermission) {
				return fmt.Errorf("table %s: %w", path, err) // not damage: the caller names the fix
			}
			return fmt.Errorf("table %s is damaged: %w; the store is not opened, so that none of its records is lost or "+
				"sent again, and nothing in the directory was changed: restore the directory from a backup", path, err)
		}
	}
	return nil
}

// removeEmptyLogs deletes the empty write-ahead (*.mem) and value-log
// (*.vlog) files in dir. Badger creates such a file and then sizes it with
// ftruncate, and deletes one by truncating it to 0 and then removing it; a
// kill between the two leaves it at 0 bytes, and Badger v4.9.6
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
//   - A MANIFEST, cut short or cut at an entry boundary, that never named
//     table files with entries newer than those it names, while no
//     write-ahead log (*.mem) exists. A crash can cut
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
// Only tables the MANIFEST never mentions count: one it created and then
// deleted (a compaction's input, or a table DropPrefix emptied) stays on
// disk when a crash comes between the entry that deletes it and the file's
// removal, and may hold the newest version (a compaction at the last level
// drops expired entries and deletions). A MANIFEST cut at an entry boundary
// loses whole entries, the flush's among them, just as a cut inside one:
// nothing tells the two apart but what the tables hold (the MANIFEST of a
// fresh store cut to its 8-byte header, after a clean shutdown, started
// empty, deleted the table and sent each of 100 acknowledged orders to the
// provider again). Badger rewrites the MANIFEST with only the tables it
// names once deletions far outnumber creations; a crash right after such a
// rewrite, during a compaction that ran while Close ended and dropped the
// newest version, would be refused though nothing was lost.
//
// A MANIFEST cut while a log exists is not caught: it looks like what a
// crash leaves.
func checkManifestWhole(dir string, mr manifestRead) error {
	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil || len(tables) == 0 {
		return err
	}
	if mr.missing {
		return fmt.Errorf("%s is missing but table files (*.sst) are there (%d): the store would start empty and delete them, "+
			"losing every record in them; restore the directory from a backup, or move it aside to start empty", badger.ManifestFilename, len(tables))
	}
	if !mr.ok {
		return nil // damage badger.Open refuses or reports itself
	}
	m := mr.m
	logs, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil || len(logs) > 0 {
		return err
	}
	var unnamed []string
	for _, path := range tables {
		if id, ok := table.ParseFileID(path); ok {
			if !mr.mentioned[id] {
				unnamed = append(unnamed, filepath.Base(path))
			}
		}
	}
	if len(unnamed) == 0 || !newerThanNamed(dir, m, unnamed) {
		return nil
	}
	cut := fmt.Sprintf("is cut short (%d of its %d bytes are whole)", mr.end, mr.size)
	if mr.end >= mr.size {
		cut = "lost entries (it may have been cut at an entry's end)"
	}
	return fmt.Errorf("%s %s and no longer names table files of a store "+
		"that was closed cleanly: the store would delete them, losing every record in them; restore the directory from a backup, "+
		"or move it aside to start empty (unnamed: %s)", badger.ManifestFilename, cut, strings.Join(unnamed, ", "))
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
	end, size int64           // the bytes of its whole entries; the file's size
	mentioned map[uint64]bool // every table id a whole entry creates or deletes
	missing   bool            // there is no MANIFEST
	ok        bool            // it was opened and replayed
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
	mentioned, err := manifestMentions(f, end)
	if err != nil {
		return manifestRead{}
	}
	return manifestRead{m: m, end: end, size: st.Size(), ok: true, mentioned: mentioned}
}

// manifestMentions returns the id of every table that the MANIFEST f's
// whole entries, its first end bytes, create or delete. Badger's replay
// keeps only the tables still named; a table it once named and then
// deleted is no table the MANIFEST lost. f was replayed by Badger up to
// end, so its entries' lengths and checksums hold there.
func manifestMentions(f *os.File, end int64) (map[uint64]bool, error) {
	b := make([]byte, end)
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, err
	}
	ids := map[uint64]bool{}
	for off := int64(8); off+8 <= end; { // the magic and version, then entries
		n := int64(binary.BigEndian.Uint32(b[off : off+4]))
		if off+8+n > end {
			return nil, fmt.Errorf("MANIFEST entry at %d runs past %d", off, end)
		}
		var cs pb.ManifestChangeSet
		if err := proto.Unmarshal(b[off+8:off+8+n], &cs); err != nil {
			return nil, err
		}
		for _, c := range cs.Changes {
			ids[c.Id] = true
		}
		off += 8 + n
	}
	return ids, nil
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

// checkTable verifies the table at path: its index, and with blocks the
// checksum of every data block, read through br.
func checkTable(path string, blocks bool, br *blockReader) error {
	index, dataEnd, err := readIndex(path)
	if err != nil {
		return err
	}
	if err := checkBlockOffsets(index, dataEnd); err != nil || !blocks {
		return err
	}
	return br.check(path, index, dataEnd)
}

// blockReader reads tables' data blocks; its buffers serve every table.
type blockReader struct {
	r   *bufio.Reader
	buf []byte // one block
}

// check reads every data block of the table at path, in file order,
// and verifies it as table.block does with OnBlockRead: the last 4 bytes
// hold the checksum length, before them the checksum (protobuf), which
// covers the rest (entries, their offsets and their count). The entry count
// is checked against the block's size too, since Badger slices by it before
// it verifies anything. index is the table's verified index, whose block
// offsets checkBlockOffsets found inside [0, dataEnd).
func (br *blockReader) check(path string, index []byte, dataEnd int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if br.r == nil {
		br.r = bufio.NewReaderSize(nil, 256<<10)
	}
	r := br.r
	r.Reset(io.NewSectionReader(f, 0, dataEnd))
	defer r.Reset(nil) // f is closed
	var pos int64
	ti := fb.GetRootAsTableIndex(index, 0)
	var bo fb.BlockOffset
	for i := range ti.OffsetsLength() {
		ti.Offsets(&bo, i)
		off, n := int64(bo.Offset()), int(bo.Len())
		if off != pos { // never so in a table Badger wrote: blocks follow each other
			r.Reset(io.NewSectionReader(f, off, dataEnd-off))
			pos = off
		}
		if cap(br.buf) < n {
			br.buf = make([]byte, n)
		}
		b := br.buf[:n]
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("block %d at offset %d: %w", i, off, err)
		}
		pos += int64(n)
		if err := checkBlock(b); err != nil {
			return fmt.Errorf("block %d at offset %d (%d bytes): %w", i, off, n, err)
		}
	}
	return nil
}

// errBlockChecksum is a data block whose checksum does not match it.
var errBlockChecksum = errors.New("its checksum does not match its data")

// checkBlock verifies one data block b (n >= 8, checkBlockOffsets).
func checkBlock(b []byte) error {
	end := len(b) - 4
	chkLen := int(binary.BigEndian.Uint32(b[end:]))
	if chkLen > end-4 {
		return fmt.Errorf("checksum length %d is larger than the block", chkLen)
	}
	end -= chkLen
	var chk pb.Checksum
	if err := proto.Unmarshal(b[end:end+chkLen], &chk); err != nil {
		return fmt.Errorf("checksum: %w", err)
	}
	if chk.Algo != pb.Checksum_CRC32C && chk.Algo != pb.Checksum_XXHash64 {
		return fmt.Errorf("unknown checksum algorithm %d", chk.Algo) // y.VerifyChecksum would panic
	}
	if y.VerifyChecksum(b[:end], &chk) != nil {
		return errBlockChecksum
	}
	if n := uint64(binary.BigEndian.Uint32(b[end-4:])); n == 0 || n*4 > uint64(end-4) {
		return fmt.Errorf("entry count %d does not fit the block", n)
	}
	return nil
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

// checkKeyRegistry refuses a damaged KEYREGISTRY before Badger reads it,
// naming the file. Badger reads it first at open and says only "Encryption
// key mismatch" (garbage in it) or "Error while reading sanity text" (cut
// short), naming neither the file nor the damage: an operator would look
// for an encryption key the store never had. The store encrypts nothing, so
// the file holds no key a record needs; a missing one Badger writes anew.
func checkKeyRegistry(dir string) error {
	// Badger opens it for writing and flattens an error of its own into
	// text; one it may not open is a permission problem, not damage.
	f, err := os.OpenFile(filepath.Join(dir, badger.KeyRegistryFileName), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // Badger writes a new one
	}
	if err != nil {
		return err
	}
	f.Close()
	kr, err := badger.OpenKeyRegistry(badger.KeyRegistryOptions{Dir: dir, ReadOnly: true})
	if err != nil {
		return fmt.Errorf("%s is damaged (%w); the store is not opened, and nothing in the directory was changed: "+
			"restore the directory from a backup (the file itself holds no record: the store encrypts nothing, and "+
			"removed, it is written anew at the next start)", filepath.Join(dir, badger.KeyRegistryFileName), err)
	}
	return kr.Close()
}
