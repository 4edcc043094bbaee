package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/idemkey"
	"github.com/idemproxy/idemproxy/pgstore"
	"github.com/idemproxy/idemproxy/pgstore/pgtest"
	"github.com/idemproxy/idemproxy/sandbox"
	"github.com/idemproxy/idemproxy/store"
)

// keyStore is one of the stores a binary keeps its records in: setup
// makes one of the test's own and returns the binary's setting for it and
// how the test opens it (for records an earlier version left) before the
// binary runs.
type keyStore struct {
	name  string
	setup func(t *testing.T) (env string, open func(t *testing.T) (store.Store, func()))
}

// keyStores are the embedded Badger store in a data directory and
// PostgreSQL on a new database of the shared cluster.
var keyStores = []keyStore{
	{"badger", func(t *testing.T) (string, func(t *testing.T) (store.Store, func())) {
		dir := t.TempDir()
		return "IDEMPROXY_DATA_DIR=" + dir, func(t *testing.T) (store.Store, func()) {
			s, err := cache.Open(cache.Options{Dir: dir, SyncWrites: true})
			if err != nil {
				t.Fatal(err)
			}
			return s, func() { s.Close() }
		}
	}},
	{"postgres", func(t *testing.T) (string, func(t *testing.T) (store.Store, func())) {
		url := pgtest.Database(t)
		return "IDEMPROXY_STORE_URL=" + url, func(t *testing.T) (store.Store, func()) {
			s, err := pgstore.Open(context.Background(), pgstore.Options{URL: url, SweepInterval: -1, AnalyzeInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			return s, func() { s.Close() }
		}
	}},
}

// keyEnv is the environment of a binary in front of the payments sandbox
// at upstream, on st, with extra settings.
func keyEnv(upstream, storeEnv string, extra ...string) []string {
	return append([]string{
		"PATH=" + "/usr/bin:/bin",
		"IDEMPROXY_PRESET=payments",
		"IDEMPROXY_SIGN_SECRET=" + sandboxSecret,
		"IDEMPROXY_UPSTREAM_URL=" + upstream,
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0",
		"IDEMPROXY_ADMIN_ADDR=127.0.0.1:0",
		storeEnv,
	}, extra...)
}

// An app that keeps the key idemproxy gave it in a SQL Server
// uniqueidentifier column sends it back upper-cased (ADO: also in braces):
// its retry is the operation the key names, replayed, and the payments
// sandbox, which compares keys byte for byte, executes the order once. So
// for a key derived from order_id and one generated (IDEMPROXY_MISSING_KEY=
// generate), under every policy and on both stores, and for an app's own
// upper-case UUID retried in lower case. Before, each spelling was a key of
// its own: the order executed twice (once per spelling).
func TestUpperCasedKeyIsOneExecution(t *testing.T) {
	for _, st := range keyStores {
		for _, policy := range []string{"reject", "generate", "passthrough"} {
			t.Run(st.name+"/"+policy, func(t *testing.T) {
				storeEnv, _ := st.setup(t)
				sb, url := startSandbox(t, sandbox.Config{Provider: sandbox.ProviderPayments})
				// The order's id is read from X-Order-Ref only, so that a body
				// without it has no source (generate gives it a random key).
				p := launch(t, launchSpec{env: keyEnv(url, storeEnv, "IDEMPROXY_MISSING_KEY="+policy,
					"IDEMPROXY_KEY_SOURCES=header:X-Order-Ref")})
				base := "http://" + p.proxy + "/payments"
				order := func(id string) string {
					return `{"order_id":"` + id + `","amount":"10.00","currency":"EUR"}`
				}
				type retried struct {
					name, body string
					first      []string // the first request's headers
				}
				cases := []retried{{"derived", order("o1"), []string{"X-Order-Ref", "o1"}}}
				if policy == "generate" {
					cases = append(cases, retried{"generated", order("o2"), nil})
				}
				want := 0
				for _, c := range cases {
					a := send(t, "POST", base, c.body, c.first...)
					key := a.header.Get("Idempotency-Key")
					if a.status != http.StatusCreated || idemkey.Canonical(key) != key || len(key) != 36 {
						t.Fatalf("%s: %d %s key %q, want 201 under a lower-case UUID", c.name, a.status, a.body, key)
					}
					want++
					for _, back := range []string{strings.ToUpper(key), "{" + strings.ToUpper(key) + "}", `"` + strings.ToUpper(key) + `"`} {
						r := send(t, "POST", base, c.body, "Idempotency-Key", back)
						if r.status != http.StatusCreated || r.body != a.body || r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Idempotency-Key") != key {
							t.Errorf("%s sent back as %s: %d %s replayed=%q key %q, want the first answer replayed under %s",
								c.name, back, r.status, r.body, r.header.Get("Idempotent-Replayed"), r.header.Get("Idempotency-Key"), key)
						}
					}
				}
				// The app's own key, upper-case first, lower-case on its retry.
				const own = "3F2504E0-4F89-11D3-9A0C-0305E82C3301"
				a := send(t, "POST", base, order("o3"), "Idempotency-Key", own)
				r := send(t, "POST", base, order("o3"), "Idempotency-Key", strings.ToLower(own))
				want++
				if a.status != http.StatusCreated || r.body != a.body || r.header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("own key %s then in lower case: %d %s / %d %s replayed=%q, want one operation", own, a.status, a.body, r.status, r.body, r.header.Get("Idempotent-Replayed"))
				}
				if l := sb.Ledger(); l.Executions != want {
					t.Errorf("the sandbox executed %d payments, want %d (one per order)", l.Executions, want)
				}
			})
		}
	}
}

// A record that a version before key canonicalisation stored under the
// app's key as it came (upper case, or in braces) is still the operation's
// when that spelling comes again, on either store: a final answer is
// replayed, nothing sent; an operation left unknown (sent to the provider,
// its answer lost), or in flight when the embedded store's process ended, is
// resumed under the key the provider saw, so the sandbox replays it instead
// of executing it again; one in flight on an old replica that holds its
// lease (PostgreSQL) is 409 idempotency_in_progress, nothing sent. Without the lookup
// of the old spelling, the retry went under the lower-case key: the stored
// orders executed once more, the unknown and in-flight ones twice.
func TestKeyStoredUnderItsOldSpellingIsKept(t *testing.T) {
	for _, st := range keyStores {
		t.Run(st.name, func(t *testing.T) {
			storeEnv, open := st.setup(t)
			// No secret: the test sends the old build's attempt itself.
			sb, err := sandbox.New(sandbox.Config{Provider: sandbox.ProviderPayments})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(sb)
			t.Cleanup(srv.Close)
			ctx := context.Background()
			body := func(id string) string { return `{"order_id":"` + id + `","amount":"5.00","currency":"EUR"}` }
			request := func(key, b string) (store.ID, store.Request) {
				fp := idemkey.Fingerprint(idemkey.Request{Method: "POST", Path: "/payments", ContentType: "application/json", Body: []byte(b)})
				return store.ID{Tenant: "default", Key: key}, store.Request{Fingerprint: fp[:], Method: "POST", Path: "/payments", UpstreamKey: key}
			}

			// What the earlier build left: two final answers and an unknown operation.
			s, closeStore := open(t)
			finals := []string{"9B2C6D1E-0A4F-4E8B-8C3D-2F1E0D9C8B7A", "{5D4C3B2A-1F0E-4D9C-8B7A-6F5E4D3C2B1A}"}
			for _, key := range finals {
				id, req := request(key, body("stored-"+key))
				if _, _, err := s.Begin(ctx, id, req, "old", time.Minute); err != nil {
					t.Fatal(err)
				}
				resp := store.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_old"}`)}
				if err := s.Complete(ctx, id, "old", resp, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			const unknown = "C0FFEE00-1234-4ABC-9DEF-0123456789AB"
			if a := send(t, "POST", srv.URL+"/payments", body("unknown"), "Idempotency-Key", unknown); a.status != http.StatusCreated {
				t.Fatalf("the old build's attempt: %d %s", a.status, a.body)
			}
			id, req := request(unknown, body("unknown"))
			if _, _, err := s.Begin(ctx, id, req, "old", time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := s.Park(ctx, id, "old", store.Outcome{FirstSentAt: time.Now(), Attempts: 1, LastError: "timeout after send"}); err != nil {
				t.Fatal(err)
			}
			// In flight: its attempt went out, and its process (a replica
			// of the old build, on PostgreSQL) holds its lease.
			const inflight = "{C0FFEE00-5678-4ABC-9DEF-0123456789AB}"
			if a := send(t, "POST", srv.URL+"/payments", body("inflight"), "Idempotency-Key", inflight); a.status != http.StatusCreated {
				t.Fatalf("the old build's attempt: %d %s", a.status, a.body)
			}
			id, req = request(inflight, body("inflight"))
			if _, _, err := s.Begin(ctx, id, req, "old", time.Hour); err != nil {
				t.Fatal(err)
			}
			closeStore()

			p := launch(t, launchSpec{env: keyEnv(srv.URL, storeEnv, "IDEMPROXY_INFLIGHT_WAIT=200ms")})
			base := "http://" + p.proxy + "/payments"
			for _, key := range finals {
				a := send(t, "POST", base, body("stored-"+key), "Idempotency-Key", key)
				if a.status != http.StatusCreated || a.body != `{"id":"pay_old"}` || a.header.Get("Idempotent-Replayed") != "true" || a.header.Get("Idempotency-Key") != key {
					t.Errorf("%s: %d %s replayed=%q key %q, want the stored answer replayed under %s", key, a.status, a.body, a.header.Get("Idempotent-Replayed"), a.header.Get("Idempotency-Key"), key)
				}
			}
			a := send(t, "POST", base, body("unknown"), "Idempotency-Key", unknown)
			if a.status != http.StatusCreated || a.header.Get("Idempotency-Key") != unknown {
				t.Errorf("unknown %s: %d %s key %q, want it resumed under %s", unknown, a.status, a.body, a.header.Get("Idempotency-Key"), unknown)
			}
			// An embedded store is its one process's: what was in flight
			// when it opened is dead, resumed under its key. A shared
			// store's lease is the old replica's: in progress, nothing sent.
			a = send(t, "POST", base, body("inflight"), "Idempotency-Key", inflight)
			want := http.StatusCreated
			if st.name == "postgres" {
				want = http.StatusConflict
			}
			if a.status != want || a.header.Get("Idempotency-Key") != inflight {
				t.Errorf("in flight %s: %d %s key %q, want %d under %s", inflight, a.status, a.body, a.header.Get("Idempotency-Key"), want, inflight)
			}
			if l := sb.Ledger(); l.Executions != 2 {
				t.Errorf("the sandbox executed %d payments, want 2 (the old build's attempts, nothing since)", l.Executions)
			}
		})
	}
}
