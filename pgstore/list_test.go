package pgstore

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestListBatchBoundedByBytes: a filtered List reads rows in batches of up
// to 500 to judge them; with stored answers of about 900 KiB, a batch is cut
// by the database once its rows hold store.MaxListBytes, so what is read
// and dropped is never more than that and one row. Before, one batch of 500
// such rows was 450 MiB, whatever the page kept. The listing still reads
// past every row once, batch after batch, to the end.
func TestListBatchBoundedByBytes(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.Database(t), time.Hour)
	size := int(min(s.MaxBodyBytes(), 900<<10))
	const n = 12
	for i := range n {
		id := store.ID{Tenant: "t", Key: fmt.Sprintf("k%02d", i)}
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Hour); err != nil {
			t.Fatal(err)
		}
		body := bytes.Repeat([]byte{'x'}, size)
		if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	rows, cut, err := s.listBatch(ctx, store.Final, store.ID{}, filterBatch)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for i := range rows {
		held += rows[i].Size()
	}
	if held > store.MaxListBytes+size+1<<10 || !cut || len(rows) == 0 {
		t.Fatalf("a batch of up to %d rows read %d rows of %d bytes together (cut %v), want no more than MaxListBytes %d and one row",
			filterBatch, len(rows), held, cut, store.MaxListBytes)
	}
	judged := map[store.ID]int{}
	recs, next, err := s.List(ctx, store.Filter{State: store.Final, Keep: func(r *store.Record) bool {
		judged[r.ID]++
		return false
	}}, "", 1000)
	if err != nil || len(recs) != 0 || next != "" || len(judged) != n {
		t.Fatalf("List keeping nothing = %d records, next %q, %v, having judged %d of %d rows", len(recs), next, err, len(judged), n)
	}
	for id, c := range judged {
		if c != 1 {
			t.Fatalf("%v judged %d times", id, c)
		}
	}
}
