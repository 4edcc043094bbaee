package idemkey_test

import (
	"testing"

	"github.com/idemproxy/idemproxy/idemkey"
)

// TestGenerations: generation 0 and 1 give the key idemproxy always gave
// (TestDeriveDeterministic pins it), each later generation a different one, and KeyFor gives
// what Derive gives for the same value.
func TestGenerations(t *testing.T) {
	src := idemkey.Source{Kind: idemkey.JSON, Name: "order_id"}
	r := idemkey.Request{Method: "POST", Path: "/cards", Body: []byte(`{"order_id":"F-1"}`)}
	first, _, ok := idemkey.Derive([]idemkey.Source{src}, r)
	if !ok {
		t.Fatal("no key derived")
	}
	seen := map[string]int{first: 1}
	for gen := 0; gen <= 5; gen++ {
		r.Generation = gen
		k, _, _ := idemkey.Derive([]idemkey.Source{src}, r)
		if got := idemkey.KeyFor(src, "F-1", r); got != k {
			t.Fatalf("generation %d: KeyFor = %s, Derive = %s", gen, got, k)
		}
		if gen <= 1 {
			if k != first {
				t.Fatalf("generation %d key %s differs from the first key %s", gen, k, first)
			}
			continue
		}
		if prev, dup := seen[k]; dup {
			t.Fatalf("generation %d repeats the key of generation %d", gen, prev)
		}
		seen[k] = gen
	}
}
