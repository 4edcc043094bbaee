package cache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
)

// Badger's write-ahead log (*.mem) format, v4.9.6 (memtable.go, structs.go,
// value.go): a header of walHeaderSize bytes (key id and IV), then entries,
// each meta, user meta, uvarint key length, value length and expiry, the key,
// the value and a big-endian CRC-32C of all that. An entry of a transaction
// has walBitTxn set and the transaction ends with an entry with walBitFinTxn.
const (
	walHeaderSize = 20
	walBitTxn     = 1 << 6
	walBitFinTxn  = 1 << 7
	walMaxKey     = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checkWALs refuses a write-ahead log (*.mem) that was cut short: one
// smaller than Badger makes it (twice the memtable size), whose last whole
// entry does not end at the end of the file. Badger replays a WAL up to its
// last whole transaction, truncates it there and starts: the records after
// the cut, each answer acknowledged to a client, are gone without a word, and
// a repeat of each order reaches the provider again (seen: 19 of 20
// acknowledged answers lost with the WAL of a killed process cut to 4 KiB).
//
// No crash cuts a WAL. Badger sizes it when it creates it (an empty file, a
// kill before the sizing, is removed by removeEmptyLogs), writes into it
// through a map, and only its own replay shortens it, to the end of the last
// whole transaction: a start killed after that replay leaves a short WAL
// that ends exactly at an entry, which is accepted. A WAL of full size whose
// entries stop part way is what a power loss during a write leaves (its tail
// was never acknowledged) and is left to Badger; so is a tail of zeros, what
// a WAL written with a smaller memtable holds after its last entry. A WAL
// shorter than its header is refused whatever it holds.
//
// The rule relies on the memtable size staying what the store has always
// used (8 MiB): a WAL of a run with a larger memtable is longer and never
// checked, but one written with a smaller memtable by a killed process
// (entries of a transaction it did not finish after its last whole one)
// would be refused.
func checkWALs(dir string, memTableSize int64) error {
	paths, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		return err
	}
	for _, path := range paths {
		fi, err := os.Lstat(path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return err
		}
		if !fi.Mode().IsRegular() || fi.Size() == 0 || fi.Size() >= 2*memTableSize {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read write-ahead log %s: %w", path, err)
		}
		// Badger writes the header when it creates the log: a shorter one
		// was cut, whatever its bytes.
		if end := walEnd(b); end < len(b) && (end < walHeaderSize || !allZero(b[end:])) {
			return fmt.Errorf("write-ahead log %s is damaged: it was cut short (%d bytes, its last whole entry ends at byte %d); "+
				"the store is not opened, so that none of its records is lost or sent again, and nothing in the "+
				"directory was changed: restore the directory from a backup", path, len(b), end)
		}
	}
	return nil
}

// walEnd returns where the last whole entry of the WAL b ends that Badger's
// replay keeps (logFile.iterate): an entry outside a transaction, or the end
// of a transaction. It is 0 if even the header is incomplete.
func walEnd(b []byte) int {
	if len(b) < walHeaderSize {
		return 0
	}
	end, off, inTxn := walHeaderSize, walHeaderSize, false
	for off < len(b) {
		r := b[off:]
		if len(r) < 2 {
			break
		}
		meta, n := r[0], 2
		var lens [3]uint64
		ok := true
		for i := range lens {
			v, k := binary.Uvarint(r[n:])
			if k <= 0 {
				ok = false
				break
			}
			lens[i], n = v, n+k
		}
		klen, vlen := lens[0], lens[1]
		if !ok || klen == 0 || klen > walMaxKey || vlen > uint64(len(r)) {
			break
		}
		size := n + int(klen) + int(vlen) + crc32.Size
		if size > len(r) || crc32.Checksum(r[:size-crc32.Size], castagnoli) != binary.BigEndian.Uint32(r[size-crc32.Size:size]) {
			break
		}
		off += size
		switch {
		case meta&walBitTxn != 0:
			inTxn = true
		case meta&walBitFinTxn != 0:
			inTxn, end = false, off
		case inTxn: // Badger stops at an entry outside the transaction it is in
			return end
		default:
			end = off
		}
	}
	return end
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
