// Package routes is idemproxy's per-endpoint protection table
// (IDEMPROXY_ROUTES): which requests get an idempotency key and how, which are
// streamed through untouched, and which are refused.
//
// A table is a list of rules separated by ';', each "METHOD PATH=POLICY":
//
//	POST /v1/payout/info=unprotected; POST /cards/*/topup=fingerprint:10m
//
// METHOD is an HTTP method (case-insensitive) or '*' for any. PATH starts
// with '/'; a '*' segment matches exactly one non-empty path segment, any
// other segment matches the same segment of the request path after
// percent-decoding of each (so /cards/a%2Fb/topup has three segments and
// /v1/payout/%69nfo is /v1/payout/info). The first rule that matches wins;
// rules also match the spellings of their path that servers commonly route
// the same, whichever of them the rule itself is written in (see
// [Table.Match]).
// POLICY is one of:
//
//	unprotected            streamed through, never stored
//	key:<sources>          protected; the key comes from these sources
//	                       (IDEMPROXY_KEY_SOURCES syntax, e.g. key:json:payment.id)
//	fingerprint:<window>   protected; identical requests within the window
//	                       are one operation (e.g. fingerprint:10m)
//	reject                 refused with 405, nothing sent
package routes

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/idemkey"
)

// Policy is what a rule does with the requests it matches.
type Policy int

// The policies. The zero Policy is not valid.
const (
	// Unprotected requests are signed and streamed through, never stored.
	Unprotected Policy = iota + 1
	// Key requests are protected with a key from the rule's Sources.
	Key
	// Fingerprint requests are protected with a key derived from the request
	// fingerprint and the rule's Window.
	Fingerprint
	// Reject requests are refused with 405 and nothing is sent.
	Reject
)

var policyNames = [...]string{Unprotected: "unprotected", Key: "key", Fingerprint: "fingerprint", Reject: "reject"}

// String returns the policy's name as written in a rule.
func (p Policy) String() string {
	if p < Unprotected || p > Reject {
		return fmt.Sprintf("policy(%d)", int(p))
	}
	return policyNames[p]
}

// ErrInvalid is wrapped by every parse error.
var ErrInvalid = errors.New("invalid route rule")

// Rule is one parsed rule.
type Rule struct {
	// Method is an upper-case method, or "*" for any.
	Method string
	// Path is the pattern as written, e.g. "/cards/*/topup".
	Path   string
	Policy Policy
	// Sources are the key sources of a Key rule; nil otherwise.
	Sources []idemkey.Source
	// Window is the window of a Fingerprint rule; zero otherwise.
	Window time.Duration

	segs []string // decoded pattern segments; "*" is a wildcard
	// loose are the segments of the pattern read leniently, as a request
	// path is (looseSegments: "/v1/payout/info/" is v1, payout, info), when
	// they differ from segs; nil otherwise, as for nearly every rule.
	loose []string
}

// String returns the rule in IDEMPROXY_ROUTES syntax; [Parse] of it gives the
// rule back.
func (r Rule) String() string {
	s := r.Method + " " + r.Path + "=" + r.Policy.String()
	switch r.Policy {
	case Key:
		srcs := make([]string, len(r.Sources))
		for i, src := range r.Sources {
			srcs[i] = src.String()
		}
		s += ":" + strings.Join(srcs, ",")
	case Fingerprint:
		s += ":" + r.Window.String()
	}
	return s
}

// Table is a parsed route table. The zero Table has no rules and matches
// nothing.
type Table struct {
	rules []Rule
}

// Rules returns the table's rules in order.
func (t Table) Rules() []Rule { return t.rules }

// String returns the table in IDEMPROXY_ROUTES syntax.
func (t Table) String() string {
	parts := make([]string, len(t.rules))
	for i, r := range t.rules {
		parts[i] = r.String()
	}
	return strings.Join(parts, "; ")
}

// Parse parses IDEMPROXY_ROUTES. Empty entries (a trailing ';') are ignored;
// an empty string is an empty table. A malformed rule, and a rule that can
// never match because an earlier one matches every request it would, are
// errors naming the rule; they wrap [ErrInvalid].
func Parse(s string) (Table, error) {
	var t Table
	n := 0
	for entry := range strings.SplitSeq(s, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		n++
		r, err := parseRule(entry)
		if err != nil {
			return Table{}, fmt.Errorf("%w %d %q: %s", ErrInvalid, n, entry, err.Error())
		}
		for i, earlier := range t.rules {
			if earlier.covers(r) {
				return Table{}, fmt.Errorf("%w %d %q: never used, rule %d %q matches every request it would",
					ErrInvalid, n, entry, i+1, earlier.String())
			}
		}
		t.rules = append(t.rules, r)
	}
	return t, nil
}

// parseRule parses one trimmed, non-empty rule. Its errors are bare reasons.
func parseRule(e string) (Rule, error) {
	method, rest, ok := strings.Cut(e, " ")
	if !ok {
		return Rule{}, errors.New(`want "METHOD PATH=POLICY", e.g. "POST /v1/payout/info=unprotected"`)
	}
	var r Rule
	var err error
	if r.Method, err = parseMethod(method); err != nil {
		return Rule{}, err
	}
	path, policy, ok := strings.Cut(strings.TrimSpace(rest), "=")
	if !ok {
		return Rule{}, errors.New(`missing "=POLICY"`)
	}
	r.Path = strings.TrimSpace(path)
	if r.segs, err = parsePattern(r.Path); err != nil {
		return Rule{}, err
	}
	if loose, ok := looseSegments(r.Path); ok && !slices.Equal(loose, r.segs) {
		r.loose = loose
	}
	if err := r.parsePolicy(strings.TrimSpace(policy)); err != nil {
		return Rule{}, err
	}
	return r, nil
}

func parseMethod(m string) (string, error) {
	if m == "*" {
		return m, nil
	}
	m = strings.ToUpper(m)
	if m == "" || strings.ContainsFunc(m, func(c rune) bool { return c < 'A' || c > 'Z' }) {
		return "", fmt.Errorf("bad method %q (want letters, or * for any)", m)
	}
	return m, nil
}

// parsePattern checks a path pattern and returns its decoded segments.
func parsePattern(p string) ([]string, error) {
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("path %q must start with /", p)
	}
	if strings.ContainsAny(p, "?# \t") {
		return nil, fmt.Errorf("path %q must not hold a query, a fragment or spaces", p)
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		if s == "*" {
			continue
		}
		if strings.Contains(s, "*") {
			return nil, fmt.Errorf("path %q: * must be a whole segment", p)
		}
		if s == "." || s == ".." {
			return nil, fmt.Errorf("path %q: dot segments never match", p)
		}
		dec, err := url.PathUnescape(s)
		if err != nil {
			return nil, fmt.Errorf("path %q: bad escape in segment %q", p, s)
		}
		if strings.Contains(dec, "*") {
			return nil, fmt.Errorf("path %q: an escaped * is not a wildcard and is refused to avoid doubt", p)
		}
		segs[i] = dec
	}
	return segs, nil
}

func (r *Rule) parsePolicy(p string) error {
	name, arg, hasArg := strings.Cut(p, ":")
	name = strings.ToLower(strings.TrimSpace(name))
	switch name {
	case "unprotected", "reject":
		if hasArg {
			return fmt.Errorf("policy %s takes no argument", name)
		}
		r.Policy = Unprotected
		if name == "reject" {
			r.Policy = Reject
		}
		return nil
	case "key":
		srcs, err := idemkey.ParseSources(arg)
		if err != nil {
			return fmt.Errorf("policy key: %w", err)
		}
		r.Policy, r.Sources = Key, srcs
		return nil
	case "fingerprint":
		d, err := time.ParseDuration(strings.TrimSpace(arg))
		if err != nil || d < time.Second {
			return fmt.Errorf("policy fingerprint: window %q: want a duration of at least 1s, e.g. fingerprint:10m", arg)
		}
		r.Policy, r.Window = Fingerprint, d
		return nil
	}
	return fmt.Errorf("unknown policy %q (want unprotected, key:<sources>, fingerprint:<window> or reject)", p)
}

// covers reports whether r matches every request later would.
func (r Rule) covers(later Rule) bool {
	if r.Method != "*" && r.Method != later.Method {
		return false
	}
	if len(r.segs) != len(later.segs) {
		return false
	}
	for i, s := range r.segs {
		switch l := later.segs[i]; {
		case s == "*" && l == "": // * never matches an empty segment
			return false
		case s != "*" && s != l:
			return false
		}
	}
	return true
}

// Match returns the rule for a request of method to the escaped request path
// (url.URL.EscapedPath: what is forwarded, unchanged), and whether a rule
// applies; when none does, the request follows the defaults.
// protectedByDefault says whether the defaults protect method
// (IDEMPROXY_PROTECTED_METHODS).
//
// A provider may read a path as written (each segment percent-decoded) or as
// a lenient server routes it (see looseSegments: "//v1/payout/info",
// "/v1/payout/info/", "/v1/payout%2Finfo", "/V1/Payout/Info" are
// /v1/payout/info to nginx, servlet containers, Express or ASP.NET). A rule
// is meant for the endpoint, however it is spelled, so Match reads the path
// both ways, takes the first rule each reading matches (the lenient reading
// against the rule's path read leniently too: a rule written
// "/v1/payout/info/" is for /v1/payout/info), and decides:
//
//   - a Reject rule on the lenient reading refuses the request: no spelling
//     of a rejected path reaches the provider;
//   - when the two readings match rules that disagree on protection, the
//     protecting one applies: the provider may read the path either way, and
//     a money-moving request sent without a key can be charged twice, where a
//     lookup answered from the store is only stale;
//   - otherwise the rule matching the path as written applies, as it always
//     did, so no key derived for such a request changes;
//   - a path only the lenient reading matches gets an Unprotected rule (a
//     status lookup spelled "/v1/payout/info/" is never stored and replayed
//     stale), and a Key or Fingerprint rule only if protectedByDefault is
//     false: such a request was protected by the defaults before, and keeps
//     the key they derive (a new key for an operation in flight across an
//     upgrade would be a second charge).
//
// The path is only read here: fingerprints and what is sent upstream use
// the path as written, keys its normal form (the proxy's keyPath).
func (t Table) Match(method, escapedPath string, protectedByDefault bool) (Rule, bool) {
	if len(t.rules) == 0 || !strings.HasPrefix(escapedPath, "/") {
		return Rule{}, false
	}
	var exact, lenient int
	if plainPath(escapedPath) {
		exact, lenient = t.firstPlain(method, escapedPath[1:])
	} else {
		exact, lenient = t.firstSpelled(method, escapedPath)
	}
	return t.decide(exact, lenient, protectedByDefault)
}

// decide applies Match's rules to the first rule matching the path as written
// (exact) and the first matching the lenient reading (lenient), indexes in
// t.rules or -1 for none.
func (t Table) decide(exact, lenient int, protectedByDefault bool) (Rule, bool) {
	eok, lok := exact >= 0, lenient >= 0
	switch {
	case lok && t.rules[lenient].Policy == Reject:
		return t.rules[lenient], true
	case eok && lok && (t.rules[exact].Policy == Unprotected) != (t.rules[lenient].Policy == Unprotected):
		if t.rules[exact].Policy == Unprotected {
			return t.rules[lenient], true
		}
		return t.rules[exact], true
	case eok:
		return t.rules[exact], true
	case lok && (t.rules[lenient].Policy == Unprotected || !protectedByDefault):
		return t.rules[lenient], true
	}
	return Rule{}, false
}

// firstSpelled returns the index of the first rule matching each reading of
// escapedPath, -1 for none, in one pass over the rules.
func (t Table) firstSpelled(method, escapedPath string) (exact, lenient int) {
	segs := strings.Split(escapedPath[1:], "/")
	loose, ok := looseSegments(escapedPath)
	if !ok { // nothing to decode, cut or drop: only letter case differs
		loose = segs
	}
	exact, lenient = -1, -1
	for i := range t.rules {
		r := &t.rules[i]
		if exact < 0 && r.matches(method, segs) {
			exact = i
		}
		if lenient < 0 && r.matchesDecoded(method, loose) {
			lenient = i
		}
		if exact >= 0 && lenient >= 0 {
			break
		}
	}
	return exact, lenient
}

// firstPlain is firstSpelled for a path that plainPath accepts, p without its
// leading '/', without allocating. Nothing in such a path is escaped and
// looseSegments leaves its segments as they are, so the two readings differ
// only in letter case: one walk of a rule's segments answers both (of its
// lenient segments, for a rule written in another spelling, which can never
// match such a path as written), and the rule matching p as written is also
// the first matching it leniently, or comes after that one.
func (t Table) firstPlain(method, p string) (exact, lenient int) {
	n := strings.Count(p, "/") + 1
	lenient = -1
	for i := range t.rules {
		r := &t.rules[i]
		if r.Method != "*" && r.Method != method {
			continue
		}
		if r.loose != nil { // read leniently, the rule has other segments
			if lenient < 0 && len(r.loose) == n {
				if _, fold := matchPlain(r.loose, p); fold {
					lenient = i
				}
			}
			if len(r.segs) == n {
				if same, _ := matchPlain(r.segs, p); same {
					return i, lenient
				}
			}
			continue
		}
		if len(r.segs) != n {
			continue
		}
		same, fold := matchPlain(r.segs, p)
		if fold && lenient < 0 {
			lenient = i
		}
		if same {
			return i, lenient
		}
	}
	return -1, lenient
}

// matchPlain reports whether the pattern segments segs match those of p (a
// path with its leading '/' cut that plainPath accepts, with as many segments
// as segs) as written (same) and ignoring letter case (fold). Method is the
// caller's.
func matchPlain(segs []string, p string) (same, fold bool) {
	same = true
	for _, want := range segs {
		got, rest, _ := strings.Cut(p, "/")
		p = rest
		switch {
		case want == "*":
			if got == "" {
				return false, false
			}
		case got == want:
		case strings.EqualFold(got, want):
			same = false
		default:
			return false, false
		}
	}
	return same, true
}

// plainPath reports whether escapedPath holds none of the forms looseSegments
// undoes: no escape, path parameter, backslash, repeated or trailing slash.
// This is what nearly every request looks like.
func plainPath(escapedPath string) bool {
	for i := 0; i < len(escapedPath); i++ {
		switch escapedPath[i] {
		case '%', ';', '\\':
			return false
		case '/':
			if i+1 == len(escapedPath) || escapedPath[i+1] == '/' {
				return false
			}
		}
	}
	return true
}

// looseSegments returns the segments of escapedPath as a lenient server
// routes it: percent-decoded, split at slashes and backslashes, each cut at
// a path parameter (";jsessionid=1", which servlet containers drop), empty
// ones dropped (nginx merges repeated slashes; many routers ignore a
// trailing one). ok is false when the path has none of these forms, so the
// segments would be the exact ones, or does not decode. (Letter case, which
// Express and ASP.NET routing ignore, is matchesDecoded's.)
func looseSegments(escapedPath string) (segs []string, ok bool) {
	if plainPath(escapedPath) {
		return nil, false
	}
	dec, err := url.PathUnescape(escapedPath)
	if err != nil {
		return nil, false
	}
	for part := range strings.FieldsFuncSeq(dec, func(c rune) bool { return c == '/' || c == '\\' }) {
		if i := strings.IndexByte(part, ';'); i >= 0 {
			part = part[:i]
		}
		if part != "" {
			segs = append(segs, part)
		}
	}
	return segs, true
}

// matchesDecoded is matches for segments already decoded, ignoring letter
// case, against the rule's own lenient segments (the lenient reading: see
// Match).
func (r *Rule) matchesDecoded(method string, segs []string) bool {
	pattern := r.segs
	if r.loose != nil {
		pattern = r.loose
	}
	if (r.Method != "*" && r.Method != method) || len(segs) != len(pattern) {
		return false
	}
	for i, want := range pattern {
		switch {
		case want == "*" && segs[i] == "":
			return false
		case want != "*" && !strings.EqualFold(segs[i], want):
			return false
		}
	}
	return true
}

func (r *Rule) matches(method string, segs []string) bool {
	if (r.Method != "*" && r.Method != method) || len(segs) != len(r.segs) {
		return false
	}
	for i, want := range r.segs {
		got := segs[i]
		if want == "*" {
			if got == "" {
				return false
			}
			continue
		}
		if got != want { // the common case: nothing escaped
			dec, err := url.PathUnescape(got)
			if err != nil || dec != want {
				return false
			}
		}
	}
	return true
}
