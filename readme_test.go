package main

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/readmetest"
)

// updateREADME rewrites the README's generated variable table:
//
//	go test -run TestREADMEVariables -update-readme .
var updateREADME = flag.Bool("update-readme", false, "rewrite README.md's variable table from config's tags")

// The README's operator section and, inside it, the generated variable table.
const (
	opsBegin  = "<!-- ops:begin"
	opsEnd    = "<!-- ops:end -->"
	varsBegin = "<!-- vars:begin: generated from config.go; go test -run TestREADMEVariables -update-readme . -->"
	varsEnd   = "<!-- vars:end -->"
)

// varRow is one variable: its name, its default as the README shows it, and
// what it means.
type varRow struct{ name, def, doc string }

// configField is one of config's variables: its full name, the options of
// its env tag, and the field's tag.
type configField struct {
	name, opts string
	tag        reflect.StructTag
}

// configFields are the variables of config's struct tags, in field order.
func configFields(t *testing.T) []configField {
	t.Helper()
	var fields []configField
	for _, v := range configVars() {
		if v.name == envPrefix || v.tag.Get("doc") == "" {
			t.Errorf("config.%s needs env and doc tags", v.field)
		}
		fields = append(fields, configField{v.name, v.opts, v.tag})
	}
	return fields
}

// configRows are the README's rows of config's variables, in field order.
func configRows(t *testing.T) []varRow {
	t.Helper()
	var rows []varRow
	for _, f := range configFields(t) {
		def := "empty"
		if d, ok := f.tag.Lookup("envDefault"); ok {
			def = "`" + d + "`"
		}
		if strings.Contains(f.opts, "required") {
			def = "(required)"
		}
		rows = append(rows, varRow{f.name, def, markdownText(f.tag.Get("doc"))})
	}
	return rows
}

// markdownText escapes what Markdown would not show as written in a table
// cell: a pipe ends the cell, and <name> reads as an HTML tag.
func markdownText(s string) string {
	return strings.NewReplacer("|", `\|`, "<", `\<`).Replace(s)
}

// variableTable renders rows as the README's Markdown table.
func variableTable(rows []varRow) string {
	var b strings.Builder
	b.WriteString("| variable | default | meaning |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", r.name, r.def, r.doc)
	}
	return b.String()
}

// readmeRows parses the variable rows of the README's table.
func readmeRows(table string) map[string]varRow {
	rows := map[string]varRow{}
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |"), " | ")
		for len(cells) < 3 {
			cells = append(cells, "")
		}
		name := strings.Trim(cells[0], "`")
		rows[name] = varRow{name, cells[1], strings.Join(cells[2:], " | ")}
	}
	return rows
}

func TestREADMEVariables(t *testing.T) {
	block := readmetest.Find(t, "README.md", opsBegin, opsEnd, varsBegin, varsEnd)
	table := block.Text
	want := configRows(t)
	if *updateREADME {
		block.Rewrite(t, variableTable(want))
		return
	}
	got := readmeRows(table)
	for _, w := range want {
		g, ok := got[w.name]
		switch {
		case !ok:
			t.Errorf("README lacks %s", w.name)
		case g != w:
			t.Errorf("README's row of %s is %q %q; config says %q %q", w.name, g.def, g.doc, w.def, w.doc)
		}
		delete(got, w.name)
	}
	for name := range got {
		t.Errorf("README documents %s, which config does not read", name)
	}
	if table != "\n"+variableTable(want) && !t.Failed() {
		t.Errorf("README's variable table is not as generated; run: go test -run TestREADMEVariables -update-readme .")
	}
}

// docs/contract.md's Configuration states the rules in its own words: the
// secrets that take <NAME>_FILE, and every variable in one group. Both must
// name exactly config's variables (it listed three of the six _FILE secrets).
func TestContractConfiguration(t *testing.T) {
	raw, err := os.ReadFile("docs/contract.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	_, section, ok := strings.Cut(doc, "\n## Configuration\n")
	if !ok {
		t.Fatal("docs/contract.md has no Configuration section")
	}
	names := regexp.MustCompile("`([A-Z_]+)`")
	var files, settings []string
	for _, f := range configFields(t) {
		name := strings.TrimPrefix(f.name, envPrefix)
		if strings.Contains(f.opts, "file") {
			files = append(files, strings.TrimSuffix(name, "_FILE"))
		} else {
			settings = append(settings, name)
		}
	}

	m := regexp.MustCompile(`(?s)- Secrets \(([^)]*)\) also accept ` + "`<NAME>_FILE`").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("docs/contract.md's Configuration has no bullet \"Secrets (…) also accept `<NAME>_FILE`\"")
	}
	var listed []string
	for _, n := range names.FindAllStringSubmatch(m[1], -1) {
		listed = append(listed, n[1])
	}
	slices.Sort(listed)
	slices.Sort(files)
	if !slices.Equal(listed, files) {
		t.Errorf("docs/contract.md says %v accept <NAME>_FILE; config.go reads a _FILE for %v", listed, files)
	}

	_, table, ok := strings.Cut(section, "| group | variables | page |")
	if !ok {
		t.Fatal("docs/contract.md's Configuration has no table of the settings in groups")
	}
	grouped := map[string]int{}
	for _, line := range strings.Split(table, "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(line, "|")
		for _, n := range names.FindAllStringSubmatch(cells[2], -1) {
			grouped[n[1]]++
		}
	}
	for _, name := range settings {
		if grouped[name] != 1 {
			t.Errorf("docs/contract.md's groups list %s %d times, want once", name, grouped[name])
		}
		delete(grouped, name)
	}
	for name := range grouped {
		t.Errorf("docs/contract.md's groups list %s, which config.go does not read", name)
	}
}
