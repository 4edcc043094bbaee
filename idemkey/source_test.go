package idemkey

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseSources(t *testing.T) {
	tests := []struct {
		in   string
		want []Source
	}{
		{"json:order_id", []Source{{JSON, "order_id"}}},
		{"json:payment.order.id", []Source{{JSON, "payment.order.id"}}},
		{"form:order_id", []Source{{Form, "order_id"}}},
		{"header:x-order-id", []Source{{Header, "X-Order-Id"}}},
		{"query:orderId", []Source{{Query, "orderId"}}},
		{"json:order_id,form:order_id,header:X-Request-Id,query:id", []Source{
			{JSON, "order_id"}, {Form, "order_id"}, {Header, "X-Request-Id"}, {Query, "id"},
		}},
		{" json : order_id , query:id ", []Source{{JSON, "order_id"}, {Query, "id"}}},
		{"JSON:order_id,Header:X-Id", []Source{{JSON, "order_id"}, {Header, "X-Id"}}},
		{"json:a:b", []Source{{JSON, "a:b"}}},
		{"json:заказ.номер", []Source{{JSON, "заказ.номер"}}},
		{"form:a[b]", []Source{{Form, "a[b]"}}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSources(tt.in)
			if err != nil {
				t.Fatalf("ParseSources(%q): %v", tt.in, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("ParseSources(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseSourcesErrors(t *testing.T) {
	tests := []struct {
		in, wantInErr string
	}{
		{"", "no sources"},
		{"   ", "no sources"},
		{"json:order_id,", `entry 2 ""`},
		{",json:order_id", `entry 1 ""`},
		{"json:a,,json:b", `entry 2 ""`},
		{"order_id", `entry 1 "order_id"`},
		{"body:order_id", `unknown kind "body"`},
		{":order_id", `unknown kind ""`},
		{"json:", "empty name"},
		{"header:  ", "empty name"},
		{"json:a..b", `"json:a..b": empty segment`},
		{"json:.a", "empty segment"},
		{"json:a.", "empty segment"},
		{"json:.", "empty segment"},
		{"json:order id", "whitespace"},
		{"form:a\tb", "whitespace"},
		{"query:a\x00", "control"},
		{"json:\xff", "UTF-8"},
		{"header:X Order", "whitespace"},
		{"header:X/Order", "not a token"},
		{"header:Заказ", "not a token"},
		{"json:ok,header:a:b", `entry 2 "header:a:b"`},
		// Another separator than the comma: one source that no request
		// has, where the operator meant two (with MISSING_KEY=generate,
		// every retry of an order a new key).
		{"json:order_id;header:X-Order-Id", `entry 1 "json:order_id;header:X-Order-Id": name holds ";" and then another source`},
		{"json:order_id; header:X-Order-Id", `";" and then another source`},
		{"json:order_id|query:id", `"|" and then another source`},
		{"header:X-Id|json:order_id", `"|" and then another source`},
		{"form:order_id;FORM:id", `";" and then another source`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSources(tt.in)
			if err == nil {
				t.Fatalf("ParseSources(%q) = %v, want an error", tt.in, got)
			}
			if !errors.Is(err, ErrInvalidSource) {
				t.Errorf("error %v does not wrap ErrInvalidSource", err)
			}
			if !strings.Contains(err.Error(), tt.wantInErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantInErr)
			}
		})
	}
}

func TestSourceString(t *testing.T) {
	tests := []struct {
		src  Source
		want string
	}{
		{Source{JSON, "a.b"}, "json:a.b"},
		{Source{Form, "f"}, "form:f"},
		{Source{Header, "X-Id"}, "header:X-Id"},
		{Source{Query, "q"}, "query:q"},
		{Source{}, "Kind(0):"},
		{Source{Kind(9), "x"}, "Kind(9):x"},
	}
	for _, tt := range tests {
		if got := tt.src.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.src, got, tt.want)
		}
	}
}

func TestDefaultSourcesParse(t *testing.T) {
	got, err := ParseSources(DefaultSources)
	if err != nil || !slices.Equal(got, []Source{{JSON, "order_id"}}) {
		t.Fatalf("ParseSources(DefaultSources) = %v, %v", got, err)
	}
}

// joinSources writes sources back in IDEMPROXY_KEY_SOURCES syntax.
func joinSources(srcs []Source) string {
	parts := make([]string, len(srcs))
	for i, s := range srcs {
		parts[i] = s.String()
	}
	return strings.Join(parts, ",")
}

func FuzzParseSources(f *testing.F) {
	for _, s := range []string{
		"json:order_id", "json:a.b.c,form:f,header:x-id,query:q", " JSON : a ", "json:a..b",
		"header:a b", "", ",", "json:", "query:%zz", "form:a=b&c", "json:\u00a0a",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		srcs, err := ParseSources(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidSource) {
				t.Fatalf("error %v does not wrap ErrInvalidSource", err)
			}
			return
		}
		if len(srcs) == 0 {
			t.Fatalf("ParseSources(%q) returned no sources and no error", s)
		}
		again, err := ParseSources(joinSources(srcs))
		if err != nil {
			t.Fatalf("re-parsing %q (from %q): %v", joinSources(srcs), s, err)
		}
		if !slices.Equal(again, srcs) {
			t.Fatalf("round trip of %q: %v, then %v", s, srcs, again)
		}
	})
}
