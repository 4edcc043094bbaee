package main

import (
	"bytes"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestUnreadableUnknownRecordShown: idemproxy is killed while the provider
// executes a payment, the next start parks its record unknown, and the
// record's value is then unreadable to this version (its format version
// byte is one no build wrote, as after a downgrade). With that record in
// the store, the operator must still see it: idemproxy_operations_unknown
// counts it (with a warning naming its key), GET /admin/v1/records?state=
// unknown and `idemproxy records list --state unknown` show it as
// unreadable, and reading it answers 500 record_unreadable (the CLI says
// so). Before, every listing of unknown records answered 503
// store_unavailable, and the gauge, whose scan failed, stayed at 0: the
// operator saw no unknown operation at all.
func TestUnreadableUnknownRecordShown(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	gw, up, held, release := heldPayments(t, time.Hour)
	env := baseEnv(up.URL, dir, "IDEMPROXY_RETRY_MAX_ATTEMPTS=1",
		"IDEMPROXY_ATTEMPT_TIMEOUT=2s", "IDEMPROXY_RETRY_BUDGET=2s")
	key, _ := killedDuringPayment(t, env, gw, held, release)
	p := launch(t, launchSpec{env: env}) // its start parks the record unknown
	if err := p.terminate(t); err != nil {
		t.Fatalf("stop: %v\n%s", err, p.text())
	}
	damageOne(t, dir, store.Unknown)

	p = launch(t, launchSpec{env: env})
	t.Cleanup(func() { p.terminate(t) })
	if m := scrape(t, "http://"+p.admin+"/metrics"); m["idemproxy_operations_unknown"] != 1 {
		t.Errorf("idemproxy_operations_unknown = %v, want 1: the unreadable unknown record counted", m["idemproxy_operations_unknown"])
	} else if l := p.waitLine(t, "counted in idemproxy_operations_unknown"); !strings.Contains(l, `"level":"WARN"`) || !strings.Contains(l, key) {
		t.Errorf("gauge warning = %s, want a WARN naming %s", l, key)
	}
	r := send(t, "GET", "http://"+p.admin+"/admin/v1/records?state=unknown", "")
	if r.status != http.StatusOK || !strings.Contains(r.body, `"key":"`+key+`"`) ||
		!strings.Contains(r.body, `"state":"unreadable","stored_state":"unknown"`) || !strings.Contains(r.body, `"reason":"`) {
		t.Errorf("unknown list = %d %s, want 200 showing %s as unreadable, with the reason", r.status, r.body, key)
	}
	t.Logf("unknown list: %d %s", r.status, r.body)
	admin := []string{"IDEMPROXY_ADMIN_ADDR=" + p.admin}
	var out, errOut bytes.Buffer
	if code := command([]string{"records", "list", "--state", "unknown"}, admin, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), key) || !strings.Contains(out.String(), "unreadable (unknown)") {
		t.Errorf("records list = exit %d stdout %q stderr %q; want 0, %s shown as unreadable (unknown)", code, out.String(), errOut.String(), key)
	}
	t.Logf("records list:\n%s", out.String())

	r = send(t, "GET", "http://"+p.admin+"/admin/v1/records/"+key, "")
	if r.status != http.StatusInternalServerError || !strings.Contains(r.body, `"code":"record_unreadable"`) {
		t.Errorf("read of the unreadable record = %d %s, want 500 record_unreadable", r.status, r.body)
	}
	out.Reset()
	errOut.Reset()
	if code := command([]string{"records", "get", key}, admin, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "record_unreadable") || !strings.Contains(errOut.String(), "cannot be read") {
		t.Errorf("records get = exit %d stdout %q stderr %q; want 1 saying the record cannot be read", code, out.String(), errOut.String())
	}
	t.Logf("records get: %s", errOut.String())
}
