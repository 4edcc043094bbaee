package idemkey

import (
	"errors"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
)

func TestFromHeader(t *testing.T) {
	long := strings.Repeat("k", MaxLen)
	tests := []struct {
		name   string
		values []string // Idempotency-Key lines; nil = absent
		want   string
	}{
		{"bare uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"bare token with punctuation", []string{"order:42/pay=1"}, "order:42/pay=1"},
		{"surrounding whitespace", []string{"  abc\t"}, "abc"},
		{"sf-string", []string{`"abc"`}, "abc"},
		{"sf-string with space and comma", []string{`"a b, c"`}, "a b, c"},
		{"sf-string escapes", []string{`"a\"b\\c"`}, `a"b\c`},
		{"exactly MaxLen", []string{long}, long},
		{"MaxLen after unescaping", []string{`"` + strings.Repeat(`\\`, MaxLen) + `"`}, strings.Repeat(`\`, MaxLen)},
		{"repeated identical lines", []string{"abc", "abc"}, "abc"},
		{"bare and quoted forms of one key", []string{"abc", `"abc"`}, "abc"},
		{"folded identical members", []string{"abc, abc"}, "abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"Idempotency-Key": tt.values}
			got, present, err := FromHeader(h)
			if err != nil || !present || got != tt.want {
				t.Fatalf("FromHeader(%q) = %q, %v, %v; want %q, true, nil", tt.values, got, present, err, tt.want)
			}
		})
	}
}

func TestFromHeaderAbsent(t *testing.T) {
	for _, h := range []http.Header{nil, {}, {"X-Other": {"abc"}}} {
		got, present, err := FromHeader(h)
		if got != "" || present || err != nil {
			t.Errorf("FromHeader(%v) = %q, %v, %v; want \"\", false, nil", h, got, present, err)
		}
	}
}

func TestFromHeaderInvalid(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		reason string
	}{
		{"empty", []string{""}, "empty"},
		{"only spaces", []string{"   "}, "empty"},
		{"empty sf-string", []string{`""`}, "empty"},
		{"too long", []string{strings.Repeat("k", MaxLen+1)}, "longer than 255"},
		{"too long quoted", []string{`"` + strings.Repeat("k", MaxLen+1) + `"`}, "longer than 255"},
		{"control character", []string{"ab\x01c"}, "control character"},
		{"DEL", []string{"abc\x7f"}, "control character"},
		{"newline in sf-string", []string{"\"a\nb\""}, "control character"},
		{"unicode", []string{"заказ-1"}, "non-ASCII"},
		{"unicode in sf-string", []string{`"café"`}, "non-ASCII"},
		{"inner space unquoted", []string{"a b"}, "whitespace"},
		{"sf-string starting with a space", []string{`" abc"`}, "space at the start or end"},
		{"sf-string ending with a space", []string{`"abc "`}, "space at the start or end"},
		{"sf-string of spaces", []string{`"   "`}, "space at the start or end"},
		{"quote inside bare", []string{`ab"c`}, "quote"},
		{"unterminated sf-string", []string{`"abc`}, "no closing quote"},
		{"trailing backslash", []string{`"abc\`}, "bad escape"},
		{"bad escape", []string{`"a\nb"`}, "bad escape"},
		{"sf parameters", []string{`"abc";x=1`}, "after the closing quote"},
		{"different lines", []string{"abc", "abd"}, "differ"},
		{"different members", []string{"abc, abd"}, "differ"},
		{"empty member", []string{"abc,"}, "empty"},
		{"invalid second line", []string{"abc", ""}, "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, present, err := FromHeader(http.Header{"Idempotency-Key": tt.values})
			if !present || got != "" || !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("FromHeader(%q) = %q, %v, %v; want \"\", true, ErrInvalidKey", tt.values, got, present, err)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q does not give the reason %q", err, tt.reason)
			}
		})
	}
}

// The key an answer carries reads back as the key the app sent: only a
// quoted key with a space, '"' or ',' is answered quoted.
func TestHeaderValue(t *testing.T) {
	for _, tt := range []struct{ sent, answered string }{
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{`"abc"`, "abc"},
		{`a\b`, `a\b`},
		{`"pay 7, retry"`, `"pay 7, retry"`},
		{`"say \"hi\""`, `"say \"hi\""`},
		{`"a\\b c"`, `"a\\b c"`},
	} {
		key, _, err := FromHeader(http.Header{"Idempotency-Key": {tt.sent}})
		if err != nil {
			t.Fatalf("FromHeader(%s): %v", tt.sent, err)
		}
		got := HeaderValue(key)
		if got != tt.answered {
			t.Errorf("HeaderValue(%q) = %s, want %s", key, got, tt.answered)
		}
		again, _, err := FromHeader(http.Header{"Idempotency-Key": {got}})
		if err != nil || again != key {
			t.Errorf("the answered %s reads back as %q, %v; want %q", got, again, err, key)
		}
	}
}

func FuzzFromHeader(f *testing.F) {
	for _, s := range []string{"abc", `"a\"b"`, `"abc`, "a, b", `"a,b", "a,b"`, "\x00", `"\\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, present, err := FromHeader(http.Header{"Idempotency-Key": {s}})
		if !present {
			t.Fatal("present = false for a header that is there")
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) || key != "" {
				t.Fatalf("FromHeader(%q) = %q, %v", s, key, err)
			}
			return
		}
		if key == "" || len(key) > MaxLen {
			t.Fatalf("FromHeader(%q) accepted a key of length %d", s, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("FromHeader(%q) accepted byte %#x", s, key[i])
			}
		}
		// The key survives as a field value (the header sent upstream and
		// answered): HTTP trims nothing from it.
		if textproto.TrimString(key) != key {
			t.Fatalf("FromHeader(%q) accepted %q, which a header carries as %q", s, key, textproto.TrimString(key))
		}
		// The key as an answer carries it reads back the same.
		if again, _, err := FromHeader(http.Header{"Idempotency-Key": {HeaderValue(key)}}); err != nil || again != key {
			t.Fatalf("answered as %s, %q read back as %q, %v", HeaderValue(key), key, again, err)
		}
		// The key written back as an sf-string reads back the same.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		again, _, err := FromHeader(http.Header{"Idempotency-Key": {quoted}})
		if err != nil || again != key {
			t.Fatalf("sf-string %s of %q read back as %q, %v", quoted, key, again, err)
		}
	})
}
