package cost

import (
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// mapCatalog is a small real PriceCatalog: prices by GPU model, matched as a
// substring of the GPU name, changeable while in use.
type mapCatalog struct {
	mu     sync.Mutex
	prices map[string]float64
}

func (c *mapCatalog) CurrentPrice(gpuName string) (float64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for model, p := range c.prices {
		if strings.Contains(gpuName, model) {
			return p, true
		}
	}
	return 0, false
}

func TestGPUPricePrecedence(t *testing.T) {
	cat := &mapCatalog{prices: map[string]float64{"H100": 2.5}}
	c := Config{GPUPricePerHour: 1, NodeGPUPricePerHour: map[string]float64{"n1": 3}, Catalog: cat}
	for _, tc := range []struct {
		runStart  float64
		node, gpu string
		want      float64
		src       string
	}{
		{4, "n1", "NVIDIA H100", 4, SourceRunStart},
		{0, "n1", "NVIDIA H100", 3, SourceNode},
		{0, "n2", "NVIDIA H100 80GB HBM3", 2.5, SourceCatalog},
		{0, "n2", "NVIDIA A100", 1, SourceFlag},
	} {
		p, src, ok := c.GPUPrice(tc.runStart, tc.node, tc.gpu)
		if !ok || p != tc.want || src != tc.src {
			t.Errorf("GPUPrice(%v, %s, %s) = %v %s %v, want %v %s", tc.runStart, tc.node, tc.gpu, p, src, ok, tc.want, tc.src)
		}
	}
	if _, _, ok := (Config{}).GPUPrice(0, "n", "g"); ok {
		t.Error("no price configured, but GPUPrice found one")
	}
	// Nil catalog is fine.
	if p, _, _ := (Config{GPUPricePerHour: 1}).GPUPrice(0, "n", "H100"); p != 1 {
		t.Error(p)
	}
}

func TestEnergyCost(t *testing.T) {
	tr := mustTariff(t, touYAML)
	c := Config{Tariff: tr}
	// 3.6 MJ = 1 kWh peak, 7.2 MJ = 2 kWh off-peak, 1.8 MJ booked to a band
	// the tariff no longer has plus 1.8 MJ never booked: 1 kWh at the default (peak).
	usd, bands, ok := c.EnergyCost(map[string]float64{"peak": 3.6e6, "offpeak": 7.2e6, "gone": 1.8e6}, 3.6e6+7.2e6+1.8e6+1.8e6)
	if !ok {
		t.Fatal("no energy cost")
	}
	near(t, "tou usd", usd, 2*0.30+2*0.12)
	if len(bands) != 2 || bands[0].Band != "offpeak" || bands[1].Band != "peak" {
		t.Fatalf("bands %+v", bands)
	}
	near(t, "peak kWh", bands[1].KWh, 2)
	near(t, "offpeak usd", bands[0].USD, 0.24)

	usd, _, ok = Config{EnergyPricePerKWh: 0.2}.EnergyCost(nil, 9e6)
	if !ok {
		t.Fatal("flat: no cost")
	}
	near(t, "flat usd", usd, 2.5*0.2)
	if usd, _, ok := (Config{EnergyIncluded: true}).EnergyCost(nil, 9e6); !ok || usd != 0 {
		t.Errorf("included: %v %v", usd, ok)
	}
	if _, _, ok := (Config{}).EnergyCost(nil, 9e6); ok {
		t.Error("no price: ok")
	}
	if co2, ok := (Config{GridGCO2PerKWh: 400}).CO2Kg(2.5); !ok || co2 != 1 {
		t.Errorf("co2 %v", co2)
	}
}

func TestPriority(t *testing.T) {
	c := Config{PriorityMultipliers: map[string]float64{"high": 1.5, "low": 0.5}}
	for labels, want := range map[string]float64{"high": 1.5, "low": 0.5, "urgent": 1, "": 1} {
		if got := c.PriorityMultiplier(map[string]string{"priority": labels}); got != want {
			t.Errorf("priority %q: %v, want %v", labels, got, want)
		}
	}
	if got := c.PriorityMultiplier(nil); got != 1 {
		t.Error(got)
	}
}

func TestConfigValidate(t *testing.T) {
	tr := mustTariff(t, touYAML)
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{GPUPricePerHour: -1}, "gpu price"},
		{Config{Tariff: tr, EnergyPricePerKWh: 0.2}, "either a flat energy price or a tariff"},
		{Config{EnergyIncluded: true, EnergyPricePerKWh: 0.2}, "included"},
		{Config{PriorityMultipliers: map[string]float64{"high": 0}}, "multiplier > 0"},
		{Config{NodeGPUPricePerHour: map[string]float64{"": 1}}, "node gpu price"},
		{Config{Tariff: &Tariff{Default: "x"}}, "tariff: "},
	} {
		if err := tc.c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.c, err, tc.want)
		}
	}
	if err := (Config{Tariff: tr, GridGCO2PerKWh: 300, PriorityMultipliers: map[string]float64{"high": 2}}).Validate(); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"high", "=2", "high=x", "high=-1", "high=NaN", "high=1.5abc", "high=Inf"} {
		if _, _, err := ParseKeyFloat(bad); err == nil {
			t.Errorf("ParseKeyFloat(%q): no error", bad)
		}
	}
	if k, v, err := ParseKeyFloat("high=1.5"); err != nil || k != "high" || v != 1.5 {
		t.Errorf("ParseKeyFloat: %v %v %v", k, v, err)
	}
}

func TestForecast(t *testing.T) {
	// 250 of 1000 planned tokens in 100 s for $10: 300 s and $30 more.
	p, ok := PlanProgress(250, 1000, 5, 50, 0, 0)
	if !ok || p.Basis != "tokens" {
		t.Fatalf("%+v", p)
	}
	proj, rem := Forecast(p, 0, 100, 10, false)
	near(t, "projected", proj, 40)
	near(t, "remaining", rem, 300)
	// At the measured rate after warmup (5 tokens/s, faster than the 2.5
	// average): 150 s and $15 more.
	proj, rem = Forecast(p, 5, 100, 10, false)
	near(t, "projected at measured rate", proj, 25)
	near(t, "remaining at measured rate", rem, 150)
	// Steps when the run reports no tokens.
	p, _ = PlanProgress(0, 1000, 5, 50, 0, 0)
	proj, rem = Forecast(p, 0, 100, 10, false)
	near(t, "steps projected", proj, 100)
	near(t, "steps remaining", rem, 900)
	// Epochs.
	p, _ = PlanProgress(0, 0, 0, 0, 1.5, 3)
	if p.Basis != "epochs" || p.Fraction() != 0.5 {
		t.Errorf("%+v", p)
	}
	// An ended run, or one past its plan: nothing left.
	if proj, rem := Forecast(p, 0, 100, 10, true); proj != 10 || rem != 0 {
		t.Error(proj, rem)
	}
	p, _ = PlanProgress(2000, 1000, 0, 0, 0, 0)
	if proj, rem := Forecast(p, 1, 100, 10, false); proj != 10 || rem != 0 || p.Fraction() != 1 {
		t.Error(proj, rem)
	}
	if _, ok := PlanProgress(10, 0, 10, 0, 1, 0); ok {
		t.Error("no plan, but progress")
	}
}

func TestPeaks(t *testing.T) {
	for _, tc := range []struct {
		name, prec string
		want       float64
	}{
		{"NVIDIA H100 80GB HBM3", "bf16", 989},
		{"NVIDIA H100 PCIe", "bf16", 756},
		{"NVIDIA H100 80GB HBM3", "fp32", 67},
		{"NVIDIA H100 80GB HBM3", "tf32", 494},
		{"NVIDIA H200", "", 989},
		{"NVIDIA A100-SXM4-80GB", "fp16", 312},
		{"NVIDIA A10", "bf16", 125},
		{"Tesla T4", "fp16", 65},
		{"Tesla V100-SXM2-32GB", "fp32", 15.7},
		{"NVIDIA GeForce RTX 4090", "bf16", 165},
		{"NVIDIA L40S", "bf16", 362},
		{"Simulated H100 80GB HBM3", "bf16", 989},
		{"NVIDIA H100 NVL", "bf16", 835},
		{"NVIDIA A100 80GB PCIe", "bf16", 312},
		{"NVIDIA A100-PCIE-40GB", "tf32", 156},
		// Whole tokens only: no peak rather than another GPU's.
		{"NVIDIA A10G", "bf16", 0},      // not A10 (docs: A10G has no entry)
		{"NVIDIA RTX A1000", "bf16", 0}, // not A100
		{"NVIDIA T400", "fp16", 0},      // not T4
		{"Quadro T4000", "fp16", 0},     // not T4
		{"NVIDIA H200 NVL", "bf16", 0},  // not the H200 SXM
		{"Tesla V100-PCIE-16GB", "fp16", 0},
		{"NVIDIA GeForce RTX 4090 D", "bf16", 0},
		{"Replay GPU", "bf16", 0},
	} {
		// Twice: the second answer is the remembered one.
		for range 2 {
			got, ok := PeakTFLOPS(tc.name, tc.prec)
			if got != tc.want || ok != (tc.want > 0) {
				t.Errorf("PeakTFLOPS(%s, %s) = %v %v, want %v", tc.name, tc.prec, got, ok, tc.want)
			}
		}
	}
	near(t, "6ND", TrainingFLOPs(7e9, 1e6), 4.2e16)
	near(t, "points", AccuracyPoints(0.71), 71)
	near(t, "points", AccuracyPoints(71), 71)
}

func rep(id, model string, at int, usd float64, acc *float64, tokens uint64) *trainmeterv1.RunReport {
	return &trainmeterv1.RunReport{
		RunId: id, Metadata: &trainmeterv1.RunMetadata{Model: model},
		Start:        timestamppb.New(time.Date(2026, 1, 1, at, 0, 0, 0, time.UTC)),
		TotalCostUsd: priced(usd), AccuracyPoints: acc, TokensProcessed: tokens, GpuHours: usd / 2,
	}
}

func f(v float64) *float64 { return &v }

// priced is usd as a run's cost: unset (no price) when not above 0.
func priced(usd float64) *float64 {
	if usd <= 0 {
		return nil
	}
	return &usd
}

func TestModelsROIAndEfficiency(t *testing.T) {
	runs := []*trainmeterv1.RunReport{
		rep("b2", "bert", 3, 20, f(80), 1e6), // +10 points for $20
		rep("b0", "bert", 1, 10, f(70), 1e6), // baseline: first with accuracy and cost
		rep("b1", "bert", 2, 5, nil, 1e6),    // no eval
		rep("b3", "bert", 4, 40, f(85), 1e6), // +15 for $40
		rep("g0", "gpt", 1, 100, f(50), 4e6),
	}
	models := Models(runs)
	if len(models) != 2 || models[0].Model != "bert" || models[1].Model != "gpt" {
		t.Fatalf("models %+v", models)
	}
	b := models[0]
	if b.Runs != 4 || b.Baseline != "b0" || b.Best != "b3" {
		t.Fatalf("bert %+v", b)
	}
	near(t, "bert total", b.TotalCostUSD, 75)
	near(t, "bert ROI", *b.ROI, (85.0-70)/(5+20+40)) // best gain over the cost of the runs after the baseline
	near(t, "bert $/point of best", *b.BestUSDPerPoint, 40.0/85)
	near(t, "bert $/Mtok", *b.USDMtok, 75.0/4e6*1e6)
	ids := []string{}
	for _, r := range b.PerRun {
		ids = append(ids, r.RunID)
	}
	if strings.Join(ids, ",") != "b0,b1,b2,b3" {
		t.Errorf("per-run order %v", ids)
	}
	near(t, "b2 ROI", *b.PerRun[2].ROI, 10.0/20)
	near(t, "b3 gain", *b.PerRun[3].GainPoints, 15)
	if b.PerRun[0].ROI != nil || b.PerRun[1].ROI != nil {
		t.Error("baseline / no-eval run has an ROI")
	}
	if models[1].ROI != nil {
		t.Error("one run: no ROI")
	}

	// Efficiency: points per $ over the model's best (b0: 7/$).
	SetEfficiency(runs, runs)
	for id, want := range map[string]float64{"b0": 1, "b2": 4.0 / 7, "b3": 85.0 / 40 / 7, "g0": 1} {
		for _, r := range runs {
			if r.GetRunId() == id {
				if r.EfficiencyScore == nil {
					t.Fatalf("%s: no score", id)
				}
				near(t, id+" efficiency", *r.EfficiencyScore, want)
			}
		}
	}
	if runs[2].EfficiencyScore != nil {
		t.Error("run without accuracy has a score")
	}
}
