package cost

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// pointsPerUSD is a run's accuracy points per dollar, if both are known.
func pointsPerUSD(r *trainmeterv1.RunReport) (float64, bool) {
	if r.AccuracyPoints == nil || r.GetTotalCostUsd() <= 0 {
		return 0, false
	}
	return r.GetAccuracyPoints() / r.GetTotalCostUsd(), true
}

// SetEfficiency fills each report's efficiency_score: its accuracy points per
// dollar divided by the best points per dollar among the runs of the same
// model in all (which should hold every run of those models). A run
// without accuracy or cost has no score.
func SetEfficiency(reports, all []*trainmeterv1.RunReport) {
	SetEfficiencyBest(reports, BestPointsPerUSD(all))
}

// BestPointsPerUSD is, per model, the most accuracy points per dollar of
// the runs in all that did not fail: what SetEfficiencyBest scores against.
func BestPointsPerUSD(all []*trainmeterv1.RunReport) map[string]float64 {
	best := map[string]float64{}
	for _, r := range all {
		if Failed(r) {
			continue
		}
		if v, ok := pointsPerUSD(r); ok && v > best[r.GetMetadata().GetModel()] {
			best[r.GetMetadata().GetModel()] = v
		}
	}
	return best
}

// SetEfficiencyBest is SetEfficiency against the per-model bests of
// BestPointsPerUSD.
func SetEfficiencyBest(reports []*trainmeterv1.RunReport, best map[string]float64) {
	for _, r := range reports {
		v, ok := pointsPerUSD(r)
		b := best[r.GetMetadata().GetModel()]
		if !ok || b <= 0 {
			r.EfficiencyScore = nil
			continue
		}
		s := min(1, v/b)
		r.EfficiencyScore = &s
	}
}

// RunROI is one run's place in its model's history.
type RunROI struct {
	RunID          string   `json:"run_id"`
	TotalCostUSD   float64  `json:"total_cost_usd"`
	AccuracyPoints *float64 `json:"accuracy_points,omitempty"`
	// GainPoints is accuracy points over the baseline run.
	GainPoints *float64 `json:"gain_points,omitempty"`
	// ROI is GainPoints per dollar this run cost.
	ROI *float64 `json:"roi_points_per_usd,omitempty"`
}

// ModelROI summarises one model's runs.
type ModelROI struct {
	Model        string  `json:"model"`
	Runs         int     `json:"runs"`
	GPUHours     float64 `json:"gpu_hours"`
	EnergyKWh    float64 `json:"energy_kwh"`
	TotalCostUSD float64 `json:"total_cost_usd"`
	// Baseline is the first run (by start) with accuracy and cost.
	Baseline       string   `json:"baseline,omitempty"`
	BaselinePoints *float64 `json:"baseline_points,omitempty"`
	// Best is the run with the most accuracy points; of equally accurate
	// runs, the one that cost less (a run whose cost is not known never wins
	// a tie), then the earliest.
	Best       string   `json:"best,omitempty"`
	BestPoints *float64 `json:"best_points,omitempty"`
	// BestUSDPerPoint is the best run's cost per accuracy point.
	BestUSDPerPoint *float64 `json:"best_usd_per_point,omitempty"`
	// ROI is (best − baseline points) / the total cost of the runs after
	// the baseline: what the model's further runs bought per dollar.
	ROI    *float64 `json:"roi_points_per_usd,omitempty"`
	PerRun []RunROI `json:"per_run,omitempty"`
	// FailedRuns counts the model's runs that failed (Failed): their
	// cost is in the totals and in what the runs after the baseline cost,
	// but they are never the baseline, the best, nor given a gain.
	FailedRuns int      `json:"failed_runs"`
	USDMtok    *float64 `json:"usd_per_mtok,omitempty"`
}

func ptr(v float64) *float64 { return &v }

// cheaper reports whether r cost less than b: r's cost is known (> 0) and
// b's is not, or is higher.
func cheaper(r, b *trainmeterv1.RunReport) bool {
	return r.GetTotalCostUsd() > 0 && (b.GetTotalCostUsd() <= 0 || r.GetTotalCostUsd() < b.GetTotalCostUsd())
}

// Models groups reports by model (sorted by name; runs by start time) and
// computes each model's cost and ROI.
func Models(reports []*trainmeterv1.RunReport) []ModelROI {
	byModel := map[string][]*trainmeterv1.RunReport{}
	for _, r := range reports {
		byModel[r.GetMetadata().GetModel()] = append(byModel[r.GetMetadata().GetModel()], r)
	}
	out := make([]ModelROI, 0, len(byModel))
	for _, n := range slices.Sorted(maps.Keys(byModel)) {
		out = append(out, modelROI(n, byModel[n]))
	}
	return out
}

func modelROI(model string, runs []*trainmeterv1.RunReport) ModelROI {
	runs = slices.Clone(runs)
	slices.SortStableFunc(runs, func(a, b *trainmeterv1.RunReport) int {
		return cmp.Or(a.GetStart().AsTime().Compare(b.GetStart().AsTime()), strings.Compare(a.GetRunId(), b.GetRunId()))
	})
	m := ModelROI{Model: model, Runs: len(runs)}
	var tokens uint64
	priced := false
	base, best := -1, -1
	for i, r := range runs {
		m.GPUHours += r.GetGpuHours()
		m.EnergyKWh += r.GetEnergyKwh()
		m.TotalCostUSD += r.GetTotalCostUsd()
		tokens += r.GetTokensProcessed()
		priced = priced || r.TotalCostUsd != nil
		if Failed(r) {
			m.FailedRuns++
			continue
		}
		if _, ok := pointsPerUSD(r); ok && base < 0 {
			base = i
		}
		if r.AccuracyPoints != nil && (best < 0 || r.GetAccuracyPoints() > *m.BestPoints ||
			r.GetAccuracyPoints() == *m.BestPoints && cheaper(r, runs[best])) {
			best = i
			m.Best, m.BestPoints = r.GetRunId(), ptr(r.GetAccuracyPoints())
			m.BestUSDPerPoint = nil
			if r.GetTotalCostUsd() > 0 && r.GetAccuracyPoints() > 0 {
				m.BestUSDPerPoint = ptr(r.GetTotalCostUsd() / r.GetAccuracyPoints())
			}
		}
	}
	if priced && tokens > 0 {
		m.USDMtok = ptr(m.TotalCostUSD / float64(tokens) * 1e6)
	}
	var basePts float64
	if base >= 0 {
		m.Baseline = runs[base].GetRunId()
		basePts = runs[base].GetAccuracyPoints()
		m.BaselinePoints = ptr(basePts)
	}
	after := 0.0
	for i, r := range runs {
		rr := RunROI{RunID: r.GetRunId(), TotalCostUSD: r.GetTotalCostUsd(), AccuracyPoints: r.AccuracyPoints}
		if base >= 0 && i > base {
			after += r.GetTotalCostUsd()
			if r.AccuracyPoints != nil && !Failed(r) {
				gain := r.GetAccuracyPoints() - basePts
				rr.GainPoints = ptr(gain)
				if r.GetTotalCostUsd() > 0 {
					rr.ROI = ptr(gain / r.GetTotalCostUsd())
				}
			}
		}
		m.PerRun = append(m.PerRun, rr)
	}
	if base >= 0 && after > 0 && m.BestPoints != nil {
		m.ROI = ptr((*m.BestPoints - basePts) / after)
	}
	return m
}
