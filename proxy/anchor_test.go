package proxy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/store"
)

// TestWindowAnchorCaughtByACrash: the anchors window.go writes carry the
// store's documented anchor marker, whatever the tenant, so that an anchor
// caught in flight by a crash (its Begin written, its Complete not) is
// deleted by the next start's release, not listed as an operation whose
// outcome is unknown: nothing was sent for it. An operation's record in
// flight beside it is kept unknown.
func TestWindowAnchorCaughtByACrash(t *testing.T) {
	ctx := context.Background()
	var fp [32]byte
	fp[0] = 7
	anchor := anchorID("", fp, 10*time.Minute, 2948)
	for _, id := range []store.ID{anchor, anchorID("app", fp, time.Second, -1)} {
		if !store.IsWindowAnchor(id) {
			t.Fatalf("anchor %q does not carry store.WindowAnchorPrefix", id.Key)
		}
	}
	op := store.ID{Tenant: DefaultTenant, Key: "ord-1"}
	if store.IsWindowAnchor(op) {
		t.Fatalf("%q taken for an anchor", op.Key)
	}

	dir := t.TempDir()
	st, err := cache.Open(cache.Options{Dir: dir, SyncWrites: true, TTL: time.Hour, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []store.ID{anchor, op} {
		if _, created, err := st.Begin(ctx, id, store.Request{Fingerprint: fp[:]}, "dead-process", anchorLease); err != nil || !created {
			t.Fatalf("Begin %q: created %v, %v", id.Key, created, err)
		}
	}
	if err := st.Close(); err != nil { // the process dies before the anchor's Complete
		t.Fatal(err)
	}
	st, err = cache.Open(cache.Options{Dir: dir, SyncWrites: true, TTL: time.Hour, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.ReleaseInFlight(); err != nil {
		t.Fatal(err)
	}
	if rec, err := st.Get(ctx, anchor); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("anchor after the release = %+v, %v; want it deleted", rec, err)
	}
	unknown, _, err := st.List(ctx, store.Filter{State: store.Unknown}, "", 10)
	if err != nil || len(unknown) != 1 || unknown[0].ID != op {
		t.Errorf("unknown list after the release = %+v, %v; want only %q", unknown, err, op.Key)
	}
}
