package oteltest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// DocMetric is one row of a metric table in docs/otel.md.
type DocMetric struct {
	// Section is the ### heading the table is under (e.g. "Per GPU — OTel
	// hardware semantic conventions").
	Section string
	// Name, Unit ("" where the table says —), Type (Gauge, Counter or
	// UpDownCounter) and PromName are the table's first four columns.
	Name, Unit, Type, PromName string
}

var (
	backticked = regexp.MustCompile("`([^`]*)`")
	// attrName is an OTel attribute name: lower case, dotted.
	attrName = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$`)
)

// readDoc returns docs/otel.md's lines from "## Metrics" to the next "## ".
func readDoc(t testing.TB) (metrics []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(t), "docs", "otel.md"))
	if err != nil {
		t.Fatal(err)
	}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = line == "## Metrics"
			continue
		}
		if in {
			metrics = append(metrics, line)
		}
	}
	if len(metrics) == 0 {
		t.Fatal(`docs/otel.md has no "## Metrics" section`)
	}
	return metrics
}

// cells splits a Markdown table row into its trimmed cells.
func cells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimSuffix(strings.TrimPrefix(row, "|"), "|")
	var out []string
	// A cell may hold `a\|b`; no metric table does, so a plain split is enough.
	for _, c := range strings.Split(row, "|") {
		out = append(out, strings.TrimSpace(c))
	}
	return out
}

func unquote(cell string) string {
	if m := backticked.FindStringSubmatch(cell); m != nil && strings.TrimSpace(cell) == "`"+m[1]+"`" {
		return m[1]
	}
	return cell
}

// DocMetrics parses the metric tables of docs/otel.md's "## Metrics"
// section: every table whose header starts "| OTel name | unit | type |
// Prometheus name |".
func DocMetrics(t testing.TB) []DocMetric {
	t.Helper()
	lines := readDoc(t)
	var out []DocMetric
	section, inTable := "", false
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "### "):
			section, inTable = strings.TrimPrefix(line, "### "), false
		case !strings.HasPrefix(strings.TrimSpace(line), "|"):
			inTable = false
		default:
			c := cells(line)
			if len(c) >= 4 && c[0] == "OTel name" {
				if c[1] != "unit" || c[2] != "type" || c[3] != "Prometheus name" {
					t.Fatalf("docs/otel.md: metric table header %q: want OTel name | unit | type | Prometheus name | ...", line)
				}
				inTable = true
				continue
			}
			if !inTable || strings.Trim(c[0], "-: ") == "" {
				continue // another table, or the header's separator row
			}
			if len(c) < 4 {
				t.Fatalf("docs/otel.md: metric row %q has %d cells", line, len(c))
			}
			unit := unquote(c[1])
			if unit == "—" {
				unit = ""
			}
			out = append(out, DocMetric{Section: section, Name: unquote(c[0]), Unit: unit, Type: c[2], PromName: unquote(c[3])})
		}
	}
	if len(out) == 0 {
		t.Fatal("docs/otel.md: no metric table found")
	}
	return out
}

// DocAttributes returns the data point attributes docs/otel.md documents for
// the metrics: the dotted names in its "Attributes:"/"Attribute:" paragraphs
// and in the last column of its metric tables, under "## Metrics".
func DocAttributes(t testing.TB) []string {
	t.Helper()
	lines := readDoc(t)
	metrics := map[string]bool{}
	for _, m := range DocMetrics(t) {
		metrics[m.Name] = true
	}
	seen := map[string]bool{}
	var out []string
	add := func(text string) {
		for _, m := range backticked.FindAllStringSubmatch(text, -1) {
			if a := m[1]; attrName.MatchString(a) && !metrics[a] && !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	inPara := false
	for _, line := range lines {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "Attributes:") || strings.HasPrefix(trimmed, "Attribute:"):
			inPara = true
		case trimmed == "":
			inPara = false
		}
		if inPara {
			add(line)
		}
		if c := cells(line); strings.HasPrefix(trimmed, "|") && len(c) >= 5 && attrName.MatchString(unquote(c[0])) {
			add(c[len(c)-1])
		}
	}
	return out
}

// PromLabel is the Prometheus label name of an OTel attribute.
func PromLabel(attr string) string { return strings.ReplaceAll(attr, ".", "_") }
