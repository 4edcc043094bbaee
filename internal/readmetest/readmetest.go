// Package readmetest finds a generated block in a README, so that a test can
// compare it with what the code says and, when asked, rewrite it.
package readmetest

import (
	"os"
	"strings"
	"testing"
)

// Block is the text of a README between the line holding a begin marker and
// the end marker after it (found inside the enclosing blocks' text).
type Block struct {
	path   string
	readme string
	// Text is the block's text; it starts with the newline ending the begin
	// marker's line.
	Text       string
	start, end int
}

// Find reads path and returns the block between begin and end, inside the
// block between each earlier pair of markers: markers are begin, end pairs,
// outermost first.
func Find(t testing.TB, path string, markers ...string) Block {
	t.Helper()
	if len(markers) == 0 || len(markers)%2 != 0 {
		t.Fatalf("readmetest.Find wants begin, end pairs; got %q", markers)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := Block{path: path, readme: string(raw), end: len(raw)}
	for i := 0; i < len(markers); i += 2 {
		text := b.readme[b.start:b.end]
		begin, end := markers[i], markers[i+1]
		at := strings.Index(text, begin)
		if at < 0 {
			t.Fatalf("%s has no %q", path, begin)
		}
		at += strings.IndexByte(text[at:], '\n')
		n := strings.Index(text[at:], end)
		if n < 0 {
			t.Fatalf("%s has no %q after %q", path, end, begin)
		}
		b.start, b.end = b.start+at, b.start+at+n
	}
	b.Text = b.readme[b.start:b.end]
	return b
}

// Rewrite replaces the block's text in the file with a newline and text.
func (b Block) Rewrite(t testing.TB, text string) {
	t.Helper()
	out := b.readme[:b.start] + "\n" + text + b.readme[b.end:]
	if err := os.WriteFile(b.path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
}
