package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestBatchPanicIsCallersError: a panic in a statement's code reaches its
// caller as an error, with the stack, instead of leaving it waiting or
// ending the process; the group goes on sending the next statement.
func TestBatchPanicIsCallersError(t *testing.T) {
	calls := 0
	g := &group[string, string]{timeout: time.Minute, run: func(_ context.Context, jobs []*job[string, string]) error {
		calls++
		if calls == 1 {
			panic("broken row")
		}
		for _, j := range jobs {
			j.found, j.out = true, "written "+j.in
		}
		return nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, err := g.do(ctx, store.ID{Tenant: "t", Key: "a"}, "a", 1)
	if err == nil || !strings.Contains(err.Error(), "broken row") || !strings.Contains(err.Error(), "batch.go") {
		t.Fatalf("do after a panic: err = %v; want the panic's value and its stack", err)
	}
	out, found, err := g.do(ctx, store.ID{Tenant: "t", Key: "b"}, "b", 1)
	if err != nil || !found || out != "written b" {
		t.Fatalf("do after the panicked statement = %q, %v, %v; want the next statement sent", out, found, err)
	}
}

// lockRows holds rows of tenant "t" locked from another connection of db
// until its transaction ends.
func lockRows(t *testing.T, db *pgxpool.Pool, keys ...string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	bkeys := make([][]byte, len(keys))
	for i, k := range keys {
		bkeys[i] = []byte(k)
	}
	tag, err := tx.Exec(ctx, `SELECT 1 FROM idemproxy_records WHERE tenant = $1 AND key = ANY($2) FOR UPDATE`, []byte("t"), bkeys)
	if err != nil || tag.RowsAffected() != int64(len(keys)) {
		t.Fatalf("locking %v: %v rows, %v", keys, tag.RowsAffected(), err)
	}
	return tx
}

// lockWaiters waits until ok accepts the backends of the store (application
// idemproxy) on db's database that wait for a lock, and returns them.
func lockWaiters(t *testing.T, db *pgxpool.Pool, what string, ok func(pids []int32) bool) []int32 {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		rows, _ := db.Query(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'idemproxy' AND wait_event_type = 'Lock' ORDER BY pid`)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		if ok(pids) {
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: the store's backends waiting for a lock are %v", what, pids)
		}
	}
}

// TestRoundEndsWhenItsCallersLeave: the statement of a round whose callers
// have all left ends, in the server too, while it waits for row locks held
// by another transaction, with the call timeout an hour away; a caller that
// leaves while another waits in its round does not end the statement, whose
// write the other caller gets, and the claim it wrote for the caller that
// left (told that nothing was written, as a caller whose call timed out is
// told "key left free") is undone: that record is unknown again, with its
// outcome, and the next claim takes it over at once.
func TestRoundEndsWhenItsCallersLeave(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	s, err := Open(ctx, Options{URL: url, TTL: time.Hour, CallTimeout: time.Hour, SweepInterval: -1, AnalyzeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	id := func(key string) store.ID { return store.ID{Tenant: "t", Key: key} }
	req := store.Request{Fingerprint: []byte("fp")}
	// Unknown records: the same request's claim takes each over.
	for _, key := range []string{"h", "a", "b", "c", "d"} {
		if _, _, err := s.Begin(ctx, id(key), req, "o1", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Park(ctx, id(key), "o1", store.Outcome{Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		rec     store.Record
		created bool
		err     error
	}
	begin := func(ctx context.Context, key, owner string) <-chan result {
		res := make(chan result, 1)
		go func() {
			rec, created, err := s.Begin(ctx, id(key), req, owner, time.Minute)
			res <- result{rec, created, err}
		}()
		return res
	}
	left := func(name string, res <-chan result) {
		t.Helper()
		if r := <-res; !errors.Is(r.err, context.Canceled) {
			t.Errorf("Begin(%s) after its caller left = %+v; want context.Canceled", name, r)
		}
	}
	one := func(pids []int32) bool { return len(pids) == 1 }

	first := lockRows(t, db, "h", "a", "b")
	second := lockRows(t, db, "c", "d")

	// A round of one caller, who leaves.
	hctx, leaveH := context.WithCancel(ctx)
	h := begin(hctx, "h", "oh")
	settle(t, s.writes, 1, 0)
	hpid := lockWaiters(t, db, "h's claim to wait for its row", one)[0]
	actx, leaveA := context.WithCancel(ctx)
	a, b := begin(actx, "a", "oa"), begin(ctx, "b", "ob")
	settle(t, s.writes, 1, 2)
	leaveH()
	left("h", h)
	settle(t, s.writes, 2, 0)
	lockWaiters(t, db, "h's statement to end in the server and a and b's to wait", func(pids []int32) bool {
		return len(pids) == 1 && pids[0] != hpid
	})

	// A round of two callers, one of whom leaves: the other gets the write.
	cctx, leaveC := context.WithCancel(ctx)
	dctx, leaveD := context.WithCancel(ctx)
	c, d := begin(cctx, "c", "oc"), begin(dctx, "d", "od")
	settle(t, s.writes, 2, 2)
	leaveA()
	left("a", a)
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-b; r.err != nil || !r.created || r.rec.Owner != "ob" || r.rec.Fence != 2 {
		t.Errorf("Begin(b), its round's other caller gone = %+v; want b taken over by ob, fence 2", r)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		rec, err := s.Get(ctx, id("a"))
		if err != nil {
			t.Fatal(err)
		}
		if rec.State == store.Unknown && rec.Outcome.Attempts == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Get(a) 10 s after its caller left and its round wrote it = state %v owner %q outcome %+v; want unknown with 1 attempt (the claim undone)",
				rec.State, rec.Owner, rec.Outcome)
		}
	}

	// A round of two callers, who both leave.
	settle(t, s.writes, 2, 0)
	lockWaiters(t, db, "c and d's statement to wait", one)
	leaveC()
	left("c", c)
	leaveD()
	left("d", d)
	lockWaiters(t, db, "c and d's statement to end in the server", func(pids []int32) bool { return len(pids) == 0 })
	settle(t, s.writes, 0, 0)
	if err := second.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The statements cancelled in the server wrote nothing.
	for _, key := range []string{"h", "c", "d"} {
		rec, err := s.Get(ctx, id(key))
		if err != nil || rec.State != store.Unknown || rec.Owner != "o1" || rec.Fence != 1 {
			t.Errorf("Get(%s) = %+v, %v; want it as parked by o1: its claim's statement was cancelled", key, rec, err)
		}
	}
	if _, created, err := s.Begin(ctx, id("c"), req, "oc2", time.Minute); err != nil || !created {
		t.Errorf("Begin(c) afterwards = created %v, %v; want it taken over", created, err)
	}
	if _, created, err := s.Begin(ctx, id("a"), req, "oa2", time.Minute); err != nil || !created {
		t.Errorf("Begin(a) once its claim is undone = created %v, %v; want it taken over", created, err)
	}
}

// TestBadRowFailsOnlyItsCaller: in a database whose encoding is EUC_JP, the
// server takes the client's bytes as EUC_JP and refuses sequences that are
// not, such as the UTF-8 of "€" (so it goes in a batch). A batch of claims,
// and one of final answers, each with one such row among good ones, fails
// only the bad row's caller: the batch is sent again one row at a time.
func TestBadRowFailsOnlyItsCaller(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Shared(t)
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("eucjp_%d_%d", os.Getpid(), time.Now().UnixNano())
	_, err = admin.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE template0 ENCODING 'EUC_JP' LC_COLLATE 'C' LC_CTYPE 'C'`)
	admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(c.URL(name))
	if err != nil {
		t.Fatal(err)
	}
	w := relay(t, u.Host)
	u.Host = w.l.Addr().String()
	s := open(t, u.String(), time.Hour)

	const bad = "€" // valid UTF-8, not EUC_JP
	refused := func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22")
	}
	id := func(key string) store.ID { return store.ID{Tenant: "t", Key: key} }
	type call struct{ key, upstreamKey, owner string }
	// Claims: batchInFlight held on the wire, then one round of three.
	calls := []call{{"good-1", "up-1", "o1"}, {"bad", bad, "o2"}, {"good-2", "up-2", "o3"}}
	for i := range batchInFlight {
		calls = append([]call{{"held-" + strconv.Itoa(i), "up", "o0"}}, calls...)
	}
	errs := make([]chan error, len(calls))
	begin := func(i int) {
		errs[i] = make(chan error, 1)
		go func() {
			req := store.Request{Fingerprint: []byte("fp"), UpstreamKey: calls[i].upstreamKey}
			_, created, err := s.Begin(ctx, id(calls[i].key), req, calls[i].owner, time.Minute)
			if err == nil && !created {
				err = fmt.Errorf("Begin(%s) created nothing", calls[i].key)
			}
			errs[i] <- err
		}()
	}
	w.hold()
	occupy(t, s.writes, batchInFlight, begin)
	for i := batchInFlight; i < len(calls); i++ {
		begin(i)
	}
	settle(t, s.writes, batchInFlight, 3)
	w.release()
	for i, c := range calls {
		err := <-errs[i]
		switch {
		case c.key == "bad" && !refused(err):
			t.Errorf("Begin(bad) = %v; want PostgreSQL's refusal (SQLSTATE class 22)", err)
		case c.key != "bad" && err != nil:
			t.Errorf("Begin(%s), in a round with a bad row = %v; want its claim", c.key, err)
		}
	}
	if _, err := s.Get(ctx, id("bad")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(bad) = %v; want ErrNotFound", err)
	}

	// Final answers: the bad one is by an owner the database refuses.
	calls = append(calls[:batchInFlight], call{key: "good-1", owner: "o1"}, call{key: "good-2", owner: bad}, call{key: "good-2", owner: "o3"})
	errs = make([]chan error, len(calls))
	complete := func(i int) {
		errs[i] = make(chan error, 1)
		go func() {
			errs[i] <- s.Complete(ctx, id(calls[i].key), calls[i].owner, store.Response{Status: 200, Body: []byte(calls[i].key)}, time.Time{})
		}()
	}
	w.hold()
	occupy(t, s.writes, batchInFlight, complete)
	complete(batchInFlight)
	complete(batchInFlight + 1)
	settle(t, s.writes, batchInFlight, 2)
	complete(batchInFlight + 2) // a key already waiting: the next round
	settle(t, s.writes, batchInFlight, 3)
	w.release()
	for i, c := range calls {
		err := <-errs[i]
		switch {
		case c.owner == bad && !refused(err):
			t.Errorf("Complete(%s) by %s = %v; want PostgreSQL's refusal (SQLSTATE class 22)", c.key, c.owner, err)
		case c.owner != bad && err != nil:
			t.Errorf("Complete(%s) by %s, in a round with a bad row = %v; want it written", c.key, c.owner, err)
		}
	}
	for _, key := range []string{"good-1", "good-2"} {
		if rec, err := s.Get(ctx, id(key)); err != nil || rec.State != store.Final || string(rec.Response.Body) != key {
			t.Errorf("Get(%s) = %+v, %v; want its final answer", key, rec, err)
		}
	}
}

// heldGroup is a group whose statements record their rows and each wait for
// a release, so that a test decides what arrives while one runs.
type heldGroup struct {
	g       *group[string, string]
	started chan int      // the rows of each statement, as it starts
	release chan struct{} // lets one statement end
}

func newHeldGroup(hold time.Duration) *heldGroup {
	h := &heldGroup{started: make(chan int, 100), release: make(chan struct{})}
	h.g = &group[string, string]{timeout: time.Minute, hold: hold, run: func(_ context.Context, jobs []*job[string, string]) error {
		h.started <- len(jobs)
		<-h.release
		for _, j := range jobs {
			j.found, j.out = true, j.in
		}
		return nil
	}}
	return h
}

// add starts n writes of new keys and returns a channel that gets each one's error.
func (h *heldGroup) add(ctx context.Context, t *testing.T, prefix string, n int) chan error {
	errs := make(chan error, n)
	for i := range n {
		k := fmt.Sprintf("%s-%d", prefix, i)
		go func() {
			_, _, err := h.g.do(ctx, store.ID{Tenant: "t", Key: k}, k, 1)
			errs <- err
		}()
	}
	return errs
}

// queued waits until n writes wait in rounds not yet sent.
func (h *heldGroup) queued(ctx context.Context, t *testing.T, n int) {
	t.Helper()
	for {
		if _, q := h.g.waiting(); q == n {
			return
		}
		select {
		case <-ctx.Done():
			_, q := h.g.waiting()
			t.Fatalf("%d writes queued, want %d", q, n)
		case <-time.After(time.Millisecond):
		}
	}
}

func (h *heldGroup) nextStatement(ctx context.Context, t *testing.T) int {
	t.Helper()
	select {
	case n := <-h.started:
		return n
	case <-ctx.Done():
		t.Fatal("no statement started")
		return 0
	}
}

func waitAll(ctx context.Context, t *testing.T, errs chan error, n int) {
	t.Helper()
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("a write did not end")
		}
	}
}

// TestRoundWaitsForRowsAfterLargeStatement: while statements run back to
// back, a small round after a statement of holdAfter rows or more waits for
// holdRows rows before it is sent, instead of going with the one write that
// arrived meanwhile (each statement costs a commit whatever its rows). The
// hold here is longer than the test, so the round is sent by its rows.
func TestRoundWaitsForRowsAfterLargeStatement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := newHeldGroup(time.Hour)
	first := h.add(ctx, t, "first", 1)
	if n := h.nextStatement(ctx, t); n != 1 {
		t.Fatalf("first statement: %d rows, want 1", n)
	}
	large := h.add(ctx, t, "large", holdAfter)
	h.queued(ctx, t, holdAfter)
	h.release <- struct{}{} // the first ends; the next round goes at once (the first was small)
	waitAll(ctx, t, first, 1)
	if n := h.nextStatement(ctx, t); n != holdAfter {
		t.Fatalf("second statement: %d rows, want %d", n, holdAfter)
	}
	one := h.add(ctx, t, "one", 1)
	h.queued(ctx, t, 1)
	h.release <- struct{}{} // the large one ends: the round of one write waits for more
	waitAll(ctx, t, large, holdAfter)
	rest := h.add(ctx, t, "rest", holdRows-1)
	if n := h.nextStatement(ctx, t); n != holdRows {
		t.Fatalf("statement after a large one: %d rows, want %d (the round waited for them)", n, holdRows)
	}
	h.release <- struct{}{}
	waitAll(ctx, t, one, 1)
	waitAll(ctx, t, rest, holdRows-1)
}

// TestRoundHoldIsBounded: a small round after a large statement is sent when
// the hold has passed, with the rows it has; and once the statements have
// stopped, a lone write is sent at once, not held.
func TestRoundHoldIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := newHeldGroup(10 * time.Millisecond)
	first := h.add(ctx, t, "first", 1)
	h.nextStatement(ctx, t)
	large := h.add(ctx, t, "large", holdAfter)
	h.queued(ctx, t, holdAfter)
	h.release <- struct{}{}
	waitAll(ctx, t, first, 1)
	h.nextStatement(ctx, t)
	one := h.add(ctx, t, "one", 1)
	h.queued(ctx, t, 1)
	h.release <- struct{}{}
	waitAll(ctx, t, large, holdAfter)
	if n := h.nextStatement(ctx, t); n != 1 {
		t.Fatalf("held round: %d rows, want the 1 it had when the hold passed", n)
	}
	after := h.add(ctx, t, "after", holdAfter)
	h.queued(ctx, t, holdAfter)
	h.release <- struct{}{}
	waitAll(ctx, t, one, 1)
	if n := h.nextStatement(ctx, t); n != holdAfter {
		t.Fatalf("statement after the held one: %d rows, want %d", n, holdAfter)
	}
	h.release <- struct{}{}
	waitAll(ctx, t, after, holdAfter)

	// The statements have stopped, the last one large: with a hold of an
	// hour, a lone write is still sent at once.
	for {
		h.g.mu.Lock()
		running := h.g.running
		if running == 0 {
			h.g.hold = time.Hour
		}
		h.g.mu.Unlock()
		if running == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the group's loop did not end")
		case <-time.After(time.Millisecond):
		}
	}
	lone := h.add(ctx, t, "lone", 1)
	if n := h.nextStatement(ctx, t); n != 1 {
		t.Fatalf("lone write: %d rows, want 1", n)
	}
	h.release <- struct{}{}
	waitAll(ctx, t, lone, 1)
}
