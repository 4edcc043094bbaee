package adminapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/adminapi"
	"github.com/idemproxy/idemproxy/cache"
	"github.com/idemproxy/idemproxy/store"
)

// TestUnreadableRecord: after a crash the store holds, beside readable
// records, an in-flight and a final record whose value this version cannot
// read (here their format version byte is one no build wrote, as after a
// downgrade; a start keeps such records as they are). Listing in_flight
// must answer 200 with the readable record as always and the unreadable one
// as state "unreadable", with its key, client, stored state, store key and
// reason, and no attempts or first send (which would say nothing was sent);
// needs_review shows the unreadable final one (whether it needs review
// cannot be told). Reading one must answer 500 record_unreadable in the
// API's error shape, saying its value cannot be read. Before, every listing
// of its state answered 503 store_unavailable, hiding all the others, and
// the read 503 "the record store cannot be read".
func TestUnreadableRecord(t *testing.T) {
	dir := t.TempDir()
	s, err := cache.Open(cache.Options{Dir: dir, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := store.Request{Fingerprint: []byte("fp"), Method: "POST", Path: "/payments"}
	for _, k := range []string{"k-readable", "k-damaged", "k-final-damaged"} {
		if _, _, err := s.Begin(ctx, store.ID{Tenant: "default", Key: k}, req, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Complete(ctx, store.ID{Tenant: "default", Key: "k-final-damaged"}, "o",
		store.Response{Status: 200, Body: []byte(`{"status":"needs_review"}`)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	damage(t, dir, "k-damaged", "k-final-damaged")
	s, err = cache.Open(cache.Options{Dir: dir, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h := adminapi.New(adminapi.Options{Store: s, DefaultTenant: "default"})

	w := call(t, h, "GET", "/admin/v1/records?state=in_flight", "")
	var page struct {
		Records []json.RawMessage `json:"records"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil || w.Code != 200 || len(page.Records) != 2 {
		t.Fatalf("in_flight list = %d %s, want 200 with the readable and the unreadable record", w.Code, w.Body)
	}
	t.Logf("in_flight list: %s", w.Body)
	for _, raw := range page.Records {
		var rec adminapi.Record
		json.Unmarshal(raw, &rec)
		switch rec.Key {
		case "k-readable":
			if rec.State != "in_flight" || rec.Method != "POST" {
				t.Errorf("readable record = %s", raw)
			}
			hasFields(t, raw, "key", "upstream_key", "client", "state", "method", "path", "attempts",
				"created_at", "first_sent_at", "expires_at", "last_error")
		case "k-damaged":
			checkUnreadable(t, raw, "in_flight")
		default:
			t.Errorf("in_flight list has %s", raw)
		}
	}

	w = call(t, h, "GET", "/admin/v1/records?state=needs_review", "")
	if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil || w.Code != 200 || len(page.Records) != 1 {
		t.Fatalf("needs_review list = %d %s, want 200 with the unreadable final record", w.Code, w.Body)
	}
	checkUnreadable(t, page.Records[0], "final")

	w = call(t, h, "GET", "/admin/v1/records/k-damaged", "")
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || w.Code != http.StatusInternalServerError ||
		e.Error.Code != "record_unreadable" || !strings.Contains(e.Error.Message, "cannot be read") {
		t.Fatalf("read of the unreadable record = %d %s, want 500 record_unreadable saying its value cannot be read", w.Code, w.Body)
	}
	t.Logf("read: %d %s", w.Code, w.Body)
	if w := call(t, h, "GET", "/admin/v1/records/k-readable", ""); w.Code != 200 {
		t.Fatalf("read of the readable record = %d %s", w.Code, w.Body)
	}
}

// checkUnreadable checks a listed record whose value cannot be read, stored
// in state.
func checkUnreadable(t *testing.T, raw []byte, state string) {
	t.Helper()
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	reason, _ := got["reason"].(string)
	storeKey, _ := got["store_key"].(string)
	if got["state"] != adminapi.StateUnreadable || got["stored_state"] != state || got["client"] != "default" ||
		storeKey == "" || !strings.Contains(reason, "corrupt record") {
		t.Errorf("unreadable record = %s, want state unreadable, stored_state %s, client default, a store key and the reason", raw, state)
	}
	for _, f := range []string{"attempts", "first_sent_at", "created_at", "last_error"} {
		if _, ok := got[f]; ok {
			t.Errorf("unreadable record = %s: has %q, which is not known", raw, f)
		}
	}
}

// damage sets the format version of the records whose value names one of
// keys, in the closed store at dir, to one no build writes.
func damage(t *testing.T, dir string, keys ...string) {
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
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			for _, k := range keys {
				if bytes.Contains(v, []byte(k)) && !bytes.Contains(v, []byte(k+"-")) {
					v[0] = 0xee
					n++
					if err := txn.SetEntry(badger.NewEntry(it.Item().KeyCopy(nil), v).WithMeta(it.Item().UserMeta())); err != nil {
						return err
					}
					break
				}
			}
		}
		return nil
	})
	if err != nil || n != len(keys) {
		t.Fatalf("damaging %v: %d found, %v", keys, n, err)
	}
}
