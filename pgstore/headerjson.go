package pgstore

import (
	"encoding/json"
	"net/http"
	"slices"
)

// headerJSON is json.Marshal(h), byte for byte, as the header column
// holds it. json.Marshal takes one or two allocations per header field
// (14 for a typical answer of 6 fields, about 1 µs); this takes one for
// the whole header when its names and values are printable ASCII, as
// nearly all are, and leaves any other string to json.Marshal.
func headerJSON(h http.Header) []byte {
	if h == nil {
		return []byte("null")
	}
	var names [16]string // on the stack for most headers
	keys, size := names[:0], len("{}")
	for k, vs := range h {
		keys = append(keys, k)
		size += len(k) + len(`"":[],`)
		for _, v := range vs {
			size += len(v) + len(`"",`)
		}
	}
	slices.Sort(keys) // json.Marshal sorts a map's keys
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(appendJSONString(b, k), ':')
		vs := h[k]
		if vs == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for j, v := range vs {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendJSONString appends s as json.Marshal writes it: quoted as it is
// when it holds only printable ASCII that needs no escape (json.Marshal
// escapes <, > and & too), else as json.Marshal(s).
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
