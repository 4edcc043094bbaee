package main

// A data directory damaged between two runs: the start must stop with a
// message naming IDEMPROXY_DATA_DIR, and must not delete what it could not
// account for, so that the records come back once the damage is repaired.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
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

// A MANIFEST removed, or cut short (inside an entry, or at an entry's start,
// as a copy that stopped at a write boundary leaves it), after a clean
// shutdown: Badger would start from what is left and delete every table file
// the MANIFEST no longer names, so that every acknowledged answer was gone
// and the next repeat of each order reached the provider again (seen: 0 of
// 100 replayed, the start logging nothing; cut at its entry's start, the
// same, until the check counted a cut at a boundary). The start is refused, the tables stay, and with the
// MANIFEST put back every answer replays.
func TestBinaryRefusesDamagedManifest(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, manifest string)
	}{
		{"removed", func(t *testing.T, manifest string) {
			if err := os.Remove(manifest); err != nil {
				t.Fatal(err)
			}
		}},
		{"cut by a byte", func(t *testing.T, manifest string) { cutFile(t, manifest, 1) }},
		{"cut at its last entry's start", func(t *testing.T, manifest string) {
			if err := os.Truncate(manifest, lastManifestEntry(t, manifest)); err != nil {
				t.Fatal(err)
			}
		}},
		{"cut to half", func(t *testing.T, manifest string) {
			st, err := os.Stat(manifest)
			if err != nil {
				t.Fatal(err)
			}
			cutFile(t, manifest, st.Size()/2)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			env := baseEnv(up.URL, dir)
			all := storeAndStop(t, env, prov, c.name)
			tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
			if len(tables) == 0 {
				t.Fatal("no table file after a clean shutdown; the test would prove nothing")
			}
			manifest := filepath.Join(dir, "MANIFEST")
			whole, err := os.ReadFile(manifest)
			if err != nil {
				t.Fatal(err)
			}
			c.damage(t, manifest)

			out := startStopsWith(t, 1, env)
			if !strings.Contains(out, "IDEMPROXY_DATA_DIR="+dir) || !strings.Contains(out, "MANIFEST") {
				t.Errorf("start on the damaged directory does not name IDEMPROXY_DATA_DIR and the MANIFEST:\n%s", out)
			}
			for _, f := range tables {
				if _, err := os.Stat(f); err != nil {
					t.Errorf("table %s gone after the refused start: %v", f, err)
				}
			}

			// Repaired (the MANIFEST from a backup): every answer is there.
			putBackAndReplay(t, env, manifest, whole, prov, all)
		})
	}
}

// lastManifestEntry returns where the MANIFEST's last entry starts: after
// the 8 bytes of magic and version, entries of a 4-byte big-endian length,
// a 4-byte checksum and that many bytes. Cut there, the MANIFEST is whole,
// one entry shorter.
func lastManifestEntry(t *testing.T, manifest string) int64 {
	t.Helper()
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	last := int64(-1)
	for off := int64(8); off+8 <= int64(len(b)); off += 8 + int64(binary.BigEndian.Uint32(b[off:])) {
		last = off
	}
	if last < 0 {
		t.Fatalf("MANIFEST of %d bytes holds no entry", len(b))
	}
	return last
}

// Garbage inside a data block of a table, after a clean shutdown (its
// footer and index whole): Badger reads no block checksum and parsed the
// garbage, so that an order whose key bytes were hit was "not found" and
// sent to the provider again (the audit: 19 of 3,336 stored orders). The
// start is refused naming the table and the block, nothing reaches the
// provider, and with the table put back every answer replays.
func TestBinaryRefusesDamagedDataBlock(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	dir := filepath.Join(t.TempDir(), "data")
	env := baseEnv(up.URL, dir)
	all := storeAndStop(t, env, prov, "block")
	path, whole := onlyFile(t, dir, "*.sst")
	damaged := bytes.Clone(whole)
	mid := tableDataEnd(t, whole) / 2
	for i := range int64(64) {
		damaged[mid+i] ^= 0xa5
	}
	if err := os.WriteFile(path, damaged, 0o600); err != nil {
		t.Fatal(err)
	}

	refusedSaying(t, env, "on a table with a damaged block", "IDEMPROXY_DATA_DIR="+dir, "table "+path+" is damaged", "block ")
	keptAndUnsent(t, path, damaged, prov, all)

	// Repaired (the table from a backup): every answer replays, nothing is sent.
	putBackAndReplay(t, env, path, whole, prov, all)
}

// tableDataEnd returns where the data blocks of the Badger table b end and
// its index begins, from the footer: ... index | index length (4) |
// checksum | checksum length (4), lengths big-endian.
func tableDataEnd(t *testing.T, b []byte) int64 {
	t.Helper()
	end := len(b) - 4
	end -= int(binary.BigEndian.Uint32(b[end:]))
	end -= 4
	end -= int(binary.BigEndian.Uint32(b[end:]))
	if end <= 0 || end >= len(b) {
		t.Fatalf("table footer points outside the file (data end %d of %d bytes)", end, len(b))
	}
	return int64(end)
}

// cutFile removes the last n bytes of path.
func cutFile(t *testing.T, path string, n int64) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, st.Size()-n); err != nil {
		t.Fatal(err)
	}
}

// startStopsWith runs the binary with env, expects it to stop at start with
// status, and returns what it printed. A binary that serves instead is killed
// after 20 s, which fails the test.
func startStopsWith(t *testing.T, status int, env []string) string {
	t.Helper()
	return startStopsAs(t, binPath, nil, status, env)
}

// startStopsAs is startStopsWith for the binary at bin run as cred (nil:
// this process's user).
func startStopsAs(t *testing.T, bin string, cred *syscall.Credential, status int, env []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = env
	who := ""
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		who = fmt.Sprintf(" as uid %d", cred.Uid)
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != status {
		t.Fatalf("start%s: %v, want exit status %d; output:\n%s", who, err, status, out)
	}
	return string(out)
}

// userBinary copies the binary into a directory of its own, prefix*, that
// any user may enter, so that a test can run it as another user; the test
// is skipped unless it runs as root.
func userBinary(t *testing.T, prefix string) (base, bin string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to run the binary as another user")
	}
	base, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(base, "idemproxy")
	exe, err := os.ReadFile(binPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	return base, bin
}

// chownAll gives dir and everything in it to uid (chown -R).
func chownAll(t *testing.T, dir string, uid int) {
	t.Helper()
	if err := filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, uid)
	}); err != nil {
		t.Fatal(err)
	}
}

// refusedSaying runs the binary with env, expects it to stop at start with
// status 1 saying each of wants (what names the case in a failure), and
// returns what it printed.
func refusedSaying(t *testing.T, env []string, what string, wants ...string) string {
	t.Helper()
	out := startStopsWith(t, 1, env)
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("start %s does not say %q:\n%s", what, want, out)
		}
	}
	return out
}

// onlyFile returns the one file in dir matching pattern and what it holds.
func onlyFile(t *testing.T, dir, pattern string) (string, []byte) {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, pattern))
	if len(m) != 1 {
		t.Fatalf("%s in the data directory: %v, want one", pattern, m)
	}
	whole, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	return m[0], whole
}

// keptAndUnsent fails unless the refused start left path holding want and
// no acknowledged order reached the provider again.
func keptAndUnsent(t *testing.T, path string, want []byte, prov *crashProvider, all []acked) {
	t.Helper()
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the refused start changed or removed %s (%v)", path, err)
	}
	for _, a := range all {
		if h := prov.hitsOf(a.key); h != a.hits {
			t.Fatalf("order %s reached the provider again (%d hits, was %d)", a.order, h, a.hits)
		}
	}
}

// putBackAndReplay writes whole back to path (the repair from a backup),
// starts the binary with env and checks that every acknowledged answer
// replays, nothing sent.
func putBackAndReplay(t *testing.T, env []string, path string, whole []byte, prov *crashProvider, all []acked) {
	t.Helper()
	if err := os.WriteFile(path, whole, 0o600); err != nil {
		t.Fatal(err)
	}
	p := launch(t, launchSpec{env: env})
	verifyReplays(t, http.DefaultClient, p.proxy, prov, all)
}

// IDEMPROXY_DATA_DIR pointing at another program's directory (a mistyped
// path, a volume shared with something else): the start stops with status 1
// naming the variable and the files, and writes nothing there. It used to
// start ready and scatter Badger's files (a 128 MiB value log, a WAL, LOCK,
// MANIFEST) among that program's, the records then lost from view once the
// setting was corrected.
func TestBinaryRefusesForeignDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "other-program")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "db.sqlite"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("not idemproxy's"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	refusedSaying(t, baseEnv("http://127.0.0.1:1", dir), "on another program's directory", "IDEMPROXY_DATA_DIR="+dir, "config.json", "db.sqlite", "a directory of its own")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the refused start left %v in the directory, want only the program's two files", names)
	}
}

// A data directory given to idemproxy's user while files in it still belong
// to root (a run as root, a backup restored by root): the start stops naming
// the user, and what it says to run is what fixes it, chown -R. It said
// "chown 65532:65532" on the directory, which the operator had already done:
// run again, the start failed the same way with the same advice.
func TestBinaryDataDirFilesOfAnotherUser(t *testing.T) {
	const uid = 65532
	base, bin := userBinary(t, "idemproxy-owner")
	dir := filepath.Join(base, "data")
	env := baseEnv("http://127.0.0.1:1", dir)
	p := launch(t, launchSpec{env: env}) // as root: the store's files are root's
	if err := p.terminate(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.text())
	}
	if err := os.Chown(dir, uid, uid); err != nil { // the directory alone
		t.Fatal(err)
	}

	cred := &syscall.Credential{Uid: uid, Gid: uid}
	out := startStopsAs(t, bin, cred, 1, env)
	for _, want := range []string{"IDEMPROXY_DATA_DIR=" + dir, "permission denied", "uid 65532", "chown -R 65532:65532"} {
		if !strings.Contains(out, want) {
			t.Errorf("start on a directory whose files are root's does not say %q:\n%s", want, out)
		}
	}

	// What it says to run, run: the start as that user succeeds.
	chownAll(t, dir, uid)
	// Its proxy port is taken, so that the start stops right after the store
	// opened: the error is then the port's, not the directory's.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	out = startStopsAs(t, bin, cred, 1, append(env, "IDEMPROXY_LISTEN_ADDR="+taken.Addr().String()))
	if strings.Contains(out, "permission denied") || !strings.Contains(out, "IDEMPROXY_LISTEN_ADDR") ||
		!strings.Contains(out, "released in-flight records") {
		t.Errorf("after chown -R, the store did not open as uid %d:\n%s", uid, out)
	}
}

// storeAndStop starts the binary with env, stores 100 orders named
// prefix-0 to prefix-99 and stops it cleanly (SIGTERM: Close flushes the
// records into a table), returning what was acknowledged.
func storeAndStop(t *testing.T, env []string, prov *crashProvider, prefix string) []acked {
	t.Helper()
	p := launch(t, launchSpec{env: env})
	all := postOrders(t, p, prov, prefix)
	if err := p.terminate(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.text())
	}
	return all
}

// postOrders sends 100 new orders through p, each of which must be
// acknowledged, and returns them with the provider's hits of each.
func postOrders(t *testing.T, p *opsProc, prov *crashProvider, prefix string) []acked {
	t.Helper()
	var all []acked
	for i := range 100 {
		a, ok := postOrder(t.Context(), http.DefaultClient, p.proxy, fmt.Sprintf("%s-%d", prefix, i))
		if !ok {
			t.Fatalf("order %d refused:\n%s", i, p.text())
		}
		a.hits = prov.hitsOf(a.key)
		all = append(all, a)
	}
	return all
}

// killedWithAnswersInWAL runs the binary on a new data directory, has it
// acknowledge postOrders' orders and SIGKILLs it, so that the answers are in
// its write-ahead log only; it returns that log's path and bytes.
func killedWithAnswersInWAL(t *testing.T, upstream string, prov *crashProvider, prefix string) (dir string, env []string, all []acked, path string, whole []byte) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "data")
	env = baseEnv(upstream, dir)
	p := launch(t, launchSpec{env: env})
	all = postOrders(t, p, prov, prefix)
	p.cmd.Process.Kill()
	<-p.done
	path, whole = onlyFile(t, dir, "*.mem")
	return dir, env, all, path, whole
}

// The write-ahead log of a killed process cut short before the next start (a
// copy that stopped part way, a restore from a partial backup): Badger
// replayed what was left, truncated the log there and started, and every
// answer after the cut was gone without a word, its order sent to the
// provider again (seen: 19 of 20 answers lost with the log cut to 4 KiB).
// No crash cuts a log (Badger sizes it when it creates it), so the start is
// refused naming the file, nothing in the directory changes, and with the
// log put back every answer replays.
func TestBinaryRefusesCutWAL(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	dir, env, all, path, whole := killedWithAnswersInWAL(t, up.URL, prov, "wal")
	if err := os.Truncate(path, 4096); err != nil { // within the first orders' entries
		t.Fatal(err)
	}

	refusedSaying(t, env, "on a cut write-ahead log", "IDEMPROXY_DATA_DIR="+dir, path+" is damaged", "cut short")
	keptAndUnsent(t, path, whole[:4096], prov, all)

	// Repaired (the log from a backup): every answer replays, nothing is sent.
	putBackAndReplay(t, env, path, whole, prov, all)
}

// The WAL of a killed process holding acknowledged answers, zeroed, or
// zeroed after its header (what a file system that lost its blocks, or a
// copy that stopped short, leaves): the start stops with exit status 1
// naming the file, nothing sent, and every answer replays once it is put
// back. Badger took each for a log that never held anything: the start
// served, 0 of 100 answers replayed and each order went upstream again.
func TestBinaryRefusesEmptiedWAL(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	for _, c := range []struct {
		name   string
		says   string
		damage func(whole []byte) []byte
	}{
		{"zeroed", "zeroed", func(b []byte) []byte { return make([]byte, len(b)) }},
		{"zeroed after its header", "holds no entry", func(b []byte) []byte {
			return append(bytes.Clone(b[:20]), make([]byte, len(b)-20)...)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, env, all, path, whole := killedWithAnswersInWAL(t, up.URL, prov, "emptied-"+c.name)
			damaged := c.damage(whole)
			if err := os.WriteFile(path, damaged, 0o600); err != nil {
				t.Fatal(err)
			}

			refusedSaying(t, env, "on an emptied write-ahead log", "IDEMPROXY_DATA_DIR="+dir, path+" is damaged", c.says)
			keptAndUnsent(t, path, damaged, prov, all)
			putBackAndReplay(t, env, path, whole, prov, all)
		})
	}
}

// The data directory deleted and made anew, or moved away, while the
// process runs (a volume remounted, a mistaken clean-up): every order after
// it is refused 503 store_unavailable with nothing sent, /readyz turns 503,
// the log names the directory, and SIGTERM ends the process. Before,
// Badger wrote on into its unlinked files: /readyz said 200, 10 of 10 orders
// were answered 201 and after a restart 0 of them replayed, each sent again.
func TestBinaryDataDirGoneWhileRunning(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	for _, c := range []struct {
		name string
		says string // in the log, after the directory's path
		gone func(t *testing.T, dir string)
	}{
		{"deleted and made anew", "/idemproxy.lock no longer holds it", func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{"moved away", "", func(t *testing.T, dir string) { // statfs of the path fails first
			if err := os.Rename(dir, dir+".moved"); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			p := launch(t, launchSpec{env: baseEnv(up.URL, dir)})
			for i := range 10 {
				if _, ok := postOrder(t.Context(), http.DefaultClient, p.proxy, fmt.Sprintf("gone-before-%d", i)); !ok {
					t.Fatalf("order %d refused:\n%s", i, p.text())
				}
			}
			c.gone(t, dir)

			waitReadyz(t, p.admin, http.StatusServiceUnavailable)
			for i := range 10 {
				body := fmt.Sprintf(`{"order_id":"gone-after-%d","amount":"1.00"}`, i)
				resp, err := http.Post("http://"+p.proxy+"/v1/payouts", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				key := resp.Header.Get("Idempotency-Key")
				if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"store_unavailable"`) {
					t.Fatalf("order after the directory went = %d %s; want 503 store_unavailable", resp.StatusCode, b)
				}
				if h := prov.hitsOf(key); h != 0 {
					t.Fatalf("refused order %d reached the provider (%d hits)", i, h)
				}
			}
			if !strings.Contains(p.text(), dir+c.says) {
				t.Errorf("the log does not say %q:\n%s", dir+c.says, p.text())
			}
			p.terminateWithin(t, 15*time.Second)
		})
	}
}

// The data directory made read-only (chmod 0500) under a process running as
// its owner, with answers large enough that Badger's memtable fills: every
// order gets 201 or 503 store_unavailable (none sent when nothing says the
// provider answered), nothing panics, the process keeps running and /readyz
// turns 503; with the mode back, orders go through without a restart, and
// after a SIGKILL every acknowledged answer replays. Before, the rotation
// that could not create its write-ahead log left Badger without a memtable:
// 51 of 60 requests had their connection dropped by a nil-pointer panic and
// the process died ("Assert failed", exit status 1).
func TestBinaryDataDirMadeReadOnlyWhileRunning(t *testing.T) {
	const uid = 65532
	base, bin := userBinary(t, "idemproxy-ro")
	prov := &crashProvider{size: 300 << 10, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	dir := filepath.Join(base, "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	chownAll(t, dir, uid)
	env := baseEnv(up.URL, dir)
	cred := &syscall.Credential{Uid: uid, Gid: uid}
	p := launch(t, launchSpec{bin: bin, env: env, cred: cred})
	client := &http.Client{Timeout: time.Minute}
	var all []acked
	order := func(name string) (acked, int, string) {
		t.Helper()
		body := fmt.Sprintf(`{"order_id":%q,"amount":"1.00"}`, name)
		resp, err := client.Post("http://"+p.proxy+"/v1/payouts", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("order %s: %v\n%s", name, err, p.text())
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("order %s: %v", name, err)
		}
		a := acked{order: name, key: resp.Header.Get("Idempotency-Key"), sum: sha256.Sum256(b), hits: prov.hitsOf(resp.Header.Get("Idempotency-Key"))}
		if resp.StatusCode == http.StatusCreated {
			all = append(all, a)
		}
		return a, resp.StatusCode, string(b)
	}
	for i := range 10 {
		if _, status, b := order(fmt.Sprintf("ro-before-%d", i)); status != http.StatusCreated {
			t.Fatalf("order before = %d %s", status, b)
		}
	}

	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for i := range 60 { // 18 MiB of answers: the 8 MiB memtable fills twice
		a, status, b := order(fmt.Sprintf("ro-%d", i))
		switch {
		case status == http.StatusCreated:
		case status == http.StatusServiceUnavailable && strings.Contains(b, `"store_unavailable"`):
			refused++
			if a.hits != 0 && !strings.Contains(b, "answered") {
				t.Errorf("order ro-%d refused saying nothing of the provider's answer reached it %d times: %s", i, a.hits, b)
			}
		default:
			t.Fatalf("order ro-%d with the directory read-only = %d %s", i, status, b)
		}
	}
	if refused == 0 {
		t.Fatal("no order refused with the data directory read-only")
	}
	waitReadyz(t, p.admin, http.StatusServiceUnavailable)
	if strings.Contains(p.text(), "panic") {
		t.Fatalf("the process panicked:\n%s", p.text())
	}

	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, p.admin, http.StatusOK)
	for i := range 10 {
		if _, status, b := order(fmt.Sprintf("ro-after-%d", i)); status != http.StatusCreated {
			t.Fatalf("order once the directory is writable again = %d %s", status, b)
		}
	}
	p.cmd.Process.Kill()
	<-p.done
	p = launch(t, launchSpec{bin: bin, env: env, cred: cred})
	verifyReplays(t, client, p.proxy, prov, all)
	t.Logf("%d orders refused while read-only; %d acknowledged answers all replayed", refused, len(all))
}

// A KEYREGISTRY with garbage in it, or cut short, between two runs: Badger
// refused it saying "Encryption key mismatch" or "Error while reading sanity
// text", naming neither the file nor the damage (the store encrypts
// nothing). The start names the file and says what to do; removing it, as
// the message says, brings every answer back.
func TestBinaryNamesDamagedKeyRegistry(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"garbage", func(t *testing.T, path string) {
			if err := os.WriteFile(path, bytes.Repeat([]byte{0x5a}, 28), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"cut short", func(t *testing.T, path string) { cutFile(t, path, 10) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			env := baseEnv(up.URL, dir)
			all := storeAndStop(t, env, prov, "keyreg")
			path := filepath.Join(dir, "KEYREGISTRY")
			c.damage(t, path)

			refusedSaying(t, env, "with a damaged KEYREGISTRY", "IDEMPROXY_DATA_DIR="+dir, path+" is damaged", "removed, it is written anew")

			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			p := launch(t, launchSpec{env: env})
			verifyReplays(t, http.DefaultClient, p.proxy, prov, all)
		})
	}
}

// A table the MANIFEST names, removed between two runs: Badger refused the
// directory saying "file does not exist for table 1". The start names the
// file, and with it put back every answer replays.
func TestBinaryNamesMissingTable(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	dir := filepath.Join(t.TempDir(), "data")
	env := baseEnv(up.URL, dir)
	all := storeAndStop(t, env, prov, "gone")
	path, whole := onlyFile(t, dir, "*.sst")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}

	refusedSaying(t, env, "with a table missing", "IDEMPROXY_DATA_DIR="+dir, "table "+path+" is missing")

	putBackAndReplay(t, env, path, whole, prov, all)
}

// Files of the data directory that idemproxy's user may not read or write,
// though they are its own (a mode changed by hand, a restore that kept
// another umask): the start stops naming the permission, the uid and the
// chown/chmod to run, never calling the file damaged and asking for a
// backup. It said "table … is damaged … restore the directory from a
// backup" for an unreadable table, the same of an unreadable KEYREGISTRY,
// and gave Badger's words without the uid or the fix for a directory it
// may not write in (its LOCK) or a value log it may not write.
func TestBinaryDataDirFilesNotPermitted(t *testing.T) {
	const uid = 65532
	base, bin := userBinary(t, "idemproxy-perm")
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	dir := filepath.Join(base, "data")
	env := baseEnv(up.URL, dir)
	all := storeAndStop(t, env, prov, "perm") // as root, then given to the user
	chownAll(t, dir, uid)
	one := func(pattern string) string {
		t.Helper()
		m, _ := filepath.Glob(filepath.Join(dir, pattern))
		if len(m) == 0 {
			t.Fatalf("no %s in the data directory", pattern)
		}
		return m[0]
	}
	cred := &syscall.Credential{Uid: uid, Gid: uid}
	for _, c := range []struct {
		name string
		path string
		mode os.FileMode
		back os.FileMode
	}{
		{"directory not writable", dir, 0o500, 0o700},
		{"table unreadable", one("*.sst"), 0, 0o644},
		{"value log read-only", one("*.vlog"), 0o444, 0o644},
		{"KEYREGISTRY unreadable", one("KEYREGISTRY"), 0, 0o600},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := os.Chmod(c.path, c.mode); err != nil {
				t.Fatal(err)
			}
			defer os.Chmod(c.path, c.back)
			out := startStopsAs(t, bin, cred, 1, env)
			for _, want := range []string{"IDEMPROXY_DATA_DIR=" + dir, "permission denied", "uid 65532", "chown -R 65532:65532"} {
				if !strings.Contains(out, want) {
					t.Errorf("start does not say %q:\n%s", want, out)
				}
			}
			for _, wrong := range []string{"damaged", "backup"} {
				if strings.Contains(out, wrong) {
					t.Errorf("start calls a permission problem %q:\n%s", wrong, out)
				}
			}
		})
	}

	// Modes put back: the user's start opens the store, every answer there.
	p := launch(t, launchSpec{bin: bin, env: env, cred: cred})
	verifyReplays(t, http.DefaultClient, p.proxy, prov, all)
}

// The header of a value log or a write-ahead log damaged between two runs
// (its first 8 bytes, the id of the encryption key its entries use, which is
// 0 in a store that encrypts nothing), or a stray file given a value log's
// name: Badger refused the start with "While opening vlog file 1 err: Error
// for the KEY ID … err: Invalid datakey id", for a write-ahead log too,
// saying neither that the file is damaged nor what to do. The start names
// the file and the fix: a value log holds no record (every value stays in
// the LSM tree), so it is removed and every answer replays; a write-ahead
// log holds acknowledged answers, so it comes from a backup.
func TestBinaryNamesDamagedLogHeader(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	flipHeader := func(t *testing.T, path string) []byte {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 8 {
			b[i] ^= 0xa5
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		name string
		kill bool // SIGKILL instead of SIGTERM: the answers in the write-ahead log
		file func(t *testing.T, dir string) string
	}{
		{"value log", false, func(t *testing.T, dir string) string { path, _ := onlyFile(t, dir, "*.vlog"); return path }},
		{"value log of a killed process", true, func(t *testing.T, dir string) string {
			path, _ := onlyFile(t, dir, "*.vlog")
			return path
		}},
		{"stray value log", false, func(t *testing.T, dir string) string {
			path := filepath.Join(dir, "000099.vlog")
			if err := os.WriteFile(path, []byte("not a value log, but named like one"), 0o600); err != nil {
				t.Fatal(err)
			}
			return path
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			env := baseEnv(up.URL, dir)
			var all []acked
			if c.kill {
				p := launch(t, launchSpec{env: env})
				all = postOrders(t, p, prov, "vlog-"+c.name)
				p.cmd.Process.Kill()
				<-p.done
			} else {
				all = storeAndStop(t, env, prov, "vlog-"+c.name)
			}
			path := c.file(t, dir)
			var damaged []byte
			if c.name == "stray value log" {
				damaged, _ = os.ReadFile(path)
			} else {
				damaged = flipHeader(t, path)
			}

			refusedSaying(t, env, "with a damaged value log", "IDEMPROXY_DATA_DIR="+dir, "value log "+path+" is damaged",
				"removing the file loses nothing")
			keptAndUnsent(t, path, damaged, prov, all)

			// As the message says: the file removed, every answer replays.
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			p := launch(t, launchSpec{env: env})
			verifyReplays(t, http.DefaultClient, p.proxy, prov, all)
		})
	}
	t.Run("write-ahead log", func(t *testing.T) {
		dir, env, all, path, whole := killedWithAnswersInWAL(t, up.URL, prov, "walhead")
		damaged := flipHeader(t, path)

		refusedSaying(t, env, "with a damaged write-ahead log header", "IDEMPROXY_DATA_DIR="+dir,
			"write-ahead log "+path+" is damaged", "restore the directory from a backup")
		keptAndUnsent(t, path, damaged, prov, all)
		putBackAndReplay(t, env, path, whole, prov, all)
	})
}

// A bit flipped in the middle of the write-ahead log of a killed process
// (the disk, a copy): the log keeps its full size, so the cut-log check did
// not see it, and Badger replayed it up to the damaged entry, truncated it
// there and started; every answer after it was gone without a word and its
// order sent to the provider again (seen: 70 of 100, one bit flipped at a
// third of the entries, the start logging only the in-flight record it
// released). The start is refused naming the log and the byte, nothing is
// sent, and with the log put back every answer replays.
func TestBinaryRefusesWALDamagedInTheMiddle(t *testing.T) {
	prov := &crashProvider{size: 2000, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	dir, env, all, path, whole := killedWithAnswersInWAL(t, up.URL, prov, "walflip")
	last := len(whole) - 1 // the entries' last byte: zeros follow
	for last > 0 && whole[last] == 0 {
		last--
	}
	damaged := bytes.Clone(whole)
	damaged[last/3] ^= 0x04
	if err := os.WriteFile(path, damaged, 0o600); err != nil {
		t.Fatal(err)
	}

	refusedSaying(t, env, "on a write-ahead log damaged in the middle", "IDEMPROXY_DATA_DIR="+dir, path+" is damaged",
		"does not match its checksum", "restore the directory from a backup")
	keptAndUnsent(t, path, damaged, prov, all)
	putBackAndReplay(t, env, path, whole, prov, all)
}
