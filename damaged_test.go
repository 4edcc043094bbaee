package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// TestReleaseKeepsDamagedInFlightRecord: idemproxy is killed while the
// provider executes a payment, and the in-flight record it left is then
// unreadable to the next start (here its format version byte is one no build
// wrote, as after a downgrade from a newer version). The start must keep the
// record as it is and name its key in a warning; the app's retry, past the
// provider's key retention, must get 503 store_unavailable with nothing sent.
// Before, the release deleted the record, the retry was a first send, and the
// sandbox, past its retention, charged a second time. The record counts in
// idemproxy_inflight_released_total, as a crash's.
func TestReleaseKeepsDamagedInFlightRecord(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	const retention = time.Second
	gw, up, held, release := heldPayments(t, retention)
	env := baseEnv(up.URL, dir, "IDEMPROXY_RETRY_MAX_ATTEMPTS=1",
		"IDEMPROXY_ATTEMPT_TIMEOUT=2s", "IDEMPROXY_RETRY_BUDGET=2s",
		"IDEMPROXY_PROVIDER_KEY_RETENTION="+retention.String())
	key, executed := killedDuringPayment(t, env, gw, held, release)
	damageInFlight(t, dir)

	p := launch(t, launchSpec{env: env}) // the release is done before it listens
	var warned bool
	for _, l := range strings.Split(p.text(), "\n") {
		if strings.Contains(l, "cannot be read") {
			t.Logf("start: %s", l)
			warned = warned || strings.Contains(l, `"level":"WARN"`) && strings.Contains(l, key)
		}
	}
	if !warned {
		t.Errorf("no warning at start names the damaged record's key %s:\n%s", key, p.text())
	}
	if m := scrape(t, "http://"+p.admin+"/metrics"); m["idemproxy_inflight_released_total"] != 1 {
		t.Errorf("idemproxy_inflight_released_total = %v, want 1: the crash alert must fire for the record kept",
			m["idemproxy_inflight_released_total"])
	}
	time.Sleep(time.Until(executed.Add(retention + 100*time.Millisecond))) // the provider has forgotten the key
	r := send(t, "POST", "http://"+p.proxy+"/payments", paymentBody)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, `"store_unavailable"`) {
		t.Errorf("retry of the damaged record's payment = %d %s, want 503 store_unavailable", r.status, r.body)
	}
	if k, n := onlyKey(t, mustPosts(gw)); k != key || n != 1 || gw.sb.Ledger().Executions != 1 {
		t.Fatalf("provider saw %d POSTs under %s and executed %d payments, want 1 and 1", n, k, gw.sb.Ledger().Executions)
	}
	// The operator sees it among the in-flight records.
	if r := send(t, "GET", "http://"+p.admin+"/admin/v1/records?state=in_flight", ""); r.status != http.StatusOK ||
		!strings.Contains(r.body, `"key":"`+key+`"`) || !strings.Contains(r.body, `"state":"unreadable","stored_state":"in_flight"`) {
		t.Errorf("in_flight list = %d %s, want 200 showing %s as unreadable", r.status, r.body, key)
	}
}

// damageInFlight sets the format version of the one in-flight record in the
// stopped store at dir to one no build writes.
func damageInFlight(t *testing.T, dir string) {
	t.Helper()
	damageOne(t, dir, store.InFlight)
}

// damageOne sets the format version of the one record in state in the
// stopped store at dir to one no build writes.
func damageOne(t *testing.T, dir string, state store.State) {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	n := 0
	err = db.Update(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte("r/")})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if it.Item().UserMeta() != byte(state) {
				continue
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			v[0] = 0xee
			n++
			if err := txn.SetEntry(badger.NewEntry(it.Item().KeyCopy(nil), v).WithMeta(byte(state))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || n != 1 {
		t.Fatalf("damaging the %s record: %d found, %v; want 1", state, n, err)
	}
}
