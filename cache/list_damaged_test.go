package cache

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/idemproxy/idemproxy/store"
)

// TestListShowsUnreadableRecords: after a crash the store holds in-flight
// and unknown records whose value this build cannot decode (a newer build's
// format, or damage; ReleaseInFlight keeps them as they are) beside
// readable ones. Listing in_flight, unknown or final records (with a Keep
// filter, as needs_review lists) must go on past them, page by page, and
// show each in its state as Unreadable, named by client and key where they
// still read, else by store key, with the reason; Get of one must fail with
// an error that says the record is unreadable. Before, List failed as a
// whole on the first such record, so an operator saw no in-flight or
// unknown record at all (and the unknown-operations gauge could not count).
func TestListShowsUnreadableRecords(t *testing.T) {
	s := openStore(t, t.TempDir(), newClock(), 0)
	newer := store.ID{Tenant: "acme", Key: "written-by-a-newer-build"}
	short := store.ID{Tenant: "acme", Key: "cut-short"}
	fine := store.ID{Tenant: "acme", Key: "readable-in-flight"}
	oldU := store.ID{Tenant: "acme", Key: "damaged-unknown"}
	fineU := store.ID{Tenant: "acme", Key: "readable-unknown"}
	final := store.ID{Tenant: "acme", Key: "damaged-final"}
	for _, id := range []store.ID{newer, short, fine, oldU, fineU, final} {
		mustBegin(t, s, id, fpA, "dead-process")
	}
	for _, id := range []store.ID{oldU, fineU} {
		if err := s.Park(ctx, id, "dead-process", store.Outcome{Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	mustComplete(t, s, final, "dead-process")
	damage := func(id store.ID, meta store.State, cut bool) {
		v, _, err := raw(t, s, id)
		if err != nil {
			t.Fatal(err)
		}
		if cut {
			v = v[:len(v)/3] // before its client and key
		} else {
			v = append(v, 0)
			v[0] = recordVersion + 1
		}
		setRaw(t, s, id, v, meta, 0)
	}
	damage(newer, store.InFlight, false)
	damage(short, store.InFlight, true)
	damage(oldU, store.Unknown, false)
	damage(final, store.Final, false)

	type seen struct {
		id         store.ID
		state      store.State
		unreadable bool
	}
	list := func(f store.Filter) map[string]seen {
		t.Helper()
		got := map[string]seen{}
		cursor := ""
		for range 10 {
			recs, next, err := s.List(ctx, f, cursor, 1)
			if err != nil {
				t.Fatalf("List(%s) = %v; want the page, unreadable records included", f.State, err)
			}
			for _, r := range recs {
				name := r.ID.Key
				if u := r.Unreadable; u != nil {
					if !errors.Is(u.Err, store.ErrUnreadable) || !errors.Is(u.Err, ErrCorrupt) || u.StoreKey == "" {
						t.Errorf("unreadable record %+v: want a store key and an ErrCorrupt that is a store.ErrUnreadable", u)
					}
					if name == "" {
						name = u.StoreKey
					}
				}
				got[name] = seen{r.ID, r.State, r.Unreadable != nil}
			}
			if cursor = next; cursor == "" {
				return got
			}
		}
		t.Fatalf("List(%s) did not end", f.State)
		return nil
	}
	shortKey := hex.EncodeToString(appendRecordKey(nil, short))
	for _, c := range []struct {
		f    store.Filter
		want map[string]seen
	}{
		{store.Filter{State: store.InFlight}, map[string]seen{
			newer.Key: {newer, store.InFlight, true},
			shortKey:  {store.ID{}, store.InFlight, true},
			fine.Key:  {fine, store.InFlight, false},
		}},
		{store.Filter{State: store.Unknown}, map[string]seen{
			oldU.Key:  {oldU, store.Unknown, true},
			fineU.Key: {fineU, store.Unknown, false},
		}},
		// As needs_review lists: whether an unreadable answer needs review
		// cannot be told, so it is shown.
		{store.Filter{State: store.Final, Keep: func(*store.Record) bool { return false }}, map[string]seen{
			final.Key: {final, store.Final, true},
		}},
	} {
		got := list(c.f)
		if len(got) != len(c.want) {
			t.Errorf("List(%s) = %+v, want %+v", c.f.State, got, c.want)
		}
		for k, w := range c.want {
			if got[k] != w {
				t.Errorf("List(%s) has %s as %+v, want %+v", c.f.State, k, got[k], w)
			}
		}
	}
	for _, id := range []store.ID{newer, short, oldU, final} {
		if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrUnreadable) {
			t.Errorf("Get(%s) = %v, want a store.ErrUnreadable", id.Key, err)
		}
	}
}
