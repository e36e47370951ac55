package report

import (
	"strings"
	"testing"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestReportShowsEstimateAndFinal: a run started with an estimate and a cap
// shows both next to its final cost, and where its price came from.
func TestReportShowsEstimateAndFinal(t *testing.T) {
	maxCost := 10.0
	r := &RunReport{
		RunId: "r", Ended: true, CostUsd: f64(6), TotalCostUsd: f64(6), GpuHours: 3, GpuPricePerHour: f64(2),
		PriceSource: "amortized", Pue: 1.3, MaxCostUsd: &maxCost,
		Estimate: &trainmeterv1.RunEstimate{
			Model: "m", Tokens: 1000, Gpus: 2, BasedOn: []string{"a", "b"},
			CostUsd:   &trainmeterv1.Range{Low: 4, Mid: 5, High: 8},
			WallS:     &trainmeterv1.Range{Low: 60, Mid: 90, High: 330},
			EnergyKwh: &trainmeterv1.Range{Low: 1, Mid: 1.5, High: 2},
		},
	}
	var b strings.Builder
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"price source:      amortized (owned GPU",
		"PUE:               1.3 (energy cost and CO2 are of the GPU energy x 1.3)",
		"max cost:          $10.00",
		"estimate:          $5.00 (band $4.00 to $8.00) for 1000 tokens on 2 GPU(s), from 2 past runs",
		"est. time:       1m30s (1m to 5m30s)",
		"vs estimate:     final cost $6.00 = 120% of the estimate",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	r.Estimate, r.EstimateError = nil, "model \"m\": no ended runs"
	b.Reset()
	_ = WriteReport(&b, r)
	if !strings.Contains(b.String(), "estimate:          none at start: model \"m\": no ended runs") {
		t.Errorf("report without an estimate:\n%s", b.String())
	}
}
