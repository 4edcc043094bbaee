package routes

import "testing"

// BenchmarkMatch measures Match, which every proxied request goes through, on
// the rule sets of the provider presets (presets.go in package main, copied
// here: a test cannot import package main) for a plain path that a rule
// protects, one that no rule names, one an unprotected rule names, and a
// lenient spelling of that one.
func BenchmarkMatch(b *testing.B) {
	presets := []struct {
		name, routes string
		cases        []struct{ name, method, path string }
	}{
		{"cards", "POST /cardholders=unprotected; POST /cards=fingerprint:10m; POST /cards/*/topup=fingerprint:10m; POST /cards/*/close=fingerprint:10m",
			[]struct{ name, method, path string }{
				{"plain", "POST", "/cards/crd_8f3a2c/topup"},
				{"unprotected", "POST", "/cardholders"},
				{"lenient", "POST", "//cardholders/"},
			}},
		{"payouts", "POST /v1/payout/info=unprotected; POST /v1/payment/info=unprotected",
			[]struct{ name, method, path string }{
				{"plain", "POST", "/v1/payout"},
				{"unprotected", "POST", "/v1/payout/info"},
				{"lenient", "POST", "/v1/payout/info/"},
			}},
	}
	for _, p := range presets {
		tab := mustParse(b, p.routes)
		for _, c := range p.cases {
			b.Run(p.name+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					tab.Match(c.method, c.path, true)
				}
			})
		}
	}
}
