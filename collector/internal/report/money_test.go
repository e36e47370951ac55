package report

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// pennyRun is a run of a tenth of a cent whose costs do not round to a sum:
// the GPU cost 0.09563 and an energy cost of 0.00047 in one band.
func pennyRun() *RunReport {
	r := fullRun()
	r.RunId = "penny"
	r.PriorityMultiplier = 1
	r.GpuHours = 0.09563 / 2.1
	r.CostUsd = f64(0.09563)
	r.EnergyKwh, r.EnergyCostUsd = 0.0015667, f64(0.00047)
	r.EnergyBands = []*trainmeterv1.EnergyBandCost{{Band: "peak", Kwh: 0.0015667, UsdPerKwh: 0.3, CostUsd: 0.00047}}
	r.TotalCostUsd = f64(0.09563 + 0.00047)
	r.ProjectedCostUsd = r.TotalCostUsd
	r.StepsPerS, r.FlopsTotal, r.Evals = nil, nil, nil
	return r
}

func moneyLine(t *testing.T, report, label string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(label) + `:\s+(.*)$`).FindStringSubmatch(report)
	if m == nil {
		t.Fatalf("no %q line in\n%s", label, report)
	}
	return m[1]
}

// TestReportMoneyLinesRoundAlone: each cost line is its own value rounded
// (not a part back-solved to fit the total), and a total the shown lines
// do not sum to says so.
func TestReportMoneyLinesRoundAlone(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteReport(&buf, pennyRun()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for label, want := range map[string]string{
		"gpu cost":    "$0.096 at $2.1/GPU-hour",
		"energy cost": "$0.00047",
		"band peak":   "0.0015667 kWh at $0.3/kWh = $0.00047",
		"total":       "$0.096 (rounded)",
	} {
		if got := moneyLine(t, out, label); got != want {
			t.Errorf("%s: %q, want %q", label, got, want)
		}
	}
	buf.Reset()
	if err := WriteReport(&buf, fullRun()); err != nil {
		t.Fatal(err)
	}
	full := buf.String()
	// $1.05 + $0.020 = $1.07 as shown: no "rounded"; its bands ($0.0030 +
	// $0.013) do not make the energy line's $0.020, which says so.
	if got := moneyLine(t, full, "total"); got != "$1.07" {
		t.Errorf("total: %q, want $1.07 with no rounded note", got)
	}
	if got := moneyLine(t, full, "energy cost"); !strings.HasPrefix(got, "$0.020 (rounded") {
		t.Errorf("energy cost: %q, want $0.020 (rounded…)", got)
	}
	golden(t, "report_money.golden", []byte(out))
}
