package e2e

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOwnedHardwareEstimateAndMaxCost, with the real binaries: owned GPUs
// are priced from their purchase (price_source amortized) and energy with
// the PUE; `trainmeter estimate` scales the model's past run; `trainmeter
// run --tokens --max-cost` starts with that estimate, is stopped by the
// collector's max-cost advice (and an alert fires), and its final report
// shows the estimate next to the final cost.
func TestOwnedHardwareEstimateAndMaxCost(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	// 7,884,000 / (1 year × 8,760 h) = $900 per GPU-hour: $0.25 a second,
	// so a $1 cap is reached within seconds.
	owned := filepath.Join(t.TempDir(), "owned.yaml")
	if err := os.WriteFile(owned, []byte(`pue: 1.5
gpus:
  - {model: "Simulated H100 80GB HBM3", purchase_usd: 7884000, lifetime_years: 1, residual_usd: 0}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCollector(t, "--owned-hardware", owned, "--energy-price-kwh", "0.2", "--gpu-price-per-hour", "1")
	sock := c.startAgent("cap-node", "sim:1")
	c.waitStreaming("cap-node")

	out, errOut, code := c.trainmeterRun("--socket", sock, "--collector", c.addr, "--run-id", "past", "--model", "sim-model",
		"--", "python3", "clients/python/examples/train_sim.py", "--duration-s", "3", "--step-time", "0.1")
	if code != 0 {
		t.Fatalf("past run: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	past := c.csvRow("past")
	if past["price_source"] != "amortized" || num(t, past, "gpu_price_per_hour") != 900 {
		t.Errorf("past run priced %s at %s, want amortized at 900", past["price_source"], past["gpu_price_per_hour"])
	}
	if got, want := num(t, past, "energy_cost_usd"), num(t, past, "energy_kWh")*1.5*0.2; math.Abs(got-want) > 1e-6 {
		t.Errorf("energy_cost_usd %v, want energy_kWh × PUE 1.5 × $0.2 = %v", got, want)
	}
	tokens := int(num(t, past, "tokens_processed"))
	pastCost := num(t, past, "total_cost_usd")
	if tokens == 0 || pastCost <= 0 {
		t.Fatalf("past run: %d tokens, $%v", tokens, pastCost)
	}

	// Ten times the tokens: ten times the past run's GPU time, energy and
	// cost (the CSV rounds to 6 decimals).
	var est struct {
		BasedOn  []string                         `json:"based_on"`
		CostUsd  struct{ Low, Mid, High float64 } `json:"cost_usd"`
		WallS    struct{ Mid float64 }            `json:"wall_s"`
		PriceSrc string                           `json:"price_source"`
	}
	if err := json.Unmarshal([]byte(c.cli("estimate", "--model", "sim-model", "--tokens", strconv.Itoa(10*tokens), "--json")), &est); err != nil {
		t.Fatal(err)
	}
	if len(est.BasedOn) != 1 || math.Abs(est.CostUsd.Mid-10*pastCost) > 1e-5*pastCost || est.PriceSrc != "amortized" {
		t.Errorf("estimate %+v, want 10 × $%v from run past, amortized", est, pastCost)
	}
	if w := num(t, past, "wall_s"); math.Abs(est.WallS.Mid-10*w) > 0.2*10*w {
		t.Errorf("estimated wall time %v s, want about 10 × %v", est.WallS.Mid, w)
	}

	out, errOut, code = c.trainmeterRun("--socket", sock, "--collector", c.addr, "--run-id", "capped", "--model", "sim-model",
		"--tokens", strconv.Itoa(10*tokens), "--max-cost", "1", "--stop-grace", "10s",
		"--", "python3", "clients/python/examples/train_sim.py", "--duration-s", "60", "--step-time", "0.1")
	if !strings.Contains(errOut, "max-cost $1.00 reached") {
		t.Errorf("trainmeter run did not say the cap stopped the run (exit %d)\nstderr:\n%s", code, errOut)
	}
	r := c.waitEnded("capped")
	t.Logf("capped run: wall %.1f s, total $%.4f (cap $1, $0.25/s + energy), estimate $%.4f (band $%.4f to $%.4f); past run $%.4f for %d tokens",
		r.GetWallS(), r.GetTotalCostUsd(), r.GetEstimate().GetCostUsd().GetMid(), r.GetEstimate().GetCostUsd().GetLow(),
		r.GetEstimate().GetCostUsd().GetHigh(), pastCost, tokens)
	if r.GetWallS() > 30 {
		t.Errorf("capped run went on for %v s: not stopped", r.GetWallS())
	}
	// The cap is the run's end status.
	if r.GetEndStatus() != "stopped: max-cost" {
		t.Errorf("capped run: end status %q, want stopped: max-cost", r.GetEndStatus())
	}
	if r.GetTotalCostUsd() < 1 || r.GetMaxCostUsd() != 1 || r.GetEstimate().GetCostUsd().GetMid() != est.CostUsd.Mid {
		t.Errorf("capped run: total $%v, max_cost %v, estimate %v (want >= $1, 1, $%v)", r.GetTotalCostUsd(), r.GetMaxCostUsd(),
			r.GetEstimate().GetCostUsd().GetMid(), est.CostUsd.Mid)
	}
	for _, want := range []string{"max cost:          $1.00", "estimate:          $", "vs estimate:     final cost $", "price source:      amortized"} {
		if !strings.Contains(out, want) {
			t.Errorf("final report lacks %q:\n%s", want, out)
		}
	}
	var alerts struct {
		Alerts []struct {
			Kind   string   `json:"kind"`
			RunIDs []string `json:"run_ids"`
		} `json:"alerts"`
	}
	if err := json.Unmarshal([]byte(c.cli("alerts", "--kind", "max-cost", "--json")), &alerts); err != nil {
		t.Fatal(err)
	}
	if len(alerts.Alerts) != 1 || alerts.Alerts[0].Kind != "max-cost" || len(alerts.Alerts[0].RunIDs) != 1 || alerts.Alerts[0].RunIDs[0] != "capped" {
		t.Errorf("alerts %+v, want one max-cost alert for run capped", alerts.Alerts)
	}
}
