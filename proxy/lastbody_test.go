package proxy

import (
	"bytes"
	"testing"

	"github.com/idemproxy/idemproxy/store"
)

// TestLastBodyBounded: a parked record keeps at most store.MaxLastBody bytes
// of the ambiguous answer, in a copy of its own.
func TestLastBodyBounded(t *testing.T) {
	long := bytes.Repeat([]byte("x"), store.MaxLastBody+10)
	cases := []struct {
		name string
		in   []byte
		want []byte
	}{
		{"no answer", nil, nil},
		{"empty answer", []byte{}, nil},
		{"short answer", []byte(`{"payment_id":"pay_1"}`), []byte(`{"payment_id":"pay_1"}`)},
		{"long answer", long, long[:store.MaxLastBody]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := lastBody(c.in)
			if !bytes.Equal(got, c.want) || (got == nil) != (c.want == nil) {
				t.Fatalf("lastBody = %d bytes, want %d", len(got), len(c.want))
			}
			if len(got) > 0 {
				c.in[0] = '!'
				if got[0] == '!' {
					t.Fatal("lastBody shares the answer's buffer")
				}
			}
		})
	}
}
