package e2e

import (
	"errors"
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
