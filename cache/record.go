package cache

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/idemproxy/idemproxy/store"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// ErrCorrupt is wrapped by every record decoding failure. It is a
// store.ErrUnreadable: errors.Is(err, store.ErrUnreadable) holds for it.
var ErrCorrupt error = corruptError{}

// corruptError is ErrCorrupt's type.
type corruptError struct{}

func (corruptError) Error() string { return "cache: corrupt record" }

// Is makes ErrCorrupt a store.ErrUnreadable.
func (corruptError) Is(target error) bool { return target == store.ErrUnreadable }

// recordVersion is the newest layout decodeRecord reads. Bump it when the
// layout changes and teach decodeRecord the old layouts, so a store written
// by an older build still opens. Version 1 lacked the fields after the body.
const recordVersion = 6

// rollbackVersion is what appendRecord writes when the newest layouts'
// additions are unused: version 5 only added a flag to version 4's flags
// byte, so a record without it is written as version 4, and version 6 only
// the request's bytes as first sent (Outcome.Sent) after version 5's, so a
// record without them is written as version 5 (or 4). A build from before
// version 5 (a rollback) still reads every record but an operator's
// reviewed needs_review answer and an unknown record that keeps its
// request's bytes, which it lists as unreadable.
const rollbackVersion = 4

// Key layout: "r/" + first 8 bytes of SHA-256(tenant) + SHA-256(len(tenant),
// tenant, key). The tenant prefix keeps one tenant's records contiguous (a
// future per-tenant purge is one DropPrefix); the full-width second hash
// covers the tenant too, so two tenants cannot share a record even if their
// 8-byte prefixes collided. Badger keys are hashes of fixed size; the raw
// tenant and key are kept in the value (since format version 3), so that
// operators can list records. Binary rather than hex halves the key size,
// which is what Badger keeps in its indexes and bloom filters.
const (
	recordPrefix = "r/"
	tenantLen    = 8
	keyLen       = len(recordPrefix) + tenantLen + sha256.Size
)

// appendRecordKey appends the Badger key for id to dst.
func appendRecordKey(dst []byte, id store.ID) []byte {
	t := sha256.Sum256([]byte(id.Tenant))
	// The hash input, uvarint(len(tenant)) | tenant | key, is built on the
	// stack when it fits.
	var buf [256]byte
	in := binary.AppendUvarint(buf[:0], uint64(len(id.Tenant)))
	in = append(in, id.Tenant...)
	in = append(in, id.Key...)
	sum := sha256.Sum256(in)
	dst = append(dst, recordPrefix...)
	dst = append(dst, t[:tenantLen]...)
	return append(dst, sum[:]...)
}

// opBuf holds the bytes one operation hands Badger: its record's key and
// the encoding of the record it writes (put). Badger keeps the key and value
// passed to a transaction only until the transaction ends (Txn.Set's
// contract), and copies what it stores, so an operation reuses them in each
// of its transactions, and puts them back in opBufs once its last one ended.
type opBuf struct {
	key [keyLen]byte
	val []byte // up to maxPooledValue: a large answer's bytes are left to the GC
}

var opBufs = sync.Pool{New: func() any { return new(opBuf) }}

// maxPooledValue bounds the encoding buffer an opBuf keeps.
const maxPooledValue = 16 << 10

// getKey returns id's key in an opBuf, to be put back with opBufs.Put(b)
// once no transaction uses the key or b.val any more.
func getKey(id store.ID) (key []byte, b *opBuf) {
	b = opBufs.Get().(*opBuf)
	return appendRecordKey(b.key[:0], id), b
}

// appendRecord appends the version-6 encoding of r to dst, cut after
// lastBody and marked version 5 when r keeps no Outcome.Sent, and marked
// version 4 (rollbackVersion, the same layout) when it is not Reviewed
// either:
//
//	version u8 | state u8 | fingerprint bytes | owner bytes |
//	leaseUntil time | createdAt time | status uvarint |
//	header count uvarint, then per name (sorted): name bytes, value count uvarint, values bytes |
//	body bytes | fence uvarint | firstSentAt time | attempts uvarint |
//	lastError bytes | tenant bytes | key bytes | flags u8 |
//	method bytes | path bytes | upstreamKey bytes | lastBody bytes |
//	sentBody bytes | sentContentType bytes | sentContentEncoding bytes
//
// flags is flagSuperseded | flagReviewed; up to version 4 it was the
// superseded flag, 0 or 1, with the same layout. Version 3 ended after
// flags; version 2 after lastError; version 1 after body. The raw tenant and key are kept (since version 3) so that
// operators can list records. ExpiresAt is not encoded: it is the Badger
// entry's.
//
// where "bytes" is a uvarint length then the bytes, and "time" is a varint of
// Unix nanoseconds with 0 meaning the zero time.
func appendRecord(dst []byte, r *store.Record) []byte {
	dst = slices.Grow(dst, encodedSize(r))
	version := byte(rollbackVersion)
	if r.Reviewed {
		version = 5
	}
	sent := r.Outcome.Sent
	if sent != nil {
		version = recordVersion
	}
	dst = append(dst, version, byte(r.State))
	dst = appendBytes(dst, r.Fingerprint)
	dst = appendString(dst, r.Owner)
	dst = appendTime(dst, r.LeaseUntil)
	dst = appendTime(dst, r.CreatedAt)
	dst = binary.AppendUvarint(dst, uint64(max(r.Response.Status, 0)))
	dst = appendHeader(dst, r.Response.Header)
	dst = appendBytes(dst, r.Response.Body)
	dst = binary.AppendUvarint(dst, r.Fence)
	dst = appendTime(dst, r.Outcome.FirstSentAt)
	dst = binary.AppendUvarint(dst, uint64(max(r.Outcome.Attempts, 0)))
	dst = appendString(dst, r.Outcome.LastError)
	dst = appendString(dst, r.ID.Tenant)
	dst = appendString(dst, r.ID.Key)
	var flags byte
	if r.Superseded {
		flags |= flagSuperseded
	}
	if r.Reviewed {
		flags |= flagReviewed
	}
	dst = append(dst, flags)
	dst = appendString(dst, r.Method)
	dst = appendString(dst, r.Path)
	dst = appendString(dst, r.UpstreamKey)
	dst = appendBytes(dst, r.Outcome.LastBody)
	if sent == nil {
		return dst
	}
	dst = appendBytes(dst, sent.Body)
	dst = appendString(dst, sent.ContentType)
	return appendString(dst, sent.ContentEncoding)
}

// encodedSize is an upper bound of appendRecord's output, so that a record
// is encoded into one allocation.
func encodedSize(r *store.Record) int {
	const uv = binary.MaxVarintLen64
	n := 3 + 6*uv + 3*binary.MaxVarintLen64 // version, state, flags; uvarints; times
	n += uv + len(r.Fingerprint) + uv + len(r.Owner) + uv + len(r.Response.Body)
	n += uv + len(r.Outcome.LastError) + uv + len(r.ID.Tenant) + uv + len(r.ID.Key)
	n += uv + len(r.Method) + uv + len(r.Path) + uv + len(r.UpstreamKey) + uv + len(r.Outcome.LastBody)
	n += uv
	if sent := r.Outcome.Sent; sent != nil {
		n += 3*uv + len(sent.Body) + len(sent.ContentType) + len(sent.ContentEncoding)
	}
	for name, vs := range r.Response.Header {
		n += 2*uv + len(name)
		for _, v := range vs {
			n += uv + len(v)
		}
	}
	return n
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendTime(dst []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.AppendVarint(dst, 0)
	}
	return binary.AppendVarint(dst, t.UnixNano())
}

// appendHeader writes names in sorted order so equal headers encode equally.
func appendHeader(dst []byte, h http.Header) []byte {
	var onStack [16]string
	names := onStack[:0]
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, name := range names {
		dst = appendString(dst, name)
		dst = binary.AppendUvarint(dst, uint64(len(h[name])))
		for _, v := range h[name] {
			dst = appendString(dst, v)
		}
	}
	return dst
}

// decodeRecord parses an encoded record. It never panics and never keeps a
// reference to b (Badger's value buffers are only valid inside a
// transaction). Failures wrap ErrCorrupt.
//
// The record's fields share one copy of b: its byte fields are slices of it
// (capped, so an append copies) and its strings point into it. Nothing
// writes to that copy after decoding, so the strings stay immutable as long
// as no caller writes into a returned Fingerprint or Body, which no caller
// does (they are an answer to replay and a hash to compare).
func decodeRecord(b []byte) (store.Record, error) {
	return decode(b, true)
}

// decodeListed is decodeRecord for List: with bodies, the same; without,
// the record without its bodies (store.Response.WithoutBody, which judges
// the answer's before it is dropped, and Outcome.LastBody nil), its other
// fields copied out of b one by one, so that nothing it returns holds the
// bodies' bytes: a page of records that are mostly body holds what it
// shows.
func decodeListed(b []byte, bodies bool) (store.Record, error) {
	return decode(b, bodies)
}

func decode(b []byte, bodies bool) (store.Record, error) {
	if len(b) == 0 {
		return store.Record{}, fmt.Errorf("%w: empty value", ErrCorrupt)
	}
	if b[0] < 1 || b[0] > recordVersion {
		return store.Record{}, fmt.Errorf("%w: format version %d unknown (this build reads versions 1 to %d)",
			ErrCorrupt, b[0], recordVersion)
	}
	d := decoder{buf: bytes.Clone(b[1:])}
	if !bodies {
		d = decoder{buf: b[1:], noBodies: true}
	}
	r := d.record()
	if b[0] == 1 {
		r.Fence = 1 // version 1 knew no takeovers' count
	} else {
		d.outcome(&r)
	}
	if b[0] >= 3 {
		d.identity(&r, b[0])
	}
	if b[0] >= 4 {
		d.request(&r)
	}
	if b[0] >= 6 {
		d.sent(&r)
	}
	if d.err != nil {
		return store.Record{}, fmt.Errorf("%w: %w", ErrCorrupt, d.err)
	}
	if len(d.buf) != 0 {
		return store.Record{}, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(d.buf))
	}
	return r, nil
}

var errShort = errors.New("truncated")

// decoder reads fields off buf; after the first failure every read returns a
// zero value and err stays set, so callers check err once at the end.
//
// With noBodies, buf is the caller's (b itself): every field is copied out
// of it (bytes, string), and the bodies are judged and dropped (body).
type decoder struct {
	buf      []byte
	err      error
	noBodies bool
}

func (d *decoder) record() store.Record {
	var r store.Record
	r.State = store.State(d.byte())
	if d.err == nil && r.State != store.InFlight && r.State != store.Final && r.State != store.Unknown {
		d.err = fmt.Errorf("unknown state %d", r.State)
	}
	r.Fingerprint = d.bytes()
	r.Owner = d.string()
	r.LeaseUntil = d.time()
	r.CreatedAt = d.time()
	status := d.uvarint()
	if status > math.MaxInt32 {
		d.fail(fmt.Errorf("status %d out of range", status))
	}
	r.Response.Status = int(status)
	r.Response.Header = d.header()
	if d.noBodies {
		r.Response.Body = d.field() // b's, judged and dropped here
		r.Response = r.Response.WithoutBody()
	} else {
		r.Response.Body = d.bytes()
	}
	return r
}

// outcome reads the fields version 2 added after the body.
func (d *decoder) outcome(r *store.Record) {
	r.Fence = d.uvarint()
	r.Outcome.FirstSentAt = d.time()
	attempts := d.uvarint()
	if attempts > math.MaxInt32 {
		d.fail(fmt.Errorf("attempts %d out of range", attempts))
	}
	r.Outcome.Attempts = int(attempts)
	r.Outcome.LastError = d.string()
}

// The flags of an encoded record (version 5; flagSuperseded alone before).
const (
	flagSuperseded = 1 << iota
	flagReviewed
)

// identity reads the fields version 3 added: the record's ID, so that List
// can name records, and the flags (version 5; before, the superseded flag).
func (d *decoder) identity(r *store.Record, version byte) {
	r.ID.Tenant = d.string()
	r.ID.Key = d.string()
	known := byte(flagSuperseded | flagReviewed)
	if version < 5 {
		known = flagSuperseded
	}
	flags := d.byte()
	if flags&^known != 0 {
		d.fail(fmt.Errorf("unknown flags %#x in a version %d record", flags, version))
	}
	r.Superseded = flags&flagSuperseded != 0
	r.Reviewed = flags&flagReviewed != 0
}

// request reads the fields version 4 added: what the request was and the
// key sent upstream, and the last ambiguous answer's body.
func (d *decoder) request(r *store.Record) {
	r.Method = d.string()
	r.Path = d.string()
	r.UpstreamKey = d.string()
	if d.noBodies {
		d.field() // skipped
	} else {
		r.Outcome.LastBody = d.bytes()
	}
}

// sent reads the fields version 6 added: the request's bytes as first sent
// (Outcome.Sent), present in every version-6 record.
func (d *decoder) sent(r *store.Record) {
	body := d.field()
	s := &store.Sent{ContentType: d.string(), ContentEncoding: d.string()}
	if d.noBodies { // listed without bodies: left out, as the others are
		return
	}
	s.Body = body // the decoder's private copy (decode)
	r.Outcome.Sent = s
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.buf = nil
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.buf) == 0 {
		d.fail(errShort)
		return 0
	}
	c := d.buf[0]
	d.buf = d.buf[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

// bytes returns the next length-prefixed field (nil if empty), a slice of
// the decoder's private buffer capped at its length, or with noBodies a
// copy of it.
func (d *decoder) bytes() []byte {
	b := d.field()
	if d.noBodies && b != nil {
		return bytes.Clone(b)
	}
	return b
}

// field returns the next length-prefixed field (nil if empty), a slice of
// buf capped at its length.
func (d *decoder) field() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.buf)) {
		d.fail(errShort)
		return nil
	}
	b := d.buf[:n:n]
	d.buf = d.buf[n:]
	if len(b) == 0 {
		return nil
	}
	return b
}

// string returns the next length-prefixed field as a string sharing the
// decoder's private buffer, which is never written after decoding (see
// decodeRecord).
func (d *decoder) string() string {
	b := d.bytes()
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func (d *decoder) time() time.Time {
	if d.err != nil {
		return time.Time{}
	}
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail(errShort)
		return time.Time{}
	}
	d.buf = d.buf[n:]
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, v).UTC()
}

// header reads the header block. Counts are checked against the bytes left
// (every entry takes at least one byte), so a forged count cannot make it
// allocate more than the input's size.
func (d *decoder) header() http.Header {
	n := d.count()
	if n == 0 {
		return http.Header{}
	}
	h := make(http.Header, n)
	slab := make([]string, 0, n) // the values of every name, most have one
	for range n {
		name := d.string()
		c := d.count()
		var values []string
		if len(slab)+c <= cap(slab) {
			values = slab[len(slab) : len(slab)+c : len(slab)+c]
			slab = slab[:len(slab)+c]
		} else {
			values = make([]string, c)
		}
		for i := range values {
			values[i] = d.string()
		}
		if d.err != nil {
			return http.Header{}
		}
		h[name] = values
	}
	return h
}

func (d *decoder) count() int {
	n := d.uvarint()
	if n > uint64(len(d.buf)) {
		d.fail(fmt.Errorf("count %d exceeds remaining %d bytes", n, len(d.buf)))
		return 0
	}
	return int(n)
}
