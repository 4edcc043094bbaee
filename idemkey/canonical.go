package idemkey

import "strings"

// Canonical is the spelling of an app's own key that idemproxy keys its
// record by and sends upstream. A UUID in its 8-4-4-4-12 hex form, in any
// letter case and with or without braces ("3F2504E0-4F89-11D3-9A0C-0305E82C3301",
// "{3f2504e0-4f89-11d3-9a0c-0305e82c3301}"), is that UUID in lower case
// without braces: the form of every key idemproxy derives or generates. An
// app that keeps such a key in a uniqueidentifier column gets it back in
// upper case (SQL Server), or in braces (ADO, COM's StringFromGUID2), and
// sends it so on its retry: one UUID in every spelling, so one operation. Any
// other key is returned as it is, and compared byte for byte, as providers
// compare keys.
func Canonical(key string) string {
	s := key
	if len(s) == 38 && s[0] == '{' && s[37] == '}' {
		s = s[1:37]
	}
	if len(s) != 36 {
		return key
	}
	lower := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return key
			}
			continue
		}
		switch {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		case 'A' <= c && c <= 'F':
			lower = false
		default:
			return key
		}
	}
	if lower && len(s) == len(key) {
		return key
	}
	return strings.ToLower(s)
}
