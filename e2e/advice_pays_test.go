package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// adviceLM is train_torch.py's tiny LM on longer sequences than tinyLM, so
// that a step is a measurable CPU cost (about 25 ms on the 2-CPU
// development machine), in batches of 2: loading a batch is then 2 sleeps.
// A busy machine wakes a sleeper late; with 16 short sleeps per batch that
// lateness ate the gain (×1.42 once, against ×2.05 and ×2.13 with 2).
var adviceLM = []string{"--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "256", "--vocab", "128",
	"--batch-size", "2", "--precision", "fp32", "--warmup-s", "0"}

const adviceBatch = 2

// itemDelayForThisMachine sizes the dataset's per-item delay so that
// loading a batch takes as long as a training step computes here: loading
// in the training process (num_workers=0) a step costs both; with one
// worker the loading overlaps the compute and a step costs the larger of
// the two, so the gain is ×2 when they are equal and stays ≥ ×1.5 while the
// compute is within half and twice the loading. A fixed delay would fail
// that on a CPU twice as fast (or slow) as the one it was tuned on. The
// compute is measured with the same loop, briefly, without an agent.
func itemDelayForThisMachine(t *testing.T, py string) float64 {
	t.Helper()
	cmd := exec.Command(py, append([]string{repoPath(t, "clients/python/examples/train_torch.py"),
		"--socket", t.TempDir() + "/no-agent.sock", "--steps", "60", "--epochs", "1", "--num-workers", "0"}, adviceLM...)...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1", "TRAINMETER_RUN_ID=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("calibration run: %v\n%s", err, out)
	}
	s := parseSummary(t, string(out))
	stepMs := 1000 * s.compute / float64(s.steps)
	delay := min(max(stepMs/adviceBatch, 0.25), 50)
	t.Logf("compute %.1f ms per step here: item delay %.2f ms (%.1f ms per batch of %d)", stepMs, delay, delay*adviceBatch, adviceBatch)
	return delay
}

// Advice that pays, through every real part: a PyTorch loop started with
// num_workers=0 under a real agent (--gpu sim:1) and collector is judged
// data-bound, gets num_workers 0→1 (on a 2-CPU host the only change there
// is: one worker per CPU beside the training process), applies it at the
// next epoch with rebuild_dataloader, and the collector's own per-epoch
// throughput shows the second epoch at least 1.5× the first. The report
// (text and --json) and `trainmeter recommend` show the change, when it
// was applied, and the measured gain.
func TestTorchAdviceThatPays(t *testing.T) {
	py := torchPython(t)
	itemDelay := itemDelayForThisMachine(t, py)
	c := startCollector(t)
	sock := c.startAgent("advice-node", "sim:1")
	c.waitStreaming("advice-node")

	// 2 epochs of 250 steps, an evaluation every 20 steps (about one per
	// 1 s batch): the advice is confirmed early in epoch 1 and applied at
	// its end; about 12 s + 6 s of training here.
	const run = "advice-pays"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, append([]string{repoPath(t, "clients/python/examples/train_torch.py"),
		"--socket", sock, "--run-id", run, "--steps", "500", "--epochs", "2", "--num-workers", "0",
		"--item-delay-ms", strconv.FormatFloat(itemDelay, 'f', 3, 64), "--adjustment-interval", "20"}, adviceLM...)...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1", "TRAINMETER_RUN_ID=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("train_torch: %v\n%s", err, out)
	}
	s := parseSummary(t, string(out))
	if s.steps != 500 {
		t.Fatalf("trained %d steps, want 500:\n%s", s.steps, out)
	}
	// The loop applied the advice after its first epoch.
	applied := regexp.MustCompile(`applied dataloader advice after step 250 \(epoch 1\): num_workers=(\d+)`).FindStringSubmatch(string(out))
	if applied == nil || applied[1] == "0" {
		t.Fatalf("the loop did not add workers at the end of epoch 1:\n%s", out)
	}

	rep := c.waitEnded(run)
	if rep.TokensProcessed != uint64(s.tokens) {
		t.Errorf("collector tokens %d, trainer reported %d", rep.TokensProcessed, s.tokens)
	}
	h, err := c.recommendClient().DataloaderHistory(context.Background(), &trainmeterv1.DataloaderHistoryRequest{RunId: run})
	if err != nil {
		t.Fatal(err)
	}
	var advised *trainmeterv1.DataloaderEvaluation
	for _, e := range h.Evaluations {
		if e.Changed && e.Delivered && advised == nil {
			advised = e
		}
	}
	if advised == nil || advised.Classification != "data-bound" || !strings.Contains(advised.Reason, "num_workers 0→1") {
		t.Fatalf("first delivered advice %v, want data-bound, num_workers 0→1", advised)
	}
	if len(h.Epochs) != 2 {
		t.Fatalf("epochs %v, want 2", h.Epochs)
	}
	e1, e2 := h.Epochs[0], h.Epochs[1]
	t.Logf("epoch 1: %d workers (reported %v), %.0f tok/s over %.1f s; epoch 2: %d workers, %.0f tok/s over %.1f s",
		e1.RanNumWorkers, e1.RanReported, e1.TokensPerS, e1.MeasuredS, e2.RanNumWorkers, e2.TokensPerS, e2.MeasuredS)
	if !e1.RanReported || e1.RanNumWorkers != 0 || !e2.RanReported || e2.RanNumWorkers == 0 {
		t.Errorf("epochs ran with %d and %d workers (reported %v, %v), want 0 then more, as the trainer reported",
			e1.RanNumWorkers, e2.RanNumWorkers, e1.RanReported, e2.RanReported)
	}
	// Whole windows only: each epoch is several 1 s windows, less the ones
	// its boundaries fall in.
	if e1.MeasuredS < 3 || e2.MeasuredS < 2 {
		t.Errorf("measured %.1f s and %.1f s of the epochs, want whole windows of both", e1.MeasuredS, e2.MeasuredS)
	}
	if len(h.Changes) != 1 {
		t.Fatalf("changes %v, want the one applied after epoch 1", h.Changes)
	}
	ch := h.Changes[0]
	if ch.AppliedAfterEpoch != 1 || ch.FromNumWorkers != 0 || ch.NumWorkers != e2.RanNumWorkers ||
		ch.TokensPerSBefore != e1.TokensPerS || ch.TokensPerSAfter != e2.TokensPerS {
		t.Errorf("change %v, want epoch 1's %.0f tok/s → epoch 2's %.0f tok/s, num_workers 0→%d", ch, e1.TokensPerS, e2.TokensPerS, e2.RanNumWorkers)
	}
	if !ch.Reported {
		t.Errorf("change %v not marked as reported by the trainer", ch)
	}
	if ch.MeasuredSpeedup < 1.5 {
		t.Errorf("measured speedup ×%.2f (%.0f → %.0f tok/s), want at least ×1.5", ch.MeasuredSpeedup, ch.TokensPerSBefore, ch.TokensPerSAfter)
	}

	// The report, for people and as JSON, shows the change and the gain.
	text := c.cli("report", run, "--collector", c.addr)
	if !regexp.MustCompile(`(?m)^\s+1\s+\S+Z\s+0→\d+\s+\d+→\d+\s+\d+\s+\d+\s+×\d\.\d\d`).MatchString(text) {
		t.Errorf("report shows no applied change with its measured gain:\n%s", text)
	}
	var js struct {
		Changes []struct {
			AppliedAfterEpoch json.Number `json:"applied_after_epoch"`
			AppliedAt         string      `json:"applied_at"`
			FromNumWorkers    json.Number `json:"from_num_workers"`
			NumWorkers        json.Number `json:"num_workers"`
			Before            float64     `json:"tokens_per_s_before"`
			After             float64     `json:"tokens_per_s_after"`
			Speedup           float64     `json:"measured_speedup"`
			ExpectedGain      float64     `json:"expected_gain"`
		} `json:"dataloader_changes"`
	}
	raw := c.cli("report", run, "--json", "--collector", c.addr)
	if err := json.Unmarshal([]byte(raw), &js); err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
	if len(js.Changes) != 1 || js.Changes[0].FromNumWorkers != "0" || js.Changes[0].AppliedAt == "" ||
		js.Changes[0].Speedup != ch.MeasuredSpeedup || js.Changes[0].ExpectedGain <= 0 {
		t.Errorf("report --json dataloader_changes %+v, want the change with its measured speedup ×%.2f", js.Changes, ch.MeasuredSpeedup)
	}
	// recommend: the next run should start with the workers, and the
	// evidence is the measured throughput, not only the expected gain.
	rec := c.cli("recommend", run, "--collector", c.addr)
	if !strings.Contains(rec, "[dataloader]") || !strings.Contains(rec, "measured (after warmup, all GPUs)") ||
		!strings.Contains(rec, "tok/s with num_workers 0") || !strings.Contains(rec, "confidence: 0.80") {
		t.Errorf("recommend does not show the measured gain:\n%s", rec)
	}
}
