package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The README's test command is the one .ci/run runs: the same flags (its
// -timeout 30m was missing, so the README's command ran under Go's default
// 10 minutes per package), and the README names every variable .ci/run
// exports to make missing PostgreSQL or Docker a failure instead of a skip.
func TestREADMETestCommand(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	flags := func(line string) []string {
		var f []string
		fields := strings.Fields(line)
		for i, w := range fields {
			if strings.HasPrefix(w, "-") {
				if w == "-timeout" && i+1 < len(fields) {
					w += " " + fields[i+1]
				}
				f = append(f, w)
			}
		}
		slices.Sort(f)
		return slices.DeleteFunc(f, func(s string) bool { return s == "-v" })
	}
	m := regexp.MustCompile("Run the tests[^\n]*\n\n```sh\n(go test [^\n]*)\n```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("the README's Quick start has no sh block with its test command after \"Run the tests\"")
	}
	want := flags(string(m[1]))
	runs := 0
	for _, line := range strings.Split(string(ci), "\n") {
		if !strings.HasPrefix(line, "go test ") {
			continue
		}
		runs++
		if got := flags(line); !slices.Equal(got, want) {
			t.Errorf(".ci/run runs %q with flags %v; the README's test command %q has %v", line, got, m[1], want)
		}
	}
	if runs == 0 {
		t.Fatal(".ci/run runs no go test")
	}
	for _, e := range regexp.MustCompile(`(?m)^export (IDEMPROXY_[A-Z_]+)=`).FindAllStringSubmatch(string(ci), -1) {
		if !strings.Contains(string(readme), e[1]) {
			t.Errorf(".ci/run sets %s, which the README does not mention", e[1])
		}
	}
}
