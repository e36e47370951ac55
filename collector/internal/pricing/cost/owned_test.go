package cost

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

const ownedYAML = `
pue: 1.25
gpus:
  - model: H100 SXM
    purchase_usd: 35040
    lifetime_years: 4
    residual_usd: 0
  - model: A100 SXM4
    purchase_usd: 20000
    lifetime_years: 5
    residual_usd: 2480
nodes:
  old-box: {purchase_usd: 8760, lifetime_years: 2, residual_usd: 0}
`

func TestOwnedHardwareAmortisedPrice(t *testing.T) {
	o, err := ParseOwnedHardware([]byte(ownedYAML))
	if err != nil {
		t.Fatal(err)
	}
	cat := &mapCatalog{prices: map[string]float64{"H100": 2.5, "RTX": 0.4}}
	c := Config{GPUPricePerHour: 0.1, NodeGPUPricePerHour: map[string]float64{"rented": 3}, Catalog: cat, Owned: o, PUE: o.PUE}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		runStart  float64
		node, gpu string
		want      float64
		src       string
	}{
		{4, "n1", "NVIDIA H100 80GB HBM3", 4, SourceRunStart},
		{0, "rented", "NVIDIA H100 80GB HBM3", 3, SourceNode},
		// 35,040 / (4 × 8,760 h) = $1/GPU-hour, not the catalog's $2.50: owned.
		{0, "n1", "NVIDIA H100 80GB HBM3", 1, SourceAmortized},
		// (20,000 − 2,480) / (5 × 8,760) = $0.40.
		{0, "n1", "NVIDIA A100-SXM4-80GB", 0.4, SourceAmortized},
		// The node's own entry wins over its GPU model's: 8,760 / (2 × 8,760).
		{0, "old-box", "NVIDIA H100 80GB HBM3", 0.5, SourceAmortized},
		{0, "n1", "NVIDIA GeForce RTX 4090", 0.4, SourceCatalog},
		{0, "n1", "Tesla T4", 0.1, SourceFlag},
		{0, "", "NVIDIA H100 80GB HBM3", 1, SourceAmortized}, // a model priced for no node
	} {
		p, src, ok := c.GPUPrice(tc.runStart, tc.node, tc.gpu)
		if !ok || math.Abs(p-tc.want) > 1e-12 || src != tc.src {
			t.Errorf("GPUPrice(%v, %q, %q) = %v %s %v, want %v %s", tc.runStart, tc.node, tc.gpu, p, src, ok, tc.want, tc.src)
		}
	}
}

// TestPUE: energy cost and CO2 are of GPU energy × PUE; 0 means 1.
func TestPUE(t *testing.T) {
	c := Config{EnergyPricePerKWh: 0.2, GridGCO2PerKWh: 400, PUE: 1.5}
	usd, bands, ok := c.EnergyCost(nil, 3.6e6) // 1 kWh at the GPUs
	if !ok || math.Abs(usd-0.3) > 1e-12 || math.Abs(bands[0].KWh-1.5) > 1e-12 {
		t.Errorf("energy cost %v bands %+v, want $0.30 for 1.5 facility kWh", usd, bands)
	}
	if co2, _ := c.CO2Kg(1); math.Abs(co2-0.6) > 1e-12 {
		t.Errorf("co2 %v kg, want 0.6", co2)
	}
	tar, err := ParseTariff([]byte("default: flat\nbands: {flat: 0.1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c = Config{Tariff: tar, PUE: 2}
	if usd, _, _ := c.EnergyCost(map[string]float64{"flat": 3.6e6}, 3.6e6); math.Abs(usd-0.2) > 1e-12 {
		t.Errorf("tariff energy cost with PUE 2: %v, want 0.2", usd)
	}
	if co2, _ := (Config{GridGCO2PerKWh: 400}).CO2Kg(1); co2 != 0.4 {
		t.Errorf("co2 without PUE %v", co2)
	}
	if err := (Config{PUE: 0.9}).Validate(); err == nil || !strings.Contains(err.Error(), "pue") {
		t.Errorf("PUE 0.9 accepted: %v", err)
	}
}

func TestOwnedHardwareErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"", "empty"},
		{"pue: 0.8", "pue must be"},
		{"gpus: [{model: H100, purchase_usd: 0, lifetime_years: 4}]", "purchase_usd must be"},
		{"gpus: [{model: H100, purchase_usd: 100, lifetime_years: 0}]", "lifetime_years must be"},
		{"gpus: [{model: H100, purchase_usd: 100, lifetime_years: 3, residual_usd: 100}]", "must be below purchase_usd"},
		{"gpus: [{model: H100, purchase_usd: 100, lifetime_years: 3, residual_usd: -1}]", "residual_usd must be"},
		{"gpus: [{purchase_usd: 100, lifetime_years: 3}]", "model is empty"},
		{"gpus: [{model: H100, purchase_usd: 1, lifetime_years: 1}, {model: H100, purchase_usd: 1, lifetime_years: 1}]", "listed twice"},
		{"nodes: {n1: {model: H100, purchase_usd: 1, lifetime_years: 1}}", "model is for the gpus list"},
		{"gpus: [{model: H100, price: 5}]", "field price not found"},
	} {
		_, err := ParseOwnedHardware([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
	path := filepath.Join(t.TempDir(), "owned.yaml")
	if err := os.WriteFile(path, []byte("pue: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if o, err := LoadOwnedHardware(path); err != nil || o.PUE != 2 {
		t.Errorf("load: %+v %v", o, err)
	}
	if _, err := LoadOwnedHardware(path + ".missing"); err == nil || !strings.Contains(err.Error(), "owned hardware") {
		t.Errorf("missing file: %v", err)
	}
}

func pastRun(id, model, gpu string, gpus uint32, tokens uint64, gpuHours, energyJ, costUSD float64) *trainmeterv1.RunReport {
	return &trainmeterv1.RunReport{
		RunId: id, Metadata: &trainmeterv1.RunMetadata{Model: model}, GpuName: gpu, Gpus: gpus, Ended: true,
		TokensProcessed: tokens, GpuHours: gpuHours, EnergyTotalJ: energyJ, CostUsd: priced(costUSD),
		PriceSource: SourceFlag,
	}
}

func TestEstimate(t *testing.T) {
	const h100 = "NVIDIA H100 80GB HBM3"
	history := []*trainmeterv1.RunReport{
		// 1e6 tokens per GPU-hour, 1 J per token, at $2/GPU-hour
		pastRun("a", "m", h100, 2, 1e6, 1, 1e6, 2),
		pastRun("b", "m", h100, 2, 2e6, 1, 3e6, 2), // 2e6 tok/GPU-h, 1.5 J/tok
		pastRun("c", "m", h100, 4, 1e6, 2, 2e6, 4), // 0.5e6 tok/GPU-h, 2 J/tok
		pastRun("other", "x", h100, 1, 1e6, 1, 1e6, 2),
	}
	live := pastRun("live", "m", h100, 1, 1e9, 1, 1, 1)
	live.Ended = false
	lost := pastRun("lost", "m", h100, 1, 1e9, 1, 1, 1)
	lost.Incomplete = true
	// A run that crashed (or was killed) ran at a pace the next run will not.
	crashed := pastRun("crashed", "m", h100, 1, 1e9, 1, 1, 1)
	crashed.EndStatus = "exit 3"
	// A run stopped by its budget ran at a normal pace until then.
	stopped := pastRun("stopped", "m", h100, 2, 1e6, 1, 1e6, 2)
	stopped.EndStatus = "stopped: budget"
	history = append(history, live, lost, crashed)
	c := Config{EnergyPricePerKWh: 0.36}
	e, err := c.Estimate(history, EstimateRequest{Model: "m", Tokens: 4e6})
	if err != nil {
		t.Fatal(err)
	}
	if withStopped, _ := c.Estimate(append(history, stopped), EstimateRequest{Model: "m", Tokens: 4e6}); !slices.Contains(withStopped.GetBasedOn(), "stopped") {
		t.Errorf("a run stopped by its budget left out: based on %v", withStopped.GetBasedOn())
	}
	if strings.Join(e.GetBasedOn(), ",") != "a,b,c" || e.GetGpus() != 2 || !e.GetSameGpu() {
		t.Fatalf("based on %v gpus %d same %v", e.GetBasedOn(), e.GetGpus(), e.GetSameGpu())
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	// GPU-hours: 4e6 tokens at 2e6 / 1e6 / 0.5e6 tokens per GPU-hour.
	near("gpu_hours.low", e.GetGpuHours().GetLow(), 2)
	near("gpu_hours.mid", e.GetGpuHours().GetMid(), 4)
	near("gpu_hours.high", e.GetGpuHours().GetHigh(), 8)
	near("wall_s.mid", e.GetWallS().GetMid(), 4*3600/2)
	// Energy: 4e6 tokens × 1 / 1.5 / 2 J.
	near("energy.low", e.GetEnergyKwh().GetLow(), 4e6/3.6e6)
	near("energy.mid", e.GetEnergyKwh().GetMid(), 6e6/3.6e6)
	near("energy.high", e.GetEnergyKwh().GetHigh(), 8e6/3.6e6)
	// Price: the past runs' $8 over 4 GPU-hours; energy at $0.36/kWh.
	near("price", e.GetGpuPricePerHour(), 2)
	near("cost.mid", e.GetCostUsd().GetMid(), 4*2+6e6/3.6e6*0.36)
	if e.CostUsd == nil || e.GetPriceSource() != SourceFlag {
		t.Errorf("cost %v source %q", e.GetCostUsd(), e.GetPriceSource())
	}

	// Four GPUs: the same GPU-hours in half the time.
	e4, _ := c.Estimate(history, EstimateRequest{Model: "m", Tokens: 4e6, GPUs: 4})
	near("wall_s.mid on 4 GPUs", e4.GetWallS().GetMid(), 4*3600/4)

	// Another GPU with no past run on it: the pace stays, the price is its own.
	c.Catalog = &mapCatalog{prices: map[string]float64{"A100": 1}}
	ea, err := c.Estimate(history, EstimateRequest{Model: "m", Tokens: 4e6, GPU: "A100 SXM4"})
	if err != nil {
		t.Fatal(err)
	}
	near("A100 gpu_hours.mid", ea.GetGpuHours().GetMid(), 4)
	near("A100 cost.mid", ea.GetCostUsd().GetMid(), 4*1+6e6/3.6e6*0.36)
	if ea.GetSameGpu() || ea.GetPriceSource() != SourceCatalog || len(ea.GetNotes()) == 0 || !strings.Contains(ea.GetNotes()[0], "only the price") {
		t.Errorf("A100 estimate: same %v source %q notes %q", ea.GetSameGpu(), ea.GetPriceSource(), ea.GetNotes())
	}
	// The GPU the runs ran on: those runs, priced for that model.
	eh, _ := c.Estimate(history, EstimateRequest{Model: "m", Tokens: 4e6, GPU: "H100 SXM"})
	if !eh.GetSameGpu() || len(eh.GetBasedOn()) != 3 {
		t.Errorf("H100 estimate: same %v based on %v", eh.GetSameGpu(), eh.GetBasedOn())
	}

	if _, err := c.Estimate(history, EstimateRequest{Model: "nope", Tokens: 1}); err == nil || !strings.Contains(err.Error(), "no ended runs") {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := c.Estimate(history, EstimateRequest{Model: "m"}); err == nil {
		t.Error("no tokens accepted")
	}
	one, _ := c.Estimate(history, EstimateRequest{Model: "x", Tokens: 1e6})
	if one.GetCostUsd().GetLow() != one.GetCostUsd().GetHigh() || len(one.GetNotes()) != 1 {
		t.Errorf("one past run: band %v notes %q", one.GetCostUsd(), one.GetNotes())
	}
}
