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
		if !fi.Mode().IsRegular() || fi.Size() == 0 {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read write-ahead log %s: %w", path, err)
		}
		end, stop := walScan(b)
		// Badger writes the header when it creates the log: a shorter one
		// was cut, whatever its bytes.
		if fi.Size() < 2*memTableSize && end < len(b) && (end < walHeaderSize || !allZero(b[end:])) {
			return fmt.Errorf("write-ahead log %s is damaged: it was cut short (%d bytes, its last whole entry ends at byte %d); "+
				"the store is not opened, so that none of its records is lost or sent again, and nothing in the "+
				"directory was changed: restore the directory from a backup", path, len(b), end)
		}
		if next := walDamagedBefore(b, stop); next > 0 {
			return fmt.Errorf("write-ahead log %s is damaged: the entry at byte %d does not match its checksum, and whole "+
				"entries follow it from byte %d (Badger would replay the log up to byte %d and drop every record after it); "+
				"the store is not opened, so that none of its records is lost or sent again, and nothing in the "+
				"directory was changed: restore the directory from a backup", path, stop, next, end)
		}
	}
	return nil
}

// walSector is the unit a disk writes whole or not at all (or leaves as it
// was) when the power fails: the smallest sector size.
const walSector = 512

// walDamagedBefore returns where the next whole entry of the WAL b starts
// after stop, the start of an entry that is not whole (walScan), when the
// bytes between cannot be what a crash leaves: 0 otherwise.
//
// Badger replays a log up to its first entry that is not whole, truncates
// it there and starts: with damage in the middle of a log (a bit flipped
// by the disk or in a copy), every acknowledged answer after it was gone
// without a word and sent to the provider again (seen: 70 of 100 answers
// of a killed process, 8 bytes changed at 0.5 % of the log). The size rule
// of checkWALs does not see it: the log keeps its full size.
//
// A crash leaves an entry that is not whole only as the last one written,
// and only so:
//   - a SIGKILL while Badger copies the entry into the log's map: the bytes
//     not yet copied are still zeros (Badger creates each log anew, sized
//     with ftruncate), nothing after it written;
//   - a power loss: of the sectors written since the last sync, which are
//     never acknowledged, some reached the disk and others did not (zeros
//     still, or a part of an earlier state of the sector, whose bytes past
//     what was written then are zeros too), so that a later entry can be
//     whole after one that is not.
//
// Either way the entry that is not whole holds zeros where it was not
// written: a run of at least 8 (a word that a SIGKILL interrupted the copy
// before) or, within it, the whole part of a sector (the sector not
// written). Damage to written bytes leaves neither, and is refused only
// when a whole entry follows it, which shows that the log was written past
// it: a break followed by no entry is left to Badger as before, a tail of
// garbage after the last entry included (a file system that after a power
// loss shows stale blocks in a file). A damaged entry whose bytes happen
// to hold such zeros is not caught.
func walDamagedBefore(b []byte, stop int) int {
	if stop < walHeaderSize || stop >= len(b) || allZero(b[stop:]) {
		return 0 // every entry whole, or what follows the last never written
	}
	if _, size := walEntry(b[stop:]); size > 0 {
		return 0 // an entry outside its transaction: whole, not damaged
	}
	next := 0
	for off := stop + 1; off < len(b); off++ {
		if _, size := walEntry(b[off:]); size > 0 {
			next = off
			break
		}
	}
	if next == 0 || zeroRun(b[stop:next], 8) {
		return 0
	}
	for s := stop - stop%walSector; s < next; s += walSector {
		if allZero(b[max(s, stop):min(s+walSector, next)]) {
			return 0
		}
	}
	return next
}

// zeroRun reports whether b holds n zero bytes in a row.
func zeroRun(b []byte, n int) bool {
	run := 0
	for _, c := range b {
		if c != 0 {
			run = 0
			continue
		}
		if run++; run >= n {
			return true
		}
	}
	return false
}

// walEnd returns where the last whole entry of the WAL b ends that Badger's
// replay keeps (logFile.iterate): an entry outside a transaction, or the end
// of a transaction. It is 0 if even the header is incomplete.
func walEnd(b []byte) int {
	end, _ := walScan(b)
	return end
}

// walScan returns walEnd's end, and stop: where the replay stops reading,
// the start of the first entry that is not whole (or of the entry outside
// the transaction it is in), len(b) when every entry is whole.
func walScan(b []byte) (end, stop int) {
	if len(b) < walHeaderSize {
		return 0, 0
	}
	end, off, inTxn := walHeaderSize, walHeaderSize, false
	for off < len(b) {
		meta, size := walEntry(b[off:])
		if size == 0 {
			return end, off
		}
		switch {
		case meta&walBitTxn != 0:
			inTxn = true
		case meta&walBitFinTxn != 0:
			inTxn, end = false, off+size
		case inTxn: // Badger stops at an entry outside the transaction it is in
			return end, off
		default:
			end = off + size
		}
		off += size
	}
	return end, off
}

// walEntry returns the meta byte and size of the whole entry r starts
// with, its checksum matching; size is 0 if r starts with none.
func walEntry(r []byte) (meta byte, size int) {
	if len(r) < 2 {
		return 0, 0
	}
	meta, n := r[0], 2
	var lens [3]uint64
	for i := range lens {
		v, k := binary.Uvarint(r[n:])
		if k <= 0 {
			return 0, 0
		}
		lens[i], n = v, n+k
	}
	klen, vlen := lens[0], lens[1]
	if klen == 0 || klen > walMaxKey || vlen > uint64(len(r)) {
		return 0, 0
	}
	size = n + int(klen) + int(vlen) + crc32.Size
	if size > len(r) || crc32.Checksum(r[:size-crc32.Size], castagnoli) != binary.BigEndian.Uint32(r[size-crc32.Size:size]) {
		return 0, 0
	}
	return meta, size
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
