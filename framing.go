package main

import (
	"bytes"
	"math"
	"sync/atomic"
)

// framing follows the requests on one client connection as net/http's
// server frames them (RFC 9112 §6), byte for byte as it reads them, to see
// what the server hides from handlers: a request with both Transfer-Encoding
// and Content-Length (the server drops Content-Length and reads the body
// chunked), Transfer-Encoding on HTTP/1.0 (the server ignores it) and a
// Content-Length given twice with one value (the server merges them). Such
// a request's length is ambiguous: a front proxy that framed it the other
// way sent another request's bytes as its body, or its body as another
// request. The handler refuses it (proxy.MarkAmbiguousFraming).
//
// It reads request heads line by line and skips bodies by their length or
// their chunks, as the server does. What the server would refuse and close
// the connection for (a malformed head or chunk, an unsupported
// Transfer-Encoding, two different lengths), and anything framing cannot
// follow, turns it off for the rest of the connection: it never refuses by
// itself, it only marks. A Transfer-Encoding or Content-Length line whose
// value it cannot read (padded past what it keeps of a line) still counts
// as one, so that with another it makes the request ambiguous. Once off, it
// cannot tell where any later request on the connection starts, so every
// later one the handler sees is marked too (refuses): when the server
// refused and closed, there is none. Read calls feed it one at a time
// (net/http reads a connection from one goroutine at a time); ambiguous
// and stopped are read by handlers.
type framing struct {
	state framingState
	// heads counts the request heads that reach the handler; ambiguous is
	// the number of the first one whose length is ambiguous, 0 if none;
	// stopped is 1 + the number of heads counted when framing turned off,
	// 0 while it follows the connection.
	heads     int64
	ambiguous atomic.Int64
	stopped   atomic.Int64

	line      framingLine
	headBytes int
	crlf      int  // CR and LF bytes skipped before this head
	afterPOST bool // the last head was a POST: the server skips up to 4 CR or LF bytes after it

	// The head being read.
	http10, optionsStar bool
	te, cls             int  // Transfer-Encoding and Content-Length lines
	chunked             bool // the Transfer-Encoding is chunked
	length              int64
	lengthUnread        bool // a Content-Length whose value framing could not read
	teUnread            bool // a Transfer-Encoding whose value framing could not read
	post                bool

	remain int64 // body or chunk bytes still to come

	// The Transfer-Encoding or Content-Length line being read, until the
	// next line shows it has no continuation.
	field      uint8 // fieldTE, fieldCL or 0
	value      []byte
	valueWhole bool
	valueBuf   [64]byte
}

const (
	fieldTE = 1 + iota
	fieldCL
)

type framingState uint8

const (
	framingHeadStart framingState = iota
	framingRequestLine
	framingHeader
	framingBody
	framingChunkSize
	framingChunkData
	framingChunkEnd // the CR LF after a chunk's data; remain counts its bytes
	framingTrailer
	framingOff
)

// maxFramingHead bounds a head framing reads; the server refuses one much
// smaller (Server.MaxHeaderBytes) and closes the connection.
const maxFramingHead = 1 << 20

// framingLine keeps the start and the end of the line being read: enough
// for a header's name and a short value, and for a request line's method
// and protocol.
type framingLine struct {
	start [128]byte
	tail  [11]byte // the last bytes: " HTTP/1.0\r\n" ends a request line
	n     int
}

// add appends b, bytes of the line, to it.
func (l *framingLine) add(b []byte) {
	if l.n < len(l.start) {
		copy(l.start[l.n:], b)
	}
	l.n += len(b)
	if len(b) >= len(l.tail) {
		copy(l.tail[:], b[len(b)-len(l.tail):])
		return
	}
	copy(l.tail[:], l.tail[len(b):])
	copy(l.tail[len(l.tail)-len(b):], b)
}

// text is the line without its CR LF (or bare LF), and whether it was kept
// whole.
func (l *framingLine) text() ([]byte, bool) {
	n := min(l.n, len(l.start))
	b := bytes.TrimSuffix(bytes.TrimSuffix(l.start[:n], []byte("\n")), []byte("\r"))
	return b, l.n <= len(l.start)
}

// endsWith reports whether the line, without its CR LF or bare LF, ends
// with s (at most 9 bytes).
func (l *framingLine) endsWith(s string) bool {
	t := l.tail[len(l.tail)-min(l.n, len(l.tail)):]
	t = bytes.TrimSuffix(bytes.TrimSuffix(t, []byte("\n")), []byte("\r"))
	return bytes.HasSuffix(t, []byte(s))
}

// crlf reports whether the line ends in CR LF and has no other CR.
func (l *framingLine) crlf() bool {
	text, _ := l.text()
	return l.n >= 2 && l.tail[len(l.tail)-2] == '\r' && bytes.IndexByte(text, '\r') < 0
}

// feed follows p, the next bytes read from the connection.
func (f *framing) feed(p []byte) {
	for len(p) > 0 {
		switch f.state {
		case framingOff:
			return
		case framingBody, framingChunkData:
			n := int64(len(p))
			if n > f.remain {
				n = f.remain
			}
			f.remain -= n
			p = p[n:]
			if f.remain == 0 {
				if f.state == framingBody {
					f.state = framingHeadStart
				} else {
					f.state, f.remain = framingChunkEnd, 2
				}
			}
		case framingChunkEnd:
			want := byte('\r')
			if f.remain == 1 {
				want = '\n'
			}
			if p[0] != want {
				f.stop() // the server refuses the body
				return
			}
			p = p[1:]
			if f.remain--; f.remain == 0 {
				f.state = framingChunkSize
			}
		case framingHeadStart:
			if f.afterPOST && f.crlf < 4 && (p[0] == '\r' || p[0] == '\n') {
				f.crlf++
				p = p[1:]
				continue
			}
			f.startHead()
		default: // a line of a head, a chunk size or a trailer
			seg := p // up to the line's LF, or all of p
			i := bytes.IndexByte(p, '\n')
			if i >= 0 {
				seg = p[:i+1]
			}
			p = p[len(seg):]
			if f.headBytes += len(seg); f.headBytes > maxFramingHead {
				f.stop()
				return
			}
			f.line.add(seg)
			if i >= 0 {
				f.endLine()
				f.line.n = 0
			}
		}
	}
}

// stop turns framing off for the rest of the connection; the requests whose
// heads it has not counted yet are marked (refuses).
func (f *framing) stop() {
	f.state = framingOff
	f.stopped.CompareAndSwap(0, f.heads+1)
}

// refuses reports whether the handler's request number n (1 first) must be
// refused: its length is ambiguous, or framing stopped before its head, so
// that where it starts and ends cannot be told.
func (f *framing) refuses(n int64) bool {
	if a := f.ambiguous.Load(); a != 0 && a == n {
		return true
	}
	s := f.stopped.Load()
	return s != 0 && n >= s
}

func (f *framing) startHead() {
	f.state, f.line.n, f.headBytes, f.crlf = framingRequestLine, 0, 0, 0
	f.http10, f.optionsStar, f.te, f.cls, f.chunked, f.length, f.post = false, false, 0, 0, false, 0, false
	f.lengthUnread, f.teUnread = false, false
	f.field, f.value = 0, f.valueBuf[:0]
}

// endLine handles the line just read, ending in LF.
func (f *framing) endLine() {
	text, whole := f.line.text()
	switch f.state {
	case framingRequestLine:
		f.http10 = f.line.endsWith(" HTTP/1.0")
		f.post = bytes.HasPrefix(text, []byte("POST "))
		f.optionsStar = whole && bytes.HasPrefix(text, []byte("OPTIONS * "))
		f.state = framingHeader
	case framingHeader:
		f.header(text, whole)
	case framingChunkSize:
		// The server reads a chunk-size line of up to 4 KiB: a long
		// extension is skipped as long as the size and its ';' are in
		// what framing keeps of the line.
		if !f.line.crlf() || !whole && bytes.IndexByte(text, ';') < 0 {
			f.stop()
			return
		}
		f.chunkSize(text)
	case framingTrailer:
		if len(text) == 0 {
			f.state = framingHeadStart
		}
	}
}

// header handles one line of a head; an empty one ends it. The value of a
// Transfer-Encoding or Content-Length line is kept until the next line
// that is not a continuation (obs-fold, which the server joins to it with a
// space).
func (f *framing) header(text []byte, whole bool) {
	if len(text) > 0 && (text[0] == ' ' || text[0] == '\t') {
		if f.field != 0 {
			f.addValue(bytes.Trim(text, " \t"), whole)
		}
		return
	}
	if f.endField(); f.state == framingOff {
		return
	}
	if len(text) == 0 {
		f.endHead()
		return
	}
	name, value, ok := bytes.Cut(text, []byte(":"))
	switch {
	case !ok: // malformed: the server refuses it
	case bytes.EqualFold(name, []byte("Transfer-Encoding")):
		f.field = fieldTE
	case bytes.EqualFold(name, []byte("Content-Length")):
		f.field = fieldCL
	}
	if f.field != 0 {
		f.value, f.valueWhole = f.value[:0], true
		f.addValue(bytes.Trim(value, " \t"), whole)
	}
}

// addValue adds a line's part of the value of the field being read.
func (f *framing) addValue(v []byte, whole bool) {
	if len(f.value) > 0 && len(v) > 0 {
		v = append([]byte{' '}, v...) // rare: a value folded over lines
	}
	if !whole || len(f.value)+len(v) > cap(f.value) {
		f.valueWhole = false
		return
	}
	f.value = append(f.value, v...)
}

// endField counts the Transfer-Encoding or Content-Length line just read,
// its continuation lines included.
func (f *framing) endField() {
	field := f.field
	f.field = 0
	switch field {
	case fieldTE:
		f.te++
		f.chunked = f.valueWhole && bytes.EqualFold(f.value, []byte("chunked"))
		f.teUnread = !f.valueWhole
	case fieldCL:
		f.cls++
		n, ok := parseLength(f.value)
		switch {
		case !f.valueWhole || !ok:
			// Padded past what framing keeps, or not a length: the
			// server refuses the request, or reads a length framing
			// cannot; either way it is a length line (endHead).
			f.lengthUnread = true
		case f.cls > 1 && !f.lengthUnread && n != f.length:
			f.stop() // the server refuses two different lengths
		default:
			f.length = n
		}
	}
}

// endHead decides the framing of the request whose head just ended, as
// net/http's server does, and marks an ambiguous one.
func (f *framing) endHead() {
	if !f.optionsStar { // the server answers OPTIONS * itself, without the handler
		f.heads++
	}
	f.afterPOST = f.post
	switch {
	case f.te > 0 && !f.http10 && (f.te > 1 || !f.chunked && !f.teUnread):
		f.stop() // the server refuses the Transfer-Encoding
		return
	case f.te > 0 && (f.cls > 0 || f.http10), f.cls > 1:
		// Also when a value could not be read: if the server refuses
		// it, the handler never sees the mark.
		if !f.optionsStar {
			f.ambiguous.CompareAndSwap(0, f.heads)
		}
		// The handler refuses it and the connection is closed.
		f.stop()
		return
	case f.teUnread:
		// The server refuses it, or reads a padded "chunked":
		// framing cannot follow.
		f.stop()
		return
	case f.lengthUnread:
		f.stop() // the server refuses the length, or reads one framing could not
		return
	case f.te > 0:
		f.state, f.line.n = framingChunkSize, 0
	case f.length > 0:
		f.state, f.remain = framingBody, f.length
	default:
		f.state = framingHeadStart
	}
}

// chunkSize reads a chunk size line (extensions ignored, as the server does).
func (f *framing) chunkSize(text []byte) {
	text, _, _ = bytes.Cut(text, []byte(";"))
	text = bytes.TrimRight(text, " \t")
	if len(text) == 0 || len(text) > 16 { // the server's limit
		f.stop()
		return
	}
	var n uint64
	for _, c := range text {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			f.stop()
			return
		}
		n = n<<4 | uint64(c)
	}
	f.headBytes = 0
	switch {
	case n == 0:
		f.state = framingTrailer
	case n > math.MaxInt64: // no body has that many bytes: nothing more to follow
		f.stop()
	default:
		f.state, f.remain = framingChunkData, int64(n)
	}
}

// parseLength parses a Content-Length value as the server does: digits only,
// leading zeros allowed.
func parseLength(v []byte) (int64, bool) {
	if len(v) > 0 {
		if v = bytes.TrimLeft(v, "0"); len(v) == 0 {
			return 0, true
		}
	}
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
