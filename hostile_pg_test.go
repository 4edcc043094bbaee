package main

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// onPostgres makes startBinary run the binary on a new database of the
// shared PostgreSQL cluster instead of the embedded store (set only by
// TestHostileOnPostgres, which runs no test in parallel).
var (
	onPostgres   bool
	lastPostgres string // the URL of the database startBinary used last
)

// TestHostileOnPostgres runs the hostile-client tests again with the binary on
// PostgreSQL, whose store takes other paths (batched claims and finals,
// leases, fencing) than the embedded one.
func TestHostileOnPostgres(t *testing.T) {
	onPostgres = true
	defer func() { onPostgres = false }()
	t.Run("records in PostgreSQL", func(t *testing.T) {
		up := httptest.NewServer(&recordingProvider{})
		defer up.Close()
		p := startBinary(t, hostileEnv(t, up.URL)...)
		if a := send(t, "POST", "http://"+p.addr+"/v1/payments", `{"order_id":"pg-1"}`); a.status != 201 {
			t.Fatalf("order: %d %s", a.status, a.body)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, lastPostgres)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM idemproxy_records WHERE state = 2`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("final records in the database: %d, %v; want the order's", n, err)
		}
	})
	for _, c := range []struct {
		name string
		test func(*testing.T)
	}{
		{"HopByHopHeaders", TestHostileHopByHopHeaders},
		{"TrailersAndEmptyBody", TestHostileTrailersAndEmptyBody},
		{"Methods", TestHostileMethods},
		{"DotSegments", TestHostileDotSegments},
		{"MalformedHeaders", TestHostileMalformedHeaders},
		{"HostAndAbsoluteForm", TestHostileHostAndAbsoluteForm},
		{"UnderscoreSpellings", TestHostileUnderscoreSpellings},
		{"HalfClosedClientSeesNoMadeUpAnswer", TestHostileHalfClosedClientSeesNoMadeUpAnswer},
		{"HalfClosedClientUnprotected", TestHostileHalfClosedClientUnprotected},
		{"AcceptEncodingNotStored", TestHostileAcceptEncodingNotStored},
		{"RejectRuleSpellings", TestHostileRejectRuleSpellings},
		{"FragmentInTarget", TestHostileFragmentInTarget},
		{"SlowBodies", TestHostileSlowBodies},
		{"SlowUnprotectedSignedBodies", TestHostileSlowUnprotectedSignedBodies},
		{"KeySourceInAnotherSpelling", TestHostileKeySourceInAnotherSpelling},
		{"UnreadableKeySourceUnderEveryPolicy", TestHostileUnreadableKeySourceUnderEveryPolicy},
		{"GzippedOrder", TestHostileGzippedOrder},
		{"KeyedPathSpeltOtherwise", TestHostileKeyedPathSpeltOtherwise},
		{"UTF16Order", TestHostileUTF16Order},
		{"MultipartOrder", TestHostileMultipartOrder},
		{"TenantsCannotReachEachOther", TestBinaryTenantsCannotReachEachOther},
		{"UnprotectedAnswerShowsTheAppsKey", TestBinaryUnprotectedAnswerShowsTheAppsKey},
		{"TenancyRefusalsAndSecrets", TestBinaryTenancyRefusalsAndSecrets},
		{"AdminCallsNameAClient", TestBinaryAdminCallsNameAClient},
		{"StatusLookupFindsAnUpperCaseUUIDKey", TestBinaryStatusLookupFindsAnUpperCaseUUIDKey},
		{"ConcurrentIdenticalPosts", TestBinaryConcurrentIdenticalPosts},
	} {
		t.Run(c.name, c.test)
	}
}
