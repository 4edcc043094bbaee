package pgstore

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// The array arguments of the batch statements (claimCols, completeCols).
// pgx reads an array argument element by element, each as an any: from a
// []string or []int64 every element is boxed (an allocation each), and a
// [][]byte or []*time.Time is read by reflection, an allocation per element
// too. These columns hand out each element as a pointer to it wrapped in a
// one-pointer struct, which fits an interface without an allocation, and
// which encodes itself as its element would (the same bytes on the wire: a
// nil []byte or *time.Time is NULL, as before).
type (
	byteaColumn       [][]byte
	textColumn        []string
	int8Column        []int64
	int4Column        []int32
	timestamptzColumn []*time.Time
)

type (
	byteaElem       struct{ p *[]byte }
	textElem        struct{ p *string }
	int8Elem        struct{ p *int64 }
	int4Elem        struct{ p *int32 }
	timestamptzElem struct{ p **time.Time }
)

func (e byteaElem) BytesValue() ([]byte, error) { return *e.p, nil }
func (e textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: *e.p, Valid: true}, nil
}
func (e int8Elem) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: *e.p, Valid: true}, nil
}
func (e int4Elem) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*e.p), Valid: true}, nil
}
func (e timestamptzElem) TimestamptzValue() (pgtype.Timestamptz, error) {
	if *e.p == nil {
		return pgtype.Timestamptz{}, nil
	}
	return pgtype.Timestamptz{Time: **e.p, Valid: true}, nil
}

// dims is a one-dimensional array's dimensions, as pgtype.FlatArray gives them.
func dims(n int) []pgtype.ArrayDimension {
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}

func (c byteaColumn) Dimensions() []pgtype.ArrayDimension       { return dims(len(c)) }
func (c byteaColumn) Index(i int) any                           { return byteaElem{&c[i]} }
func (c byteaColumn) IndexType() any                            { return byteaElem{} }
func (c textColumn) Dimensions() []pgtype.ArrayDimension        { return dims(len(c)) }
func (c textColumn) Index(i int) any                            { return textElem{&c[i]} }
func (c textColumn) IndexType() any                             { return textElem{} }
func (c int8Column) Dimensions() []pgtype.ArrayDimension        { return dims(len(c)) }
func (c int8Column) Index(i int) any                            { return int8Elem{&c[i]} }
func (c int8Column) IndexType() any                             { return int8Elem{} }
func (c int4Column) Dimensions() []pgtype.ArrayDimension        { return dims(len(c)) }
func (c int4Column) Index(i int) any                            { return int4Elem{&c[i]} }
func (c int4Column) IndexType() any                             { return int4Elem{} }
func (c timestamptzColumn) Dimensions() []pgtype.ArrayDimension { return dims(len(c)) }
func (c timestamptzColumn) Index(i int) any                     { return timestamptzElem{&c[i]} }
func (c timestamptzColumn) IndexType() any                      { return timestamptzElem{} }
