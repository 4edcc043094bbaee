package idemkey

import (
	"bytes"
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
	return st.fingerprint(r, nil)
}

// maxParsedSources is how many JSON key sources [Parse] reads in the
// fingerprint's pass over the body; [Parsed.Derive] looks any later one up
// in a pass of its own, as [Derive] does.
const maxParsedSources = 4

// Parsed is what one pass over a request's body gives: its fingerprint, and
// the values of its JSON key sources, which [Parsed.Derive] derives a key
// from without reading the body again.
type Parsed struct {
	Fingerprint [32]byte
	sources     []Source
	// json holds the first maxParsedSources JSON sources' values, in the
	// order of sources, when looked: what state.value gives for them.
	json   [maxParsedSources]parsedValue
	looked bool
}

// parsedValue is one JSON source's value: the body's own bytes, or its
// decoded copy when the string had escapes.
type parsedValue struct {
	val []byte
	ok  bool
}

// Parse returns r's fingerprint, as [Fingerprint], and the values of its
// JSON sources among sources, read in the same pass over the body: the
// canonical form is emitted and the sources looked up together. A body
// that starts with a byte order mark, which the fingerprint takes as it
// came but a JSON source reads past (see [Derive]), is looked up by
// Parsed.Derive instead.
func Parse(sources []Source, r Request) Parsed {
	st := getState()
	defer putState(st)
	p := Parsed{sources: sources}
	p.Fingerprint = st.fingerprint(r, &p)
	return p
}

// Derive is [Derive] over the sources given to [Parse], for a request with
// the body Parse read (its path, tenant and generation may differ): the key
// of the first source present, with JSON sources' values taken from the
// parse.
func (p *Parsed) Derive(r Request) (key string, src Source, ok bool) {
	st := getState()
	defer putState(st)
	j := 0
	var unread Kind // as in Derive
	for i, s := range p.sources {
		if unread != 0 && s.Kind != unread {
			break
		}
		var (
			val   []byte
			found bool
		)
		if s.Kind == JSON && p.looked && j < len(p.json) {
			val, found = p.json[j].val, p.json[j].ok
		} else {
			val, found = st.value(s, r)
		}
		if s.Kind == JSON {
			j++
		}
		if found {
			return st.key(r, s, val), s, true
		}
		if unread == 0 && i < len(p.sources)-1 && st.mentions(s, r) != ReasonNone {
			unread = s.Kind // see Derive: no source of another kind stands in
		}
	}
	return "", Source{}, false
}

// fingerprint computes r's fingerprint; with p, it also looks up p's JSON
// sources (see Parse).
func (st *state) fingerprint(r Request, p *Parsed) [32]byte {
	b := append(st.buf[:0], "idemproxy-fp-v1"...)
	b = appendField(b, r.Method)
	b = appendField(b, r.Path)
	b = st.appendQuery(b, r.RawQuery)
	st.buf = b
	st.sha.Reset()
	st.sha.Write(b)
	st.writeBody(r, p)
	var sum [32]byte
	copy(sum[:], st.sha.Sum(st.sum[:0]))
	return sum
}

// look sets up the looks of p's JSON sources for a canonical pass over
// body (st.json reset for it) and says whether the pass gives their
// values: not for a body with a byte order mark (state.value reads past it,
// the canonical form does not). A document that is not an object gives
// none, as state.value: p is settled at once.
func (st *state) look(body []byte, p *Parsed) bool {
	if p == nil || bytes.HasPrefix(body, utf8BOM) {
		return false
	}
	p.looked = true
	if firstNonSpace(body) != '{' {
		return false // no values: p.json stays zero
	}
	j := 0
	for _, s := range p.sources {
		if s.Kind != JSON || j == len(p.json) {
			continue
		}
		seg, rest, nested := cutDot(s.Name)
		st.json.frames = append(st.json.frames, frame{parent: -1, seg: seg, rest: rest, nested: nested})
		j++
	}
	return j > 0
}

// looked settles p's JSON sources from the document's frames after a
// canonical pass with looks (look); a document that did not parse gives
// none, as state.value.
func (st *state) looked(p *Parsed, parsed bool) {
	if !parsed {
		return
	}
	for j, f := range st.json.frames {
		p.json[j] = parsedValue{val: f.val, ok: f.found && f.exact && !f.ambiguous}
	}
}

// lookOutside settles p's JSON sources for a body the fingerprint does not
// parse as JSON: such a body does not start with '{' (the fingerprint
// parses every one that does), so no JSON source has a value, unless it
// starts with a byte order mark (state.value reads past it): those are
// left to Parsed.Derive.
func lookOutside(body []byte, p *Parsed) {
	if p != nil && !bytes.HasPrefix(body, utf8BOM) {
		p.looked = true
	}
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

// writeForm hashes a tag and the canonical form of an
// application/x-www-form-urlencoded or multipart/form-data body, if r's is
// one that parses.
func (st *state) writeForm(r Request) bool {
	if isFormType(r.ContentType) {
		dec, pairs, ok := formPairs(st.dec[:0], st.pairs[:0], r.Body)
		st.dec, st.pairs = dec, pairs
		if ok {
			st.buf = st.appendPairs(append(st.buf[:0], tagForm), dec, pairs)
			st.sha.Write(st.buf)
			return true
		}
	} else if boundary, ok := formDataBoundary(r.ContentType); ok {
		if b, ok := appendFormData(append(st.buf[:0], tagFormData), r.Body, boundary); ok {
			st.buf = b
			st.sha.Write(st.buf)
			return true
		}
	}
	return false
}

// writeBody hashes a tag and the canonical or raw body. The body is the last
// field, so it needs no length prefix.
func (st *state) writeBody(r Request, p *Parsed) {
	if c := firstNonSpace(r.Body); c == '{' || c == '[' || isJSONType(r.ContentType) {
		st.json.reset(r.Body, true)
		st.json.singleByte = singleByteCharset(r.ContentType)
		looks := st.look(r.Body, p)
		// The canonical form is at most about the body's size: sized once,
		// a large body is not copied over and over as the buffer grows.
		st.json.out = append(slices.Grow(st.json.out[:0], len(r.Body)+1), tagJSON)
		err := st.json.canonical()
		if looks {
			st.looked(p, err == nil)
		}
		// A body with bytes of a single-byte charset is hashed as it came,
		// as it was before idemproxy read keys in it.
		if err == nil && !st.json.notUTF8 {
			st.sha.Write(st.json.out)
			return
		}
	} else {
		lookOutside(r.Body, p)
		if st.writeForm(r) {
			return
		}
	}
	st.buf = append(st.buf[:0], tagRaw)
	st.sha.Write(st.buf)
	st.sha.Write(r.Body)
}
