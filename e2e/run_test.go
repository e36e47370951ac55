package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// trainmeterRun runs `trainmeter run` with the real binary and returns its
// stdout, stderr and exit code.
func (c *cluster) trainmeterRun(args ...string) (string, string, int) {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "trainmeter"), append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), "TRAINMETER_COLLECTOR="+c.addr)
	cmd.Dir = ".."
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("trainmeter run: %v", err)
	}
	return out.String(), errb.String(), code
}

// TestRunMeasuresACommand: `trainmeter run` around the example trainer (no
// run id or socket passed to it: its client takes both from the
// environment) gives a run with the trainer's tokens; around a plain shell
// command, a run with energy and time but no tokens, and its exit code.
func TestRunMeasuresACommand(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	c := startCollector(t)
	sock := c.startAgent("run-node", "sim:2")
	c.waitStreaming("run-node")

	out, errOut, code := c.trainmeterRun("--socket", sock, "--collector", c.addr, "--run-id", "zr", "--model", "sim-model",
		"--status-every", "1s", "--", "python3", "clients/python/examples/train_sim.py", "--duration-s", "3", "--step-time", "0.1")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	m := regexp.MustCompile(`train_sim: run_id=(\S+) .* tokens=(\d+) .*agent_errors=(\d+)`).FindStringSubmatch(out)
	if m == nil || m[1] != "zr" || m[3] != "0" {
		t.Fatalf("train_sim output %q (want run_id=zr, agent_errors=0)\nstderr:\n%s", out, errOut)
	}
	if !strings.Contains(out, "run zr (ended: ok)") || !strings.Contains(errOut, "trainmeter zr | ") {
		t.Errorf("want the final report on stdout and status lines on stderr\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
	row := c.csvRow("zr")
	if row["tokens_processed"] != m[2] || m[2] == "0" {
		t.Errorf("tokens_processed %q, train_sim reported %s", row["tokens_processed"], m[2])
	}
	if row["model"] != "sim-model" || row["status"] != "ended" || row["end_status"] != "ok" {
		t.Errorf("model %q status %q end_status %q", row["model"], row["status"], row["end_status"])
	}
	if num(t, row, "energy_total_J") <= 0 || num(t, row, "wall_s") < 3 {
		t.Errorf("energy_total_J %s wall_s %s", row["energy_total_J"], row["wall_s"])
	}

	out, errOut, code = c.trainmeterRun("--socket", sock, "--collector", c.addr, "--run-id", "z3", "--", "sh", "-c", "sleep 2; exit 3")
	if code != 3 {
		t.Fatalf("exit %d, want 3\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "run z3 (ended: exit 3)") {
		t.Errorf("no report:\n%s\nstderr:\n%s", out, errOut)
	}
	row = c.csvRow("z3")
	if row["end_status"] != "exit 3" {
		t.Errorf("end_status %q, want exit 3", row["end_status"])
	}
	if row["tokens_processed"] != "0" || row["J_per_token"] != "" {
		t.Errorf("tokens_processed %q J_per_token %q, want no tokens", row["tokens_processed"], row["J_per_token"])
	}
	if e := num(t, row, "energy_total_J"); e <= 0 {
		t.Errorf("energy_total_J %v", e)
	}
	if w := num(t, row, "wall_s"); w < 1.9 || w > 4 {
		t.Errorf("wall_s %v, want about 2", w)
	}
	if g, _ := strconv.Atoi(row["gpus"]); g != 2 {
		t.Errorf("gpus %q: sim GPUs cannot list processes, so the run gets both", row["gpus"])
	}
}

// TestRunKeepsTheScriptsMetadata: the fields `trainmeter run` was not given
// come from the wrapped script's client (train_sim.py sends model, batch
// size, ... and warmup_s), so the run is not "model: -"; a field both name
// differently keeps the command line's value, the script's tokens still
// count, and `trainmeter run` says so on stderr.
func TestRunKeepsTheScriptsMetadata(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	c := startCollector(t)
	sock := c.startAgent("meta-node", "sim:2")
	c.waitStreaming("meta-node")
	trainSim := []string{"python3", "clients/python/examples/train_sim.py", "--step-time", "0.1", "--batch-size", "4"}

	out, errOut, code := c.trainmeterRun(append([]string{"--socket", sock, "--collector", c.addr, "--run-id", "zm", "--"}, append(trainSim, "--duration-s", "4", "--warmup-s", "1")...)...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "agent_errors=0") {
		t.Errorf("the script's client got errors from the agent:\n%s", out)
	}
	row := c.csvRow("zm")
	for col, want := range map[string]string{"model": "sim-model", "dataset": "synthetic", "backend": "sim",
		"optimizer": "adamw", "batch_size": "4", "seq_len": "2048", "precision": "bf16", "seed": "42"} {
		if row[col] != want {
			t.Errorf("%s = %q, want the script's %q", col, row[col], want)
		}
	}
	// The script's warmup_s (1 s, from its join) replaced the agent's 60 s
	// default: the 4 s run has figures after warmup.
	if w := num(t, row, "warmup_s"); w < 0.9 || w > 3 { // 1 s from the join, which follows the start by the interpreter's start-up
		t.Errorf("warmup_s %v, want about 1 (the script's)", w)
	}
	if row["J_per_token"] == "" || num(t, row, "tokens_measured") <= 0 {
		t.Errorf("J_per_token %q tokens_measured %q: no figures after the script's warmup", row["J_per_token"], row["tokens_measured"])
	}

	out, errOut, code = c.trainmeterRun(append([]string{"--socket", sock, "--collector", c.addr, "--run-id", "zc",
		"--model", "cli-model", "--batch-size", "16", "--"}, append(trainSim, "--duration-s", "2")...)...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{`model "sim-model" (kept "cli-model")`, `batch_size 4 (kept 16)`} {
		if !strings.Contains(errOut, want) {
			t.Errorf("trainmeter run's stderr does not show the conflict %s:\n%s", want, errOut)
		}
	}
	m := regexp.MustCompile(`tokens=(\d+) .*agent_errors=(\d+)`).FindStringSubmatch(out)
	if m == nil || m[2] != "1" {
		t.Fatalf("train_sim output %q: want one error from the agent (the conflict) in the client's errors()", out)
	}
	row = c.csvRow("zc")
	if row["model"] != "cli-model" || row["batch_size"] != "16" || row["dataset"] != "synthetic" {
		t.Errorf("model %q batch_size %q dataset %q: want the command line's model and batch size, the script's dataset",
			row["model"], row["batch_size"], row["dataset"])
	}
	if row["tokens_processed"] != m[1] || m[1] == "0" {
		t.Errorf("tokens_processed %q, the script reported %s: a conflicting script's tokens must count", row["tokens_processed"], m[1])
	}
}

// TestDDPRankReportsItsOwnGPU: a torchrun rank (LOCAL_RANK=1, no gpus, no
// CUDA_VISIBLE_DEVICES) on a 2-GPU agent is attributed GPU 1 only, not
// every GPU of the node. GPU 0 draws 100 W and GPU 1 300 W, so the run's
// power says which GPU it got.
func TestDDPRankReportsItsOwnGPU(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	var b strings.Builder
	b.WriteString("time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct\n")
	for i := 0; i <= 1200; i++ {
		ts := float64(i) * 0.1
		fmt.Fprintf(&b, "%.1f,0,100,%.3f,1000,81559,90\n%.1f,1,300,%.3f,2000,81559,90\n", ts, 1e5+100*ts, ts, 1e5+300*ts)
	}
	trace := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(trace, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCollector(t)
	sock := c.startAgent("ddp-node", "replay:"+trace)
	c.waitStreaming("ddp-node")

	cmd := exec.Command("python3", "clients/python/examples/train_sim.py", "--socket", sock, "--run-id", "rank1",
		"--gpus", "", "--warmup-s", "0", "--duration-s", "3", "--step-time", "0.1")
	cmd.Dir = ".."
	env := []string{"WORLD_SIZE=2", "RANK=1", "LOCAL_RANK=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") && !strings.HasPrefix(kv, "TRAINMETER_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("train_sim: %v\n%s", err, out)
	}
	c.waitEnded("rank1")
	row := c.csvRow("rank1")
	if row["gpus"] != "1" {
		t.Errorf("gpus %q, want 1 (the rank's own GPU)", row["gpus"])
	}
	if p := num(t, row, "avg_power_W"); p < 290 || p > 310 {
		t.Errorf("avg_power_W %v, want 300 (GPU 1 alone; 400 is both GPUs, 100 the wrong one)", p)
	}
}
