package routes

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func mustParse(t testing.TB, s string) Table {
	t.Helper()
	tab, err := Parse(s)
	if err != nil {
		t.Fatalf("Parse(%q): %v", s, err)
	}
	return tab
}

func TestParse(t *testing.T) {
	tab := mustParse(t, " post /v1/payout/info = unprotected ;POST /cards/*/topup=fingerprint:10m; PUT /x=key:json:a.b, header:x-req ; * /admin=reject;")
	rules := tab.Rules()
	if len(rules) != 4 {
		t.Fatalf("got %d rules, want 4: %v", len(rules), tab)
	}
	want := []struct {
		method, path string
		policy       Policy
	}{
		{"POST", "/v1/payout/info", Unprotected},
		{"POST", "/cards/*/topup", Fingerprint},
		{"PUT", "/x", Key},
		{"*", "/admin", Reject},
	}
	for i, w := range want {
		r := rules[i]
		if r.Method != w.method || r.Path != w.path || r.Policy != w.policy {
			t.Errorf("rule %d = %s %s %s, want %s %s %s", i, r.Method, r.Path, r.Policy, w.method, w.path, w.policy)
		}
	}
	if rules[1].Window != 10*time.Minute {
		t.Errorf("window %v, want 10m", rules[1].Window)
	}
	if got := len(rules[2].Sources); got != 2 || rules[2].Sources[1].Name != "X-Req" {
		t.Errorf("sources %v, want json:a.b and header:X-Req", rules[2].Sources)
	}
	if got, want := tab.String(), "POST /v1/payout/info=unprotected; POST /cards/*/topup=fingerprint:10m0s; PUT /x=key:json:a.b,header:X-Req; * /admin=reject"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestParseEmpty(t *testing.T) {
	for _, s := range []string{"", " ", ";", " ; ; "} {
		tab := mustParse(t, s)
		if len(tab.Rules()) != 0 {
			t.Errorf("Parse(%q) has rules: %v", s, tab)
		}
		if _, ok := tab.Match("POST", "/x", true); ok {
			t.Errorf("empty table matched")
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ in, want string }{
		{"POST", "METHOD PATH=POLICY"},
		{"/x=reject", "METHOD PATH=POLICY"},
		{"POST /x", `missing "=POLICY"`},
		{"P0ST /x=reject", "bad method"},
		{"POST x=reject", "must start with /"},
		{"POST /x?a=1=reject", "query"},
		{"POST /a*b=reject", "whole segment"},
		{"POST /a/../b=reject", "dot segments"},
		{"POST /a%zz=reject", "bad escape"},
		{"POST /a/%2A=reject", "escaped *"},
		{"POST /x=maybe", "unknown policy"},
		{"POST /x=", "unknown policy"},
		{"POST /x=reject:now", "no argument"},
		{"POST /x=unprotected:1", "no argument"},
		{"POST /x=key:", "policy key"},
		{"POST /x=key:cookie:a", "policy key"},
		{"POST /x=fingerprint:", "window"},
		{"POST /x=fingerprint:soon", "window"},
		{"POST /x=fingerprint:500ms", "at least 1s"},
		{"POST /x=fingerprint:-1m", "at least 1s"},
		{"POST /x=reject; POST /x=unprotected", "never used"},
		{"* /cards/*=reject; POST /cards/c1=unprotected", "never used"},
	}
	for _, c := range cases {
		_, err := Parse(c.in)
		if err == nil {
			t.Errorf("Parse(%q) = nil error, want %q", c.in, c.want)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want ErrInvalid mentioning %q", c.in, err, c.want)
		}
	}
}

func TestParseNotShadowed(t *testing.T) {
	// * never matches an empty segment, so /cards/ is still reachable; a
	// narrower rule before a wider one is the normal order.
	for _, s := range []string{
		"POST /cards/*=reject; POST /cards/=unprotected",
		"POST /cards/c1=unprotected; POST /cards/*=reject",
		"POST /cards/*=reject; GET /cards/*=unprotected",
		"POST /cards/*=reject; POST /cards/*/topup=unprotected",
	} {
		mustParse(t, s)
	}
}

func TestMatch(t *testing.T) {
	tab := mustParse(t, "POST /v1/payout/info=unprotected; POST /cards/*/topup=fingerprint:10m; POST /cards=fingerprint:1m; * /=reject")
	cases := []struct {
		method, path string
		want         string // rule path, "" for no match
	}{
		{"POST", "/v1/payout/info", "/v1/payout/info"},
		{"POST", "/v1/payout/%69nfo", "/v1/payout/info"}, // the provider decodes it the same
		{"GET", "/v1/payout/info", ""},
		{"POST", "/v1/payout/info/", "/v1/payout/info"}, // an unprotected rule takes every spelling (TestMatchSpellings)
		{"POST", "/v1/payout", ""},
		{"POST", "/cards/c-1/topup", "/cards/*/topup"},
		{"POST", "/cards/a%2Fb/topup", "/cards/*/topup"}, // one segment
		{"POST", "/cards/a/b/topup", ""},
		{"POST", "/cards//topup", ""}, // * needs a segment
		{"POST", "/cards", "/cards"},
		{"POST", "/Cards", ""}, // paths are case-sensitive
		{"DELETE", "/", "/"},
		{"POST", "/cards/%zz/topup", "/cards/*/topup"}, // * takes any segment, even a bad escape
		{"POST", "/v1/payout/%zznfo", ""},
		{"POST", "", ""},
		{"POST", "cards", ""},
	}
	for _, c := range cases {
		r, ok := tab.Match(c.method, c.path, true)
		got := ""
		if ok {
			got = r.Path
		}
		if got != c.want {
			t.Errorf("Match(%s %s) = %q, want %q", c.method, c.path, got, c.want)
		}
	}
}

// TestMatchSpellings: a rule applies to the spellings of its path that a
// lenient provider routes to it, except where that would change the key of a
// request the defaults protected.
func TestMatchSpellings(t *testing.T) {
	tab := mustParse(t, "POST /v1/payout/info=unprotected; PUT /cards/*/topup=key:json:id; POST /cards/*/topup=fingerprint:10m; "+
		"POST /wide/*=unprotected; POST /wide/*/pay=key:json:id; POST /narrow/*/pay=key:json:id; POST /narrow/*=unprotected")
	cases := []spellingCase{
		// An unprotected rule: every spelling is streamed, never stored.
		{"POST", "/v1/payout/info", true, "POST /v1/payout/info=unprotected"},
		{"POST", "//v1/payout/info", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/v1/payout/info/", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/v1//payout/info", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/v1/payout%2Finfo", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/v1/payout%2finfo", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/v1%5Cpayout%5Cinfo", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/v1\\payout\\info", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/v1/payout/info;v=2", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/v1;x/payout/info", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/V1/Payout/INFO", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/%76%31/payout/info", true, "POST /v1/payout/info=unprotected"},
		{"POST", "/v1/payout/infos", true, ""},
		{"POST", "/v1/payout/info/x", true, ""},
		{"GET", "/v1/payout/info/", false, ""},
		// A key: or fingerprint: rule: its exact path as before; another
		// spelling of a method the defaults protect keeps the defaults (and
		// their key); of one they do not protect, the rule protects it.
		{"POST", "/cards/c1/topup", true, "POST /cards/*/topup=fingerprint:10m0s"},
		{"POST", "/cards/c%31/topup", true, "POST /cards/*/topup=fingerprint:10m0s"},
		{"POST", "/cards/a%2Fb/topup", true, "POST /cards/*/topup=fingerprint:10m0s"},
		{"POST", "/cards/c1/topup/", true, ""},
		{"POST", "//cards/c1/topup", true, ""},
		{"POST", "/Cards/c1/Topup", true, ""},
		{"PUT", "/cards/c1/topup", false, "PUT /cards/*/topup=key:json:id"},
		{"PUT", "/cards/c1/topup/", false, "PUT /cards/*/topup=key:json:id"},
		{"PUT", "/cards;x/c1//topup", false, "PUT /cards/*/topup=key:json:id"},
		{"PUT", "/CARDS/c1/TOPUP", false, "PUT /cards/*/topup=key:json:id"},
		{"PUT", "/cards/c1/topup/", true, ""},
		// Two rules that disagree on protection: the protecting one.
		{"POST", "/wide/w1", true, "POST /wide/*=unprotected"},
		{"POST", "/wide/w1%2Fpay", true, "POST /wide/*/pay=key:json:id"},
		{"POST", "/narrow/n1/pay", true, "POST /narrow/*/pay=key:json:id"},
		{"POST", "/narrow/n1%2Fpay", true, "POST /narrow/*/pay=key:json:id"},
		{"POST", "/narrow/n1;x", true, "POST /narrow/*=unprotected"},
		// An unprotected rule whose path a lenient reading takes elsewhere,
		// to no rule: the rule as written, as before.
		{"POST", "/wide/a%2Fb%2Fc", true, "POST /wide/*=unprotected"},
	}
	checkSpellings(t, tab, cases)
}

// spellingCase is a request and the rule it must match, as written ("" for
// the defaults).
type spellingCase struct {
	method, path string
	protected    bool // the defaults protect method
	want         string
}

// checkSpellings matches each case's request against tab.
func checkSpellings(t *testing.T, tab Table, cases []spellingCase) {
	t.Helper()
	for _, c := range cases {
		r, ok := tab.Match(c.method, c.path, c.protected)
		got := ""
		if ok {
			got = r.String()
		}
		if got != c.want {
			t.Errorf("Match(%s %s, protected %v) = %q, want %q", c.method, c.path, c.protected, got, c.want)
		}
	}
}

// TestMatchRuleSpelledLoosely: a rule written in a lenient spelling of its
// path (a trailing or repeated slash, an encoded slash) is for the endpoint
// as the plain spelling is: "POST /v1/payout/info/=unprotected" keeps the
// lookup POST /v1/payout/info fresh, and a reject rule written so refuses the
// endpoint. Before, such a rule matched only requests spelled as it is, so
// the lookup was stored and replayed and the rejected endpoint was sent.
func TestMatchRuleSpelledLoosely(t *testing.T) {
	tab := mustParse(t, "POST /v1/payout/info/=unprotected; POST //internal/*/=reject; PUT /cards/*/close/=key:json:id; "+
		"POST /v1/payment%2Finfo=unprotected")
	cases := []spellingCase{
		{"POST", "/v1/payout/info", true, "POST /v1/payout/info/=unprotected"},
		{"POST", "/v1/payout/info/", true, "POST /v1/payout/info/=unprotected"},
		{"POST", "//v1/payout/info", true, "POST /v1/payout/info/=unprotected"},
		{"POST", "/V1/Payout/Info", true, "POST /v1/payout/info/=unprotected"},
		{"POST", "/v1/payout", true, ""},
		{"POST", "/internal/x", true, "POST //internal/*/=reject"},
		{"POST", "/internal/x/", true, "POST //internal/*/=reject"},
		{"POST", "/Internal/x", true, "POST //internal/*/=reject"},
		{"POST", "/internal", true, ""},
		// A key rule: another spelling of a method the defaults protect
		// keeps the defaults, as for a rule written plainly.
		{"PUT", "/cards/c1/close", false, "PUT /cards/*/close/=key:json:id"},
		{"PUT", "/cards/c1/close/", false, "PUT /cards/*/close/=key:json:id"},
		{"PUT", "/cards/c1/close", true, ""},
		{"PUT", "/cards/c1/close/", true, "PUT /cards/*/close/=key:json:id"},
		{"POST", "/v1/payment/info", true, "POST /v1/payment%2Finfo=unprotected"},
		{"POST", "/v1/payment%2Finfo", true, "POST /v1/payment%2Finfo=unprotected"},
	}
	checkSpellings(t, tab, cases)
	for _, path := range []string{"/v1/payout/info", "/internal/x", "/v1/payout"} {
		if n := testing.AllocsPerRun(100, func() { tab.Match("POST", path, true) }); n != 0 {
			t.Errorf("Match(POST %s): %v allocations, want 0", path, n)
		}
	}
}

func TestMatchFirstWins(t *testing.T) {
	tab := mustParse(t, "POST /cards/c1/topup=unprotected; POST /cards/*/topup=reject")
	if r, _ := tab.Match("POST", "/cards/c1/topup", true); r.Policy != Unprotected {
		t.Errorf("c1: %v, want the first rule", r)
	}
	if r, _ := tab.Match("POST", "/cards/c2/topup", true); r.Policy != Reject {
		t.Errorf("c2: %v, want the second rule", r)
	}
}

// TestMatchPlainAllocs: Match runs on every request; for a path spelled the
// plain way, as nearly all are, it allocates nothing.
func TestMatchPlainAllocs(t *testing.T) {
	tab := mustParse(t, "POST /cardholders=unprotected; POST /cards=fingerprint:10m; POST /cards/*/topup=fingerprint:10m; "+
		"POST /cards/*/close=fingerprint:10m; * /internal/*=reject")
	for _, path := range []string{"/cards/c1/topup", "/cardholders", "/Cards/c1/TOPUP", "/v1/payout", "/internal/x", "/a/b/c/d/e"} {
		if n := testing.AllocsPerRun(100, func() { tab.Match("POST", path, true) }); n != 0 {
			t.Errorf("Match(POST %s): %v allocations, want 0", path, n)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"POST /v1/payout/info=unprotected; POST /cards/*/topup=fingerprint:10m",
		"PUT /x=key:json:a.b,header:X-Req; * /admin=reject",
		"POST /a%2Fb/*=reject;;",
		"post /=key:query:id",
		"POST /x=fingerprint:1h30m",
		"POST /Cards/*/topup=unprotected; POST /cards/*/topup=fingerprint:10m; * /cards/*/TOPUP=reject",
	} {
		f.Add(s, "POST", "/cards/c1/topup")
		f.Add(s, "POST", "/CARDS/c1/Topup")
	}
	f.Fuzz(func(t *testing.T, s, method, path string) {
		tab, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		// What String writes, Parse reads back to the same table.
		again, err := Parse(tab.String())
		if err != nil {
			t.Fatalf("Parse(String()) of %q: %v (String %q)", s, err, tab.String())
		}
		if again.String() != tab.String() {
			t.Fatalf("round trip changed the table: %q -> %q", tab.String(), again.String())
		}
		// A plain path takes a shortcut through the rules; it must find what
		// the reading of any other path finds.
		if strings.HasPrefix(path, "/") && plainPath(path) {
			e1, l1 := tab.firstPlain(method, path[1:])
			e2, l2 := tab.firstSpelled(method, path)
			if e1 != e2 || l1 != l2 {
				t.Fatalf("%s %s in %q: plain reading found rules %d and %d, full one %d and %d", method, path, tab, e1, l1, e2, l2)
			}
		}
		r, ok := tab.Match(method, path, true)
		if ok && (r.Policy < Unprotected || r.Policy > Reject) {
			t.Fatalf("matched a rule with policy %v", r.Policy)
		}
		if ok && r.Method != "*" && r.Method != method {
			t.Fatalf("rule %v matched method %q", r, method)
		}
	})
}
