package e2e

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/money"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// What the figures shown mean, through the real binaries.

// TestEpochTableCountsEachEpochsSteps: 20 steps per epoch, the evals falling
// inside a second (an epoch lasts 0.6 s), must show 20 per epoch and the
// 7 steps after the last eval as a partial epoch. Counting the 1 s windows
// showed 22/18.
func TestEpochTableCountsEachEpochsSteps(t *testing.T) {
	c := startCollector(t)
	sock := c.startAgent("node", "sim:1")
	c.waitStreaming("node")
	tr := dialTrainer(t, sock)
	const run, perEpoch, epochs, tail = "epochs", 20, 4, 7
	tr.send(`{"event":"run_start","run_id":%q,"model":"m","gpus":[0],"warmup_s":0}`, run)
	step := 0
	for e := 1; e <= epochs; e++ {
		for range perEpoch {
			step++
			time.Sleep(30 * time.Millisecond) // the trainer's pace, not synchronisation
			tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":100,"compute_s":0.03}`, run, step)
		}
		tr.send(`{"event":"eval","run_id":%q,"epoch":%d,"val_loss":1}`, run, e)
	}
	for range tail {
		step++
		time.Sleep(30 * time.Millisecond)
		tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":100,"compute_s":0.03}`, run, step)
	}
	tr.sync()
	tr.send(`{"event":"run_end","run_id":%q}`, run)
	c.waitEnded(run)

	rc := c.recommendClient()
	var h *trainmeterv1.DataloaderHistoryResponse
	c.eventually("the partial epoch stored", func() bool {
		var err error
		h, err = rc.DataloaderHistory(context.Background(), &trainmeterv1.DataloaderHistoryRequest{RunId: run})
		return err == nil && len(h.Epochs) == epochs+1
	})
	for i, e := range h.Epochs {
		want := uint64(perEpoch)
		if i == epochs {
			want = tail
		}
		if e.Epoch != int64(i+1) || e.Steps != want || e.Partial != (i == epochs) {
			t.Errorf("epoch row %d: epoch %d, %d steps, partial %v; want epoch %d, %d steps, partial %v",
				i, e.Epoch, e.Steps, e.Partial, i+1, want, i == epochs)
		}
	}
}

// reportFigure returns the number before unit on the report line labelled
// label (e.g. "average", "W whole run"); ok false when it is "-".
func reportFigure(t *testing.T, report, label, unit string) (float64, bool) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(label) + `:.*?(\S+) ` + regexp.QuoteMeta(unit)).FindStringSubmatch(report)
	if m == nil {
		t.Fatalf("no %q line with %q in\n%s", label, unit, report)
	}
	if m[1] == "-" {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("%s: %q: %v", label, m[1], err)
	}
	return v, true
}

// TestRunShorterThanTheWarmupShowsItsPower: `trainmeter run -- sleep 3`
// never leaves the default warmup (60 s): its whole-run power is still
// shown (it was "- W"), and the report says why the efficiency figures are
// empty and how to set the warmup. A trainer with steps (train_sim.py, 3 s
// of 0.1 s steps, no warmup named) gets efficiency figures under the
// default warmup, which ends at the 20th step.
func TestRunShorterThanTheWarmupShowsItsPower(t *testing.T) {
	c := startCollector(t, "--gpu-price-per-hour", "2.10", "--energy-price-kwh", "0.15")
	sock := c.startAgent("short-node", "sim:2")
	c.waitStreaming("short-node")

	out, errOut, code := c.trainmeterRun("--socket", sock, "--collector", c.addr, "--run-id", "nap", "--", "sleep", "3")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	row := c.csvRow("nap")
	wantAvg := num(t, row, "energy_total_J") / num(t, row, "wall_s")
	avg, ok := reportFigure(t, out, "average", "W whole run")
	if !ok || math.Abs(avg-wantAvg) > 0.1 {
		t.Errorf("report's whole-run average power %v (shown %v), want energy_total_J / wall_s = %.1f W:\n%s", avg, ok, wantAvg, out)
	}
	peak, ok := reportFigure(t, out, "peak", "W whole run")
	if !ok || peak < avg {
		t.Errorf("report's whole-run peak power %v (shown %v), want at least the average %.1f W:\n%s", peak, ok, avg, out)
	}
	if _, ok := reportFigure(t, out, "average", "W after warmup"); ok {
		t.Errorf("after-warmup power shown for a run that never left its warmup:\n%s", out)
	}
	for _, want := range []string{"never left its warmup", "warmup_s=", "trainmeter run --warmup", "--warmup-steps"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	runs := c.cli("runs")
	if !regexp.MustCompile(`(?m)^nap\s.*\s`+strconv.Itoa(int(math.Round(wantAvg)))+`\s`).MatchString(runs) ||
		!strings.Contains(runs, "never left the warmup") {
		t.Errorf("runs: want nap's whole-run AVG W %.0f and the warmup note:\n%s", wantAvg, runs)
	}

	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	out, errOut, code = c.trainmeterRun("--socket", sock, "--collector", c.addr, "--run-id", "sim3", "--",
		"python3", "clients/python/examples/train_sim.py", "--duration-s", "3", "--step-time", "0.1")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	row = c.csvRow("sim3")
	if row["tok_per_s"] == "" || row["J_per_token"] == "" || num(t, row, "warmup_s") > 3 {
		t.Errorf("train_sim 3 s under the default warmup: tok_per_s %q J_per_token %q warmup_s %q, want figures after a 20-step warmup",
			row["tok_per_s"], row["J_per_token"], row["warmup_s"])
	}

	// `runs` ENERGY is the whole run, as `summary`'s energy is (one word,
	// one quantity: not the after-warmup energy), and its header says so.
	runs = c.cli("runs")
	if !strings.Contains(runs, "ENERGY kJ") || !strings.Contains(runs, "whole run, all GPUs") || !strings.Contains(runs, "VRAM PEAK MiB") {
		t.Errorf("runs header does not name ENERGY's scope and unit:\n%s", runs)
	}
	m := regexp.MustCompile(`(?m)^sim3\s.*?\s(\d+\.\d)\s+\d+\s+\S+\s+run\s*$`).FindStringSubmatch(runs)
	total, measured := num(t, row, "energy_total_J")/1000, num(t, row, "energy_J")/1000
	if m == nil {
		t.Fatalf("no sim3 row with ENERGY kJ in\n%s", runs)
	}
	if got, _ := strconv.ParseFloat(m[1], 64); math.Abs(got-total) > 0.051 || math.Abs(total-measured) < 0.1 {
		t.Errorf("runs ENERGY kJ %v, want the whole run's %.3f (after warmup: %.3f)", got, total, measured)
	}
	// A run of a fraction of a cent: each cost line is its own figure
	// rounded, and the total says "rounded" when the lines shown do not add
	// up to it.
	rep := c.cli("report", "sim3")
	// Against report --json's full figures: the CSV's 6 decimals are too
	// few to round a figure of 1e-4 dollars to two significant digits.
	full := c.endedReports("sim3")["sim3"]
	var shown [3]string
	for i, col := range []string{"cost_usd", "energy_cost_usd", "total_cost_usd"} {
		label := []string{"gpu cost", "energy cost", "total"}[i]
		m := regexp.MustCompile(`(?m)^\s+` + label + `:\s+(\$\d+\.\d+)(\s|$)`).FindStringSubmatch(rep)
		if m == nil {
			t.Fatalf("no plain dollar amount on the %q line:\n%s", label, rep)
		}
		shown[i] = m[1]
		v, ok := full[col].(float64)
		if !ok {
			t.Fatalf("report --json %s = %v, want a number", col, full[col])
		}
		if want := money.Amount(v); shown[i] != want {
			t.Errorf("%s %s, want %s = %s rounded on its own:\n%s", label, shown[i], col, want, rep)
		}
	}
	if rounded := strings.Contains(rep, "total:             "+shown[2]+" (rounded)"); rounded == money.AddsUp(shown[2], shown[0], shown[1]) {
		t.Errorf("%s + %s vs total %s: rounded note %v:\n%s", shown[0], shown[1], shown[2], rounded, rep)
	}

	sum := c.cli("summary")
	var allJ float64
	for _, id := range []string{"nap", "sim3"} {
		allJ += num(t, c.csvRow(id), "energy_total_J")
	}
	if !strings.Contains(sum, fmt.Sprintf("= %.1f kJ (whole runs", allJ/1000)) {
		t.Errorf("summary energy, want %.1f kJ (nap + sim3 whole runs):\n%s", allJ/1000, sum)
	}
}
