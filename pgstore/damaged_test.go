package pgstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// damageRow runs the UPDATE set (an assignment list) on id's row, which
// must exist.
func damageRow(t *testing.T, s *Store, id store.ID, set string) {
	t.Helper()
	tag, err := s.pool.Exec(context.Background(), `UPDATE idemproxy_records SET `+set+` WHERE tenant = $1 AND key = $2`,
		[]byte(id.Tenant), []byte(id.Key))
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("UPDATE … SET %s on %s: %v, %d rows", set, id.Key, err, tag.RowsAffected())
	}
}

// TestDamagedRecords runs the contract's suite for records kept that cannot
// be read on a real PostgreSQL, their rows damaged by SQL: a header column
// that is not JSON, a state no version wrote yet (4). Before, a listing of
// their state failed as a whole (503 through the admin API, and the
// unknown-operations gauge could not count), the newer state's row was
// listed nowhere, a request for the damaged unknown record took it over and
// resumed it, and a resolve deleted or overwrote it.
func TestDamagedRecords(t *testing.T) {
	url := pgtest.Database(t)
	storetest.RunDamaged(t, func(t *testing.T, ttl time.Duration) (store.Store, func(time.Duration)) {
		return open(t, url, ttl), time.Sleep
	}, func(t *testing.T, s store.Store, id store.ID, d storetest.Damage) {
		switch d {
		case storetest.Undecodable:
			damageRow(t, s.(*Store), id, `header = '\x6e6f74206a736f6e'::bytea`) // "not json"
		case storetest.NewerState:
			damageRow(t, s.(*Store), id, `state = 4`)
		default:
			t.Fatalf("damage %d", d)
		}
	})
}

// TestDamagedColumns: a row damaged in any column that decodes (a time
// Go cannot hold, a negative fence, a header of another JSON shape, a
// header on an unknown record) is listed as unreadable with the others,
// named by its client and key and saying which column, and a request or a
// read of its key fails with store.ErrUnreadable, the record left as it
// is. Before, such a row failed every listing of its state; the unknown
// records whose first send or header was damaged were taken over by a
// request with their fingerprint and resumed.
func TestDamagedColumns(t *testing.T) {
	s := open(t, pgtest.Database(t), time.Hour)
	ctx := context.Background()
	req := store.Request{Fingerprint: []byte("fp")}
	cases := []struct {
		key, set, reason string
		state            store.State
	}{
		{"created-infinity", `created_at = '-infinity'`, "created_at is -infinity", store.Unknown},
		{"first-send-infinity", `first_sent_at = 'infinity'`, "first_sent_at is infinity", store.Unknown},
		{"fence-negative", `fence = -1`, "fence -1 is negative", store.Unknown},
		{"header-on-unknown", `header = '\x7b7d'::bytea`, "the record is unknown but holds an answer's header", store.Unknown}, // {}
		{"lease-infinity", `lease_until = 'infinity'`, "lease_until is infinity", store.InFlight},
		{"header-array", `header = '\x5b315d'::bytea`, "header: json", store.Final}, // [1]
	}
	for _, c := range cases {
		id := store.ID{Tenant: "t", Key: c.key}
		if _, _, err := s.Begin(ctx, id, req, "dead", time.Minute); err != nil {
			t.Fatal(err)
		}
		switch c.state {
		case store.Unknown:
			if err := s.Park(ctx, id, "dead", store.Outcome{Attempts: 1, FirstSentAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
		case store.Final:
			if err := s.Complete(ctx, id, "dead", store.Response{Status: 200, Body: []byte(`{}`)}, time.Time{}); err != nil {
				t.Fatal(err)
			}
		}
		damageRow(t, s, id, c.set)
	}
	fine := store.ID{Tenant: "t", Key: "z-readable"}
	if _, _, err := s.Begin(ctx, fine, req, "dead", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Park(ctx, fine, "dead", store.Outcome{Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	listed := map[string]store.Record{}
	for _, state := range []store.State{store.InFlight, store.Unknown, store.Final} {
		recs, _, err := s.List(ctx, store.Filter{State: state}, "", 100)
		if err != nil {
			t.Fatalf("List(%s) = %v; want the page, damaged rows included", state, err)
		}
		for _, r := range recs {
			listed[r.ID.Key] = r
		}
	}
	if r, ok := listed[fine.Key]; !ok || r.Unreadable != nil || r.Outcome.Attempts != 1 {
		t.Errorf("readable record listed as %+v (found %v)", r, ok)
	}
	for _, c := range cases {
		id := store.ID{Tenant: "t", Key: c.key}
		r, ok := listed[c.key]
		if !ok || r.Unreadable == nil || r.State != c.state || r.ID != id ||
			!errors.Is(r.Unreadable.Err, store.ErrUnreadable) || !strings.Contains(r.Unreadable.Err.Error(), c.reason) {
			t.Errorf("%s listed as %+v (found %v); want it unreadable in %s, saying %q", c.key, r, ok, c.state, c.reason)
		} else {
			t.Logf("%s: %v", c.key, r.Unreadable.Err)
		}
		if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrUnreadable) {
			t.Errorf("Get(%s) = %v, want a store.ErrUnreadable", c.key, err)
		}
		if rec, created, err := s.Begin(ctx, id, req, "next", time.Minute); created || !errors.Is(err, store.ErrUnreadable) {
			t.Errorf("Begin(%s) = created %v, %+v, %v; want a store.ErrUnreadable, nothing claimed", c.key, created, rec, err)
		}
		if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrUnreadable) {
			t.Errorf("Get(%s) after Begin = %v, want a store.ErrUnreadable: the record left as it was", c.key, err)
		}
	}
}

// TestSweepLeavesDamagedInFlight: in-flight records of a stopped replica
// whose rows do not read (a header that is not JSON, a claim time of
// -infinity) are left in flight as they are by the sweep that parks the
// others as unknown, as the embedded store's start leaves its damaged
// records, and stay listed as unreadable. Before, the sweep parked them,
// taking their first send from the damaged row, and the claim time of
// -infinity failed the sweep's batch.
func TestSweepLeavesDamagedInFlight(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.Database(t), time.Hour)
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemproxy_records
		(tenant, key, state, fingerprint, owner, fence, lease_until, created_at, header)
		VALUES ('t', 'dead',         1, 'fp', 'gone', 1, now() - interval '1 h', now() - interval '2 h', NULL),
		       ('t', 'dead-header',  1, 'fp', 'gone', 1, now() - interval '1 h', now() - interval '2 h', 'not json'),
		       ('t', 'dead-created', 1, 'fp', 'gone', 1, now() - interval '1 h', '-infinity', NULL)`); err != nil {
		t.Fatal(err)
	}
	n, err := s.parkOrphans(ctx)
	if err != nil || n != 1 {
		t.Errorf("parkOrphans = %d, %v; want 1 parked: the readable record", n, err)
	}
	recs, _, err := s.List(ctx, store.Filter{State: store.InFlight}, "", 10)
	if err != nil || len(recs) != 2 {
		t.Fatalf("List(in_flight) = %+v, %v; want both damaged records", recs, err)
	}
	for _, r := range recs {
		if r.Unreadable == nil || r.State != store.InFlight || !strings.HasPrefix(r.ID.Key, "dead-") {
			t.Errorf("listed in flight: %+v; want a damaged record, unreadable", r)
		}
	}
	if rec, err := s.Get(ctx, store.ID{Tenant: "t", Key: "dead"}); err != nil || rec.State != store.Unknown {
		t.Errorf("readable record after the sweep: %+v, %v; want it unknown", rec, err)
	}
}
