package idemkey

import (
	"testing"
	"time"
)

func TestWindowKey(t *testing.T) {
	fp := Fingerprint(postJSON(`{"amount":"10"}`))
	other := Fingerprint(postJSON(`{"amount":"11"}`))
	k := WindowKey(fp, time.Minute, 100, "")
	same := []string{WindowKey(fp, time.Minute, 100, "")}
	different := []string{
		WindowKey(other, time.Minute, 100, ""),
		WindowKey(fp, time.Minute, 101, ""),
		WindowKey(fp, 2*time.Minute, 100, ""),
		WindowKey(fp, time.Minute, 100, "app-a"),
	}
	for _, s := range same {
		if s != k {
			t.Errorf("same inputs, keys %s and %s", s, k)
		}
	}
	for i, d := range different {
		if d == k {
			t.Errorf("case %d: different input, same key %s", i, k)
		}
	}
	if len(k) != 36 {
		t.Errorf("key %q is not a UUID", k)
	}
}

func TestWindowPeriod(t *testing.T) {
	w := 10 * time.Minute
	base := time.Unix(0, 0).Add(1000 * w)
	cases := []struct {
		t    time.Time
		want int64
	}{
		{base, 1000},
		{base.Add(w - 1), 1000},
		{base.Add(w), 1001},
		{base.Add(-1), 999},
		{time.Unix(0, -1), -1},
		{time.Unix(0, 0), 0},
	}
	for _, c := range cases {
		if got := WindowPeriod(c.t, w); got != c.want {
			t.Errorf("WindowPeriod(%v) = %d, want %d", c.t, got, c.want)
		}
	}
}
