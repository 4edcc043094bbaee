package pgstore

import (
	"bytes"
	"context"
	"fmt"
	"strings"
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
	rows, cut, err := s.listBatch(ctx, store.Final, store.ID{}, filterBatch, true)
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

// TestListWithoutBodiesFetchesNone: a List without bodies (the admin API's
// listing without body=1) does not fetch the body columns: final answers of
// about 900 KiB (one of them naming needs_review elsewhere than at status,
// fetched to be judged) and unknown records keeping a last ambiguous body of
// 64 KiB are listed, every one, for a few KiB on the wire, where the same
// listings with bodies take the bodies' bytes. Before, every listing
// fetched every body (about 7.6 MiB here, and pages cut by them).
func TestListWithoutBodiesFetchesNone(t *testing.T) {
	ctx := context.Background()
	s, w := relayed(t)
	size := int(min(s.MaxBodyBytes(), 900<<10))
	const n = 8
	for i := range n {
		id := store.ID{Tenant: "t", Key: fmt.Sprintf("f%02d", i)}
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Hour); err != nil {
			t.Fatal(err)
		}
		body := []byte(`{"status":"succeeded","pad":"` + strings.Repeat("x", size) + `"}`)
		if i == 0 {
			body = []byte(`{"status":"succeeded","note":"needs_review","pad":"` + strings.Repeat("x", size) + `"}`)
		}
		if err := s.Complete(ctx, id, "o", store.Response{Status: 200, Body: body}, time.Time{}); err != nil {
			t.Fatal(err)
		}
		id.Key = fmt.Sprintf("u%02d", i)
		if _, _, err := s.Begin(ctx, id, store.Request{Fingerprint: []byte("fp")}, "o", time.Hour); err != nil {
			t.Fatal(err)
		}
		last := bytes.Repeat([]byte{'y'}, store.MaxLastBody)
		if err := s.Park(ctx, id, "o", store.Outcome{Attempts: 1, LastBody: last}); err != nil {
			t.Fatal(err)
		}
	}
	for _, state := range []store.State{store.Final, store.Unknown} {
		fetched := map[bool]int64{}
		for _, bodies := range []bool{false, true} {
			got, cursor := 0, ""
			before := w.recv.Load()
			for {
				recs, next, err := s.List(ctx, store.Filter{State: state, Bodies: bodies}, cursor, 1000)
				if err != nil {
					t.Fatal(err)
				}
				got += len(recs)
				if next == "" {
					break
				}
				cursor = next
			}
			fetched[bodies] = w.recv.Load() - before
			if got != n {
				t.Fatalf("List(%s, bodies %v) listed %d records, want %d", state, bodies, got, n)
			}
		}
		t.Logf("List(%s): %d bytes from the server without bodies, %d with", state, fetched[false], fetched[true])
		bodyBytes := int64(n * store.MaxLastBody)
		if state == store.Final {
			bodyBytes = int64(n * size)
		}
		if fetched[false] > int64(size)+64<<10 || fetched[true] < bodyBytes {
			t.Fatalf("List(%s) fetched %d bytes without bodies (the one answer to judge is %d), %d with; the bodies are %d bytes",
				state, fetched[false], size, fetched[true], bodyBytes)
		}
	}
}
