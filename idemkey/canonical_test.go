package idemkey

import "testing"

// A UUID key in upper or mixed case or in braces is the lower-case UUID
// without braces that idemproxy derives; anything else stays as it came.
func TestCanonical(t *testing.T) {
	const u = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
	for in, want := range map[string]string{
		u:                                        u,
		"3F2504E0-4F89-11D3-9A0C-0305E82C3301":   u,
		"3F2504e0-4f89-11D3-9a0c-0305E82C3301":   u,
		"{3F2504E0-4F89-11D3-9A0C-0305E82C3301}": u,
		"{" + u + "}":                            u,
		// Not a UUID in its 8-4-4-4-12 form: kept byte for byte.
		"3F2504E04F8911D39A0C0305E82C3301":              "3F2504E04F8911D39A0C0305E82C3301",
		"urn:uuid:3F2504E0-4F89-11D3-9A0C-0305E82C3301": "urn:uuid:3F2504E0-4F89-11D3-9A0C-0305E82C3301",
		"3F2504E0-4F89-11D3-9A0C-0305E82C330G":          "3F2504E0-4F89-11D3-9A0C-0305E82C330G",
		"3F2504E0_4F89-11D3-9A0C-0305E82C3301":          "3F2504E0_4F89-11D3-9A0C-0305E82C3301",
		"{3F2504E0-4F89-11D3-9A0C-0305E82C3301":         "{3F2504E0-4F89-11D3-9A0C-0305E82C3301",
		"(3F2504E0-4F89-11D3-9A0C-0305E82C3301)":        "(3F2504E0-4F89-11D3-9A0C-0305E82C3301)",
		"Order-ABC":                                     "Order-ABC",
		"{abc}":                                         "{abc}",
	} {
		if got := Canonical(in); got != want {
			t.Errorf("Canonical(%q) = %q, want %q", in, got, want)
		}
	}
}
