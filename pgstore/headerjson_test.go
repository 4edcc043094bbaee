package pgstore

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
)

// TestHeaderJSONIsJSONMarshal: the header column gets the bytes
// json.Marshal gave it, whatever the header holds.
func TestHeaderJSONIsJSONMarshal(t *testing.T) {
	many := http.Header{}
	for i := range 40 {
		many["X-Field-"+strconv.Itoa(i)] = []string{strconv.Itoa(i)}
	}
	headers := []http.Header{
		nil,
		{},
		{"Content-Type": {"application/json"}},
		{"B": {"2"}, "A": {"1", "1b"}, "a": {"lower"}, "C": nil, "D": {}, "E": {""}},
		{"X-Html": {"<b>&amp;</b>"}, "X-Quote": {`say "hi" \ bye`}, "X-Ctl": {"a\tb\nc\rd\x00e\x1f\x7f\b\f"}},
		{"X-Utf8": {"naïve €", "\u2028\u2029", "\xff\xfe invalid", "日本"}, "Ключ": {"значение"}},
		{"": {""}, " ": {" "}, "~": {"~"}},
		many,
	}
	for _, h := range headers {
		want, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		if got := headerJSON(h); !bytes.Equal(got, want) {
			t.Errorf("headerJSON(%q) =\n%s\nwant (json.Marshal)\n%s", h, got, want)
		}
	}
}

// TestHeaderJSONAllocatesOnce: a typical answer's header is encoded with
// one allocation; json.Marshal made 14.
func TestHeaderJSONAllocatesOnce(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Content-Length": {"123"},
		"Date": {"Wed, 02 Dec 2026 16:00:00 GMT"}, "X-Request-Id": {"req_123456"},
		"Idempotency-Key": {"0d7f3c1e-5b2a-5c1d-8e9f-123456789abc"}, "Idempotent-Attempts": {"1"}}
	if n := testing.AllocsPerRun(100, func() { headerJSON(h) }); n > 1 {
		t.Errorf("headerJSON of a 6-field header: %v allocations, want 1", n)
	}
}
