package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// TestChaosReplicasOnPostgres is the multi-replica run CI executes: three
// replicas of the real binary on one PostgreSQL, the blind client sending
// each try to a random replica, the faulty sandbox, SIGKILLs of random
// replicas and one restart of the database halfway. Every must-be-zero count,
// "an order executed by two replicas" included, must be zero.
func TestChaosReplicasOnPostgres(t *testing.T) {
	pgtest.Shared(t) // skip or fail without PostgreSQL, as the other tests do
	c, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Remove()
	url, err := c.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Binary: binPath, DataDir: t.TempDir(), Provider: sandbox.ProviderPayments,
		Orders: max(*ordersFlag/2, 1), Kills: *killsFlag, Replicas: 3, StoreURL: url, Faults: DefaultFaults(),
		// A restart the replicas meet mid-request: requests refused meanwhile
		// are 503 store_unavailable with nothing sent, and the client retries.
		RestartStore: func() error {
			if err := c.Stop(true); err != nil {
				return err
			}
			return c.Start()
		},
		Seed: *seedFlag, Logf: t.Logf})
	if rep != nil {
		t.Logf("report:\n%s", rep)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Failures() {
		t.Errorf("promise broken: %s", f)
	}
	checkRunHappened(t, rep, min(*killsFlag, 3))
	if rep.StoreRestarts != 1 {
		t.Errorf("database restarts = %d, want 1", rep.StoreRestarts)
	}
}

// TestChaosReplicasOnOwnBadgerCaught is the control: three replicas, each on
// its own Badger directory, in front of a provider that does not deduplicate
// (it forgets keys at once). The only fault is a 429 with Retry-After: 1,
// a refusal before acting, so one replica alone would never execute twice;
// but the pause outlasts the client's timeout, and the try the client then
// sends to another replica starts a second sequence there. The suite
// must see that as duplicates executed by two replicas, or it proves nothing.
func TestChaosReplicasOnOwnBadgerCaught(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Binary: binPath, DataDir: t.TempDir(), Provider: sandbox.ProviderPayments,
		Orders: 300, Replicas: 3, KeyRetention: time.Nanosecond,
		Faults: sandbox.Faults{RateLimited: 0.5}, RetryAfter: 1,
		Seed: *seedFlag, Logf: t.Logf})
	if rep != nil {
		t.Logf("report:\n%s", rep)
	}
	if err != nil {
		t.Fatal(err)
	}
	if rep.DuplicateExecutions == 0 || rep.CrossReplicaDuplicates == 0 {
		t.Fatalf("control run: %d duplicate executions, %d orders executed by two replicas; want both above zero",
			rep.DuplicateExecutions, rep.CrossReplicaDuplicates)
	}
}
