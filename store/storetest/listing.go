package storetest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// testList: List pages through the records of one state, each with its ID,
// with a cursor; expired records and other states are left out.
func testList(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	base := newID("")
	id := func(k string) store.ID { return store.ID{Tenant: base.Tenant, Key: k} }
	for _, k := range []string{"f1", "u1", "u2", "i1", "i2", "i3"} {
		mustBegin(t, s, id(k), fpA, "o-"+k, Long)
	}
	if err := s.Complete(ctx, id("f1"), "o-f1", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"u1", "u2"} {
		if err := s.Park(ctx, id(k), "o-"+k, store.Outcome{Attempts: 1, LastError: "504 from upstream"}); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		state store.State
		want  []string
	}{
		{store.InFlight, []string{"i1", "i2", "i3"}},
		{store.Unknown, []string{"u1", "u2"}},
		{store.Final, []string{"f1"}},
	}
	for _, c := range cases {
		got := listAll(t, s, c.state, base.Tenant)
		var keys []string
		for _, r := range got {
			if r.State != c.state {
				t.Fatalf("List(%s) returned a record in state %s", c.state, r.State)
			}
			keys = append(keys, r.ID.Key)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, c.want) {
			t.Fatalf("List(%s) keys of this tenant = %v, want %v", c.state, keys, c.want)
		}
	}
	for _, r := range listAll(t, s, store.Unknown, base.Tenant) {
		if r.Outcome.Attempts != 1 || r.Outcome.LastError != "504 from upstream" {
			t.Fatalf("listed unknown record %+v lacks its outcome", r)
		}
	}
	if _, _, err := s.List(ctx, store.Filter{State: store.Unknown}, "not a cursor", 10); err == nil {
		t.Fatal("List with a cursor it never gave: no error")
	}
}

// listAll pages through List(state) two at a time and keeps tenant's records.
func listAll(t *testing.T, s store.Store, state store.State, tenant string) []store.Record {
	t.Helper()
	var out []store.Record
	cursor := ""
	for page := 0; ; page++ {
		recs, next, err := s.List(context.Background(), store.Filter{State: state}, cursor, 2)
		if err != nil {
			t.Fatalf("List(%s, %q): %v", state, cursor, err)
		}
		if len(recs) > 2 {
			t.Fatalf("List with limit 2 returned %d records", len(recs))
		}
		for _, r := range recs {
			if r.ID.Tenant == tenant {
				out = append(out, r)
			}
		}
		if next == "" {
			return out
		}
		if next == cursor || page > 100000 {
			t.Fatalf("List(%s) does not advance: cursor %q", state, next)
		}
		cursor = next
	}
}

// testListKeepFullPages: with a Keep filter that skips most records of the
// state, and records of other states between them, every page but the last
// is full and the pages together hold each kept record once.
func testListKeepFullPages(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	base := newID("")
	id := func(k string) store.ID { return store.ID{Tenant: base.Tenant, Key: k} }
	review := store.Response{Status: 200, Header: http.Header{}, Body: []byte(`{"status":"needs_review"}`)}
	var want []string
	for i := range 23 {
		k := fmt.Sprintf("k%02d", i)
		mustBegin(t, s, id(k), fpA, "o-"+k, Long)
		var err error
		switch i % 4 {
		case 0: // kept
			err = s.Complete(ctx, id(k), "o-"+k, review, time.Time{})
			want = append(want, k)
		case 1: // final, skipped by Keep
			err = s.Complete(ctx, id(k), "o-"+k, ok, time.Time{})
		case 2: // another state
			err = s.Park(ctx, id(k), "o-"+k, store.Outcome{Attempts: 1})
		} // 3: left in flight
		if err != nil {
			t.Fatal(err)
		}
	}
	f := store.Filter{State: store.Final, Bodies: true, Keep: func(r *store.Record) bool {
		return r.ID.Tenant == base.Tenant && bytes.Contains(r.Response.Body, []byte("needs_review"))
	}}
	for _, limit := range []int{1, 2, 5, 6, 100} {
		var got []string
		cursor := ""
		for page := 0; ; page++ {
			recs, next, err := s.List(ctx, f, cursor, limit)
			if err != nil {
				t.Fatalf("List(limit %d, %q): %v", limit, cursor, err)
			}
			if len(recs) > limit || next != "" && len(recs) != limit {
				t.Fatalf("limit %d, page %d: %d records, next cursor %q: want a full page unless it is the last",
					limit, page, len(recs), next)
			}
			for _, r := range recs {
				if r.State != store.Final || !f.Keep(&r) {
					t.Fatalf("limit %d: listed a record Keep refuses: %+v", limit, r)
				}
				got = append(got, r.ID.Key)
			}
			if next == "" {
				break
			}
			if next == cursor || page > len(want) {
				t.Fatalf("limit %d: List does not advance: cursor %q", limit, next)
			}
			cursor = next
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("limit %d: listed %v, want %v", limit, got, want)
		}
	}
}

// testSupersede: only a final record can be superseded, once; it says so
// afterwards and keeps its answer.
func testSupersede(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	_, err := s.Supersede(ctx, id, "o1")
	wantErr(t, "Supersede of a missing record", err, store.ErrNotFound)
	mustBegin(t, s, id, fpA, "o1", Long)
	_, err = s.Supersede(ctx, id, "o1")
	wantErr(t, "Supersede in flight", err, store.ErrNotFinal)
	if err := s.Park(ctx, id, "o1", store.Outcome{Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Supersede(ctx, id, "o1")
	wantErr(t, "Supersede of an unknown record", err, store.ErrNotFinal)
	mustBegin(t, s, id, fpA, "o2", Long)
	if err := s.Complete(ctx, id, "o2", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Supersede(ctx, id, "o1")
	wantErr(t, "Supersede naming the claim before the resume", err, store.ErrNotOwner)
	if got := get(t, s, id); got.Superseded {
		t.Fatalf("superseded naming another claim: %+v", got)
	}
	rec, err := s.Supersede(ctx, id, "o2")
	if err != nil || !rec.Superseded || rec.ID != id {
		t.Fatalf("Supersede of a final record = %+v, %v", rec, err)
	}
	got := get(t, s, id)
	if !got.Superseded || got.State != store.Final || got.ID != id {
		t.Fatalf("after Supersede: %+v", got)
	}
	wantResponse(t, "superseded record's answer", got.Response, ok)
	// A second Supersede of the same claim (a second renew that read the
	// record before the first wrote it) is refused: one renew moves the
	// order on, and only it says so.
	_, err = s.Supersede(ctx, id, "o2")
	wantErr(t, "second Supersede", err, store.ErrSuperseded)
	if got := get(t, s, id); !got.Superseded || got.State != store.Final {
		t.Fatalf("after the refused second Supersede: %+v", got)
	}
}

// testSupersedeReclaimed: an operator reads a failed final record and
// supersedes it; if meanwhile it expired and the key was claimed anew, the
// Supersede names the claim read and changes nothing: neither a new
// operation in flight nor its success moves to a new key.
func testSupersedeReclaimed(t *testing.T, s store.Store, advance func(time.Duration)) {
	ctx := context.Background()
	id := newID("k")
	declined := store.Response{Status: 402, Body: []byte(`{"status":"failed"}`)}
	mustBegin(t, s, id, fpA, "o1", Long)
	if err := s.Complete(ctx, id, "o1", declined, time.Time{}); err != nil {
		t.Fatal(err)
	}
	seen := get(t, s, id)
	advance(3 * time.Second)
	if rec := mustBegin(t, s, id, fpA, "o2", Long); rec.Fence != 1 || rec.Owner != "o2" {
		t.Fatalf("Begin after the TTL = %+v, want a new record of o2", rec)
	}
	_, err := s.Supersede(ctx, id, seen.Owner)
	wantErr(t, "Supersede of the old claim, the new one in flight", err, store.ErrNotOwner)
	if err := s.Complete(ctx, id, "o2", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Supersede(ctx, id, seen.Owner)
	wantErr(t, "Supersede of the old claim, the new one a success", err, store.ErrNotOwner)
	got := get(t, s, id)
	if got.Superseded || got.State != store.Final || got.Owner != "o2" || got.ExpiresAt.IsZero() {
		t.Fatalf("new claim's record after the refused Supersedes: %+v", got)
	}
	wantResponse(t, "new claim's answer", got.Response, ok)
}

// testSupersededKept: a superseded record outlives the TTL, so an order
// never falls back to an older key generation.
func testSupersededKept(t *testing.T, s store.Store, advance func(time.Duration)) {
	ctx := context.Background()
	kept, gone := newID("kept"), newID("gone")
	for _, id := range []store.ID{kept, gone} {
		mustBegin(t, s, id, fpA, "o", Long)
		if err := s.Complete(ctx, id, "o", ok, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Supersede(ctx, kept, "o"); err != nil {
		t.Fatal(err)
	}
	advance(3 * time.Second)
	if _, err := s.Get(ctx, gone); err == nil {
		t.Fatal("a final record outlived the TTL")
	}
	if rec := get(t, s, kept); !rec.Superseded {
		t.Fatalf("superseded record after the TTL: %+v", rec)
	}
}

// testListByBytes: records whose sizes together exceed store.MaxListBytes
// are paged by bytes as well as by limit: no page of more than one record
// holds more than MaxListBytes (Record.Size), a page short of limit with a
// next cursor is one the next record would have taken past it, and every
// record is reached exactly once across the pages, with and without Keep.
func testListByBytes(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	base := newID("")
	id := func(k string) store.ID { return store.ID{Tenant: base.Tenant, Key: k} }
	large := int(min(s.MaxBodyBytes(), 900<<10))
	body := paddedBody
	var review, all []string // this tenant's needs_review keys, and all its final keys
	sizes := map[string]int{}
	for i := range 14 {
		k := fmt.Sprintf("b%02d", i)
		var resp store.Response
		switch i % 4 {
		case 0, 1: // large, needs review
			resp = store.Response{Status: 200, Body: body("needs_review", large)}
			review = append(review, k)
		case 2: // small, needs review
			resp = store.Response{Status: 200, Body: body("needs_review", 100)}
			review = append(review, k)
		case 3: // large, left out by Keep
			resp = store.Response{Status: 200, Body: body("succeeded", large)}
		}
		mustBegin(t, s, id(k), fpA, "o-"+k, Long)
		if err := s.Complete(ctx, id(k), "o-"+k, resp, time.Time{}); err != nil {
			t.Fatalf("Complete(%s, %d bytes): %v", k, len(resp.Body), err)
		}
		all = append(all, k)
		sizes[k] = len(resp.Body)
	}
	needsReview := func(r *store.Record) bool {
		return r.ID.Tenant == base.Tenant && store.NeedsReview(r.Response.Body)
	}
	for _, c := range []struct {
		name string
		f    store.Filter
		want []string
	}{
		{"Keep", store.Filter{State: store.Final, Keep: needsReview, Bodies: true}, review},
		{"no Keep", store.Filter{State: store.Final, Bodies: true}, all},
	} {
		var pages [][]store.Record
		byBytes := false
		seen := map[store.ID]bool{}
		cursor := ""
		for page := 0; ; page++ {
			recs, next, err := s.List(ctx, c.f, cursor, 1000)
			if err != nil {
				t.Fatalf("%s: List(%q): %v", c.name, cursor, err)
			}
			held := 0
			for _, r := range recs {
				held += r.Size()
				if seen[r.ID] {
					t.Fatalf("%s: %v listed twice", c.name, r.ID)
				}
				seen[r.ID] = true
			}
			if len(recs) > 1 && held > store.MaxListBytes {
				t.Fatalf("%s: page %d holds %d records of %d bytes together, more than MaxListBytes %d",
					c.name, page, len(recs), held, store.MaxListBytes)
			}
			if next != "" && len(recs) < 1000 {
				byBytes = true
			}
			pages = append(pages, recs)
			if next == "" {
				break
			}
			if next == cursor || page > 1000 {
				t.Fatalf("%s: List does not advance: cursor %q", c.name, next)
			}
			cursor = next
		}
		// A page ends short only where the next record would not fit.
		for i := 0; i+1 < len(pages); i++ {
			held := 0
			for _, r := range pages[i] {
				held += r.Size()
			}
			if len(pages[i+1]) > 0 && held+pages[i+1][0].Size() <= store.MaxListBytes {
				t.Fatalf("%s: page %d holds %d records of %d bytes, and the next page begins with one of %d: it would have fit",
					c.name, i, len(pages[i]), held, pages[i+1][0].Size())
			}
		}
		if !byBytes {
			total := 0
			for _, k := range c.want {
				total += sizes[k]
			}
			t.Fatalf("%s: %d pages, none short of the limit 1000 with a next cursor: records of %d bytes together were not paged by bytes",
				c.name, len(pages), total)
		}
		var got []string
		for _, p := range pages {
			for _, r := range p {
				if r.ID.Tenant != base.Tenant {
					continue
				}
				if len(r.Response.Body) != sizes[r.ID.Key] {
					t.Fatalf("%s: %s listed with a body of %d bytes, stored %d", c.name, r.ID.Key, len(r.Response.Body), sizes[r.ID.Key])
				}
				got = append(got, r.ID.Key)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Fatalf("%s: listed %v, want %v", c.name, got, c.want)
		}
	}
}

// testListWithoutBodies: without Filter.Bodies, List gives records without
// their bodies (Response.Body and Outcome.LastBody nil), and a page's bytes
// are those of the records as given: final answers of up to 900 KiB each,
// several MiB together, and unknown records keeping a last ambiguous body
// of MaxLastBody, come in one page with limit 1000, where the final
// answers with their bodies take several. Response.NeedsReview still answers for the stored
// body, so Keep (Record.AwaitsReview, as the admin API's needs_review
// listing asks it) selects without the bodies what it selects with them,
// an answer spelling needs_review with a \u escape or naming it elsewhere
// than at status included; with Filter.Bodies the bodies come as stored.
func testListWithoutBodies(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	base := newID("")
	id := func(k string) store.ID { return store.ID{Tenant: base.Tenant, Key: k} }
	large := int(min(s.MaxBodyBytes(), 900<<10))
	body := paddedBody
	bodies := map[string][]byte{} // the final answers' bodies
	needs := map[string]bool{}    // whether each final answer needs review
	var awaiting, final []string  // keys of the final records awaiting review, and of all
	for i := range 12 {
		k := fmt.Sprintf("f%02d", i)
		var b []byte
		switch i % 4 {
		case 0, 1: // large, needs review
			b = body("needs_review", large)
		case 2: // large, names needs_review but not at status
			b = body("succeeded", large-40)
			b = append(b[:len(b)-1], `,"note":"needs_review"}`...)
		case 3: // large, ordinary
			b = body("succeeded", large)
		}
		bodies[k], needs[k] = b, store.NeedsReview(b)
	}
	bodies["u0"] = []byte(`{"status":"needs\u005freview"}`) // needs review, spelled with an escape
	bodies["r0"] = body("needs_review", large)              // needs review, marked reviewed
	needs["u0"], needs["r0"] = true, true
	for k, b := range bodies {
		mustBegin(t, s, id(k), fpA, "o-"+k, Long)
		if err := s.Complete(ctx, id(k), "o-"+k, store.Response{Status: 200, Body: b}, time.Time{}); err != nil {
			t.Fatalf("Complete(%s, %d bytes): %v", k, len(b), err)
		}
		final = append(final, k)
		if needs[k] && k != "r0" {
			awaiting = append(awaiting, k)
		}
	}
	if !needs["f00"] || needs["f02"] || needs["f03"] || !store.NeedsReview(bodies["u0"]) {
		t.Fatal("the test's bodies do not say what the test means")
	}
	if _, marked, err := s.Reviewed(ctx, id("r0")); err != nil || !marked {
		t.Fatalf("Reviewed(r0) = %v, %v", marked, err)
	}
	last := body("", store.MaxLastBody)
	var unknown []string
	for i := range 6 {
		k := fmt.Sprintf("p%02d", i)
		mustBegin(t, s, id(k), fpA, "o-"+k, Long)
		if err := s.Park(ctx, id(k), "o-"+k, store.Outcome{Attempts: 1, LastError: "504 from upstream", LastBody: last}); err != nil {
			t.Fatal(err)
		}
		unknown = append(unknown, k)
	}
	mine := func(r *store.Record) bool { return r.ID.Tenant == base.Tenant }
	awaits := func(r *store.Record) bool { return mine(r) && r.AwaitsReview() }
	// list pages through f with limit 1000, and returns this tenant's
	// records and the number of pages that were short of the limit with a
	// next cursor (cut by bytes).
	list := func(name string, f store.Filter) (map[string]store.Record, int) {
		got := map[string]store.Record{}
		cut, cursor := 0, ""
		for page := 0; ; page++ {
			recs, next, err := s.List(ctx, f, cursor, 1000)
			if err != nil {
				t.Fatalf("%s: List(%q): %v", name, cursor, err)
			}
			held := 0
			for _, r := range recs {
				held += r.Size()
				if !mine(&r) {
					continue
				}
				if _, dup := got[r.ID.Key]; dup {
					t.Fatalf("%s: %s listed twice", name, r.ID.Key)
				}
				got[r.ID.Key] = r
			}
			if len(recs) > 1 && held > store.MaxListBytes {
				t.Fatalf("%s: page %d holds %d records of %d bytes together, more than MaxListBytes", name, page, len(recs), held)
			}
			if next == "" {
				return got, cut
			}
			if len(recs) < 1000 {
				cut++
			}
			if next == cursor || page > 1000 {
				t.Fatalf("%s: List does not advance: cursor %q", name, next)
			}
			cursor = next
		}
	}
	keys := func(m map[string]store.Record) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	slices.Sort(awaiting)
	slices.Sort(final)
	for _, c := range []struct {
		name string
		f    store.Filter
		want []string
	}{
		{"needs review", store.Filter{State: store.Final, Keep: awaits}, awaiting},
		{"final", store.Filter{State: store.Final}, final},
		{"unknown", store.Filter{State: store.Unknown}, unknown},
	} {
		got, cut := list(c.name+" without bodies", c.f)
		if k := keys(got); !slices.Equal(k, c.want) {
			t.Fatalf("%s without bodies: listed %v, want %v", c.name, k, c.want)
		}
		if cut > 0 {
			t.Fatalf("%s without bodies: %d pages short of limit 1000 with a next cursor: records listed without their bodies were paged by the bodies' bytes",
				c.name, cut)
		}
		for k, r := range got {
			if r.Response.Body != nil || r.Outcome.LastBody != nil {
				t.Fatalf("%s without bodies: %s listed with a body of %d bytes and a last body of %d",
					c.name, k, len(r.Response.Body), len(r.Outcome.LastBody))
			}
			if r.Size() > 1<<10 {
				t.Fatalf("%s without bodies: %s holds %d bytes (Record.Size)", c.name, k, r.Size())
			}
			if r.State == store.Final && r.Response.NeedsReview() != needs[k] {
				t.Fatalf("%s without bodies: %s NeedsReview %v, its stored body's is %v", c.name, k, r.Response.NeedsReview(), needs[k])
			}
			if r.State == store.Unknown && (r.Outcome.Attempts != 1 || r.Outcome.LastError != "504 from upstream") {
				t.Fatalf("%s without bodies: %s lacks its outcome: %+v", c.name, k, r.Outcome)
			}
		}
		c.f.Bodies = true
		got, cut = list(c.name+" with bodies", c.f)
		if k := keys(got); !slices.Equal(k, c.want) {
			t.Fatalf("%s with bodies: listed %v, want %v", c.name, k, c.want)
		}
		if c.name != "unknown" && cut == 0 {
			t.Fatalf("%s with bodies: one page: records of several MiB together were not paged by bytes", c.name)
		}
		for k, r := range got {
			if r.State == store.Final && (!bytes.Equal(r.Response.Body, bodies[k]) || r.Response.NeedsReview() != needs[k]) {
				t.Fatalf("%s with bodies: %s listed with a body of %d bytes (NeedsReview %v), stored %d (%v)",
					c.name, k, len(r.Response.Body), r.Response.NeedsReview(), len(bodies[k]), needs[k])
			}
			if r.State == store.Unknown && !bytes.Equal(r.Outcome.LastBody, last) {
				t.Fatalf("%s with bodies: %s listed with a last body of %d bytes, stored %d", c.name, k, len(r.Outcome.LastBody), len(last))
			}
		}
	}
}

// paddedBody is a JSON answer with the given status, padded to n bytes.
func paddedBody(status string, n int) []byte {
	b := []byte(`{"status":"` + status + `","pad":"`)
	b = append(b, bytes.Repeat([]byte{'x'}, max(0, n-len(b)-2))...)
	return append(b, `"}`...)
}

// testListBudget: with Filter.Budget, a call stops looking once the budget
// is spent and returns a short (or empty) page with a next cursor; paging
// on still reaches every record once. The records kept are few among many
// more of the state that Keep skips (needs_review among every final
// answer), more than one of PostgreSQL's batches: a listing without the
// budget scanned them all in one call, however long that took (over the
// operator command's 10 s timeout on a store of a million final answers).
func testListBudget(t *testing.T, s store.Store, _ func(time.Duration)) {
	ctx := context.Background()
	base := newID("")
	id := func(k string) store.ID { return store.ID{Tenant: base.Tenant, Key: k} }
	review := store.Response{Status: 200, Header: http.Header{}, Body: []byte(`{"status":"needs_review"}`)}
	var want []string
	for i := range 1100 {
		k := fmt.Sprintf("b%04d", i)
		mustBegin(t, s, id(k), fpA, "o-"+k, Long)
		resp := ok
		if i%250 == 7 {
			resp = review
			want = append(want, k)
		}
		if err := s.Complete(ctx, id(k), "o-"+k, resp, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	f := store.Filter{State: store.Final, Budget: time.Nanosecond, Keep: func(r *store.Record) bool {
		return r.ID.Tenant == base.Tenant && r.Response.NeedsReview()
	}}
	var got []string
	cursor, cut := "", 0
	for page := 0; ; page++ {
		recs, next, err := s.List(ctx, f, cursor, 100)
		if err != nil {
			t.Fatalf("List(page %d, %q): %v", page, cursor, err)
		}
		for _, r := range recs {
			if !f.Keep(&r) {
				t.Fatalf("listed a record Keep refuses: %+v", r)
			}
			got = append(got, r.ID.Key)
		}
		if next == "" {
			break
		}
		if len(recs) < 100 {
			cut++
		}
		if next == cursor || page > 100000 {
			t.Fatalf("List does not advance: cursor %q", next)
		}
		cursor = next
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	if cut == 0 {
		t.Fatalf("with a budget of 1ns, every call scanned on to the end or a full page: the budget bounds nothing")
	}
}
