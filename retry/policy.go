// Package retry runs the upstream attempt sequence of one request: it sends
// the same request (same Idempotency-Key, same body bytes) again after
// failures whose outcome is unknown or temporary, waits between attempts with
// capped exponential backoff and full jitter or the provider's Retry-After,
// bounds every attempt and the whole sequence in time, and paces attempts
// through a [ratelimit.Gate].
//
// The one rule (docs/contract.md):
// never send a new key for an operation whose outcome is unknown. This
// package never touches the key; every attempt is a clone of the caller's
// request. Only signature headers change, and they are added below this
// package by a re-signing RoundTripper that each attempt passes through.
package retry

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultMaxDelay is the cap on one wait when [Policy.MaxDelay] is zero
// (the IDEMPROXY_RETRY_MAX_DELAY default). A zero cap is not "no cap":
// an uncapped Retry-After would let one response pause a provider for days.
const DefaultMaxDelay = 60 * time.Second

// MaxAttemptsLimit is the most attempts one request may make
// (IDEMPROXY_RETRY_MAX_ATTEMPTS above it is refused at start). With the
// backoff doubling from BaseDelay, 20 attempts already span the longest
// sensible budget; more only multiply the load on a provider that is failing.
const MaxAttemptsLimit = 20

// Policy says which failures are retried and how long to wait.
type Policy struct {
	// MaxAttempts counts attempts including the first; below 1 means 1,
	// above MaxAttemptsLimit means MaxAttemptsLimit.
	MaxAttempts int
	// BaseDelay is the backoff base: the n-th retry (from 0) waits a random
	// time in [0, min(MaxDelay, BaseDelay·2ⁿ)). Zero means no backoff wait.
	BaseDelay time.Duration
	// MaxDelay caps every wait, Retry-After included; zero means
	// DefaultMaxDelay.
	MaxDelay time.Duration
	// Budget is the total time for one request's attempts and waits, from the
	// start of the sequence; zero means no limit beyond MaxAttempts.
	Budget time.Duration
	// AttemptTimeout bounds one attempt, reading the response body included;
	// zero means none (the Budget still bounds it).
	AttemptTimeout time.Duration
	// Statuses are the response statuses retried for protected requests,
	// e.g. 429, 500, 502, 503, 504. Nil means none.
	Statuses map[int]bool
	// Codes are the business codes that make a 4xx response retriable for
	// protected requests, found at "error.code" or at "code" of a JSON body,
	// e.g. payout.funds_maturing. Nil means none.
	Codes map[string]bool
	// Classify decides each answer's disposition. Nil means
	// DefaultClassify, which reads Statuses and Codes; see Dispose for the
	// invariants every classifier is held to.
	Classify Classifier
}

func (p Policy) maxAttempts() int { return min(max(p.MaxAttempts, 1), MaxAttemptsLimit) }

func (p Policy) maxDelay() time.Duration {
	if p.MaxDelay <= 0 {
		return DefaultMaxDelay
	}
	return p.MaxDelay
}

// capDelay limits a wait (a Retry-After, typically) to the policy's cap.
func (p Policy) capDelay(d time.Duration) time.Duration {
	return min(max(d, 0), p.maxDelay())
}

// Backoff returns the wait before retry number retry (0 for the first retry)
// with full jitter: rnd()·min(MaxDelay, BaseDelay·2^retry), so in
// [0, ceiling). rnd returns a float in [0, 1); nil means math/rand/v2.
// Backoff never overflows and never returns a negative value or one above
// the cap, whatever retry and rnd are.
//
// Full jitter (not "delay + small random") spreads clients that failed
// together over the whole interval, so they do not hit the provider again
// at once (providers ask for jitter explicitly).
func (p Policy) Backoff(retry int, rnd func() float64) time.Duration {
	ceiling := p.backoffCeiling(retry)
	if ceiling <= 0 {
		return 0
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	f := rnd()
	if !(f > 0) { // also catches NaN
		return 0
	}
	d := f * float64(ceiling)
	if d >= float64(ceiling) {
		// rnd broke its contract (or rounding reached the top): stay below
		// the cap without converting an out-of-range float to an integer.
		return ceiling - 1
	}
	return min(time.Duration(d), ceiling)
}

// DialBackoff is the wait after an attempt that never reached the upstream
// (connection refused, no file descriptor): "equal jitter", half the
// ceiling plus a random half, so at least BaseDelay/2 (with the
// ceiling doubling per retry). A refused connection fails in microseconds;
// retrying it at once, or after a full-jitter wait that may be near zero,
// spends every attempt within milliseconds, while a provider restart takes
// longer than that.
func (p Policy) DialBackoff(retry int, rnd func() float64) time.Duration {
	half := p.backoffCeiling(retry) / 2
	return half + Policy{BaseDelay: half, MaxDelay: half}.Backoff(0, rnd)
}

// backoffCeiling is min(MaxDelay, BaseDelay·2^retry), computed without
// overflow: the shift is taken only when it cannot pass the cap.
func (p Policy) backoffCeiling(retry int) time.Duration {
	limit := p.maxDelay()
	if p.BaseDelay <= 0 {
		return 0
	}
	retry = max(retry, 0)
	if retry >= 63 || p.BaseDelay > limit>>uint(retry) {
		return limit
	}
	return min(p.BaseDelay<<uint(retry), limit)
}

// ParseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3): either
// delay-seconds or an HTTP-date, which is turned into the time left after now.
// A date in the past gives 0. Delay-seconds are a non-negative decimal
// integer; a fraction such as "1.5", which RFC 9110 does not allow but
// providers send (and clients read with float()), is rounded UP to whole
// seconds, so the wait is never shorter than the provider asked. Anything
// else, including an empty value, gives ok == false. A delay too large for a
// time.Duration saturates at the largest one; callers cap it (Policy.MaxDelay).
//
// A 0 is returned as it is: the caller decides what a zero wait means
// (Transport falls back to its backoff, so waits never collapse).
func ParseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if whole, frac, dot := strings.Cut(v, "."); isDigits(whole) && whole != "" && (!dot || isDigits(frac) && frac != "") {
		d = secondsDuration(whole)
		if strings.Trim(frac, "0") != "" {
			d = min(d, maxDuration-time.Second) + time.Second
		}
		return d, true
	}
	t, err := http.ParseTime(v) // RFC 9110 IMF-fixdate and the two obsolete forms
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true // Sub saturates instead of overflowing
}

const maxDuration = time.Duration(1<<63 - 1)

func isDigits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// secondsDuration converts delay-seconds (digits only) to a duration,
// saturating instead of overflowing.
func secondsDuration(digits string) time.Duration {
	const maxSeconds = int64(maxDuration) / int64(time.Second)
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n > maxSeconds { // the only possible error here is range
		return maxDuration
	}
	return time.Duration(n) * time.Second
}

// ParseStatuses parses a comma list of HTTP statuses such as
// "429,500,502,503,504" (IDEMPROXY_RETRY_STATUSES). An item may also be an
// inclusive range such as "500-599", for a provider that says "retry every
// status of 500 or more" (payments) or "retry any 5xx" (cards). Spaces and
// empty items are ignored; an item that is not a status in 100–599, or a
// range whose start is above its end, is an error, and so is any item that
// takes in a status that can never be retried.
func ParseStatuses(s string) (map[int]bool, error) {
	out := make(map[int]bool)
	for _, item := range splitList(s) {
		lo, hi, err := parseStatusItem(item)
		if err != nil {
			return nil, fmt.Errorf("retry: parse statuses: %q: %w", item, err)
		}
		for n := lo; n <= hi; n++ {
			if n < 400 || n == http.StatusUnauthorized || n == http.StatusForbidden {
				// A success or a redirect is an answer, and a refused credential
				// is refused again: retrying them would resend a done operation
				// or hammer the provider until the budget ends.
				return nil, fmt.Errorf("retry: parse statuses: %d: %w", n, errNotRetriable)
			}
			out[n] = true
		}
	}
	return out, nil
}

// parseStatusItem parses one item of a status list: a status, or a range
// "A-B" of statuses with A <= B.
func parseStatusItem(item string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(item, "-")
	if lo, err = parseStatus(a); err != nil {
		return 0, 0, err
	}
	if !isRange {
		return lo, lo, nil
	}
	if hi, err = parseStatus(b); err != nil {
		return 0, 0, err
	}
	if lo > hi {
		return 0, 0, errBadRange
	}
	return lo, hi, nil
}

func parseStatus(s string) (int, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil || !isDigits(s) || n < 100 || n > 599 {
		return 0, errBadStatus
	}
	return n, nil
}

var (
	errBadStatus    = errors.New("not an HTTP status (100-599) or a range of them such as 500-599")
	errBadRange     = errors.New("range starts above its end")
	errNotRetriable = errors.New("1xx, 2xx, 3xx, 401 and 403 cannot be retried")
)

// ParseCodes parses a comma list of business codes such as
// "payout.funds_maturing,payout.frozen" (IDEMPROXY_RETRY_CODES). Spaces and
// empty items are ignored. Codes are compared exactly, case included.
func ParseCodes(s string) map[string]bool {
	out := make(map[string]bool)
	for _, item := range splitList(s) {
		out[item] = true
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
