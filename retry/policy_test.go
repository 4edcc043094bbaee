package retry

import (
	"maps"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	half := func() float64 { return 0.5 }
	tests := []struct {
		name  string
		p     Policy
		retry int
		rnd   func() float64
		want  time.Duration
	}{
		{"first retry", Policy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}, 0, half, 50 * time.Millisecond},
		{"doubles", Policy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}, 2, half, 200 * time.Millisecond},
		{"capped", Policy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}, 4, half, 500 * time.Millisecond},
		{"huge retry stays capped", Policy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}, 1000, half, 500 * time.Millisecond},
		{"negative retry is the first", Policy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}, -3, half, 50 * time.Millisecond},
		{"zero jitter", Policy{BaseDelay: time.Second, MaxDelay: time.Minute}, 3, func() float64 { return 0 }, 0},
		{"jitter near 1 stays below the ceiling", Policy{BaseDelay: time.Second, MaxDelay: time.Minute}, 0, func() float64 { return math.Nextafter(1, 0) }, time.Second - 1},
		{"broken rnd above 1", Policy{BaseDelay: time.Second, MaxDelay: time.Minute}, 0, func() float64 { return 7 }, time.Second - 1},
		{"broken rnd NaN", Policy{BaseDelay: time.Second, MaxDelay: time.Minute}, 0, math.NaN, 0},
		{"broken rnd negative", Policy{BaseDelay: time.Second, MaxDelay: time.Minute}, 0, func() float64 { return -1 }, 0},
		{"no base delay", Policy{MaxDelay: time.Minute}, 5, half, 0},
		{"zero MaxDelay is the default cap", Policy{BaseDelay: time.Hour}, 0, half, DefaultMaxDelay / 2},
		{"base above cap", Policy{BaseDelay: time.Hour, MaxDelay: time.Second}, 0, half, 500 * time.Millisecond},
		{"largest durations", Policy{BaseDelay: math.MaxInt64, MaxDelay: math.MaxInt64}, 62, half, 1 << 62},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Backoff(tt.retry, tt.rnd); got != tt.want {
				t.Errorf("Backoff(%d) = %v, want %v", tt.retry, got, tt.want)
			}
		})
	}
}

func TestBackoffDefaultRand(t *testing.T) {
	p := Policy{BaseDelay: time.Second, MaxDelay: time.Minute}
	for retry := range 10 {
		if d := p.Backoff(retry, nil); d < 0 || d >= p.backoffCeiling(retry) {
			t.Errorf("Backoff(%d, nil) = %v, outside [0, %v)", retry, d, p.backoffCeiling(retry))
		}
	}
}

func FuzzBackoff(f *testing.F) {
	f.Add(int64(500*time.Millisecond), int64(time.Minute), 3, 0.5)
	f.Add(int64(1), int64(0), 62, 0.999999)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), 63, 1.0)
	f.Add(int64(-5), int64(-5), -1, -0.5)
	f.Add(int64(time.Second), int64(time.Hour), 1<<40, math.Inf(1))
	f.Fuzz(func(t *testing.T, base, maxDelay int64, retry int, r float64) {
		p := Policy{BaseDelay: time.Duration(base), MaxDelay: time.Duration(maxDelay)}
		d := p.Backoff(retry, func() float64 { return r })
		ceiling := p.backoffCeiling(retry)
		if ceiling < 0 || ceiling > p.maxDelay() {
			t.Fatalf("ceiling %v outside [0, %v]", ceiling, p.maxDelay())
		}
		if d < 0 || d > p.maxDelay() {
			t.Fatalf("Backoff = %v outside [0, MaxDelay %v]", d, p.maxDelay())
		}
		if ceiling > 0 && d >= ceiling || ceiling == 0 && d != 0 {
			t.Fatalf("Backoff = %v, not in [0, %v)", d, ceiling)
		}
	})
}

// A dial failure waits at least half the backoff ceiling, whatever the
// random draw: DialBackoff lies in [ceiling/2, ceiling).
func TestDialBackoff(t *testing.T) {
	p := Policy{BaseDelay: 500 * time.Millisecond, MaxDelay: 10 * time.Second}
	for retry, ceiling := range []time.Duration{500 * ms, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second} {
		for _, f := range []float64{0, 1e-9, 0.5, 0.999999} {
			d := p.DialBackoff(retry, func() float64 { return f })
			if d < ceiling/2 || d >= ceiling {
				t.Errorf("DialBackoff(%d, %v) = %v, want in [%v, %v)", retry, f, d, ceiling/2, ceiling)
			}
		}
	}
}

func TestMaxAttemptsLimit(t *testing.T) {
	for in, want := range map[int]int{-1: 1, 0: 1, 1: 1, 5: 5, MaxAttemptsLimit: MaxAttemptsLimit, 1_000_000: MaxAttemptsLimit} {
		if got := (Policy{MaxAttempts: in}).maxAttempts(); got != want {
			t.Errorf("MaxAttempts %d: %d attempts, want %d", in, got, want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 10, 7, 9, 13, 2, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"2", 2 * time.Second, true},
		{"60", time.Minute, true},
		{"0", 0, true},
		{" 5 ", 5 * time.Second, true},
		{"007", 7 * time.Second, true},
		{date(90 * time.Second), 90 * time.Second, true},
		{date(-time.Hour), 0, true},
		{"Wednesday, 07-Oct-26 09:13:32 GMT", 30 * time.Second, true}, // RFC 850, obsolete but valid
		{"Wed Oct  7 09:14:02 2026", time.Minute, true},               // asctime
		{"99999999999999999999", math.MaxInt64, true},                 // saturates; callers cap
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", math.MaxInt64, true},
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 2 * time.Second, true}, // a fraction rounds up: never shorter than asked
		{"0.5", time.Second, true},
		{"0.001", time.Second, true},
		{"2.0", 2 * time.Second, true},
		{"2.000", 2 * time.Second, true},
		{" 1.25 ", 2 * time.Second, true},
		{"9223372036.5", math.MaxInt64, true}, // rounding up saturates too
		{"99999999999999999999.5", math.MaxInt64, true},
		{"1.", 0, false},
		{".5", 0, false},
		{"1.5.2", 0, false},
		{"1,5", 0, false},
		{"1.5s", 0, false},
		{"-1.5", 0, false},
		{"+3", 0, false},
		{"soon", 0, false},
		{"2026-10-07T09:14:02Z", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, ok := ParseRetryAfter(tt.in, now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2026, 10, 7, 9, 13, 2, 0, time.UTC)
	for _, s := range []string{
		"2", "0", "120", "", "-1", "1.5", " 3 ", "99999999999999999999",
		"Wed, 21 Oct 2015 07:28:00 GMT", "Sun, 06 Nov 2094 08:49:37 GMT",
		"Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
	} {
		f.Add(s)
	}
	capped := Policy{MaxDelay: time.Minute}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := ParseRetryAfter(v, now)
		if d < 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, negative", v, d)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v with ok=false", v, d)
		}
		if s := strings.TrimSpace(v); s != "" && isDigits(s) && !ok {
			t.Fatalf("ParseRetryAfter(%q): delay-seconds rejected", v)
		}
		if whole, _, dot := strings.Cut(strings.TrimSpace(v), "."); ok && dot && whole != "" && isDigits(whole) {
			if w, _ := ParseRetryAfter(whole, now); d < w {
				t.Fatalf("ParseRetryAfter(%q) = %v, shorter than its whole part %v", v, d, w)
			}
			if d%time.Second != 0 && d != math.MaxInt64 {
				t.Fatalf("ParseRetryAfter(%q) = %v, not whole seconds", v, d)
			}
		}
		if c := capped.capDelay(d); c < 0 || c > time.Minute {
			t.Fatalf("capped %q = %v outside [0, 1m]", v, c)
		}
	})
}

func TestParseStatuses(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{"429,500,502,503,504", []int{429, 500, 502, 503, 504}, false},
		{" 503 , ,429,", []int{429, 503}, false},
		{"", nil, false},
		{"abc", nil, true},
		{"99", nil, true},
		{"600", nil, true},
		{"500;502", nil, true},
		{"408,409,425", []int{408, 409, 425}, false},
		{"200", nil, true},
		{"503,201", nil, true},
		{"302", nil, true},
		{"100", nil, true},
		{"401", nil, true},
		{"429,403", nil, true},
		{"429,500-505", []int{429, 500, 501, 502, 503, 504, 505}, false},
		{" 500 - 502 ,503", []int{500, 501, 502, 503}, false},
		{"500-599", func() (s []int) {
			for n := 500; n <= 599; n++ {
				s = append(s, n)
			}
			return s
		}(), false},
		{"504-504", []int{504}, false},
		{"599-500", nil, true},
		{"500-600", nil, true},
		{"500-", nil, true},
		{"-500", nil, true},
		{"500-502-504", nil, true},
		{"+500", nil, true},
		{"400-500", nil, true},
		{"300-599", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseStatuses(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseStatuses(%q) err = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if tt.wantErr {
				if !strings.Contains(err.Error(), "statuses") {
					t.Errorf("error %q does not name what failed", err)
				}
				return
			}
			want := make(map[int]bool)
			for _, s := range tt.want {
				want[s] = true
			}
			if !maps.Equal(got, want) {
				t.Errorf("ParseStatuses(%q) = %v, want %v", tt.in, got, want)
			}
		})
	}
}

func TestParseCodes(t *testing.T) {
	got := ParseCodes(" idempotency.in_progress,payout.funds_maturing, ,payout.frozen,")
	want := map[string]bool{"idempotency.in_progress": true, "payout.funds_maturing": true, "payout.frozen": true}
	if !maps.Equal(got, want) {
		t.Errorf("ParseCodes = %v, want %v", got, want)
	}
	if got := ParseCodes(""); len(got) != 0 {
		t.Errorf("ParseCodes(\"\") = %v, want empty", got)
	}
}
