package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/retry"
)

// docSection returns the text of path's section under heading (a whole
// line, "## ..."), up to the next heading of any level.
func docSection(t *testing.T, path, heading string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, s, ok := strings.Cut(string(raw), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", path, heading)
	}
	if i := regexp.MustCompile(`\n#+ `).FindStringIndex(s); i != nil {
		s = s[:i[0]]
	}
	return s
}

// docs/contract.md's table of the headers idemproxy adds to answers names
// every one it sets: Idemproxy-Reconciled (an answer found by the status
// probe or given by an operator's records resolve, replayed with it) was
// missing, so an app reading the contract could not tell such an answer from
// the provider's own.
func TestContractAnswerHeaders(t *testing.T) {
	section := docSection(t, "docs/contract.md", "## Headers idemproxy adds to answers")
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Za-z-]+)[:`]").FindAllStringSubmatch(section, -1) {
		listed[m[1]] = true
	}
	for _, h := range []string{"Idempotency-Key", proxy.ReplayedHeader, retry.AttemptsHeader, retry.ReconciledHeader} {
		if !listed[h] {
			t.Errorf("docs/contract.md's Headers idemproxy adds to answers does not list %s", h)
		}
	}
}

// What happens to a record whose final answer could not be stored is said
// once in behaviour (TestUnstoredAnswerKeptUnknown, TestUnstoredAnswerOnFullDisk:
// kept as unknown, never released) and must be said so wherever the docs say
// it: docs/storage.md's "When the store cannot be written" still said the
// in-flight record is released and the provider's idempotency answers the
// retry, against its own step 5 and the README.
func TestStorageDocUnstoredAnswer(t *testing.T) {
	section := docSection(t, "docs/storage.md", "## When the store cannot be written")
	_, bullet, ok := strings.Cut(section, "\n- `Complete` fails")
	if !ok {
		t.Fatal("docs/storage.md's When the store cannot be written has no bullet on Complete failing")
	}
	bullet, _, _ = strings.Cut(bullet, "\n- ")
	if strings.Contains(bullet, "is released") || !strings.Contains(bullet, "`unknown`") {
		t.Errorf("docs/storage.md says of a Complete that failed:%s\nwant: the record is kept as `unknown`, not released", bullet)
	}
}

// A request whose body did not arrive in full (a client stalled past the
// server's read timeout) is answered 400 bad_request (proxy.ErrBodyUnread);
// neither error table said so.
func TestErrorTablesBodyUnread(t *testing.T) {
	if proxy.ErrBodyUnread.Status != 400 || proxy.ErrBodyUnread.Code != proxy.CodeBadRequest {
		t.Fatalf("ErrBodyUnread is %d %s; this test checks the tables' 400 bad_request row", proxy.ErrBodyUnread.Status, proxy.ErrBodyUnread.Code)
	}
	for _, c := range []struct{ path, heading string }{
		{"README.md", "### Errors idemproxy answers itself"},
		{"docs/contract.md", "## Errors idemproxy answers itself"},
	} {
		found := false
		for _, line := range strings.Split(docSection(t, c.path, c.heading), "\n") {
			if strings.HasPrefix(line, "| 400 | `bad_request` |") && strings.Contains(line, "did not arrive in full") && strings.Contains(line, "read timeout") {
				found = true
			}
		}
		if !found {
			t.Errorf("%s's %s has no 400 bad_request row for a body that did not arrive in full (the read timeout)", c.path, c.heading)
		}
	}
}
