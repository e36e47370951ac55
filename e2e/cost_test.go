package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The cost scenarios run a replayed node (2 GPUs at a constant 300 W, the
// counter agreeing) so the energy of any stretch of the run is known by hand:
// 600 W × its length. Expectations are computed from the report's own start
// and end (the run's real times) and the configured prices; the tolerance is
// 1 %, the same as the energy figures themselves are held to
// (TestReplayedPowerGivesExactRunFigures): the windows that carry energy and
// GPU time start and end within a sample tick (50 ms) of run_start/run_end.
const (
	costGPUs   = 2
	costPowerW = 300.0
	costTol    = 0.01
)

// runCosted runs one trainer through a run of n steps spaced by every, with
// the given extra run_start keys, and returns its CSV row.
func runCosted(t *testing.T, c *cluster, sock, run, extra string, n int, every time.Duration) map[string]string {
	t.Helper()
	c.waitStreaming("replay-node")
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":%q,"model":"costed","backend":"b","precision":"bf16","gpus":[0,1],"warmup_s":1%s}`, run, extra)
	tr.runSteps(run, n, 512, every)
	tr.send(`{"event":"run_end","run_id":%q}`, run)
	tr.sync()
	c.waitEnded(run)
	return c.csvRow(run)
}

func runTimes(t *testing.T, row map[string]string) (start, end time.Time) {
	t.Helper()
	var err error
	if start, err = time.Parse(time.RFC3339Nano, row["start_time"]); err != nil {
		t.Fatal(err)
	}
	if end, err = time.Parse(time.RFC3339Nano, row["end_time"]); err != nil {
		t.Fatal(err)
	}
	return start, end
}

// closeTo checks got against want to within abs (for sums of rounded cells).
func closeTo(t *testing.T, what string, got, want, abs float64) {
	t.Helper()
	if math.Abs(got-want) > abs {
		t.Errorf("%s = %.9g, want %.9g ± %g", what, got, want, abs)
	}
}

func TestCostColumnsFlatTariff(t *testing.T) {
	t.Parallel()
	// $3.6 per GPU-hour is $0.001 per GPU-second; $36/kWh is $0.00001 per J.
	// Large prices keep the 6-decimal CSV cells far from their rounding.
	c := startCollector(t, "--gpu-price-per-hour", "3.6", "--energy-price-kwh", "36", "--grid-gco2-kwh", "500",
		"--priority-multiplier", "high=2", "--priority-multiplier", "low=0.5")
	sock := c.startAgent("replay-node", "replay:"+writeTrace(t, costGPUs, costPowerW, costPowerW, 120), "--warmup", "30s")
	// While the run goes, its projected cost is the cost so far scaled to the
	// plan; read it once half the planned tokens have arrived.
	type forecast struct{ projected, total, progress, tokens, tokPerS, wallS float64 }
	mid := make(chan forecast, 1)
	go func() {
		defer close(mid)
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			resp, err := c.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "flat"})
			if r := resp.GetRun(); err == nil && !r.GetEnded() && r.GetTokensProcessed() >= 10240 {
				mid <- forecast{r.GetProjectedCostUsd(), r.GetTotalCostUsd(), r.GetProgress(), float64(r.GetTokensProcessed()), r.GetTokPerS(), r.GetWallS()}
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	row := runCosted(t, c, sock, "flat", `,"priority":"high","params":1000000,"planned_tokens":20480,"dataset_size":400`, 40, 100*time.Millisecond)
	if f, ok := <-mid; !ok {
		t.Error("never saw the live run past half its planned tokens")
	} else {
		// The tokens left at the measured tok/s, at the average spend so far
		// (docs/costs.md); at a steady pace and power that is the final cost,
		// up to how evenly the loaded machine paced the steps: 20 %.
		remaining := (20480 - f.tokens) / f.tokPerS
		within(t, "projected at "+fmt.Sprintf("%.0f%%", 100*f.progress), f.projected, f.total+remaining*f.total/f.wallS, 1e-9)
		within(t, "mid-run projection vs final total", f.projected, num(t, row, "total_cost_usd"), 0.2)
	}

	start, end := runTimes(t, row)
	wall := end.Sub(start).Seconds()
	energyJ := costGPUs * costPowerW * wall // whole run, warmup included
	gpuHours := costGPUs * wall / 3600
	compute := gpuHours * 3.6
	energyUSD := energyJ / 3.6e6 * 36
	total := 2*compute + energyUSD
	t.Logf("run %.3f s: expect compute $%.6f, energy $%.6f, total $%.6f", wall, compute, energyUSD, total)

	within(t, "gpu_hours", num(t, row, "gpu_hours"), gpuHours, costTol)
	within(t, "cost_usd", num(t, row, "cost_usd"), compute, costTol)
	within(t, "energy_kWh", num(t, row, "energy_kWh"), energyJ/3.6e6, costTol)
	within(t, "energy_cost_usd", num(t, row, "energy_cost_usd"), energyUSD, costTol)
	within(t, "co2_kg", num(t, row, "co2_kg"), energyJ/3.6e6*500/1000, costTol)
	within(t, "total_cost_usd", num(t, row, "total_cost_usd"), total, costTol)
	within(t, "usd_per_mtok", num(t, row, "usd_per_mtok"), total/20480*1e6, costTol)
	// The columns agree with each other to the CSV's rounding.
	closeTo(t, "total = 2 × cost + energy", num(t, row, "total_cost_usd"), 2*num(t, row, "cost_usd")+num(t, row, "energy_cost_usd"), 3e-6)
	closeTo(t, "gpu_price_per_hour", num(t, row, "gpu_price_per_hour"), 3.6, 1e-6)
	if row["price_source"] != "flag" || row["priority_multiplier"] != "2" {
		t.Errorf("price_source %q priority_multiplier %q", row["price_source"], row["priority_multiplier"])
	}
	// Ended, and all 20480 planned tokens done: the projection is the total.
	if row["projected_cost_usd"] != row["total_cost_usd"] || row["status"] != "ended" {
		t.Errorf("projected %s total %s status %s", row["projected_cost_usd"], row["total_cost_usd"], row["status"])
	}
	// Compute report: 6 × 1e6 params × 20480 tokens; 40 steps.
	within(t, "flops_total", num(t, row, "flops_total"), 6*1e6*20480, 1e-9)
	within(t, "flops_per_step", num(t, row, "flops_per_step"), 6*1e6*512, 1e-9)
	within(t, "J_per_PFLOP", num(t, row, "J_per_PFLOP"), num(t, row, "energy_J")/(6*1e6*float64(num(t, row, "tokens_measured"))/1e15), 1e-6)
	if row["mfu"] != "" || row["peak_TFLOPS"] != "" {
		t.Errorf("a replay GPU has no peak in the table, yet mfu %q peak %q", row["mfu"], row["peak_TFLOPS"])
	}
	if row["accuracy_points"] != "" || row["efficiency_score"] != "" {
		t.Errorf("no eval, yet accuracy %q efficiency %q", row["accuracy_points"], row["efficiency_score"])
	}
}

// tariffAcrossNextSwitch writes a UTC tariff whose peak band starts at the
// next minute boundary at least lead ahead, and returns the switch time.
func tariffAcrossNextSwitch(t *testing.T, lead time.Duration) (string, time.Time) {
	t.Helper()
	sw := time.Now().UTC().Add(lead).Truncate(time.Minute).Add(time.Minute)
	to := sw.Add(30 * time.Minute)
	y := fmt.Sprintf("zone: UTC\ndefault: offpeak\nbands: {offpeak: 50, peak: 150}\nrules:\n  - {days: [all], from: %q, to: %q, band: peak}\n",
		sw.Format("15:04"), to.Format("15:04"))
	path := filepath.Join(t.TempDir(), "tariff.yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, sw
}

func TestCostColumnsTimeOfUseAcrossTheSwitch(t *testing.T) {
	t.Parallel()
	// Off-peak $50/kWh until the next minute boundary (5-65 s away), then peak
	// $150/kWh; the run lasts until 5 s past the switch.
	tariff, sw := tariffAcrossNextSwitch(t, 5*time.Second)
	// The node's own price wins over the default.
	c := startCollector(t, "--tariff", tariff, "--gpu-price-per-hour", "3.6", "--node-gpu-price", "replay-node=7.2")
	sock := c.startAgent("replay-node", "replay:"+writeTrace(t, costGPUs, costPowerW, costPowerW, 150), "--warmup", "30s")
	const every = 100 * time.Millisecond
	steps := int(time.Until(sw.Add(5*time.Second))/every) + 1
	row := runCosted(t, c, sock, "tou", "", steps, every)

	start, end := runTimes(t, row)
	if !start.Before(sw) || !end.After(sw) {
		t.Fatalf("run %v..%v does not span the switch at %v", start, end, sw)
	}
	offJ := costGPUs * costPowerW * sw.Sub(start).Seconds()
	peakJ := costGPUs * costPowerW * end.Sub(sw).Seconds()
	energyUSD := offJ/3.6e6*50 + peakJ/3.6e6*150
	allPeak := (offJ + peakJ) / 3.6e6 * 150
	t.Logf("off-peak %.1f J, peak %.1f J: expect energy $%.6f (all at peak it would be $%.6f)", offJ, peakJ, energyUSD, allPeak)
	within(t, "energy_cost_usd", num(t, row, "energy_cost_usd"), energyUSD, costTol)
	within(t, "cost_usd at the node's price", num(t, row, "cost_usd"), costGPUs*end.Sub(start).Seconds()/3600*7.2, costTol)
	within(t, "total_cost_usd", num(t, row, "total_cost_usd"), costGPUs*end.Sub(start).Seconds()/3600*7.2+energyUSD, costTol)
	if row["price_source"] != "node" || row["gpu_price_per_hour"] != "7.2" {
		t.Errorf("price_source %q gpu_price_per_hour %q, want node and 7.2", row["price_source"], row["gpu_price_per_hour"])
	}
	closeTo(t, "total = cost + energy", num(t, row, "total_cost_usd"), num(t, row, "cost_usd")+num(t, row, "energy_cost_usd"), 2e-6)

	// The whole report, as scripts read it.
	var rep struct {
		EnergyBands []struct {
			Band      string  `json:"band"`
			KWh       float64 `json:"kwh"`
			USDPerKWh float64 `json:"usd_per_kwh"`
			CostUSD   float64 `json:"cost_usd"`
		} `json:"energy_bands"`
		TotalCostUSD float64 `json:"total_cost_usd"`
	}
	if err := json.Unmarshal([]byte(c.cli("report", "tou", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.EnergyBands) != 2 || rep.EnergyBands[0].Band != "offpeak" || rep.EnergyBands[1].Band != "peak" {
		t.Fatalf("energy bands %+v", rep.EnergyBands)
	}
	within(t, "off-peak kWh", rep.EnergyBands[0].KWh, offJ/3.6e6, costTol)
	within(t, "peak kWh", rep.EnergyBands[1].KWh, peakJ/3.6e6, costTol)
	closeTo(t, "JSON total = CSV total", rep.TotalCostUSD, num(t, row, "total_cost_usd"), 1e-6)
}

func TestComputeReportOnSimulatedH100(t *testing.T) {
	t.Parallel()
	c := startCollector(t)
	sock := c.startAgent("sim-node", "sim:1", "--warmup", "30s")
	c.waitStreaming("sim-node")
	tr := dialTrainer(t, sock)
	// 1e8 params, bf16, 50 steps of 4096 tokens / 8 samples, dataset of 400
	// samples, 2 epochs planned.
	tr.send(`{"event":"run_start","run_id":"mfu","model":"m","precision":"bf16","gpus":[0],"warmup_s":0.5,"params":100000000,"dataset_size":400,"planned_epochs":2,"planned_steps":100}`)
	for i := 1; i <= 50; i++ {
		time.Sleep(50 * time.Millisecond)
		tr.send(`{"event":"step","run_id":"mfu","step":%d,"tokens":4096,"samples":8}`, i)
	}
	tr.send(`{"event":"run_end","run_id":"mfu"}`)
	tr.sync()
	c.waitEnded("mfu")
	row := c.csvRow("mfu")

	measured := num(t, row, "wall_s") - num(t, row, "warmup_s")
	tokS := num(t, row, "tok_per_s")
	within(t, "peak_TFLOPS (H100 SXM bf16)", num(t, row, "peak_TFLOPS"), 989, 0)
	within(t, "mfu", num(t, row, "mfu"), 6*1e8*tokS/(1*989e12), 1e-4) // tok_per_s is rounded to 6 decimals in the CSV
	within(t, "flops_total", num(t, row, "flops_total"), 6*1e8*50*4096, 1e-9)
	within(t, "flops_per_step", num(t, row, "flops_per_step"), 6*1e8*4096, 1e-9)
	within(t, "J_per_PFLOP", num(t, row, "J_per_PFLOP"), num(t, row, "energy_J")/(6*1e8*num(t, row, "tokens_measured")/1e15), 1e-6)
	// Steps and samples after warmup: tokens_measured / 4096 steps of 8 samples.
	stepsMeasured := num(t, row, "tokens_measured") / 4096
	within(t, "steps_per_s", num(t, row, "steps_per_s"), stepsMeasured/measured, 1e-4)
	within(t, "epoch_s", num(t, row, "epoch_s"), 400/(8*stepsMeasured/measured), 1e-4)
	within(t, "epochs_done", num(t, row, "epochs_done"), 50*8/400.0, 1e-9)
	// Ended: the estimated total time is the wall time.
	within(t, "est_total_s", num(t, row, "est_total_s"), num(t, row, "wall_s"), 1e-9)
}
