package proxy_test

import (
	"slices"
	"strings"
	"testing"
)

// A request line whose path holds a byte a path may not hold as it is (raw
// UTF-8, "|", "{") went upstream with the decoded path escaped anew
// (url.URL.EscapedPath): the app's escapes were lost, "%2F" became a "/",
// and the request, signed so, went to another resource than the app named
// ("/cards/a|b%2Fc/topup" left as a top-up of card "a|b" under "/c").
// README, Paths: the path signed is the path sent. The bytes that must be
// escaped are escaped, in upper case as Go does; the app's escapes stay.
func TestRawPathKeepsEscapes(t *testing.T) {
	e := newEnv(t)
	addr := strings.TrimPrefix(e.srv.URL, "http://")
	cases := []struct{ target, want string }{
		{"/v1/items/инфо%2Fx", "/v1/items/%D0%B8%D0%BD%D1%84%D0%BE%2Fx"},
		{"/cards/a|b%2Fc/topup", "/cards/a%7Cb%2Fc/topup"},
		{"/v1/items/{id}%2f%3B", "/v1/items/%7Bid%7D%2f%3B"},
		{"/v1/items/ж", "/v1/items/%D0%B6"}, // no escape of the app's: as before
		{"/v1/items/a%2Fb", "/v1/items/a%2Fb"},
		{"/v1/инфо/..%2F..%2Fadmin", ""}, // a dot-segment behind an encoded slash: 400, nothing sent
	}
	for _, c := range cases {
		line := rawRequest(t, addr, "GET "+c.target+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		status, want := " 200 ", []string{"GET " + c.want}
		if c.want == "" {
			status, want = " 400 ", nil
		}
		if !strings.Contains(line, status) {
			t.Errorf("GET %s: status line %q, want%s", c.target, line, status)
		}
		if got := e.prov.takeTargets(); !slices.Equal(got, want) {
			t.Errorf("GET %s: provider saw %q, want %q", c.target, got, want)
		}
	}
}
