package report

import (
	"bytes"
	"encoding/csv"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/internal/money"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func fullRun() *RunReport {
	return &RunReport{
		RunId: "llama-sft-1",
		Metadata: &trainmeterv1.RunMetadata{
			Model: "llama-3-8b", Dataset: "sft", Backend: "unsloth", Optimizer: "adamw_torch",
			BatchSize: proto.Int64(8), GradAccum: proto.Int64(4), SeqLen: proto.Int64(2048), Precision: "bf16", Seed: proto.Int64(0), Notes: "lora r=32, \"quoted\"",
		},
		TokensProcessed: 1_310_720, TokensMeasured: 1_048_576, WallS: 600.5, WarmupS: 60,
		EnergyJ: 216000.123456789, EnergyTotalJ: 240000, EnergyJIntegrated: 214000,
		EnergyMethod: "counter", AvgPowerW: proto.Float64(399.6), PeakPowerW: 700.25, TokPerS: proto.Float64(1940.0111),
		JPerToken: proto.Float64(216000.123456789 / 1_048_576), VramPeakMb: 70123, VramAvgMb: 65000.5,
		Gpus: 2, Nodes: 1, GpuName: "NVIDIA H100 80GB HBM3", GpuHours: 600.5 * 2 / 3600,
		CostUsd: f64(600.5 * 2 / 3600 * 2.1), EnergyKwh: 240000 / 3.6e6, EnergyCostUsd: f64(240000 / 3.6e6 * 0.3),
		UsdPerMtok: proto.Float64(0.5), Co2Kg: f64(240000 / 3.6e6 * 0.4), Co2Gco2PerKwh: f64(400),
		Start: timestamppb.New(t0), End: timestamppb.New(t0.Add(600500 * time.Millisecond)), Ended: true, EndStatus: "ok",
		Steps: 20, DataWaitS: 12, ComputeS: 588, GapS: 0.25, EnergyDisagreementPct: 0.926,
		GpuPricePerHour:    f64(2.1),
		Evals:              []*trainmeterv1.Eval{{Epoch: proto.Int64(1), ValLoss: proto.Float64(1.93), Accuracy: proto.Float64(0.71), Time: timestamppb.New(t0.Add(5 * time.Minute))}},
		LastLoss:           f64(2.3125),
		TotalCostUsd:       f64(600.5*2/3600*2.1*1.5 + 240000/3.6e6*0.3),
		ProjectedCostUsd:   f64(600.5*2/3600*2.1*1.5 + 240000/3.6e6*0.3),
		PriorityMultiplier: 1.5, PriceSource: "run_start",
		EnergyBands: []*trainmeterv1.EnergyBandCost{
			{Band: "offpeak", Kwh: 0.025, UsdPerKwh: 0.12, CostUsd: 0.003},
			{Band: "peak", Kwh: 240000/3.6e6 - 0.025, UsdPerKwh: 0.3, CostUsd: (240000/3.6e6 - 0.025) * 0.3},
		},
		Samples: 640, UsdPerSample: f64(1.2), EpochsDone: f64(2), UsdPerEpoch: f64(3.4), AccuracyPoints: f64(71),
		UsdPerAccuracyPoint: f64(0.0123456789), EfficiencyScore: f64(0.875), StepsPerS: f64(0.0368),
		EpochS: f64(271.7), EstTotalS: f64(600.5), FlopsPerStep: f64(6 * 8e9 * 65536), FlopsTotal: f64(6 * 8e9 * 1_310_720),
		PeakTflops: f64(989), Mfu: f64(0.0471), JPerPflop: f64(4.291234567891),
		EnergyUncertaintyPct: f64(0.066818),
	}
}

func f64(v float64) *float64 { return &v }

// sparseRun has unknown values everywhere: a live run still in warmup,
// without prices or metadata ints.
func sparseRun() *RunReport {
	return &RunReport{
		RunId:           "warming",
		Metadata:        &trainmeterv1.RunMetadata{Model: "tiny"},
		TokensProcessed: 4096, WallS: 12, WarmupS: 12, EnergyTotalJ: 1234.5,
		Gpus: 1, Nodes: 1, GpuHours: 12.0 / 3600, EnergyKwh: 1234.5 / 3.6e6,
		JPerToken: proto.Float64(math.NaN()), Start: timestamppb.New(t0), End: timestamppb.New(t0.Add(12 * time.Second)),
		RatesUnavailable: "in_warmup",
	}
}

func tinyRun() *RunReport {
	r := fullRun()
	r.RunId = "tiny-jpt"
	r.JPerToken = proto.Float64(1.234567891234e-7)
	r.EnergyMethod = "integrated"
	// No price and no carbon intensity: the cost and CO2 figures are unset.
	r.CostUsd, r.EnergyCostUsd, r.GpuPricePerHour, r.TotalCostUsd, r.ProjectedCostUsd, r.UsdPerMtok, r.Co2Kg, r.Co2Gco2PerKwh = nil, nil, nil, nil, nil, nil, nil, nil
	r.Metadata = nil
	r.EndStatus = "exit 3"
	return r
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run go test ./collector/internal/report -update to accept):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func TestCSVGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteCSV(&buf, []*RunReport{fullRun(), sparseRun(), tinyRun()}); err != nil {
		t.Fatal(err)
	}
	golden(t, "runs.csv.golden", buf.Bytes())

	recs, err := csv.NewReader(bytes.NewReader(buf.Bytes())).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	for i, rec := range recs {
		if len(rec) != len(Header()) {
			t.Errorf("row %d has %d cells, header %d", i, len(rec), len(Header()))
		}
		for j, c := range rec {
			if l := strings.ToLower(c); l == "nan" || strings.Contains(l, "inf") && recs[0][j] != "notes" {
				t.Errorf("row %d %s = %q", i, recs[0][j], c)
			}
		}
	}
}

func TestHeaderContract(t *testing.T) {
	want := []string{"run_id", "tokens_processed", "wall_s", "warmup_s", "energy_J", "avg_power_W",
		"peak_power_W", "tok_per_s", "J_per_token", "E10k_J", "vram_peak_MB", "vram_avg_MB",
		"model", "dataset", "backend", "optimizer", "batch_size", "grad_accum", "seq_len",
		"precision", "seed", "notes", "tokens_measured", "energy_total_J", "energy_J_integrated",
		"energy_method", "gpus", "nodes", "gpu_name", "gpu_hours", "cost_usd", "energy_kWh",
		"energy_cost_usd", "usd_per_mtok", "co2_kg"}
	h := Header()
	if len(h) < len(want) {
		t.Fatalf("header too short: %v", h)
	}
	for i, c := range want {
		if h[i] != c {
			t.Errorf("column %d = %q, want %q", i, h[i], c)
		}
	}
	h[0] = "mutated"
	if Header()[0] != "run_id" {
		t.Error("Header returns shared slice")
	}
}

func cell(t *testing.T, r *RunReport, col string) string {
	t.Helper()
	for i, c := range Header() {
		if c == col {
			return Row(r)[i]
		}
	}
	t.Fatalf("no column %s", col)
	return ""
}

func TestUnknownsAreEmpty(t *testing.T) {
	r := sparseRun()
	for _, col := range []string{"energy_J", "avg_power_W", "peak_power_W", "tok_per_s", "J_per_token",
		"E10k_J", "vram_peak_MB", "vram_avg_MB", "batch_size", "grad_accum", "seq_len", "seed",
		"energy_J_integrated", "cost_usd", "energy_cost_usd", "usd_per_mtok", "co2_kg",
		"energy_disagreement_pct", "data_wait_share", "last_loss", "total_cost_usd", "projected_cost_usd",
		"usd_per_sample", "epochs_done", "usd_per_epoch", "accuracy_points",
		"usd_per_accuracy_point", "efficiency_score", "steps_per_s", "epoch_s", "est_total_s",
		"flops_per_step", "flops_total", "peak_TFLOPS", "mfu", "J_per_PFLOP", "peak_power_total_W"} {
		if got := cell(t, r, col); got != "" {
			t.Errorf("%s = %q, want empty", col, got)
		}
	}
	if got := cell(t, r, "tokens_processed"); got != "4096" {
		t.Errorf("tokens_processed = %q", got)
	}
	if got := cell(t, fullRun(), "seed"); got != "0" {
		t.Errorf("seed 0 with has_seed = %q, want 0", got)
	}
	if got := cell(t, tinyRun(), "J_per_token"); got != "0.000000123456789" {
		t.Errorf("tiny J_per_token = %q", got)
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{0, "0"}, {math.Copysign(0, -1), "0"}, {1.5, "1.5"}, {1.0000004, "1"}, {1.0000005, "1.000001"},
		{123456789.123, "123456789.123"}, {math.NaN(), ""}, {math.Inf(1), ""}, {1e-7, "0"}} {
		if got := F(c.v); got != c.want {
			t.Errorf("F(%v) = %q, want %q", c.v, got, c.want)
		}
	}
	if got := G9(0.000123456789123); got != "0.000123456789" {
		t.Errorf("G9 = %q", got)
	}
}

func TestTableAndReportGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, []*RunReport{fullRun(), sparseRun()}); err != nil {
		t.Fatal(err)
	}
	golden(t, "table.golden", buf.Bytes())
	buf.Reset()
	if err := WriteReport(&buf, fullRun()); err != nil {
		t.Fatal(err)
	}
	if err := WriteReport(&buf, sparseRun()); err != nil {
		t.Fatal(err)
	}
	golden(t, "report.golden", buf.Bytes())
}

func TestIncompleteRunIsMarked(t *testing.T) {
	r := fullRun()
	if cell(t, r, "complete") != "yes" || cell(t, r, "lost_batches") != "0" || cell(t, r, "lost_tokens") != "0" || cell(t, r, "lost_energy_J") != "0" {
		t.Errorf("complete run: %s %s %s %s", cell(t, r, "complete"), cell(t, r, "lost_batches"), cell(t, r, "lost_tokens"), cell(t, r, "lost_energy_J"))
	}
	r.Incomplete, r.LostBatches, r.LostTokens, r.LostEnergyJ, r.LostGpuSeconds = true, 12, 65536, 7200.5, 24
	r.LostReasons = []string{"spool full"}
	if cell(t, r, "complete") != "no" || cell(t, r, "lost_batches") != "12" || cell(t, r, "lost_tokens") != "65536" || cell(t, r, "lost_energy_J") != "7200.5" {
		t.Errorf("incomplete run: %s %s %s %s", cell(t, r, "complete"), cell(t, r, "lost_batches"), cell(t, r, "lost_tokens"), cell(t, r, "lost_energy_J"))
	}
	var buf bytes.Buffer
	if err := WriteReport(&buf, r); err != nil {
		t.Fatal(err)
	}
	want := "INCOMPLETE: 12 batches of this run were dropped on an agent (spool full); missing from the figures: 65536 tokens, 7200.5 J GPU energy, 0.006667 GPU-hours"
	if lines := strings.Split(buf.String(), "\n"); len(lines) < 2 || lines[1] != want {
		t.Errorf("report starts:\n%s\nwant line 2: %s", buf.String()[:min(300, buf.Len())], want)
	}

	// The dropped batches' host energy (the run's CPU+DRAM share), named as such.
	// Empty where no node measured host energy (unknown, not 0), 0 where
	// one did and none of it was lost.
	if c := cell(t, r, "lost_host_energy_J"); c != "" {
		t.Errorf("lost_host_energy_J %q without host energy measured, want empty", c)
	}
	cpu := 5.0
	r.CpuEnergyJ = &cpu
	if c := cell(t, r, "lost_host_energy_J"); c != "0" {
		t.Errorf("lost_host_energy_J %q without host energy lost, want 0", c)
	}
	r.LostHostEnergyJ = 310.25
	if c := cell(t, r, "lost_host_energy_J"); c != "310.25" {
		t.Errorf("lost_host_energy_J %q, want 310.25", c)
	}
	buf.Reset()
	if err := WriteReport(&buf, r); err != nil {
		t.Fatal(err)
	}
	want = "INCOMPLETE: 12 batches of this run were dropped on an agent (spool full); missing from the figures: 65536 tokens, 7200.5 J GPU energy, 310.25 J host energy (CPU+DRAM), 0.006667 GPU-hours"
	if lines := strings.Split(buf.String(), "\n"); len(lines) < 2 || lines[1] != want {
		t.Errorf("report starts:\n%s\nwant line 2: %s", buf.String()[:min(300, buf.Len())], want)
	}
}

// TestReportCostLinesAreTheirOwnValues: over costs of six orders of
// magnitude, with and without a priority multiplier, each cost line is its
// own value rounded (money.Amount) and the total says "rounded" exactly
// when the lines shown do not add up to it.
func TestReportCostLinesAreTheirOwnValues(t *testing.T) {
	for _, gpuHours := range []float64{0.00001, 0.0055, 0.02, 0.7, 3, 41, 1234} {
		for _, mult := range []float64{1, 1.5} {
			r := fullRun()
			r.EnergyBands = nil
			r.GpuHours = gpuHours
			r.CostUsd = f64(gpuHours * 2.1)
			r.EnergyCostUsd = f64(gpuHours * 0.0917)
			r.PriorityMultiplier = mult
			r.TotalCostUsd = f64(r.GetCostUsd()*mult + r.GetEnergyCostUsd())
			var b bytes.Buffer
			if err := WriteReport(&b, r); err != nil {
				t.Fatal(err)
			}
			gpu := strings.Fields(moneyLine(t, b.String(), "gpu cost"))[0]
			energy := strings.Fields(moneyLine(t, b.String(), "energy cost"))[0]
			total := moneyLine(t, b.String(), "total")
			shown := strings.Fields(total)[0]
			if gpu != money.Amount(r.GetCostUsd()*mult) || energy != money.Amount(r.GetEnergyCostUsd()) || shown != money.Amount(r.GetTotalCostUsd()) {
				t.Errorf("%v GPU-hours ×%v: gpu %s energy %s total %s, want each its own value rounded in\n%s", gpuHours, mult, gpu, energy, shown, b.String())
			}
			if rounded := strings.Contains(total, "(rounded)"); rounded == money.AddsUp(shown, gpu, energy) {
				t.Errorf("%v GPU-hours ×%v: %s + %s vs total %q: rounded note %v", gpuHours, mult, gpu, energy, total, rounded)
			}
		}
	}
}

// TestWholeRunPowerOfARunInItsWarmup: a run that never left its warmup has
// no after-warmup power, but its whole-run average is energy_total_J /
// wall_s, in the CSV as in the report.
func TestWholeRunPowerOfARunInItsWarmup(t *testing.T) {
	r := sparseRun()
	r.PeakPowerTotalW = 130
	if got := cell(t, r, "avg_power_total_W"); got != "102.875" {
		t.Errorf("avg_power_total_W = %q, want 1234.5 J / 12 s = 102.875", got)
	}
	if got := cell(t, r, "peak_power_total_W"); got != "130" {
		t.Errorf("peak_power_total_W = %q, want 130", got)
	}
	if got := cell(t, r, "avg_power_W"); got != "" {
		t.Errorf("avg_power_W (after warmup) = %q, want empty", got)
	}
	var b bytes.Buffer
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"average:           102.9 W whole run, - W after warmup", "peak:              130.0 W whole run, - W after warmup", "still in its warmup"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
