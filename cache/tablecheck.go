package cache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/dgraph-io/badger/v4/fb"
	"github.com/dgraph-io/badger/v4/pb"
	"github.com/dgraph-io/badger/v4/y"
	"google.golang.org/protobuf/proto"
)

// checkTables verifies the footer and index checksum of every table file in
// dir before Badger sees them. Badger v4.9.6 opens tables in goroutines of
// its own (newLevelsController), and a damaged footer there either panics
// (slice bounds, seen with a garbage .sst) or reaches y.Check, which calls
// log.Fatalf: neither can be recovered by the caller of badger.Open, so a
// corrupt directory would kill the process instead of failing Open.
//
// The check mirrors table.initIndex: the last 4 bytes hold the checksum
// length, before them the checksum (protobuf), before it the index length
// and before that the index (a flatbuffer), whose checksum must match and
// whose block offsets must lie inside the file. That catches garbage, zeroed
// and truncated tables. Data blocks are not read (that would read the whole
// store at every start): a table damaged only inside its blocks still gets
// past this check, and Badger may then crash on reading them.
func checkTables(dir string) error {
	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		return err
	}
	for _, path := range tables {
		if err := checkTable(path); err != nil {
			return fmt.Errorf("table %s is damaged: %w", path, err)
		}
	}
	return nil
}

func checkTable(path string) (err error) {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	pos := st.Size()
	chkLen, err := readU32(f, &pos)
	if err != nil {
		return fmt.Errorf("checksum length: %w", err)
	}
	chkBytes, err := readBack(f, &pos, int64(chkLen))
	if err != nil {
		return fmt.Errorf("checksum: %w", err)
	}
	if len(chkBytes) == 0 {
		return errors.New("checksum is empty")
	}
	var chk pb.Checksum
	if err := proto.Unmarshal(chkBytes, &chk); err != nil {
		return fmt.Errorf("checksum: %w", err)
	}
	if chk.Algo != pb.Checksum_CRC32C && chk.Algo != pb.Checksum_XXHash64 {
		return fmt.Errorf("unknown checksum algorithm %d", chk.Algo)
	}
	indexLen, err := readU32(f, &pos)
	if err != nil {
		return fmt.Errorf("index length: %w", err)
	}
	index, err := readBack(f, &pos, int64(indexLen))
	if err != nil {
		return fmt.Errorf("index: %w", err)
	}
	if len(index) == 0 {
		return errors.New("index is empty")
	}
	if err := y.VerifyChecksum(index, &chk); err != nil {
		return fmt.Errorf("index: %w", err)
	}
	return checkBlockOffsets(index, pos)
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
