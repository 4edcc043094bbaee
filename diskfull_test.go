package main

// A full disk at shutdown: the data directory's file system is filled by
// another writer, then the binary gets SIGTERM. Badger writes through mmap
// into sparse files, so a memtable flush into a full file system is a SIGBUS,
// not an error. The process must still exit by itself within the grace (plus
// exitMargin), a start while the disk is still full must fail with a clear error
// rather than crash, and once the space is back the next start must replay
// every answer a client was given.

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// smallDisk mounts a 300 MiB tmpfs for a data directory, unmounted at the
// end: big enough for the store's default free-space reserve (260 MiB) plus
// what a test's orders write, so that they are accepted until it fills.
func smallDisk(t *testing.T) string {
	t.Helper()
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=300m"); err != nil {
		t.Skipf("cannot mount a tmpfs for the data directory (needs root or CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

func TestSIGTERMOnFullDisk(t *testing.T) {
	mnt := smallDisk(t)
	const size = 16 << 10
	prov := &crashProvider{size: size, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	const grace = 3 * time.Second
	env := baseEnv(up.URL, filepath.Join(mnt, "data"), "IDEMPROXY_SHUTDOWN_GRACE="+grace.String())
	p := launch(t, launchSpec{env: env})
	client := &http.Client{Timeout: time.Minute} // a hang fails, it does not block the run

	// Orders acknowledged while there is room: they sit in Badger's memtable
	// and its WAL, not yet flushed to a table.
	var all []acked
	for i := range 40 {
		a, ok := postOrder(t.Context(), client, p.proxy, fmt.Sprintf("before-%d", i))
		if !ok {
			t.Fatalf("order %d refused with the disk not full:\n%s", i, p.text())
		}
		a.hits = prov.hitsOf(a.key)
		all = append(all, a)
	}

	filler := filepath.Join(mnt, "filler")
	fill(t, filler)

	// Orders while the disk is full: each gets a clear 503 store_unavailable,
	// or is accepted (and must then replay like the others); never a hang or
	// a crash. The store looks at the disk again within a bounded number of
	// record bytes, so the refusals start within a few dozen orders.
	refused := 0
	for i := 0; i < 200 && refused < 3; i++ {
		order := fmt.Sprintf("full-%d", i)
		body := fmt.Sprintf(`{"order_id":%q,"amount":"1.00"}`, order)
		resp, err := client.Post("http://"+p.proxy+"/v1/payouts", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("order %s on a full disk: %v\n%s", order, err, p.text())
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), `"store_unavailable"`):
			refused++
		case resp.StatusCode == http.StatusCreated:
			key := resp.Header.Get("Idempotency-Key")
			all = append(all, acked{order: order, key: key, sum: sha256.Sum256(b), hits: prov.hitsOf(key)})
		default:
			t.Fatalf("order %s on a full disk = %d %s; want 503 store_unavailable or 201", order, resp.StatusCode, b)
		}
	}
	if refused == 0 {
		t.Fatalf("200 orders accepted on a full disk; want 503 store_unavailable once the store looks at the disk")
	}

	took, _ := p.terminateWithin(t, grace+exitMargin)
	// The Go runtime turns a SIGBUS in its own code into "fatal error: fault"
	// and exit status 2; one outside Go would leave the signal in the status.
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("killed by %v during shutdown on a full disk:\n%s", ws.Signal(), p.text())
		}
	}
	if strings.Contains(p.text(), "signal SIGBUS") {
		t.Fatalf("SIGBUS during shutdown on a full disk (%v):\n%s", p.err, p.text())
	}
	if p.err != nil {
		t.Errorf("exit after SIGTERM on a full disk: %v; want 0 (nothing acknowledged is lost)\n%s", p.err, p.text())
	}
	t.Logf("exited %s after SIGTERM (grace %s): %v; %d orders acknowledged, %d refused on the full disk",
		took.Round(time.Millisecond), grace, p.err, len(all), refused)

	// A start while the disk is still full must not crash either: Badger
	// would flush the WAL it replays into a new table. It exits with a clear
	// error instead, and the records wait for the space.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || strings.Contains(string(out), "SIGBUS") ||
		!strings.Contains(string(out), "free space, then start again") {
		t.Fatalf("start on the full disk: %v; want exit status 1 asking to free space\n%s", err, out)
	}
	t.Logf("start on the full disk: %v: %s", err, strings.TrimSpace(string(out)))

	// The space comes back: the store opens and every acknowledged answer
	// replays without reaching the provider again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	p = launch(t, launchSpec{env: env})
	verifyReplays(t, client, p.proxy, prov, all)
	t.Logf("restarted: all %d acknowledged answers replayed", len(all))
}

// fillLeaving fills the file system at mnt but for free bytes, and returns
// the file that fills it (removed, the space is back).
func fillLeaving(t *testing.T, mnt string, free int64) (filler string) {
	t.Helper()
	filler = filepath.Join(mnt, "filler")
	fill(t, filler)
	fi, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, fi.Size()-free); err != nil {
		t.Fatal(err)
	}
	return filler
}

// fill writes path until its file system returns ENOSPC.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n := len(buf); n > 0; {
		_, err := f.Write(buf[:n])
		if errors.Is(err, syscall.ENOSPC) {
			n /= 2 // the last partial chunks, down to a byte
			continue
		}
		if err != nil {
			t.Fatalf("fill %s: %v", path, err)
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
		t.Fatal(err)
	}
	if st.Bavail != 0 {
		t.Fatalf("%d blocks still free after filling %s", st.Bavail, path)
	}
}

// The disk fills while idemproxy runs, and is freed again: a new order gets
// 503 store_unavailable with its key and Retry-After and reaches no provider,
// /readyz says 503; once the space is back, without a restart, /readyz says
// 200 and the same order goes through at once, with the key the 503 named,
// as a first send.
func TestFullDiskRefusesThenRecovers(t *testing.T) {
	mnt := smallDisk(t)
	prov := &crashProvider{size: 200, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	p := launch(t, launchSpec{env: baseEnv(up.URL, filepath.Join(mnt, "data"))})
	client := &http.Client{Timeout: time.Minute}
	if _, ok := postOrder(t.Context(), client, p.proxy, "room"); !ok {
		t.Fatalf("order refused with the disk not full:\n%s", p.text())
	}
	filler := filepath.Join(mnt, "filler")
	fill(t, filler)
	waitReadyz(t, p.admin, http.StatusServiceUnavailable)

	const body = `{"order_id":"no-room","amount":"1.00"}`
	got := send(t, http.MethodPost, "http://"+p.proxy+"/v1/payouts", body)
	key := got.header.Get("Idempotency-Key")
	if got.status != http.StatusServiceUnavailable || !strings.Contains(got.body, `"store_unavailable"`) ||
		got.header.Get("Retry-After") == "" || key == "" {
		t.Fatalf("order on a full disk = %d %s (Retry-After %q, key %q); want 503 store_unavailable with Retry-After and the key",
			got.status, got.body, got.header.Get("Retry-After"), key)
	}
	if h := prov.hitsOf(key); h != 0 {
		t.Fatalf("the refused order reached the provider %d times; want none", h)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, p.admin, http.StatusOK)
	got = send(t, http.MethodPost, "http://"+p.proxy+"/v1/payouts", body)
	if got.status != http.StatusCreated || got.header.Get("Idempotency-Key") != key || got.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the order once space is back = %d %s (key %q, replayed %q); want 201, first sent, with key %q",
			got.status, got.body, got.header.Get("Idempotency-Key"), got.header.Get("Idempotent-Replayed"), key)
	}
	if h := prov.hitsOf(key); h != 1 {
		t.Errorf("provider saw the key %d times, want once", h)
	}
}

// waitReadyz polls /readyz until it answers status (the store looks at the
// free space about once a second).
func waitReadyz(t *testing.T, admin string, status int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == status {
			return
		}
	}
	t.Fatalf("/readyz did not answer %d within a minute", status)
}

// A data directory on a file system with less free space than the store's
// reserve (here a volume of 300 MiB with 100 MiB free; a volume smaller than
// the reserve is the same for ever): the process starts but refuses every
// write and is never ready. Behind a readiness check no request comes to
// log why; the start itself must say it.
func TestStartBelowReserveSaysSo(t *testing.T) {
	mnt := smallDisk(t)
	filler := fillLeaving(t, mnt, 100<<20)
	p := launch(t, launchSpec{env: baseEnv("http://127.0.0.1:1", filepath.Join(mnt, "data"))})
	waitReadyz(t, p.admin, http.StatusServiceUnavailable)
	line := p.waitLine(t, "less free space than the store keeps in reserve")
	for _, want := range []string{`"level":"WARN"`, `"free_bytes":`, `"reserve_bytes":`} {
		if !strings.Contains(line, want) {
			t.Errorf("the start's line about the reserve lacks %s: %s", want, line)
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, p.admin, http.StatusOK)
}

// The expiry sweep on a disk another program filled, with nothing else
// running: the process keeps running and logs that it could not reclaim
// (the store's reserve refuses the sweep's flush), and once the space is
// back the next sweep gives the expired records' space back. Before, the
// sweep's memtable flush wrote a table through mmap into a full tmpfs and
// the idle process died of SIGBUS (exit status 2).
func TestSweepOnFullDisk(t *testing.T) {
	mnt := smallDisk(t)
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	const ttl = 13 * time.Second // the shortest the lease allows with these settings
	p := launch(t, launchSpec{env: baseEnv(up.URL, filepath.Join(mnt, "data"), "IDEMPROXY_RECORD_TTL="+ttl.String(),
		"IDEMPROXY_RETRY_BUDGET=1s", "IDEMPROXY_ATTEMPT_TIMEOUT=1s", "IDEMPROXY_STORE_LEASE=5s")})
	for i := range 300 {
		if _, ok := postOrder(t.Context(), http.DefaultClient, p.proxy, fmt.Sprintf("sweep-%d", i)); !ok {
			t.Fatalf("order %d refused:\n%s", i, p.text())
		}
	}
	filler := filepath.Join(mnt, "filler")
	fill(t, filler)
	waitLog := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(ttl + time.Minute); time.Now().Before(deadline); {
			select {
			case <-p.done:
				t.Fatalf("idemproxy exited waiting for %q: %v\n%s", what, p.err, p.text())
			case <-time.After(100 * time.Millisecond):
			}
			if strings.Contains(p.text(), what) {
				return
			}
		}
		t.Fatalf("no %q in the log:\n%s", what, p.text())
	}
	waitLog(`"msg":"reclaiming expired records failed"`)
	if strings.Contains(p.text(), "every record had expired") {
		t.Fatalf("the sweep ran on the full disk:\n%s", p.text())
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitLog("every record had expired")
}
