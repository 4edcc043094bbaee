package pgstore

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemproxy/idemproxy/store"
)

// claimOIDs and completeOIDs are the array types of the batch statements'
// arguments, in their order (claims, completesFrom).
var (
	claimOIDs = []uint32{pgtype.ByteaArrayOID, pgtype.ByteaArrayOID, pgtype.ByteaArrayOID, pgtype.TextArrayOID,
		pgtype.Int8ArrayOID, pgtype.TextArrayOID, pgtype.TextArrayOID, pgtype.TextArrayOID}
	completeOIDs = []uint32{pgtype.ByteaArrayOID, pgtype.ByteaArrayOID, pgtype.TextArrayOID, pgtype.Int4ArrayOID,
		pgtype.ByteaArrayOID, pgtype.ByteaArrayOID, pgtype.TimestamptzArrayOID, pgtype.Int8ArrayOID}
)

// batchCols are the columns of a batch of n claims and n final answers, every
// other answer sent (a first send) and every other one not (NULL).
func batchCols(n int) (claimCols, completeCols) {
	c, f := newClaimCols(n), newCompleteCols(n)
	sent := time.Date(2026, 12, 2, 15, 0, 0, 123456000, time.UTC)
	for i := range n {
		id := store.ID{Tenant: "default", Key: "key-" + strconv.Itoa(i)}
		c.add(id, &claimArgs{owner: "owner", lease: time.Minute, req: store.Request{Fingerprint: bytes.Repeat([]byte{byte(i)}, 32),
			Method: "POST", Path: "/v1/payments", UpstreamKey: id.Key}})
		a := &completeArgs{owner: "owner", status: 200, header: []byte(`{"Content-Type":["application/json"]}`),
			body: []byte(`{"status":"succeeded"}`), ttl: micros(time.Hour)}
		if i%2 == 0 {
			a.sent = &sent
		}
		f.add(id, a)
	}
	return c, f
}

// TestColumnsEncodeAsSlices: a column goes to PostgreSQL as the plain slice
// it holds would, byte for byte: a nil []byte or *time.Time as NULL, an
// empty []byte or string as empty.
func TestColumnsEncodeAsSlices(t *testing.T) {
	m := pgtype.NewMap()
	sent := time.Now()
	cases := []struct {
		oid         uint32
		plain, cols any
	}{
		{pgtype.ByteaArrayOID, [][]byte{[]byte("a"), nil, {}}, byteaColumn{[]byte("a"), nil, {}}},
		{pgtype.TextArrayOID, []string{"a", "", "ü"}, textColumn{"a", "", "ü"}},
		{pgtype.Int4ArrayOID, []int32{200, -1, 1 << 30}, int4Column{200, -1, 1 << 30}},
		{pgtype.Int8ArrayOID, []int64{0, -1, 1 << 40}, int8Column{0, -1, 1 << 40}},
		{pgtype.TimestamptzArrayOID, []*time.Time{&sent, nil}, timestamptzColumn{&sent, nil}},
		{pgtype.ByteaArrayOID, [][]byte{}, byteaColumn{}},
		{pgtype.TextArrayOID, []string{}, textColumn{}},
	}
	for _, c := range cases {
		want, err := m.Encode(c.oid, pgtype.BinaryFormatCode, c.plain, nil)
		if err != nil {
			t.Fatalf("%T: %v", c.plain, err)
		}
		got, err := m.Encode(c.oid, pgtype.BinaryFormatCode, c.cols, nil)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%T %v: encoded %x, %v; want %x as %T", c.cols, c.cols, got, err, want, c.plain)
		}
	}
}

// TestBatchArgsAllocateOncePerArray: encoding a batch's arguments
// allocates once per array (its dimensions), however many rows it has.
// As []string, []int64, [][]byte and []*time.Time they cost an allocation
// per element (boxed, or read by reflection): 18 for an array of 16 rows.
func TestBatchArgsAllocateOncePerArray(t *testing.T) {
	m := pgtype.NewMap()
	c, f := batchCols(16)
	check := func(name string, args []any, oids []uint32) {
		for i, a := range args {
			buf, err := m.Encode(oids[i], pgtype.BinaryFormatCode, a, nil) // plans the encoding once
			if err != nil {
				t.Fatalf("%s $%d: %v", name, i+1, err)
			}
			n := testing.AllocsPerRun(20, func() { buf, _ = m.Encode(oids[i], pgtype.BinaryFormatCode, a, buf[:0]) })
			if n > 1 {
				t.Errorf("%s $%d (%T, 16 rows): %v allocations, want at most 1", name, i+1, a, n)
			}
		}
	}
	check("claims", c.args(), claimOIDs)
	check("final answers", f.args(), completeOIDs)
}
