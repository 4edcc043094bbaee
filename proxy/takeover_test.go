package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream"
)

// A record taken over in flight (its owner died mid-sequence and its lease
// ran out; nothing was parked) is an operation whose outcome is unknown: an
// attempt may have reached the provider. Its re-send is not blind: past the
// provider's key retention, counted from the claim, the app gets 409
// idempotency_key_expired, nothing is sent, and the record is kept unknown
// for a person.
func TestTakeoverOfDeadOwnerIsUnknown(t *testing.T) {
	// The request's fingerprint, as a first idemproxy records it.
	first := newEnv(t)
	a := first.do(t, "POST", "/v1/payments", order)
	key := a.header.Get("Idempotency-Key")
	id := store.ID{Tenant: proxy.DefaultTenant, Key: key}
	done, err := first.store.Get(context.Background(), id)
	if a.status != http.StatusCreated || err != nil {
		t.Fatalf("first = %d %s, record %v", a.status, a.body, err)
	}

	e := newEnvUpstream(t, func(c *upstream.Config) { c.KeyRetention = time.Nanosecond })
	// A dead owner's claim: in flight, its lease already over.
	req := store.Request{Fingerprint: done.Fingerprint, Method: done.Method, Path: done.Path, UpstreamKey: key}
	claim, _, err := e.store.Begin(context.Background(), id, req, "dead-owner", time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	a = e.do(t, "POST", "/v1/payments", order)
	if a.status != http.StatusConflict || errorCode(t, a) != "idempotency_key_expired" || a.header.Get("Idempotency-Key") != key {
		t.Fatalf("takeover past the key retention = %d %s, want 409 idempotency_key_expired with key %s", a.status, a.body, key)
	}
	if total, _ := e.prov.counts(); total != 0 {
		t.Fatalf("the provider saw %d requests, want none", total)
	}
	rec, err := e.store.Get(context.Background(), id)
	if err != nil || rec.State != store.Unknown || !rec.Outcome.FirstSentAt.Equal(claim.CreatedAt) {
		t.Fatalf("record after = %+v, %v; want unknown, first sent at the dead owner's claim %v", rec, err, claim.CreatedAt)
	}
}
