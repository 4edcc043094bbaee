package idemkey

import (
	"encoding/binary"
	"slices"
)

// Body encodings in the fingerprint input; distinct tags keep a canonical
// form from ever colliding with raw bytes.
const (
	tagJSON     = 'J'
	tagForm     = 'F'
	tagRaw      = 'R'
	tagQuery    = 'Q'
	tagRawQuery = 'q'
	tagFormData = 'M'
)

// Fingerprint identifies "the same request" for replay versus conflict
// (docs/keys.md): a SHA-256 digest over the method, the path, the query
// and the body, each canonicalised so that retries of one request match
// however the legacy app serialised them:
//   - the query by its decoded fields sorted by name (repeated names keep
//     their order, which applications read as a list); a query that does not
//     decode counts by its raw text;
//   - a body whose Content-Type is JSON, or which starts with '{' or '[', by
//     [CanonicalJSON]: member order and insignificant whitespace do not
//     matter, numbers compare by literal text (1.0 is not 1) and strings by
//     decoded value;
//   - otherwise an application/x-www-form-urlencoded body by its sorted
//     fields, as for the query, and a multipart/form-data body by its parts
//     without the boundary, which clients draw anew for every request
//     (appendFormData);
//   - any other body, and a JSON or form body that does not parse, by its raw
//     bytes: invalid bodies are still forwarded and the provider decides.
//
// Requests that still differ after this canonicalisation never share a
// fingerprint, short of a SHA-256 collision: every field is length-prefixed
// and every body encoding tagged.
func Fingerprint(r Request) [32]byte {
	st := getState()
	defer putState(st)
	b := append(st.buf[:0], "idemproxy-fp-v1"...)
	b = appendField(b, r.Method)
	b = appendField(b, r.Path)
	b = st.appendQuery(b, r.RawQuery)
	st.buf = b
	st.sha.Reset()
	st.sha.Write(b)
	st.writeBody(r)
	var sum [32]byte
	copy(sum[:], st.sha.Sum(st.sum[:0]))
	return sum
}

// appendQuery appends the canonical query to b.
func (st *state) appendQuery(b []byte, rawQuery string) []byte {
	dec, pairs, ok := formPairs(st.dec[:0], st.pairs[:0], rawQuery)
	st.dec, st.pairs = dec, pairs
	if !ok {
		return appendField(append(b, tagRawQuery), rawQuery)
	}
	return st.appendPairs(append(b, tagQuery), dec, pairs)
}

// appendPairs appends a count and then each length-prefixed key and value.
func (st *state) appendPairs(b, dec []byte, pairs []pair) []byte {
	b = binary.AppendUvarint(b, uint64(len(pairs)))
	for _, p := range pairs {
		b = appendField(b, dec[p.kStart:p.kEnd])
		b = appendField(b, dec[p.vStart:p.vEnd])
	}
	return b
}

// writeBody hashes a tag and the canonical or raw body. The body is the last
// field, so it needs no length prefix.
func (st *state) writeBody(r Request) {
	if c := firstNonSpace(r.Body); c == '{' || c == '[' || isJSONType(r.ContentType) {
		st.json.reset(r.Body, true)
		// The canonical form is at most about the body's size: sized once,
		// a large body is not copied over and over as the buffer grows.
		st.json.out = append(slices.Grow(st.json.out[:0], len(r.Body)+1), tagJSON)
		if st.json.canonical() == nil {
			st.sha.Write(st.json.out)
			return
		}
	} else if isFormType(r.ContentType) {
		dec, pairs, ok := formPairs(st.dec[:0], st.pairs[:0], r.Body)
		st.dec, st.pairs = dec, pairs
		if ok {
			st.buf = st.appendPairs(append(st.buf[:0], tagForm), dec, pairs)
			st.sha.Write(st.buf)
			return
		}
	} else if boundary, ok := formDataBoundary(r.ContentType); ok {
		if b, ok := appendFormData(append(st.buf[:0], tagFormData), r.Body, boundary); ok {
			st.buf = b
			st.sha.Write(st.buf)
			return
		}
	}
	st.buf = append(st.buf[:0], tagRaw)
	st.sha.Write(st.buf)
	st.sha.Write(r.Body)
}
