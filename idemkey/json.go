package idemkey

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrInvalidJSON is wrapped by [CanonicalJSON]'s errors.
var ErrInvalidJSON = errors.New("invalid JSON")

// maxDepth is encoding/json's nesting limit, so every document the standard
// library accepts is accepted here, and a hostile body cannot exhaust the stack.
const maxDepth = 10000

// CanonicalJSON appends the canonical form of the JSON document body to dst:
// object members sorted by key (bytewise on the canonical key encoding; members
// with the same key keep their order), no insignificant whitespace, numbers
// copied as written, strings re-encoded canonically (the shortest escapes of
// RFC 8785: \" \\ \b \f \n \r \t, \u00xx for other control characters, every
// other character as raw UTF-8; a lone surrogate escape stays \uxxxx).
//
// Two documents have the same canonical form exactly when they differ only in
// member order, whitespace and string escaping, so comparing canonical forms
// never mistakes one request for another. Invalid JSON, including invalid
// UTF-8, which RFC 8259 §8.1 forbids, gives an error wrapping
// [ErrInvalidJSON], and dst is returned with its original length. dst must
// not overlap body.
func CanonicalJSON(dst, body []byte) ([]byte, error) {
	st := getState()
	defer putState(st)
	p := &st.json
	p.reset(body, true)
	p.out = dst
	defer func() { p.out = nil }() // dst belongs to the caller, not the pool
	if err := p.canonical(); err != nil {
		return dst, fmt.Errorf("canonical JSON: %w", err)
	}
	return p.out, nil
}

// jsonParser is a small validating JSON parser. With emit set it appends the
// canonical form to out; lookup walks to one value without emitting. Its
// slices are reused between documents (see state).
type jsonParser struct {
	data     []byte
	pos      int
	emit     bool
	out      []byte
	docStart int // where the document starts in out

	members []member // open objects' members, innermost last (emit only)
	moves   []move   // objects whose members must be reordered, once parsed
	sorted  []member // the members of every move, each move's in key order
	scratch []byte   // the canonical form while moves are applied
	key     []byte   // decoded object key (lookup, and a look's escaped key)
	val     []byte   // decoded value found by lookup

	// seen is set by lookup when a member at the path, its key in any
	// letter case, gave a value (a string that is not empty, or a number)
	// or two such members disagreed, whether or not the document parses
	// whole after it (Unreadable).
	seen bool

	// lone is set by a \u escape that stands for a lone surrogate
	// ("\ud800" not followed by a low one), which has no UTF-8 form:
	// encoding/json reads U+FFFD in its place, JavaScript, Python and Java
	// the surrogate itself.
	lone bool

	// loneSeen is set by lookup when a member at the path gave no value
	// because of a lone surrogate escape (lone), so that Unreadable can say
	// why (ReasonLoneSurrogate).
	loneSeen bool

	// singleByte lets strings hold bytes that are not UTF-8, for a body
	// declared in a single-byte charset such as windows-1251 (see
	// singleByteCharset): there every byte from 0x80 up is one character
	// inside a string, so the document's structure reads the same to every
	// parser. A value with such bytes is no key (see lookup). notUTF8 is
	// set (and cleared by reset) when the document had such a byte.
	singleByte, notUTF8 bool

	// frames are the looks (Parse) into the objects open on their
	// paths: while the canonical form is emitted, the document's key
	// sources are looked up in the same pass (lookMember). The first
	// frames, whose parent is -1, are the document's own.
	frames []frame
}

// frame is one dotted path's look into one object of the document being
// emitted: what lookupObject keeps in its locals for that object, so that
// a look gives what lookup gives. seg is the key it matches here, rest the
// path below it (when nested); seen, ambiguous, exact and found are
// lookupObject's prev >= 0, ambiguous, exact and found, and val the value
// of the last member whose key matched (meaningful when found). hit marks
// the frames whose seg the member being parsed matched.
type frame struct {
	parent                        int // the frame of the enclosing object, -1 for the document
	seg, rest                     string
	nested                        bool
	hit                           bool
	seen, ambiguous, exact, found bool
	val                           []byte
}

// member locates one object member in out: [start,end) is `"key":value`,
// [keyStart,keyEnd) the key between its quotes.
type member struct{ start, keyStart, keyEnd, end int }

// move is an object of out, '{' at open and '}' at close, whose members are
// not in key order: sorted[first:last] lists them in key order.
type move struct{ open, close, first, last int }

func (p *jsonParser) reset(data []byte, emit bool) {
	p.data, p.pos, p.emit, p.notUTF8 = data, 0, emit, false
	p.members = p.members[:0]
	p.moves, p.sorted = p.moves[:0], p.sorted[:0]
	p.frames = p.frames[:0]
}

// canonical parses the document and puts every object's members in key order.
//
// Why not reorder each object as it closes: that copies the object's whole
// text, nested objects included, once per level of nesting, which is
// quadratic in the body size for deeply nested bodies. Instead each
// unsorted object is noted as a move while out is written in input order,
// and one pass then writes every byte once, walking the moves.
func (p *jsonParser) canonical() error {
	if err := p.document(); err != nil {
		return err
	}
	if len(p.moves) == 0 {
		return nil
	}
	slices.SortFunc(p.moves, func(a, b move) int { return a.open - b.open })
	start := p.docStart
	p.scratch = p.apply(slices.Grow(p.scratch[:0], len(p.out)-start), start, len(p.out))
	p.out = append(p.out[:start], p.scratch...)
	return nil
}

// apply appends out[a:b] to dst with the members of every move inside it in
// key order.
func (p *jsonParser) apply(dst []byte, a, b int) []byte {
	for i := p.nextMove(a); i < len(p.moves) && p.moves[i].open < b; i = p.nextMove(a) {
		mv := p.moves[i]
		dst = append(dst, p.out[a:mv.open+1]...)
		for k, m := range p.sorted[mv.first:mv.last] {
			if k > 0 {
				dst = append(dst, ',')
			}
			dst = p.apply(dst, m.start, m.end)
		}
		dst = append(dst, '}')
		a = mv.close + 1
	}
	return append(dst, p.out[a:b]...)
}

// nextMove returns the index of the first move that opens at or after pos.
func (p *jsonParser) nextMove(pos int) int {
	i, _ := slices.BinarySearchFunc(p.moves, pos, func(m move, pos int) int { return m.open - pos })
	return i
}

func (p *jsonParser) fail(what string) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalidJSON, what, p.pos)
}

// peek returns the current byte, or 0 (never valid JSON) at the end.
func (p *jsonParser) peek() byte {
	if p.pos < len(p.data) {
		return p.data[p.pos]
	}
	return 0
}

func (p *jsonParser) put(c byte) {
	if p.emit {
		p.out = append(p.out, c)
	}
}

func (p *jsonParser) skipWS() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// document parses one complete document: a value with optional whitespace around it.
func (p *jsonParser) document() error {
	p.docStart = len(p.out)
	p.skipWS()
	var err error
	if looks := len(p.frames); looks > 0 && p.peek() == '{' {
		err = p.object(1, 0, looks) // value(0), with the document's looks
	} else {
		err = p.value(0)
	}
	if err != nil {
		return err
	}
	p.skipWS()
	if p.pos != len(p.data) {
		return p.fail("data after the top-level value")
	}
	return nil
}

// value parses the value at p.pos; depth counts the containers around it.
func (p *jsonParser) value(depth int) error {
	switch c := p.peek(); {
	case c == '{':
		return p.object(depth+1, 0, 0)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		if p.emit {
			return p.str(&p.out, true)
		}
		return p.str(nil, false)
	case c == '-' || isDigit(c):
		start := p.pos
		if err := p.number(); err != nil {
			return err
		}
		if p.emit {
			p.out = append(p.out, p.data[start:p.pos]...)
		}
		return nil
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	case p.pos >= len(p.data):
		return p.fail("unexpected end of input")
	}
	return p.fail("unexpected character")
}

// object parses the object at p.pos, depth containers deep; the frames
// [lo,hi) look into it (none when lo == hi).
func (p *jsonParser) object(depth, lo, hi int) error {
	if depth > maxDepth {
		return p.fail("nesting too deep")
	}
	open, base := len(p.out), len(p.members)
	p.pos++
	p.put('{')
	p.skipWS()
	if p.peek() == '}' {
		p.pos++
		p.put('}')
		return nil
	}
	for first := true; ; first = false {
		if !first {
			p.put(',')
		}
		var err error
		if lo < hi {
			err = p.lookMember(depth, lo, hi)
		} else {
			err = p.objectMember(depth)
		}
		if err != nil {
			return err
		}
		p.skipWS()
		switch p.peek() {
		case ',':
			p.pos++
			p.skipWS()
		case '}':
			p.pos++
			if p.emit {
				p.noteOrder(open, base)
				p.out = append(p.out, '}')
			}
			return nil
		default:
			return p.fail("want ',' or '}' after an object member")
		}
	}
}

// objectMember parses `"key": value` and, when emitting, records where it went.
func (p *jsonParser) objectMember(depth int) error {
	if p.peek() != '"' {
		return p.fail("want an object key")
	}
	m := member{start: len(p.out), keyStart: len(p.out) + 1}
	var err error
	if p.emit {
		err = p.str(&p.out, true)
	} else {
		err = p.str(nil, false)
	}
	if err != nil {
		return err
	}
	m.keyEnd = len(p.out) - 1
	if err := p.colon(); err != nil {
		return err
	}
	if err := p.value(depth); err != nil {
		return err
	}
	if p.emit {
		m.end = len(p.out)
		p.members = append(p.members, m)
	}
	return nil
}

// lookMember is objectMember (emitting) in an object the frames [lo,hi)
// look into: each frame whose key the member's matches (in any letter case,
// as lookupObject matches) is given the member's value (lookValue).
func (p *jsonParser) lookMember(depth, lo, hi int) error {
	if p.peek() != '"' {
		return p.fail("want an object key")
	}
	m := member{start: len(p.out), keyStart: len(p.out) + 1}
	at := p.pos
	if err := p.str(&p.out, true); err != nil {
		return err
	}
	m.keyEnd = len(p.out) - 1
	key := p.data[at+1 : p.pos-1] // the decoded key, unless it has an escape
	if bytes.IndexByte(key, '\\') >= 0 {
		p.key = p.key[:0]
		q := jsonParser{data: p.data[at:p.pos], singleByte: p.singleByte} // valid: just parsed
		q.str(&p.key, false)
		key = p.key
	}
	if err := p.colon(); err != nil {
		return err
	}
	hits, nested := false, false
	for i := lo; i < hi; i++ {
		f := &p.frames[i]
		if f.hit = bytes.EqualFold(key, []byte(f.seg)); f.hit {
			hits, nested = true, nested || f.nested
			f.exact = f.exact || string(key) == f.seg
		}
	}
	var err error
	if hits {
		err = p.lookValue(depth, lo, hi, nested)
	} else {
		err = p.value(depth)
	}
	if err != nil {
		return err
	}
	m.end = len(p.out)
	p.members = append(p.members, m)
	return nil
}

// lookValue parses (emitting) the value of a member whose key matched the
// frames of [lo,hi) marked hit, and settles each with what lookupMember
// gives for it: a nested frame looks on into an object (with a frame of its
// own there), a frame at its path's end takes a string's decoded value
// (found when not empty) or a number's literal text; anything else is not
// found. A value is the body's own bytes unless it is a string with an
// escape.
func (p *jsonParser) lookValue(depth, lo, hi int, nested bool) error {
	var (
		found bool
		val   []byte
	)
	c := p.peek()
	switch {
	case c == '{' && nested:
		inner := len(p.frames)
		for i := lo; i < hi; i++ {
			if f := p.frames[i]; f.hit && f.nested {
				seg, rest, deeper := cutDot(f.rest)
				p.frames = append(p.frames, frame{parent: i, seg: seg, rest: rest, nested: deeper})
			}
		}
		end := len(p.frames)
		if err := p.object(depth+1, inner, end); err != nil {
			return err
		}
		for _, f := range p.frames[inner:end] {
			p.settle(f.parent, f.found && f.exact && !f.ambiguous, f.val)
		}
		p.frames = p.frames[:inner]
	case c == '"':
		at := p.pos
		if err := p.str(&p.out, true); err != nil {
			return err
		}
		val = p.data[at+1 : p.pos-1]
		lone := false
		if bytes.IndexByte(val, '\\') >= 0 {
			q := jsonParser{data: p.data[at:p.pos], singleByte: p.singleByte}
			dec := make([]byte, 0, len(val))
			q.str(&dec, false)
			val, lone = dec, q.lone
		}
		found = len(val) > 0 && !lone && utf8.Valid(val) // a lone surrogate or a byte of a single-byte charset: see lookup
	case c == '-' || isDigit(c):
		at := p.pos
		if err := p.number(); err != nil {
			return err
		}
		val, found = p.data[at:p.pos], true
		p.out = append(p.out, val...)
	default:
		if err := p.value(depth); err != nil {
			return err
		}
	}
	for i := lo; i < hi; i++ {
		f := &p.frames[i]
		switch {
		case !f.hit:
		case !f.nested:
			p.settle(i, found, val)
		case c != '{': // a nested frame's object was settled above
			p.settle(i, false, nil)
		}
	}
	return nil
}

// settle gives frame i the result of one more member whose key matched:
// lookupObject's sameAs check against the one before it, then found and
// val.
func (p *jsonParser) settle(i int, found bool, val []byte) {
	f := &p.frames[i]
	if f.seen && !f.ambiguous {
		f.ambiguous = f.found != found || found && !bytes.Equal(f.val, val)
	}
	f.seen, f.found, f.val = true, found, val
}

func (p *jsonParser) colon() error {
	p.skipWS()
	if p.peek() != ':' {
		return p.fail("want ':' after an object key")
	}
	p.pos++
	p.put(':')
	p.skipWS()
	return nil
}

// noteOrder notes a move for the object opened at out[open] if its members,
// recorded from p.members[base], are not in key order, then drops them from
// p.members. The object's '}' is the next byte of out.
func (p *jsonParser) noteOrder(open, base int) {
	ms := p.members[base:]
	defer func() { p.members = p.members[:base] }()
	if slices.IsSortedFunc(ms, p.keyOrder) {
		return
	}
	first := len(p.sorted)
	p.sorted = append(p.sorted, ms...)
	slices.SortStableFunc(p.sorted[first:], p.keyOrder)
	p.moves = append(p.moves, move{open: open, close: len(p.out), first: first, last: len(p.sorted)})
}

// keyOrder compares members by their canonical key bytes.
func (p *jsonParser) keyOrder(a, b member) int {
	return bytes.Compare(p.out[a.keyStart:a.keyEnd], p.out[b.keyStart:b.keyEnd])
}

func (p *jsonParser) array(depth int) error {
	if depth > maxDepth {
		return p.fail("nesting too deep")
	}
	p.pos++
	p.put('[')
	p.skipWS()
	if p.peek() == ']' {
		p.pos++
		p.put(']')
		return nil
	}
	for {
		if err := p.value(depth); err != nil {
			return err
		}
		p.skipWS()
		switch p.peek() {
		case ',':
			p.pos++
			p.put(',')
			p.skipWS()
		case ']':
			p.pos++
			p.put(']')
			return nil
		default:
			return p.fail("want ',' or ']' in an array")
		}
	}
}

func (p *jsonParser) literal(word string) error {
	if !bytes.HasPrefix(p.data[p.pos:], []byte(word)) {
		return p.fail("unexpected character")
	}
	p.pos += len(word)
	if p.emit {
		p.out = append(p.out, word...)
	}
	return nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// number consumes an RFC 8259 §6 number.
func (p *jsonParser) number() error {
	if p.peek() == '-' {
		p.pos++
	}
	switch c := p.peek(); {
	case c == '0':
		p.pos++
	case isDigit(c):
		p.digits()
	default:
		return p.fail("want a digit")
	}
	if p.peek() == '.' {
		p.pos++
		if !isDigit(p.peek()) {
			return p.fail("want a digit after '.'")
		}
		p.digits()
	}
	if c := p.peek(); c == 'e' || c == 'E' {
		p.pos++
		if c := p.peek(); c == '+' || c == '-' {
			p.pos++
		}
		if !isDigit(p.peek()) {
			return p.fail("want a digit in the exponent")
		}
		p.digits()
	}
	return nil
}

func (p *jsonParser) digits() {
	for isDigit(p.peek()) {
		p.pos++
	}
}

// str consumes the string at p.pos. With dst nil it only validates; otherwise
// it appends the string to *dst, canonically encoded with its quotes when
// canon is set, else decoded (lone surrogates become U+FFFD, as in
// encoding/json).
func (p *jsonParser) str(dst *[]byte, canon bool) error {
	p.pos++ // opening quote
	if dst != nil && canon {
		*dst = append(*dst, '"')
	}
	for {
		start := p.pos
		for p.pos < len(p.data) {
			if c := p.data[p.pos]; c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
				break
			}
			p.pos++
		}
		if dst != nil {
			*dst = append(*dst, p.data[start:p.pos]...)
		}
		switch c := p.peek(); {
		case p.pos >= len(p.data):
			return p.fail("unterminated string")
		case c == '"':
			p.pos++
			if dst != nil && canon {
				*dst = append(*dst, '"')
			}
			return nil
		case c == '\\':
			if err := p.escape(dst, canon); err != nil {
				return err
			}
		case c < 0x20:
			return p.fail("control character in a string")
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size == 1 {
				if !p.singleByte {
					return p.fail("invalid UTF-8 in a string")
				}
				p.notUTF8 = true
			}
			if dst != nil {
				*dst = append(*dst, p.data[p.pos:p.pos+size]...)
			}
			p.pos += size
		}
	}
}

// escape consumes one backslash escape and appends what it stands for.
func (p *jsonParser) escape(dst *[]byte, canon bool) error {
	if p.pos+1 >= len(p.data) {
		return p.fail("unterminated string")
	}
	c := p.data[p.pos+1]
	p.pos += 2
	var r rune
	switch c {
	case '"', '\\', '/':
		r = rune(c)
	case 'b':
		r = '\b'
	case 'f':
		r = '\f'
	case 'n':
		r = '\n'
	case 'r':
		r = '\r'
	case 't':
		r = '\t'
	case 'u':
		return p.unicodeEscape(dst, canon)
	default:
		p.pos -= 2
		return p.fail("invalid escape in a string")
	}
	if dst != nil {
		*dst = appendRune(*dst, r, canon)
	}
	return nil
}

// unicodeEscape consumes the hex digits of a \u escape (the "\u" is already
// consumed), pairing a high surrogate with a following low one.
func (p *jsonParser) unicodeEscape(dst *[]byte, canon bool) error {
	r, ok := hex4(p.data[p.pos:])
	if !ok {
		return p.fail(`want 4 hex digits after \u`)
	}
	p.pos += 4
	if utf16.IsSurrogate(r) && r < 0xdc00 && bytes.HasPrefix(p.data[p.pos:], []byte(`\u`)) {
		if r2, ok := hex4(p.data[p.pos+2:]); ok && 0xdc00 <= r2 && r2 < 0xe000 {
			p.pos += 6
			r = utf16.DecodeRune(r, r2)
		}
	}
	if utf16.IsSurrogate(r) {
		p.lone = true
	}
	if dst == nil {
		return nil
	}
	if utf16.IsSurrogate(r) && canon {
		// A lone surrogate has no UTF-8 form; keep it escaped so that it stays
		// distinct from U+FFFD and from other lone surrogates.
		*dst = append(*dst, '\\', 'u', hexDigits[r>>12], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
		return nil
	}
	*dst = appendRune(*dst, r, canon)
	return nil
}

const hexDigits = "0123456789abcdef"

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		var v byte
		switch {
		case '0' <= c && c <= '9':
			v = c - '0'
		case 'a' <= c && c <= 'f':
			v = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	return r, true
}

// appendRune appends r decoded, or canonically escaped when canon is set.
func appendRune(dst []byte, r rune, canon bool) []byte {
	if !canon {
		return utf8.AppendRune(dst, r)
	}
	switch r {
	case '"', '\\':
		return append(dst, '\\', byte(r))
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	if r < 0x20 {
		return append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
	}
	return utf8.AppendRune(dst, r)
}

// lookup returns the scalar at the dotted path in data, which must be a
// valid JSON document whose top-level value is an object. Strings give their
// decoded value, numbers their literal text; an empty string, null, a bool,
// an object, an array, a missing member or invalid JSON give ok=false. A key
// of the path that repeats in its object ({"order_id":"a","order_id":"b"}),
// also in another letter case ({"order_id":"a","Order_ID":"b"}), gives
// ok=false unless every member gives the same value: parsers differ on which
// member wins (encoding/json and JavaScript take the last, others the first
// or refuse; encoding/json, ASP.NET and Json.NET match keys without regard to
// case), so idemproxy cannot know which order the provider reads, and a key
// derived from one would be another order's key for a provider that reads
// the other. A key present only in another letter case counts as absent.
// So does a string with a \u escape of a lone surrogate ("A\ud800"), which
// has no UTF-8 form: encoding/json reads U+FFFD in its place, so "A\ud800",
// "A\udbff" and "A\ufffd" are one order to a Go provider and three to one in
// JavaScript, Python or Java, which keep the surrogate; any key derived from
// it would be wrong for one of them. In a body in a single-byte charset
// (singleByte), a string with a byte that is not UTF-8 ("\xc8-1", И-1 in
// windows-1251) counts as absent too: a provider that ignores the charset
// reads U+FFFD for each such byte, so two orders would be one to it.
// val is valid until the parser is reused.
func (p *jsonParser) lookup(data []byte, path string) (val []byte, ok bool) {
	p.reset(data, false)
	p.seen, p.loneSeen = false, false
	p.skipWS()
	if p.peek() != '{' {
		return nil, false
	}
	ok, err := p.lookupObject(path, 1)
	if err != nil {
		return nil, false
	}
	if p.skipWS(); p.pos != len(p.data) {
		return nil, false
	}
	return p.val, ok
}

// lookupObject walks the object at p.pos (depth containers deep) for path.
func (p *jsonParser) lookupObject(path string, depth int) (found bool, err error) {
	if depth > maxDepth {
		return false, p.fail("nesting too deep")
	}
	seg, rest, nested := cutDot(path)
	p.pos++
	p.skipWS()
	if p.peek() == '}' {
		p.pos++
		return false, nil
	}
	// prev is where the last member with key seg, in any letter case,
	// started, -1 before one; ambiguous is set when two such members give
	// different values; exact when one has key seg as written.
	prev, ambiguous, exact := -1, false, false
	for {
		if p.peek() != '"' {
			return false, p.fail("want an object key")
		}
		p.key = p.key[:0]
		if err := p.str(&p.key, false); err != nil {
			return false, err
		}
		if err := p.colon(); err != nil {
			return false, err
		}
		// encoding/json (and ASP.NET's and Json.NET's defaults) match a
		// member whose key differs in letter case too, the last one winning:
		// {"order_id":"a","ORDER_ID":"b"} is order b to a Go provider and
		// order a to others, a repeat like any other.
		if bytes.EqualFold(p.key, []byte(seg)) {
			exact = exact || string(p.key) == seg
			start := p.pos
			found, err = p.lookupMember(rest, nested, depth)
			if err == nil && prev >= 0 && !ambiguous {
				ambiguous = !p.sameAs(p.data[prev:], found, rest, nested, depth)
			}
			if err == nil && !nested && (found || ambiguous) {
				p.seen = true
			}
			prev = start
		} else {
			err = p.value(depth)
		}
		if err != nil {
			return false, err
		}
		p.skipWS()
		switch p.peek() {
		case ',':
			p.pos++
			p.skipWS()
		case '}':
			p.pos++
			return found && exact && !ambiguous, nil
		default:
			return false, p.fail("want ',' or '}' after an object member")
		}
	}
}

// lookupMember reads the value of a member whose key matched.
func (p *jsonParser) lookupMember(rest string, nested bool, depth int) (bool, error) {
	switch c := p.peek(); {
	case nested && c == '{':
		return p.lookupObject(rest, depth+1)
	case !nested && c == '"':
		p.val = p.val[:0]
		p.lone = false
		err := p.str(&p.val, false)
		if p.lone && err == nil {
			// No one value: see lookup. It is a value all the same
			// (Unreadable).
			p.seen, p.loneSeen = true, true
			return false, nil
		}
		if err == nil && !utf8.Valid(p.val) {
			// A byte of a single-byte charset (singleByte): no one value
			// either, see lookup.
			p.seen = true
			return false, nil
		}
		return len(p.val) > 0, err
	case !nested && (c == '-' || isDigit(c)):
		start := p.pos
		err := p.number()
		p.val = append(p.val[:0], p.data[start:p.pos]...)
		return true, err
	}
	return false, p.value(depth)
}

// sameAs reports whether the member value at the start of data gives what
// the member just read gave (found, and p.val when found). It runs only when
// a key repeats, with a parser of its own so that p's state is left alone.
func (p *jsonParser) sameAs(data []byte, found bool, rest string, nested bool, depth int) bool {
	q := &jsonParser{data: data, singleByte: p.singleByte}
	qFound, err := q.lookupMember(rest, nested, depth)
	p.seen = p.seen || q.seen
	p.loneSeen = p.loneSeen || q.loneSeen
	return err == nil && qFound == found && (!found || bytes.Equal(q.val, p.val))
}

// cutDot splits a dotted path at its first dot.
func cutDot(path string) (seg, rest string, nested bool) {
	for i := 0; i < len(path); i++ {
		if path[i] == '.' {
			return path[:i], path[i+1:], true
		}
	}
	return path, "", false
}
