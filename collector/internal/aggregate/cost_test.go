package aggregate

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

type catalog map[string]float64

func (c catalog) CurrentPrice(gpu string) (float64, bool) {
	for k, p := range c {
		if strings.Contains(gpu, k) {
			return p, true
		}
	}
	return 0, false
}

func approx(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.12g, want %.12g", what, got, want)
	}
}

func optv(t *testing.T, what string, got *float64, want float64) {
	t.Helper()
	if got == nil {
		t.Errorf("%s unknown, want %g", what, want)
		return
	}
	approx(t, what, *got, want)
}

// costRun: node a (2 GPUs) warms up over [0, 60) s and measures [60, 120);
// node b (1 GPU) measures [30, 90). t0 is 12:00 UTC; off-peak ends at 12:01.
func costRun(bands EnergyBands) *State {
	s := New("r1")
	s.AddStart("a", &trainmeterv1.RunStart{
		RunId: "r1", Time: ts(0), GpuName: "NVIDIA H100 80GB HBM3",
		Metadata: &trainmeterv1.RunMetadata{Model: "m"}, Labels: map[string]string{"priority": "high"},
		PlannedTokens: 36000, Params: 1e6, DatasetSize: 300,
	})
	s.AddWindowBooked("a", &trainmeterv1.RunWindow{RunId: "r1", Start: ts(0), End: ts(60), Phase: trainmeterv1.Phase_PHASE_WARMUP,
		EnergyCounterJ: 600, CounterOk: true, GpuSeconds: 120, Gpus: []uint32{0, 1}}, bands, nil)
	s.AddWindowBooked("b", &trainmeterv1.RunWindow{RunId: "r1", Start: ts(30), End: ts(90), Phase: trainmeterv1.Phase_PHASE_MEASURED,
		EnergyCounterJ: 600, CounterOk: true, GpuSeconds: 60, Gpus: []uint32{0},
		Tokens: 3000, TokensMeasured: 3000, Steps: 5, Samples: 50}, bands, nil)
	s.AddWindowBooked("a", &trainmeterv1.RunWindow{RunId: "r1", Start: ts(60), End: ts(120), Phase: trainmeterv1.Phase_PHASE_MEASURED,
		EnergyCounterJ: 1200, CounterOk: true, GpuSeconds: 120, Gpus: []uint32{0, 1},
		Tokens: 6000, TokensMeasured: 6000, Steps: 10, Samples: 100}, bands, nil)
	s.AddEval("a", &trainmeterv1.Eval{RunId: "r1", Time: ts(100), Epoch: proto.Int64(1), Accuracy: proto.Float64(0.8)})
	return s
}

func TestReportCostModel(t *testing.T) {
	tariff, err := cost.ParseTariff([]byte(`{default: off, bands: {off: 0.1, peak: 0.3}, rules: [{from: "12:01", to: "24:00", band: peak}]}`))
	if err != nil {
		t.Fatal(err)
	}
	s := costRun(tariff)
	// Round trip through the stored form.
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if s, err = Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	approx(t, "off-peak J", s.EnergyByBand["off"], 600+300) // a's warmup + b's first half
	approx(t, "peak J", s.EnergyByBand["peak"], 1200+300)

	p := Pricing{
		Tariff: tariff, NodeGPUPricePerHour: map[string]float64{"a": 3}, Catalog: catalog{"H100": 2},
		PriorityMultipliers: map[string]float64{"high": 1.5}, GridGCO2PerKWh: 400,
	}
	r := s.Report(p)
	compute := 240.0/3600*3 + 60.0/3600*2 // node a at its price, b at the catalog's
	energy := (900*0.1 + 1500*0.3) / 3.6e6
	total := compute*1.5 + energy
	approx(t, "cost_usd", r.GetCostUsd(), compute)
	approx(t, "gpu_price_per_hour (GPU-time-weighted)", r.GetGpuPricePerHour(), compute/(300.0/3600))
	if r.GetPriceSource() != cost.SourceMixed || r.GetPriorityMultiplier() != 1.5 {
		t.Errorf("source %q multiplier %v", r.GetPriceSource(), r.GetPriorityMultiplier())
	}
	approx(t, "energy_cost_usd", r.GetEnergyCostUsd(), energy)
	approx(t, "total_cost_usd", r.GetTotalCostUsd(), total)
	approx(t, "co2_kg", r.GetCo2Kg(), 2400/3.6e6*0.4)
	if len(r.GetEnergyBands()) != 2 || r.GetEnergyBands()[1].GetBand() != "peak" {
		t.Fatalf("bands %v", r.GetEnergyBands())
	}
	approx(t, "peak band $", r.GetEnergyBands()[1].GetCostUsd(), 1500*0.3/3.6e6)
	approx(t, "usd_per_mtok", r.GetUsdPerMtok(), total/9000*1e6)
	optv(t, "usd_per_sample", r.UsdPerSample, total/150)
	optv(t, "epochs_done", r.EpochsDone, 0.5)
	optv(t, "usd_per_epoch", r.UsdPerEpoch, total/0.5)
	optv(t, "accuracy_points", r.AccuracyPoints, 80)
	optv(t, "usd_per_accuracy_point", r.UsdPerAccuracyPoint, total/80)

	// Live run, 9000 of 36000 planned tokens: the 27000 left take 270 s at
	// the 100 tok/s measured after warmup, spending the average $total/120 s.
	if r.GetEnded() || r.GetProjectionBasis() != "tokens" {
		t.Fatalf("ended %v basis %q", r.GetEnded(), r.GetProjectionBasis())
	}
	optv(t, "progress", r.Progress, 0.25)
	approx(t, "projected_cost_usd", r.GetProjectedCostUsd(), total+270*total/120)
	optv(t, "est_total_s", r.EstTotalS, 120+270)

	// Throughput and compute: measured period 30..120 s.
	optv(t, "steps_per_s", r.StepsPerS, 15.0/90)
	optv(t, "epoch_s", r.EpochS, 300/(150.0/90))
	optv(t, "flops_total", r.FlopsTotal, 6*1e6*9000)
	optv(t, "flops_per_step", r.FlopsPerStep, 6*1e6*600)
	optv(t, "peak_tflops", r.PeakTflops, 989)
	optv(t, "mfu", r.Mfu, 6*1e6*100/(3*989e12))
	optv(t, "j_per_pflop", r.JPerPflop, 1800/(6*1e6*9000/1e15))

	// Ended: projected = total.
	s.AddEnd("a", &trainmeterv1.RunEnd{RunId: "r1", Time: ts(120)})
	r = s.Report(p)
	approx(t, "ended projected", r.GetProjectedCostUsd(), r.GetTotalCostUsd())
	optv(t, "ended est_total_s", r.EstTotalS, 120)
}

func TestReportCostWithoutPricesOrPlan(t *testing.T) {
	r := costRun(nil).Report(Pricing{})
	if r.CostUsd != nil || r.EnergyCostUsd != nil || r.TotalCostUsd != nil || r.UsdPerSample != nil || r.UsdPerAccuracyPoint != nil {
		t.Errorf("costs without prices: %v", r)
	}
	if r.GetPriorityMultiplier() != 1 {
		t.Errorf("multiplier %v", r.GetPriorityMultiplier())
	}
	// A node without a price makes the compute cost unknown, not partial.
	r = costRun(nil).Report(Pricing{NodeGPUPricePerHour: map[string]float64{"a": 3}})
	if r.CostUsd != nil {
		t.Errorf("node b has no price, yet cost %v", r.GetCostUsd())
	}
}

func TestTariffAddedLaterPricesUnbookedEnergyAtDefault(t *testing.T) {
	// Energy folded with no tariff has no band: priced at the default band.
	tariff, err := cost.ParseTariff([]byte(`{default: off, bands: {off: 0.1, peak: 0.3}, rules: [{from: "12:01", to: "24:00", band: peak}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := costRun(nil).Report(Pricing{Tariff: tariff})
	approx(t, "energy cost", r.GetEnergyCostUsd(), 2400*0.1/3.6e6)
	r = costRun(nil).Report(Pricing{EnergyIncluded: true, GPUPricePerHour: 2})
	if !r.GetEnergyIncluded() || r.GetEnergyCostUsd() != 0 || r.EnergyCostUsd == nil {
		t.Errorf("energy included: %v %v", r.GetEnergyIncluded(), r.GetEnergyCostUsd())
	}
	approx(t, "total = compute × priority (no multiplier configured)", r.GetTotalCostUsd(), 300.0/3600*2)
}

// TestReportOwnedHardware: node a's owned GPUs are priced from their
// purchase, node b's from the catalog (mixed); without the catalog both are
// amortized; energy cost and CO2 carry the PUE, energy_kWh does not.
func TestReportOwnedHardware(t *testing.T) {
	owned, err := cost.ParseOwnedHardware([]byte("pue: 1.5\nnodes: {a: {purchase_usd: 26280, lifetime_years: 3}}\ngpus: [{model: H100 SXM, purchase_usd: 8760, lifetime_years: 1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := Pricing{Owned: owned, PUE: owned.PUE, EnergyPricePerKWh: 0.2, GridGCO2PerKWh: 400, GPUPricePerHour: 9}
	r := costRun(nil).Report(p)
	// a: 26,280 / (3 × 8,760) = $1/GPU-hour; b: its H100's 8,760 / 8,760 = $1.
	approx(t, "cost_usd", r.GetCostUsd(), 300.0/3600*1)
	if r.GetPriceSource() != cost.SourceAmortized || r.GetPue() != 1.5 {
		t.Errorf("price_source %q pue %v", r.GetPriceSource(), r.GetPue())
	}
	approx(t, "energy_kWh", r.GetEnergyKwh(), 2400/3.6e6)
	approx(t, "energy_cost_usd", r.GetEnergyCostUsd(), 2400/3.6e6*1.5*0.2)
	approx(t, "co2_kg", r.GetCo2Kg(), 2400/3.6e6*1.5*0.4)

	p.Owned, _ = cost.ParseOwnedHardware([]byte("nodes: {a: {purchase_usd: 26280, lifetime_years: 3}}\n"))
	r = costRun(nil).Report(p)
	if r.GetPriceSource() != cost.SourceMixed {
		t.Errorf("a amortized, b by the flag: price_source %q, want mixed", r.GetPriceSource())
	}
	p.Owned = nil
	if r = costRun(nil).Report(p); r.GetPriceSource() != cost.SourceFlag {
		t.Errorf("flag price: price_source %q", r.GetPriceSource())
	}
}
