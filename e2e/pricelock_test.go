package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeNamedTrace is a replay trace of gpus GPUs named name at powerW.
func writeNamedTrace(t *testing.T, name string, gpus int, powerW, seconds float64) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("time_s,gpu,name,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct\n")
	for i := 0; float64(i)*0.1 <= seconds; i++ {
		ts := float64(i) * 0.1
		for g := 0; g < gpus; g++ {
			fmt.Fprintf(&b, "%.1f,%d,%s,%g,%.3f,30000,81559,95\n", ts, g, name, powerW, 5e5+powerW*ts)
		}
	}
	path := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func importPrice(t *testing.T, c *cluster, usdPerGPUHour float64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "prices.csv")
	if err := os.WriteFile(path, fmt.Appendf(nil, "gpu_name,usd_per_gpu_hour\nH100 SXM,%g\n", usdPerGPUHour), 0o644); err != nil {
		t.Fatal(err)
	}
	c.cli("prices", "import", path)
}

// TestEndedRunKeepsItsPriceAfterPricesImport: an ended run priced from the
// catalog keeps its cost when a cheaper price list is imported; only
// `trainmeter reprice` changes it, and the run says so.
func TestEndedRunKeepsItsPriceAfterPricesImport(t *testing.T) {
	t.Parallel()
	c := startCollector(t, "--energy-price-kwh", "36")
	importPrice(t, c, 3.6)
	sock := c.startAgent("replay-node", "replay:"+writeNamedTrace(t, "NVIDIA H100 80GB HBM3", costGPUs, costPowerW, 120), "--warmup", "30s")
	before := runCosted(t, c, sock, "locked", "", 20, 100*time.Millisecond)
	if before["price_source"] != "catalog" || num(t, before, "gpu_price_per_hour") != 3.6 {
		t.Fatalf("run priced at %s from %q, want 3.6 from the catalog", before["gpu_price_per_hour"], before["price_source"])
	}
	importPrice(t, c, 0.45)
	after := c.csvRow("locked")
	for _, col := range []string{"cost_usd", "energy_cost_usd", "total_cost_usd", "gpu_price_per_hour", "price_source", "usd_per_mtok"} {
		if after[col] != before[col] {
			t.Errorf("after a cheaper price list: %s = %s, was %s", col, after[col], before[col])
		}
	}
	if after["repriced_at"] != "" {
		t.Errorf("repriced_at %q without a reprice", after["repriced_at"])
	}

	out := c.cli("reprice", "--run", "locked", "--price", "0.9", "--reason", "contract price")
	if !strings.Contains(out, "repriced 1 run") {
		t.Errorf("reprice said %q", out)
	}
	re := c.csvRow("locked")
	closeTo(t, "repriced cost_usd", num(t, re, "cost_usd"), num(t, before, "gpu_hours")*0.9, 1e-6)
	if re["price_source"] != "repriced" || re["repriced_at"] == "" || re["previous_cost_usd"] != before["cost_usd"] ||
		re["previous_total_cost_usd"] != before["total_cost_usd"] || re["reprice_reason"] != "contract price" {
		t.Errorf("repriced run: price_source %q repriced_at %q previous %q/%q reason %q; want repriced, a time, %s/%s, \"contract price\"",
			re["price_source"], re["repriced_at"], re["previous_cost_usd"], re["previous_total_cost_usd"], re["reprice_reason"], before["cost_usd"], before["total_cost_usd"])
	}
	if rep := c.cli("report", "locked"); !strings.Contains(rep, "repriced") || !strings.Contains(rep, `"contract price"`) {
		t.Errorf("report does not show the reprice:\n%s", rep)
	}
}
