package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// Damage is a way RunDamaged has a record damaged.
type Damage int

const (
	// Undecodable keeps the record's state and makes its stored value one
	// this version cannot decode (in the store's own terms: a format
	// version no build wrote, a column that does not decode).
	Undecodable Damage = iota + 1
	// NewerState makes the record's state 4, one this version does not
	// know, as a newer version might write.
	NewerState
)

// Damager damages id's record in s (opened by the same Factory) as a
// store's own tests can, below the contract: its raw bytes, its row.
type Damager func(t *testing.T, s store.Store, id store.ID, d Damage)

// newerState is the state NewerState gives a record.
const newerState = store.State(4)

// RunDamaged checks what a store does with records it keeps but cannot
// read (store.ErrUnreadable), damaged by damage: in flight, unknown and
// final records whose value does not decode, and an unknown one moved to a
// state this version does not know, beside readable ones.
//
// List must go on past them, page by page, and show each in the listing of
// its state (the one in a newer state with the unknown records) with
// Unreadable set, its ID, its stored State and an error that is a
// store.ErrUnreadable; the readable records are listed as always. Get,
// Begin (with the record's fingerprint or another), Supersede, Resolve and
// Reviewed must each fail with a store.ErrUnreadable and leave the record
// as it is: never taken over (its operation would be resumed from what
// damaged bytes say), deleted or overwritten. Discard, an operator's
// removal once the operation is settled with the provider, must delete
// each of them, leaving its key free for a new claim, and refuse every
// readable record with store.ErrReadable, leaving it as it is.
func RunDamaged(t *testing.T, newStore Factory, damage Damager) {
	s, _ := newStore(t, time.Hour)
	ctx := context.Background()
	base := newID("")
	id := func(k string) store.ID { return store.ID{Tenant: base.Tenant, Key: k} }
	var (
		inFlight    = id("in-flight")
		inFlightBad = id("in-flight-damaged")
		unknown     = id("unknown")
		unknownBad  = id("unknown-damaged")
		finalBad    = id("final-damaged")
		newer       = id("unknown-newer-state")
	)
	for _, i := range []store.ID{inFlight, inFlightBad, unknown, unknownBad, finalBad, newer} {
		mustBegin(t, s, i, fpA, "dead", Long)
	}
	for _, i := range []store.ID{unknown, unknownBad, newer} {
		if err := s.Park(ctx, i, "dead", store.Outcome{Attempts: 1, LastError: "504 from upstream"}); err != nil {
			t.Fatal(err)
		}
	}
	review := store.Response{Status: 200, Body: []byte(`{"status":"needs_review"}`)}
	if err := s.Complete(ctx, finalBad, "dead", review, time.Time{}); err != nil {
		t.Fatal(err)
	}
	for _, i := range []store.ID{inFlightBad, unknownBad, finalBad} {
		damage(t, s, i, Undecodable)
	}
	damage(t, s, newer, NewerState)

	type seen struct {
		state      store.State
		unreadable bool
	}
	list := func(f store.Filter) map[string]seen {
		t.Helper()
		got := map[string]seen{}
		cursor := ""
		for range 1000 {
			recs, next, err := s.List(ctx, f, cursor, 1)
			if err != nil {
				t.Fatalf("List(%s) = %v; want the page, records that cannot be read included", f.State, err)
			}
			for _, r := range recs {
				if r.ID.Tenant != base.Tenant {
					continue
				}
				if u := r.Unreadable; u != nil && (!errors.Is(u.Err, store.ErrUnreadable) || u.StoreKey == "") {
					t.Errorf("List(%s) shows %s as unreadable with store key %q and reason %v; want a store key and a store.ErrUnreadable",
						f.State, r.ID.Key, u.StoreKey, u.Err)
				}
				got[r.ID.Key] = seen{r.State, r.Unreadable != nil}
			}
			if cursor = next; cursor == "" {
				return got
			}
		}
		t.Fatalf("List(%s) did not end", f.State)
		return nil
	}
	check := func(what string) {
		t.Helper()
		for _, c := range []struct {
			f    store.Filter
			want map[string]seen
		}{
			{store.Filter{State: store.InFlight}, map[string]seen{
				inFlight.Key:    {store.InFlight, false},
				inFlightBad.Key: {store.InFlight, true},
			}},
			{store.Filter{State: store.Unknown}, map[string]seen{
				unknown.Key:    {store.Unknown, false},
				unknownBad.Key: {store.Unknown, true},
				newer.Key:      {newerState, true},
			}},
			// As needs_review lists: whether an answer that cannot be read
			// needs review cannot be told, so it is shown.
			{store.Filter{State: store.Final, Keep: func(*store.Record) bool { return false }}, map[string]seen{
				finalBad.Key: {store.Final, true},
			}},
		} {
			got := list(c.f)
			keys := func(m map[string]seen) []string {
				var k []string
				for n := range m {
					k = append(k, n)
				}
				slices.Sort(k)
				return k
			}
			if !slices.Equal(keys(got), keys(c.want)) {
				t.Errorf("%s: List(%s) has %v, want %v", what, c.f.State, keys(got), keys(c.want))
			}
			for k, w := range c.want {
				if g, ok := got[k]; ok && g != w {
					t.Errorf("%s: List(%s) shows %s as %+v, want %+v", what, c.f.State, k, g, w)
				}
			}
		}
		for _, i := range []store.ID{inFlightBad, unknownBad, finalBad, newer} {
			if _, err := s.Get(ctx, i); !errors.Is(err, store.ErrUnreadable) {
				t.Errorf("%s: Get(%s) = %v, want a store.ErrUnreadable", what, i.Key, err)
			}
		}
	}
	check("after the damage")

	for _, i := range []store.ID{inFlightBad, unknownBad, finalBad, newer} {
		for _, fp := range [][]byte{fpA, fpB} {
			rec, created, err := s.Begin(ctx, i, store.Request{Fingerprint: fp}, "next", Long)
			if !errors.Is(err, store.ErrUnreadable) || created {
				t.Errorf("Begin(%s, fingerprint %x…) = created %v, %+v, %v; want a store.ErrUnreadable, nothing claimed",
					i.Key, fp[0], created, rec, err)
			}
		}
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrUnreadable) {
			t.Errorf("%s = %v, want a store.ErrUnreadable", what, err)
		}
	}
	for _, i := range []store.ID{finalBad, newer} {
		_, err := s.Supersede(ctx, i, "dead")
		refused("Supersede("+i.Key+")", err)
		_, _, err = s.Reviewed(ctx, i)
		refused("Reviewed("+i.Key+")", err)
	}
	for _, i := range []store.ID{unknownBad, newer} {
		_, err := s.Resolve(ctx, i, nil)
		refused("Resolve("+i.Key+", not executed)", err)
		_, err = s.Resolve(ctx, i, &ok)
		refused("Resolve("+i.Key+", executed)", err)
	}
	check("after the calls refused")

	// Discard: refused for a record that can be read, whatever its state,
	// which it leaves as it is; a record that cannot be read is deleted and
	// returned as List shows it, and its key is free: the next Begin creates
	// a new record (an operator settled its operation with the provider).
	finalOK := id("final")
	mustBegin(t, s, finalOK, fpA, "dead", Long)
	if err := s.Complete(ctx, finalOK, "dead", ok, time.Time{}); err != nil {
		t.Fatal(err)
	}
	for _, i := range []store.ID{inFlight, unknown, finalOK} {
		before := get(t, s, i)
		_, err := s.Discard(ctx, i)
		wantErr(t, "Discard("+i.Key+"), which can be read", err, store.ErrReadable)
		if after := get(t, s, i); after.State != before.State || after.Owner != before.Owner {
			t.Errorf("%s after the refused Discard = %+v, want %+v", i.Key, after, before)
		}
	}
	_, err := s.Discard(ctx, id("none"))
	wantErr(t, "Discard of a missing record", err, store.ErrNotFound)
	check("after the discards refused")
	for _, i := range []store.ID{inFlightBad, unknownBad, finalBad, newer} {
		rec, err := s.Discard(ctx, i)
		if err != nil || rec.ID != i || rec.Unreadable == nil || !errors.Is(rec.Unreadable.Err, store.ErrUnreadable) {
			t.Errorf("Discard(%s) = %+v, %v; want the record as it was, unreadable", i.Key, rec, err)
		}
		if _, err := s.Get(ctx, i); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(%s) after Discard = %v, want store.ErrNotFound", i.Key, err)
		}
		_, err = s.Discard(ctx, i)
		wantErr(t, "second Discard("+i.Key+")", err, store.ErrNotFound)
		rec, created, err := s.Begin(ctx, i, store.Request{Fingerprint: fpB}, "next", Long)
		if err != nil || !created || rec.State != store.InFlight || !rec.Outcome.IsZero() {
			t.Errorf("Begin(%s) after Discard = created %v, %+v, %v; want a new claim", i.Key, created, rec, err)
		}
	}
	for _, i := range []store.ID{inFlight, unknown, finalOK} {
		if _, err := s.Get(ctx, i); err != nil {
			t.Errorf("Get(%s) after the discards = %v; want it kept", i.Key, err)
		}
	}
}
