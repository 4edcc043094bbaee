package cache

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

var t0 = time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.UTC)

func sampleRecords() map[string]store.Record {
	return map[string]store.Record{
		"in flight": {
			State:       store.InFlight,
			Fingerprint: bytes.Repeat([]byte{0xab}, 32),
			Owner:       "owner-1",
			LeaseUntil:  t0.Add(30 * time.Second),
			CreatedAt:   t0,
		},
		"final with header and body": {
			State:       store.Final,
			Fingerprint: bytes.Repeat([]byte{1}, 32),
			Owner:       "owner-2",
			CreatedAt:   t0,
			Response: store.Response{
				Status: 201,
				Header: http.Header{
					"Content-Type": {"application/json"},
					"Set-Cookie":   {"a=1", "b=2"},
					"X-Empty":      {""},
				},
				Body: []byte(`{"id":"pay_1","status":"succeeded"}`),
			},
		},
		"final with binary body and zero times": {
			State:    store.Final,
			Response: store.Response{Status: 422, Header: http.Header{}, Body: []byte{0, 0xff, '\n'}},
		},
		"final with nil header and body": {
			State:    store.Final,
			Response: store.Response{Status: 204},
		},
		"superseded final with its ID": {
			ID:         store.ID{Tenant: "shop", Key: "order-1"},
			State:      store.Final,
			Response:   store.Response{Status: 409, Header: http.Header{}, Body: []byte(`{"status":"failed"}`)},
			Superseded: true,
		},
		"reviewed final that needed review": {
			ID:       store.ID{Tenant: "shop", Key: "order-2"},
			State:    store.Final,
			Response: store.Response{Status: 200, Header: http.Header{}, Body: []byte(`{"status":"needs_review"}`)},
			Reviewed: true,
		},
		"unknown with outcome": {
			State:       store.Unknown,
			Fingerprint: bytes.Repeat([]byte{7}, 32),
			Owner:       "o",
			Fence:       3,
			CreatedAt:   time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC),
			Outcome:     store.Outcome{FirstSentAt: time.Date(2026, 5, 1, 0, 0, 1, 0, time.UTC), Attempts: 7, LastError: "504 from upstream"},
		},
		"unknown with its request and last answer": {
			ID:          store.ID{Tenant: "shop", Key: "order-7"},
			State:       store.Unknown,
			Fingerprint: bytes.Repeat([]byte{8}, 32),
			Owner:       "o",
			Fence:       1,
			Method:      "POST",
			Path:        "/payments",
			UpstreamKey: "9b1d0c7e",
			Outcome:     store.Outcome{Attempts: 2, LastError: "status 504 from upstream", LastBody: []byte(`{"payment_id":"pay_7"}`)},
		},
		"unknown with its request as first sent": {
			ID:          store.ID{Tenant: "shop", Key: "order-8"},
			State:       store.Unknown,
			Fingerprint: bytes.Repeat([]byte{9}, 32),
			Owner:       "o",
			Fence:       2,
			Method:      "POST",
			Path:        "/payments",
			Outcome: store.Outcome{Attempts: 1, LastError: "timeout after send",
				Sent: &store.Sent{Body: []byte(`{"order_id":"o-8","amount":100}`), ContentType: "application/json", ContentEncoding: "gzip, identity"}},
		},
		"unknown that sent an empty body": {
			State:    store.Unknown,
			Reviewed: false,
			Outcome:  store.Outcome{Attempts: 1, Sent: &store.Sent{}},
		},
		"pre-1970 time": {
			State:     store.InFlight,
			Owner:     "o",
			CreatedAt: time.Date(1960, 1, 1, 0, 0, 0, 1, time.UTC),
		},
	}
}

// normalize maps the forms decoding cannot tell apart (nil vs empty).
func normalize(r store.Record) store.Record {
	if len(r.Fingerprint) == 0 {
		r.Fingerprint = nil
	}
	if len(r.Response.Body) == 0 {
		r.Response.Body = nil
	}
	if r.Response.Header == nil {
		r.Response.Header = http.Header{}
	}
	r.LeaseUntil, r.CreatedAt = r.LeaseUntil.UTC(), r.CreatedAt.UTC()
	r.Outcome.FirstSentAt = r.Outcome.FirstSentAt.UTC()
	if r.Outcome.Sent != nil && len(r.Outcome.Sent.Body) == 0 {
		sent := *r.Outcome.Sent
		sent.Body = nil
		r.Outcome.Sent = &sent
	}
	return r
}

// TestDecodeVersion1 reads a record written by builds before version 2: no
// outcome, and a fence of 1.
func TestDecodeVersion1(t *testing.T) {
	// version 1 | final | fp "ab" | owner "o" | lease 0 | created 0 | 200 | no headers | body "x"
	v1 := []byte{1, 2, 2, 'a', 'b', 1, 'o', 0, 0, 0xc8, 1, 0, 1, 'x'}
	got, err := decodeRecord(v1)
	if err != nil {
		t.Fatalf("decode version 1: %v", err)
	}
	want := store.Record{State: store.Final, Fingerprint: []byte("ab"), Owner: "o", Fence: 1,
		Response: store.Response{Status: 200, Header: http.Header{}, Body: []byte("x")}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("version 1 decoded as\n%#v\nwant\n%#v", got, want)
	}
}

// TestDecodeVersion2 reads a record written before version 3: no ID, not
// superseded.
func TestDecodeVersion2(t *testing.T) {
	want := store.Record{State: store.Unknown, Owner: "o", Fence: 2,
		Response: store.Response{Header: http.Header{}},
		Outcome:  store.Outcome{Attempts: 3, LastError: "x"}}
	enc := appendRecord(nil, &want)
	v2 := append([]byte{2}, enc[1:len(enc)-7]...) // drop tenant "", key "", the flag and version 4's four empty fields
	got, err := decodeRecord(v2)
	if err != nil {
		t.Fatalf("decode version 2: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("version 2 decoded as\n%#v\nwant\n%#v", got, want)
	}
}

// TestDecodeVersion3 reads a record written before version 4: no method,
// path, upstream key or last answer's body.
func TestDecodeVersion3(t *testing.T) {
	want := store.Record{ID: store.ID{Tenant: "shop", Key: "k"}, State: store.Unknown, Owner: "o", Fence: 2,
		Response: store.Response{Header: http.Header{}},
		Outcome:  store.Outcome{Attempts: 3, LastError: "x"}}
	enc := appendRecord(nil, &want)
	v3 := append([]byte{3}, enc[1:len(enc)-4]...) // drop the four empty fields version 4 added
	got, err := decodeRecord(v3)
	if err != nil {
		t.Fatalf("decode version 3: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("version 3 decoded as\n%#v\nwant\n%#v", got, want)
	}
}

// TestDecodeVersion4 reads a record written before version 5, whose flags
// byte was the superseded flag alone: 0 or 1, never the reviewed flag.
func TestDecodeVersion4(t *testing.T) {
	want := store.Record{ID: store.ID{Tenant: "shop", Key: "k"}, State: store.Final,
		Response: store.Response{Status: 409, Header: http.Header{}, Body: []byte(`{"status":"failed"}`)}, Superseded: true}
	enc := appendRecord(nil, &want)
	v4 := append([]byte{4}, enc[1:]...) // the same layout
	got, err := decodeRecord(v4)
	if err != nil {
		t.Fatalf("decode version 4: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("version 4 decoded as\n%#v\nwant\n%#v", got, want)
	}
	reviewed := want
	reviewed.Superseded, reviewed.Reviewed = false, true
	enc = appendRecord(nil, &reviewed)
	if _, err := decodeRecord(append([]byte{4}, enc[1:]...)); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "unknown flags") {
		t.Fatalf("version 4 with the reviewed flag: %v, want ErrCorrupt for unknown flags", err)
	}
	// The flags byte comes before the four empty fields that end enc.
	enc[len(enc)-5] |= 0x80
	if _, err := decodeRecord(enc); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "unknown flags") {
		t.Fatalf("version 5 with an unknown flag: %v, want ErrCorrupt for unknown flags", err)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for name, want := range sampleRecords() {
		t.Run(name, func(t *testing.T) {
			enc := appendRecord(nil, &want)
			if n := encodedSize(&want); len(enc) > n {
				t.Fatalf("encoding is %d bytes, more than the %d reserved for it", len(enc), n)
			}
			// Version 5 only for what version 4 cannot say, and 6 for
			// what 5 cannot, so that a rollback to a build before them
			// reads the rest.
			version := byte(rollbackVersion)
			if want.Reviewed {
				version = 5
			}
			if want.Outcome.Sent != nil {
				version = 6
			}
			if enc[0] != version {
				t.Fatalf("first byte %d, want version %d (reviewed %v, sent %v)", enc[0], version, want.Reviewed, want.Outcome.Sent != nil)
			}
			got, err := decodeRecord(enc)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, normalize(want)) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, normalize(want))
			}
			if again := appendRecord(nil, &got); !bytes.Equal(again, enc) {
				t.Fatalf("re-encoding differs:\n%x\n%x", again, enc)
			}
		})
	}
}

func TestRecordEncodingIsDeterministic(t *testing.T) {
	r := store.Record{State: store.Final, Response: store.Response{Header: http.Header{}}}
	for _, name := range []string{"B", "A", "D", "C", "E"} {
		r.Response.Header[name] = []string{name}
	}
	first := appendRecord(nil, &r)
	for range 20 {
		if got := appendRecord(nil, &r); !bytes.Equal(got, first) {
			t.Fatal("same record encoded differently (header map order leaked)")
		}
	}
}

func TestDecodeRecordRejects(t *testing.T) {
	valid := appendRecord(nil, &store.Record{State: store.Final, Owner: "o", Response: store.Response{Status: 200, Body: []byte("x")}})
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "empty value"},
		{"unknown version", append([]byte{7}, valid[1:]...), "format version 7 unknown"},
		{"version zero", append([]byte{0}, valid[1:]...), "format version 0 unknown"},
		{"state zero", append([]byte{recordVersion, 0}, valid[2:]...), "unknown state 0"},
		{"state four", append([]byte{recordVersion, 4}, valid[2:]...), "unknown state 4"},
		{"trailing byte", append(bytes.Clone(valid), 0), "1 trailing bytes"},
		{"fingerprint longer than input", []byte{recordVersion, 1, 0x7f, 1}, "truncated"},
		{"header count beyond input", []byte{recordVersion, 2, 0, 0, 0, 0, 0, 0xc8, 1, 0xff, 0xff, 0x03}, "exceeds remaining"},
		{"status out of range", []byte{recordVersion, 2, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0}, "status"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeRecord(tt.in)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("decode(%x) = %v, want ErrCorrupt mentioning %q", tt.in, err, tt.want)
			}
		})
	}
}

func TestDecodeRecordRejectsEveryTruncation(t *testing.T) {
	for name, r := range sampleRecords() {
		enc := appendRecord(nil, &r)
		for n := range len(enc) {
			if _, err := decodeRecord(enc[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s: prefix of %d/%d bytes decoded without error", name, n, len(enc))
			}
		}
	}
}

func TestDecodeRecordDoesNotAlias(t *testing.T) {
	r := sampleRecords()["final with header and body"]
	enc := appendRecord(nil, &r)
	got, err := decodeRecord(enc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range enc {
		enc[i] = 0
	}
	if !reflect.DeepEqual(got, normalize(r)) {
		t.Fatal("decoded record changed when the input buffer was overwritten")
	}
}

// TestRecordAllocations pins the allocations of the record codec, which runs
// on every request: one buffer to encode; to decode, one copy of the value
// that every field shares, plus the header map (two allocations: the map and
// its table) and one slice for all its values.
func TestRecordAllocations(t *testing.T) {
	slack := 0.0
	if raceEnabled {
		slack = 1 // the sorted names' array escapes under the race detector
	}
	r := benchRecord()
	if n := testing.AllocsPerRun(100, func() { appendRecord(nil, &r) }); n > 1+slack {
		t.Errorf("encode: %v allocations, want 1", n)
	}
	enc := appendRecord(nil, &r)
	if n := testing.AllocsPerRun(100, func() { decodeRecord(enc) }); n > 4+slack {
		t.Errorf("decode with %d header names: %v allocations, want at most 4", len(r.Response.Header), n)
	}
	// Every field counts in the size reserved up front: long ones would
	// otherwise overflow it (and cost a second allocation).
	long := strings.Repeat("x", 4096)
	full := store.Record{ID: store.ID{Tenant: long, Key: long}, State: store.Unknown, Fingerprint: []byte(long),
		Owner: long, Method: long, Path: long, UpstreamKey: long,
		Response: store.Response{Status: 200, Header: http.Header{long: {long, long}}, Body: []byte(long)},
		Outcome:  store.Outcome{LastError: long, LastBody: []byte(long)}}
	if enc, n := appendRecord(nil, &full), encodedSize(&full); len(enc) > n {
		t.Errorf("a record with every field set encodes to %d bytes, more than the %d reserved", len(enc), n)
	}
	if n := testing.AllocsPerRun(20, func() { appendRecord(nil, &full) }); n > 1+slack {
		t.Errorf("encode with every field set: %v allocations, want 1", n)
	}
	flight := sampleRecords()["in flight"]
	enc = appendRecord(nil, &flight)
	if n := testing.AllocsPerRun(100, func() { decodeRecord(enc) }); n > 2+slack {
		t.Errorf("decode without header: %v allocations, want at most 2", n)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(appendRecord(nil, &r))
	}
	f.Add([]byte{})
	f.Add([]byte{recordVersion})
	f.Add([]byte{recordVersion, 2, 0, 0, 0, 0, 0, 0xc8, 1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := decodeRecord(in)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		// Whatever decodes must survive its own round trip.
		again, err := decodeRecord(appendRecord(nil, &r))
		if err != nil {
			t.Fatalf("re-decoding a decoded record: %v", err)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("round trip of decoded record:\n got %#v\nwant %#v", again, r)
		}
	})
}

func TestRecordKey(t *testing.T) {
	a := appendRecordKey(nil, store.ID{Tenant: "acme", Key: "order-1"})
	tests := []struct {
		name string
		id   store.ID
	}{
		{"other key", store.ID{Tenant: "acme", Key: "order-2"}},
		{"other tenant", store.ID{Tenant: "globex", Key: "order-1"}},
		{"empty tenant", store.ID{Key: "order-1"}},
		// Without the length prefix these two would hash the same bytes.
		{"boundary shift", store.ID{Tenant: "acmeo", Key: "rder-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if bytes.Equal(appendRecordKey(nil, tt.id), a) {
				t.Fatalf("%+v shares the key of acme/order-1", tt.id)
			}
		})
	}
	t.Run("layout", func(t *testing.T) {
		if len(a) != keyLen || !bytes.HasPrefix(a, []byte(recordPrefix)) {
			t.Fatalf("key %x: want %d bytes starting %q", a, keyLen, recordPrefix)
		}
		same := appendRecordKey(nil, store.ID{Tenant: "acme", Key: "other"})
		if !bytes.Equal(a[:len(recordPrefix)+tenantLen], same[:len(recordPrefix)+tenantLen]) {
			t.Fatal("records of one tenant do not share the tenant prefix")
		}
		if bytes.Contains(a, []byte("order-1")) || bytes.Contains(a, []byte("acme")) {
			t.Fatal("raw tenant or key found in the stored key")
		}
	})
}

func BenchmarkRecordEncode(b *testing.B) {
	r := benchRecord()
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendRecord(buf[:0], &r)
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkRecordDecode(b *testing.B) {
	r := benchRecord()
	enc := appendRecord(nil, &r)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeRecord(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// benchRecord is a typical final record: 32-byte fingerprint, a few
// response headers and a 512-byte JSON body.
func benchRecord() store.Record {
	return store.Record{
		State:       store.Final,
		Fingerprint: bytes.Repeat([]byte{7}, 32),
		Owner:       "0b8f5e3c-4f6a-4a8e-9a47-1c1f3e0d9b21",
		CreatedAt:   t0,
		Response: store.Response{
			Status: 200,
			Header: http.Header{
				"Content-Type":         {"application/json"},
				"Date":                 {"Tue, 06 May 2031 07:08:09 GMT"},
				"Idempotent-Replayed":  {"false"},
				"X-Request-Id":         {"req_8d1f0c3b2a"},
				"Idempotency-Key":      {"5b0f3f4e-2d7a-5c1b-9e8f-6a7b8c9d0e1f"},
				"Strict-Transport-Sec": {"max-age=63072000"},
			},
			Body: bytes.Repeat([]byte("a"), 512),
		},
	}
}

// TestDecodeListedWithoutBodies: List without bodies decodes every sample
// record as decodeRecord does, but for its bodies: Response.Body and
// Outcome.LastBody nil, Response.NeedsReview answering for the body it
// had, and nothing shared with the value (Badger's buffer, valid only in
// the transaction): the record stays as decoded when the value is
// overwritten. A body of 1 MiB that needs review and a last ambiguous
// body are left out the same way.
func TestDecodeListedWithoutBodies(t *testing.T) {
	samples := sampleRecords()
	big := store.Record{State: store.Final, Fingerprint: bytes.Repeat([]byte{2}, 32), Owner: "o", CreatedAt: t0,
		ID: store.ID{Tenant: "acme", Key: "k"}, Method: "POST", Path: "/v1/payments", UpstreamKey: "u",
		Response: store.Response{Status: 202, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(`{"status":"needs_review","pad":"` + strings.Repeat("x", 1<<20) + `"}`)}}
	samples["final of 1 MiB that needs review"] = big
	unknown := big
	unknown.State, unknown.Response = store.Unknown, store.Response{}
	unknown.Outcome = store.Outcome{Attempts: 2, LastError: "504", LastBody: bytes.Repeat([]byte{'y'}, store.MaxLastBody)}
	samples["unknown with a last body"] = unknown
	for name, r := range samples {
		t.Run(name, func(t *testing.T) {
			enc := appendRecord(nil, &r)
			got, err := decodeListed(enc, false)
			if err != nil {
				t.Fatal(err)
			}
			for i := range enc {
				enc[i] = 0
			}
			want := normalize(r)
			needs := store.NeedsReview(r.Response.Body)
			want.Response.Body, want.Outcome.LastBody, want.Outcome.Sent = nil, nil, nil
			if got.Response.Body != nil || got.Outcome.LastBody != nil || got.Outcome.Sent != nil || got.Response.NeedsReview() != needs {
				t.Fatalf("listed without bodies: body %d bytes, last body %d, NeedsReview %v; want none, none, %v",
					len(got.Response.Body), len(got.Outcome.LastBody), got.Response.NeedsReview(), needs)
			}
			got.Response = store.Response{Status: got.Response.Status, Header: got.Response.Header}
			want.Response = store.Response{Status: want.Response.Status, Header: want.Response.Header}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("listed without bodies, its value overwritten:\n got %#v\nwant %#v", got, want)
			}
			if got.Size() > 1<<10 {
				t.Fatalf("listed without bodies: %d bytes (Record.Size)", got.Size())
			}
		})
	}
}
