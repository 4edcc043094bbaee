package idemkey

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"
)

// state is the scratch space of one Derive or Fingerprint call, pooled so the
// hot path of every protected request allocates next to nothing.
type state struct {
	json  jsonParser
	buf   []byte // hash input being assembled
	val   []byte // a source's value
	dec   []byte // decoded form fields
	pairs []pair
	sha   hash.Hash
	sum   [sha256.Size]byte
}

// maxPooled bounds the buffers kept in the pool: one huge body must not pin
// its canonical copy in memory for ever.
const maxPooled = 64 << 10

var statePool = sync.Pool{New: func() any { return &state{sha: sha256.New()} }}

func getState() *state { return statePool.Get().(*state) }

func putState(st *state) {
	st.json.data = nil                          // do not keep the request body alive
	st.json.singleByte = false                  // set per request (singleByteCharset)
	clear(st.json.frames[:cap(st.json.frames)]) // nor the values looked up in it (Parse)
	for _, b := range []*[]byte{&st.buf, &st.val, &st.dec, &st.json.out, &st.json.scratch, &st.json.key, &st.json.val} {
		if cap(*b) > maxPooled {
			*b = nil
		}
	}
	if cap(st.json.sorted) > maxPooled/32 { // a member is 32 bytes
		st.json.members, st.json.sorted, st.json.moves = nil, nil, nil
	}
	statePool.Put(st)
}

// appendField appends b with a length prefix, so that a sequence of fields
// has exactly one reading.
func appendField[T text](dst []byte, b T) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}
