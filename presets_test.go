package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/routes"
)

func loadEnv(t *testing.T, vars ...string) (config, settings, error) {
	t.Helper()
	return loadConfig(append([]string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1"}, vars...))
}

func TestPresetsLoad(t *testing.T) {
	for name := range presets {
		t.Run(name, func(t *testing.T) {
			cfg, set, err := loadEnv(t, "IDEMPROXY_PRESET="+name, "IDEMPROXY_SIGN_SECRET=s")
			if err != nil {
				t.Fatalf("preset %s does not load: %v", name, err)
			}
			if cfg.Preset != name || set.sign.TimestampHeader != "X-Timestamp" || set.sign.SignatureHeader != "X-Signature" {
				t.Errorf("preset %s: %+v", name, set.sign)
			}
			for _, s := range []int{429, 500, 502, 503, 504} {
				if !set.policy.Statuses[s] {
					t.Errorf("preset %s does not retry %d", name, s)
				}
			}
		})
	}
}

func TestPresetSettings(t *testing.T) {
	_, pay, err := loadEnv(t, "IDEMPROXY_PRESET=payments")
	if err != nil {
		t.Fatal(err)
	}
	if pay.sign.NonceHeader != "X-Nonce" || !strings.Contains(pay.sign.Template.String(), "{body_sha256}") {
		t.Errorf("payments signing: nonce %q, template %q", pay.sign.NonceHeader, pay.sign.Template)
	}
	payCfg, _, _ := loadEnv(t, "IDEMPROXY_PRESET=payments")
	if pay.probe == nil || payCfg.ProviderKeyRetention != 48*time.Hour {
		t.Errorf("payments: probe %v, key retention %v; want GET /payments/{resp.payment_id} and 48h", pay.probe, payCfg.ProviderKeyRetention)
	}
	cfg, po, err := loadEnv(t, "IDEMPROXY_PRESET=payouts")
	if err != nil {
		t.Fatal(err)
	}
	// Only the answer each seed documents for an operation the provider
	// does not have means "not executed": payouts' 404 payout.not_found;
	// the payments provider documents none.
	if !slices.Equal(po.notFound, []string{"payout.not_found"}) || len(pay.notFound) != 0 {
		t.Errorf("probe not-found codes: payouts %q, payments %q; want [payout.not_found] and none", po.notFound, pay.notFound)
	}
	if cfg.InProgressCode != "idempotency.in_progress" || !po.policy.Codes["payout.funds_maturing"] {
		t.Errorf("payouts: in-progress %q, codes %v", cfg.InProgressCode, po.policy.Codes)
	}
	if r, ok := po.routes.Match("POST", "/v1/payout/info", true); !ok || r.Policy != routes.Unprotected {
		t.Errorf("payouts: /v1/payout/info rule %v, want unprotected", r)
	}
	if _, ok := po.routes.Match("POST", "/v1/payout", true); ok {
		t.Errorf("payouts: /v1/payout has a rule; want the default order_id key")
	}
	_, cards, err := loadEnv(t, "IDEMPROXY_PRESET=cards")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]routes.Policy{"/cardholders": routes.Unprotected, "/cards": routes.Fingerprint,
		"/cards/c1/topup": routes.Fingerprint, "/cards/c1/close": routes.Fingerprint}
	for path, p := range want {
		if r, ok := cards.routes.Match("POST", path, true); !ok || r.Policy != p {
			t.Errorf("cards: POST %s rule %v, want %v", path, r, p)
		}
	}
}

func TestPresetExplicitVariablesWin(t *testing.T) {
	cfg, set, err := loadEnv(t, "IDEMPROXY_PRESET=payouts", "IDEMPROXY_INPROGRESS_CODE=busy",
		"IDEMPROXY_ROUTES=", "IDEMPROXY_RETRY_CODES=x.y")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.InProgressCode != "busy" {
		t.Errorf("in-progress code %q, want the explicit busy", cfg.InProgressCode)
	}
	if len(set.routes.Rules()) != 0 {
		t.Errorf("routes %v, want none: an explicit empty value wins too (ROUTES has no default)", set.routes)
	}
	if !set.policy.Codes["x.y"] || set.policy.Codes["payout.frozen"] {
		t.Errorf("codes %v, want only x.y", set.policy.Codes)
	}
	// What the preset does not name keeps its default.
	if cfg.RetryMaxAttempts != 5 {
		t.Errorf("RETRY_MAX_ATTEMPTS %d, want the default 5", cfg.RetryMaxAttempts)
	}
}

func TestNoPresetKeepsDefaults(t *testing.T) {
	cfg, set, err := loadEnv(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.InProgressStatus != 409 || cfg.InProgressCode != "idempotency_in_progress" || len(set.routes.Rules()) != 0 {
		t.Errorf("defaults: %d %q routes %v", cfg.InProgressStatus, cfg.InProgressCode, set.routes)
	}
}

func TestBadRouteAndPresetConfig(t *testing.T) {
	cases := []struct {
		env  []string
		want string
	}{
		{[]string{"IDEMPROXY_PRESET=stripe"}, "IDEMPROXY_PRESET"},
		{[]string{"IDEMPROXY_ROUTES=POST /x=maybe"}, "IDEMPROXY_ROUTES"},
		{[]string{"IDEMPROXY_ROUTES=POST /x=key:cookie:a"}, "IDEMPROXY_ROUTES"},
		{[]string{"IDEMPROXY_ROUTES=POST /x=fingerprint:100h"}, "IDEMPROXY_RECORD_TTL"},
		// An unknown operation is found through anchors up to three
		// windows old, which must not have expired.
		{[]string{"IDEMPROXY_RECORD_TTL=72h", "IDEMPROXY_ROUTES=POST /x=fingerprint:72h"}, "IDEMPROXY_RECORD_TTL"},
		{[]string{"IDEMPROXY_RECORD_TTL=29m", "IDEMPROXY_ROUTES=POST /x=fingerprint:10m"}, "IDEMPROXY_RECORD_TTL"},
		{[]string{"IDEMPROXY_INPROGRESS_STATUS=200"}, "IDEMPROXY_INPROGRESS_STATUS"},
		{[]string{"IDEMPROXY_INPROGRESS_STATUS=busy"}, "IDEMPROXY_INPROGRESS_STATUS"},
		{[]string{"IDEMPROXY_INPROGRESS_CODE=in progress"}, "IDEMPROXY_INPROGRESS_CODE"},
		// A preset's values are checked like explicit ones.
		{[]string{"IDEMPROXY_PRESET=cards", "IDEMPROXY_RECORD_TTL=5m", "IDEMPROXY_RETRY_BUDGET=1m"}, "IDEMPROXY_ROUTES"},
	}
	for _, c := range cases {
		_, _, err := loadEnv(t, c.env...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %s", c.env, err, c.want)
		}
	}
}

func TestFingerprintWindowWithinTTL(t *testing.T) {
	_, set, err := loadEnv(t, "IDEMPROXY_RECORD_TTL=72h", "IDEMPROXY_ROUTES=POST /x=fingerprint:24h")
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := set.routes.Match("POST", "/x", true); r.Window != 24*time.Hour {
		t.Errorf("window %v", r.Window)
	}
}
