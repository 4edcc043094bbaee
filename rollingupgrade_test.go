package main

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
)

// countMigrations returns how many migrations pgstore/schema.go's source
// src lists: the schema version a build of it brings a database to.
func countMigrations(src []byte) (int, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "schema.go", src, 0)
	if err != nil {
		return 0, err
	}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			for i, name := range v.Names {
				if name.Name != "migrations" || i >= len(v.Values) {
					continue
				}
				if lit, ok := v.Values[i].(*ast.CompositeLit); ok {
					return len(lit.Elts), nil
				}
			}
		}
	}
	return 0, fmt.Errorf("no migrations list")
}

// git runs git in the repository and returns its trimmed output.
func git(args ...string) (string, error) {
	out, err := exec.Command("git", args...).Output()
	if ee, ok := err.(*exec.ExitError); ok {
		err = fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, ee.Stderr)
	}
	return strings.TrimSpace(string(out)), err
}

// previousSchemaBuild finds, in the repository's history, the newest commit
// whose schema version is lower than the work tree's: the build that
// replicas still run while a rolling upgrade starts the work tree's. It
// returns the commit and the two versions; without the history (no git, a
// shallow clone) it returns why not in skip.
func previousSchemaBuild(t *testing.T) (commit string, old, current int, skip string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("pgstore", "schema.go"))
	if err != nil {
		t.Fatal(err)
	}
	if current, err = countMigrations(src); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		return "", 0, 0, "no git to read the history with"
	}
	shallow, err := git("rev-parse", "--is-shallow-repository")
	if err != nil {
		return "", 0, 0, fmt.Sprintf("not a git repository (%v)", err)
	}
	if shallow == "true" {
		return "", 0, 0, "a shallow clone: the older builds are not in it (clone with the whole history, e.g. fetch-depth: 0)"
	}
	log, err := git("log", "--format=%H", "HEAD", "--", "pgstore/schema.go")
	if err != nil {
		t.Fatal(err)
	}
	// Newest first: the first commit with fewer migrations than the work
	// tree is the schema.go the newest older-schema commit holds; that
	// commit is the parent of the last one seen with as many (or HEAD
	// itself when HEAD is older than the work tree).
	newer := ""
	for _, c := range strings.Fields(log) {
		src, err := git("show", c+":pgstore/schema.go")
		if err != nil {
			t.Fatal(err)
		}
		n, err := countMigrations([]byte(src))
		if err != nil {
			t.Fatalf("pgstore/schema.go at %s: %v", c, err)
		}
		if n >= current {
			newer = c
			continue
		}
		if newer == "" {
			commit, err = git("rev-parse", "HEAD")
		} else {
			commit, err = git("rev-parse", newer+"^")
		}
		if err != nil {
			t.Fatal(err)
		}
		return commit, n, current, ""
	}
	t.Fatalf("no commit of pgstore/schema.go has fewer than %d migrations", current)
	return
}

// buildAt builds the idemproxy binary of commit into dir (from git archive,
// so the repository's work trees are left alone) and returns its path.
func buildAt(t *testing.T, commit, dir string) string {
	t.Helper()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	archive := exec.CommandContext(ctx, "sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	bin := filepath.Join(dir, "idemproxy-"+commit[:7])
	build := exec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-o", bin, ".")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build idemproxy at %s: %v\n%s", commit, err, out)
	}
	return bin
}

// queryInt runs a query giving one integer on the database at url.
func queryInt(t *testing.T, url, sql string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// schemaVersion reads the database's schema version.
func schemaVersion(t *testing.T, url string) int {
	t.Helper()
	return queryInt(t, url, `SELECT coalesce(max(version), 0) FROM idemproxy_schema`)
}

// recordCount is how many records the database holds.
func recordCount(t *testing.T, url string) int {
	t.Helper()
	return queryInt(t, url, `SELECT count(*) FROM idemproxy_records`)
}

// TestRollingUpgradeOlderReplicaKeepsWorking runs a rolling upgrade for
// real: the binary of the newest commit whose schema version is lower than
// this tree's (built from the git history) serves on a fresh PostgreSQL,
// then this tree's binary starts on the same database, upgrading the schema
// while the old replica keeps taking orders, and both then serve together
// in front of the payments sandbox. The old replica's orders sent during
// the upgrade are all 201; after it, its new orders, repeats and replays
// work; an answer stored by either is replayed by the other, and a changed
// body is 409 idempotency_conflict on either; each order reaches the
// provider exactly once (executed once, no repeat reaching it). Each
// replica's expiry sweep (once a minute) deletes the expired records the
// other wrote, the database then holding none, and neither logs an error
// or a failed store call; both stay ready and keep serving afterwards. The
// records expire after 20 s and the new replica starts 30 s after the old
// one, so that each replica's first sweep has records of both builds to
// delete; the test takes about 95 s.
func TestRollingUpgradeOlderReplicaKeepsWorking(t *testing.T) {
	commit, oldVersion, version, skip := previousSchemaBuild(t)
	if skip != "" {
		// Not a missing PostgreSQL: the older build cannot be made, so
		// this is a skip even where PostgreSQL is required.
		t.Skip("no older build to upgrade from: " + skip)
	}
	began := time.Now()
	oldBin := buildAt(t, commit, t.TempDir())
	t.Logf("older build %s (schema version %d, this tree %d) built in %v", commit[:12], oldVersion, version, time.Since(began).Round(time.Millisecond))

	sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderPayments, Secret: []byte(sandboxSecret)})
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(sb)
	defer up.Close()
	_, url := pgtest.Own(t, pgtest.Options{})
	const ttl, upgradeAt = 20 * time.Second, 30 * time.Second
	env := presetEnv(t, "payments", up.URL, "IDEMPROXY_STORE_URL="+url, "IDEMPROXY_LOG_LEVEL=debug",
		"IDEMPROXY_RETRY_BUDGET=1s", "IDEMPROXY_ATTEMPT_TIMEOUT=1s", "IDEMPROXY_STORE_LEASE=6s",
		"IDEMPROXY_RECORD_TTL="+ttl.String())

	order := func(id, amount string) string { return `{"order_id":"` + id + `","amount":"` + amount + `"}` }
	var orders []string // every order sent, each to be executed once
	post := func(p *opsProc, id string) reply {
		t.Helper()
		return send(t, "POST", "http://"+p.proxy+"/payments", order(id, "5.00"))
	}
	// created sends new orders through p: each is 201, executed.
	created := func(p *opsProc, who string, ids ...string) map[string]reply {
		t.Helper()
		out := map[string]reply{}
		for _, id := range ids {
			r := post(p, id)
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("new order %s through the %s replica: %d replayed=%q %s, want 201 executed\n%s",
					id, who, r.status, r.header.Get("Idempotent-Replayed"), r.body, p.text())
			}
			orders = append(orders, id)
			out[id] = r
		}
		return out
	}
	// replayed sends each of first's orders again through p: each is
	// first's answer, replayed.
	replayed := func(p *opsProc, who string, first map[string]reply) {
		t.Helper()
		for id, f := range first {
			r := post(p, id)
			if r.status != f.status || r.body != f.body || r.header.Get("Idempotent-Replayed") != "true" ||
				r.header.Get("Idempotency-Key") != f.header.Get("Idempotency-Key") {
				t.Fatalf("order %s again through the %s replica: %d replayed=%q key=%q %s, want the replay of %d key=%q %s\n%s",
					id, who, r.status, r.header.Get("Idempotent-Replayed"), r.header.Get("Idempotency-Key"), r.body,
					f.status, f.header.Get("Idempotency-Key"), f.body, p.text())
			}
		}
	}
	conflict := func(p *opsProc, who, id string) {
		t.Helper()
		r := send(t, "POST", "http://"+p.proxy+"/payments", order(id, "6.00"))
		if r.status != http.StatusConflict || !strings.Contains(r.body, "idempotency_conflict") {
			t.Fatalf("order %s with another amount through the %s replica: %d %s, want 409 idempotency_conflict", id, who, r.status, r.body)
		}
	}
	ids := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%d", prefix, i))
		}
		return out
	}

	old := launch(t, launchSpec{bin: oldBin, env: env})
	oldStart := time.Now()
	waitReady(t, "the older build started", old)
	if v := schemaVersion(t, url); v != oldVersion {
		t.Fatalf("schema version %d after the older build started, want %d", v, oldVersion)
	}
	// Shortly before the upgrade, so that they have not expired when the
	// new replica replays them.
	time.Sleep(time.Until(oldStart.Add(upgradeAt - 4*time.Second)))
	before := created(old, "old", ids("before", 10)...)
	replayed(old, "old", before)

	// Orders keep arriving at the old replica while the new one starts
	// and upgrades the schema.
	stop := make(chan struct{})
	var during []reply
	var duringIDs []string
	var slowest time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			id := fmt.Sprintf("during-%d", i)
			sent := time.Now()
			r, err := trySend("POST", "http://"+old.proxy+"/payments", order(id, "5.00"))
			slowest = max(slowest, time.Since(sent))
			if err != nil {
				r = reply{status: -1, body: err.Error()}
			}
			during, duringIDs = append(during, r), append(duringIDs, id)
		}
	})
	time.Sleep(time.Until(oldStart.Add(upgradeAt)))
	newer := launch(t, launchSpec{env: env})
	waitReady(t, "the new build started", newer)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	if v := schemaVersion(t, url); v != version {
		t.Fatalf("schema version %d after the new build started, want %d\n%s", v, version, newer.text())
	}
	for i, r := range during {
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("order %s through the old replica while the new one started: %d %s, want 201 executed\n%s", duringIDs[i], r.status, r.body, old.text())
		}
	}
	if len(during) < 10 {
		t.Fatalf("only %d orders went through the old replica while the new one started", len(during))
	}
	orders = append(orders, duringIDs...)
	t.Logf("%d orders through the old replica while the new one started, the slowest answered in %v", len(during), slowest.Round(time.Millisecond))
	waitReady(t, "the schema upgrade", old)

	// Both builds serve the upgraded schema together.
	oldNew := created(old, "old", ids("old-after", 10)...)
	newNew := created(newer, "new", ids("new-after", 10)...)
	replayed(old, "old", oldNew)
	replayed(newer, "new", newNew)
	replayed(newer, "new", before)
	replayed(newer, "new", oldNew)
	replayed(old, "old", newNew)
	conflict(old, "old", "new-after-0")
	conflict(newer, "new", "old-after-0")
	conflict(newer, "new", "before-0")

	// The old replica's first sweep, a minute after its start: every
	// record is expired by then, the new build's too.
	swept := func(p *opsProc, who string, want int) {
		t.Helper()
		line := p.waitLine(t, `"msg":"expired records deleted"`)
		_, count, _ := strings.Cut(line, `"count":`)
		n, _ := strconv.Atoi(strings.TrimRight(count, "}"))
		if n != want {
			t.Errorf("the %s replica's sweep deleted %d records, want all %d: %s", who, n, want, line)
		}
		if left := recordCount(t, url); left != 0 {
			t.Errorf("%d records left after the %s replica's sweep, want none", left, who)
		}
	}
	swept(old, "old", len(orders))
	if time.Since(oldStart) > upgradeAt+time.Minute-ttl-time.Second {
		t.Fatalf("the old replica's sweep came %v after its start, too late for the new one's to have expired records to delete", time.Since(oldStart))
	}

	// Records of both builds written now expire before the new replica's
	// first sweep, a minute after its start.
	n := len(orders)
	oldLate := created(old, "old", ids("old-late", 5)...)
	newLate := created(newer, "new", ids("new-late", 5)...)
	replayed(newer, "new", oldLate)
	replayed(old, "old", newLate)
	swept(newer, "new", len(orders)-n)

	// Both keep serving after the sweeps.
	waitReady(t, "the sweeps", old, newer)
	oldLast := created(old, "old", ids("old-last", 3)...)
	newLast := created(newer, "new", ids("new-last", 3)...)
	replayed(newer, "new", oldLast)
	replayed(old, "old", newLast)

	l := sb.Ledger()
	for _, id := range orders {
		if l.ByOrder[id] != 1 {
			t.Errorf("order %s executed %d times, want once", id, l.ByOrder[id])
		}
	}
	if l.Executions != len(orders) || l.Replays != 0 || len(l.DuplicateOrders) != 0 {
		t.Errorf("provider: %d executions of %d orders, %d repeats that reached it, duplicates %v; want each order once and no repeat",
			l.Executions, len(orders), l.Replays, l.DuplicateOrders)
	}
	for _, p := range []struct {
		who string
		p   *opsProc
	}{{"old", old}, {"new", newer}} {
		for _, line := range strings.Split(p.p.text(), "\n") {
			if strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "failed") {
				t.Errorf("the %s replica logged: %s", p.who, line)
			}
		}
	}
	t.Logf("%d orders; test ran %v", len(orders), time.Since(began).Round(time.Millisecond))
}
