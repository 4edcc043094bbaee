package main

// The crash loop: the real binary is SIGKILLed at random moments under write
// load and restarted on the same data directory, round after round. Every
// start must succeed (a kill during a Badger flush or compaction leaves table
// files the MANIFEST does not name, which Badger discards), and every answer a
// client was given must replay byte for byte from the store, never reaching
// the provider again.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/table"
)

var (
	crashRounds = flag.Int("crashloop.rounds", 10, "SIGKILL rounds per answer size in TestCrashLoop (the issue's long run: 100)")
	crashSeed   = flag.Uint64("crashloop.seed", 0, "seed of TestCrashLoop's kill moments; 0 = from the clock")
)

// crashProvider executes each key once and replays it after, like a provider
// keeping idempotency keys. Its answer is derived from the key, padded to size.
type crashProvider struct {
	size int
	mu   sync.Mutex
	hits map[string]int
}

func (p *crashProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.hits[key]++
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(crashAnswer(key, p.size))
}

func (p *crashProvider) hitsOf(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hits[key]
}

// crashAnswer is a JSON body of about size bytes whose padding depends on key,
// so that a record damaged or swapped with another is caught.
func crashAnswer(key string, size int) []byte {
	sum := sha256.Sum256([]byte(key))
	pad := bytes.Repeat([]byte(fmt.Sprintf("%x", sum[:8])), size/16+1)[:size]
	b, _ := json.Marshal(map[string]string{"key": key, "pad": string(pad)})
	return b
}

// acked is an answer a client received in full: it must replay forever after.
type acked struct {
	order string
	key   string
	sum   [sha256.Size]byte
	hits  int // provider hits of the key when the answer was received
}

func TestCrashLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("crash loop runs the binary for many rounds")
	}
	seed := *crashSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -crashloop.seed=%d)", seed, seed)
	for _, tc := range []struct {
		name string
		size int
	}{{"small", 200}, {"large", 700 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			crashLoop(t, tc.size, *crashRounds, rand.New(rand.NewPCG(seed, uint64(tc.size))))
		})
	}
}

func crashLoop(t *testing.T, size, rounds int, rng *rand.Rand) {
	prov := &crashProvider{size: size, hits: map[string]int{}}
	up := httptest.NewServer(prov)
	defer up.Close()
	dir := filepath.Join(t.TempDir(), "data")
	env := baseEnv(up.URL, dir)
	var all []acked
	orphanRounds, orphans := 0, 0
	start := time.Now()
	for round := range rounds {
		p := launch(t, launchSpec{env: env}) // fails the test if the start fails
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		// The previous round's answers are the ones a kill could have hit; older
		// ones are sampled, and all are checked at the end.
		check := lastRound(all, round-1)
		for range min(16, len(all)) {
			check = append(check, all[rng.IntN(len(all))])
		}
		verifyReplays(t, client, p.proxy, prov, check)
		got := writeUntilKilled(t, client, p, round, size, prov, time.Duration(50+rng.IntN(1500))*time.Millisecond)
		all = append(all, got...)
		client.CloseIdleConnections()
		if n := orphanTables(t, dir); n > 0 {
			orphanRounds++
			orphans += n
		}
	}
	p := launch(t, launchSpec{env: env})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	verifyReplays(t, client, p.proxy, prov, all)
	t.Logf("%d rounds in %s: %d answers acknowledged, all replayed intact; %d kills left %d table files outside the MANIFEST",
		rounds, time.Since(start).Round(time.Second), len(all), orphanRounds, orphans)
	if len(all) == 0 {
		t.Fatal("no answer was acknowledged in any round: the load did not run")
	}
}

func lastRound(all []acked, round int) []acked {
	var out []acked
	prefix := fmt.Sprintf("r%d-", round)
	for _, a := range all {
		if strings.HasPrefix(a.order, prefix) {
			out = append(out, a)
		}
	}
	return out
}

// writeUntilKilled runs 32 workers posting distinct orders and SIGKILLs the
// process after d; it returns the answers received in full before the kill.
func writeUntilKilled(t *testing.T, client *http.Client, p *opsProc, round, size int,
	prov *crashProvider, d time.Duration) []acked {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var got []acked
	var wg sync.WaitGroup
	var n atomic.Int64
	for w := range 32 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				order := fmt.Sprintf("r%d-w%d-%d", round, w, i)
				a, ok := postOrder(ctx, client, p.proxy, order)
				if !ok {
					continue
				}
				if want := crashAnswer(a.key, size); sha256.Sum256(want) != a.sum {
					t.Errorf("order %s: the answer differs from the provider's", order)
				}
				a.hits = prov.hitsOf(a.key)
				n.Add(1)
				mu.Lock()
				got = append(got, a)
				mu.Unlock()
			}
		})
	}
	// Kill at a random moment after the first answer, so every round writes.
	for n.Load() == 0 && ctx.Err() == nil {
		select {
		case <-p.done:
			t.Fatalf("process exited under load: %v\n%s", p.err, p.text())
		case <-time.After(5 * time.Millisecond):
		}
	}
	time.Sleep(d)
	p.cmd.Process.Kill()
	<-p.done
	cancel()
	wg.Wait()
	return got
}

// postOrder sends one order; ok is true only for a 201 whose body came whole.
func postOrder(ctx context.Context, client *http.Client, addr, order string) (acked, bool) {
	body := fmt.Sprintf(`{"order_id":%q,"amount":"1.00"}`, order)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/payouts", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return acked{}, false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusCreated {
		return acked{}, false
	}
	return acked{order: order, key: resp.Header.Get("Idempotency-Key"), sum: sha256.Sum256(b)}, true
}

// verifyReplays repeats every order in list: each must be replayed from the
// store, byte for byte, without the provider seeing the key again.
func verifyReplays(t *testing.T, client *http.Client, addr string, prov *crashProvider, list []acked) {
	t.Helper()
	for _, a := range list {
		body := fmt.Sprintf(`{"order_id":%q,"amount":"1.00"}`, a.order)
		resp, err := client.Post("http://"+addr+"/v1/payouts", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("repeat of %s: %v", a.order, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" ||
			sha256.Sum256(b) != a.sum {
			t.Fatalf("repeat of acknowledged order %s = %d replayed=%q (%d bytes, %v); want the stored answer replayed",
				a.order, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), len(b), err)
		}
		if h := prov.hitsOf(a.key); h != a.hits {
			t.Fatalf("order %s reached the provider again after its answer was given (%d hits, was %d)", a.order, h, a.hits)
		}
	}
}

// orphanTables counts table files in dir that its MANIFEST does not name:
// what a kill during a flush or compaction leaves behind for the next start.
func orphanTables(t *testing.T, dir string) int {
	f, err := os.Open(filepath.Join(dir, badger.ManifestFilename))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, _, err := badger.ReplayManifestFile(f, 0, badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatalf("MANIFEST after a kill: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	n := 0
	for _, name := range files {
		if id, ok := table.ParseFileID(name); ok {
			if _, ok := m.Tables[id]; !ok {
				n++
			}
		}
	}
	return n
}
