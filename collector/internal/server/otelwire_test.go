package server

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/internal/oteltest"
)

// The alert log record's detail attributes are exactly those docs/otel.md
// lists under "Alerts as log records" (for each detail (...)).
func TestAlertAttributesAreDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(oteltest.RepoRoot(t), "docs", "otel.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "for each detail (")
	if i < 0 {
		t.Fatal(`docs/otel.md: no "for each detail (" list in "Alerts as log records"`)
	}
	i += len("for each detail (")
	j := strings.Index(doc[i:], ")")
	if j < 0 {
		t.Fatal(`docs/otel.md: the "for each detail (" list does not end`)
	}
	list := doc[i : i+j]
	var documented []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(list, -1) {
		documented = append(documented, m[1])
	}
	sort.Strings(documented)

	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	full := []alert.Alert{
		{Kind: alert.KindBudget, ID: "a1", Severity: "exceeded", Scope: "team-a", Period: "month", PeriodKey: "2026-11",
			BudgetID: "b1", Threshold: 1, SpentUSD: 12, BudgetUSD: 10, Projected: true, Time: at},
		{Kind: alert.KindPrice, ID: "a2", Severity: "warning", Scope: "H100", GPUName: "H100", Threshold: 0.25,
			PriceUSDPerHour: 2.5, ReferenceUSDPerHour: 2, Change: 0.25, Time: at},
	}
	seen := map[string]bool{}
	for _, a := range full {
		for k := range alertAttributes(a) {
			seen[k] = true
		}
	}
	var sent []string
	for k := range seen {
		sent = append(sent, k)
	}
	sort.Strings(sent)
	if !slices.Equal(sent, documented) {
		t.Errorf("alert record attributes %v, docs/otel.md documents %v", sent, documented)
	}
	if got := alertAttributes(alert.Alert{Kind: alert.KindPrice, ID: "x", Severity: "info"}); len(got) != 2 {
		t.Errorf("a price alert without details has attributes %v, want only id and severity", got)
	}
}
