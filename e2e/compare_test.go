package e2e

import (
	"context"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestCompareMatchesReports: four runs of one model, two per backend, made
// by a real agent on simulated GPUs; `trainmeter compare --json` gives each
// backend the mean of the figures `trainmeter report --json` gives its
// runs, and the timeline of a run adds up to its report's energy.
func TestCompareMatchesReports(t *testing.T) {
	t.Parallel()
	c := startCollector(t)
	sock := c.startAgent("cmp-node", "sim:2")
	c.waitStreaming("cmp-node")
	tr := dialTrainer(t, sock)
	backends := map[string]string{"bnb-1": "bnb", "uns-1": "unsloth", "bnb-2": "bnb", "uns-2": "unsloth"}
	for _, pair := range [][2]string{{"bnb-1", "uns-1"}, {"bnb-2", "uns-2"}} {
		for gpu, run := range pair {
			tr.send(`{"event":"run_start","run_id":%q,"model":"cmp-model","backend":%q,"gpus":[%d],"warmup_s":0.3,"seq_len":512,"dataset":"d"}`, run, backends[run], gpu)
		}
		// 30 steps 60 ms apart: over 1 s after the 0.3 s warmup, which a
		// rate after warmup needs (docs/measurement.md).
		for i := 1; i <= 30; i++ {
			time.Sleep(60 * time.Millisecond)
			// The unsloth runs do twice the tokens per step: faster.
			tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":%d,"compute_s":0.05,"data_wait_s":0.01}`, pair[0], i, 1000+10*i)
			tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":%d,"compute_s":0.05,"data_wait_s":0.01}`, pair[1], i, 2000+10*i)
		}
		for _, run := range pair {
			tr.send(`{"event":"run_end","run_id":%q}`, run)
		}
		tr.sync()
	}
	reports := c.endedReports(slices.Collect(maps.Keys(backends))...)
	var cmp struct {
		Baseline string `json:"baseline"`
		Groups   []struct {
			Key        string         `json:"key"`
			RunIDs     []string       `json:"run_ids"`
			JPerToken  map[string]any `json:"j_per_token"`
			TokPerS    map[string]any `json:"tok_per_s"`
			VramPeakMb map[string]any `json:"vram_peak_mb"`
			E10kJ      map[string]any `json:"e10k_j"`
		} `json:"groups"`
		Rows []struct {
			Key     string         `json:"key"`
			Speedup map[string]any `json:"speedup"`
		} `json:"rows"`
		Warnings []string `json:"warnings"`
	}
	out := c.cli("compare", "--model", "cmp-model", "--by", "backend", "--json")
	if err := json.Unmarshal([]byte(out), &cmp); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if cmp.Baseline != "bnb" || len(cmp.Groups) != 2 || len(cmp.Rows) != 1 {
		t.Fatalf("compare --json:\n%s", out)
	}
	mean := func(runs []string, field string) float64 {
		var s float64
		for _, r := range runs {
			s += reports[r][field].(float64)
		}
		return s / float64(len(runs))
	}
	closeRel := func(what string, got, want float64) {
		t.Helper()
		if want == 0 || math.Abs(got-want) > 1e-9*math.Abs(want) {
			t.Errorf("%s: compare says %v, the reports' mean is %v", what, got, want)
		}
	}
	for _, g := range cmp.Groups {
		if len(g.RunIDs) != 2 {
			t.Fatalf("group %s has runs %v, want 2", g.Key, g.RunIDs)
		}
		closeRel(g.Key+" J/token", g.JPerToken["mean"].(float64), mean(g.RunIDs, "j_per_token"))
		closeRel(g.Key+" tok/s", g.TokPerS["mean"].(float64), mean(g.RunIDs, "tok_per_s"))
		closeRel(g.Key+" VRAM peak", g.VramPeakMb["mean"].(float64), mean(g.RunIDs, "vram_peak_mb"))
		closeRel(g.Key+" E10k_J", g.E10kJ["mean"].(float64), mean(g.RunIDs, "j_per_token")*1e4)
		if g.JPerToken["ci_low"] == nil {
			t.Errorf("group %s: two runs, no interval: %v", g.Key, g.JPerToken)
		}
	}
	closeRel("speedup", cmp.Rows[0].Speedup["value"].(float64), mean(cmp.Groups[1].RunIDs, "tok_per_s")/mean(cmp.Groups[0].RunIDs, "tok_per_s"))
	if len(cmp.Warnings) != 0 {
		t.Errorf("same GPU model, node count, seq_len and dataset, yet warnings: %v", cmp.Warnings)
	}
	t.Logf("compare table:\n%s", c.cli("compare", "--model", "cmp-model", "--by", "backend"))

	// The timeline of a run, through the query API: its cumulative energy
	// ends at the report's whole-run energy.
	tl, err := c.q.Timeline(context.Background(), &trainmeterv1.TimelineRequest{RunId: "bnb-1", Series: []string{"energy_j", "power_w"}})
	if err != nil {
		t.Fatal(err)
	}
	e := tl.GetSeries()[0].GetValues()
	if len(e) == 0 || tl.GetSeries()[0].GetName() != "energy_j" {
		t.Fatalf("timeline %v", tl)
	}
	closeRel("timeline energy", e[len(e)-1], reports["bnb-1"]["energy_total_j"].(float64))
	if tl.GetWarmupEnd() == nil || len(tl.GetEvents()) < 3 {
		t.Errorf("timeline warmup_end %v events %v", tl.GetWarmupEnd(), tl.GetEvents())
	}
}
