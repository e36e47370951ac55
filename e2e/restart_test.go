package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// The agent is killed (SIGKILL) in the middle of a run and started again on
// the same spool. The trainer, using the real Python client, reconnects and
// carries on. No token may be lost, and the energy counter (an anchored
// replay, which like a real GPU's counter keeps counting while no agent runs)
// must bridge the downtime.
func TestAgentKilledMidRunLosesNothing(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	c := startCollector(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	trace := writeTrace(t, 2, 300, 300, 120)
	anchor := strconv.FormatFloat(float64(time.Now().UnixNano())/1e9, 'f', 3, 64)
	agentArgs := []string{"--collector", c.addr, "--socket", sock, "--node", "kill-node",
		"--gpu", "replay:" + trace + "@" + anchor, "--spool", filepath.Join(dir, "spool"), "--rejoin-grace", "30s"}
	first := daemon(t, "trainmeter-agent", agentArgs...)
	c.eventually("agent socket", func() bool { return dialable(sock) })

	trainer := exec.Command("python3", "../clients/python/examples/train_sim.py", "--socket", sock,
		"--run-id", "killed", "--model", "m", "--backend", "b", "--gpus", "0,1", "--warmup-s", "1",
		"--duration-s", "9", "--tokens-per-s", "20000", "--step-time", "0.05")
	out, err := os.CreateTemp(dir, "trainer")
	if err != nil {
		t.Fatal(err)
	}
	trainer.Stdout, trainer.Stderr = out, out
	if err := trainer.Start(); err != nil {
		t.Fatal(err)
	}

	time.Sleep(3 * time.Second)
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	daemon(t, "trainmeter-agent", agentArgs...)

	if err := trainer.Wait(); err != nil {
		b, _ := os.ReadFile(out.Name())
		t.Fatalf("trainer: %v\n%s", err, b)
	}
	b, _ := os.ReadFile(out.Name())
	m := regexp.MustCompile(`train_sim: .* tokens=(\d+) .*dropped=(\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("trainer summary not found in:\n%s", b)
	}
	produced, dropped := string(m[1]), string(m[2])
	t.Logf("trainer produced %s tokens; its client dropped %s events while the agent was down", produced, dropped)

	c.waitEnded("killed")
	row := c.csvRow("killed")
	if row["tokens_processed"] != produced {
		t.Errorf("tokens_processed %s, want every token the trainer produced: %s", row["tokens_processed"], produced)
	}
	wall, warm := num(t, row, "wall_s"), num(t, row, "warmup_s")
	within(t, "energy_J across the restart", num(t, row, "energy_J"), 600*(wall-warm), 0.01)
	within(t, "energy_total_J across the restart", num(t, row, "energy_total_J"), 600*wall, 0.01)
	if row["energy_method"] != "counter" {
		t.Errorf("energy_method %q, want counter (the counter bridged the downtime)", row["energy_method"])
	}
	if dropped == "0" {
		t.Error("the client dropped nothing: the agent was not down while the trainer ran")
	}
	fmt.Fprintln(os.Stderr) // keep go test output readable after the daemons' noise
}

func dialable(sock string) bool {
	conn, err := net.Dial("unix", sock)
	if err == nil {
		conn.Close()
	}
	return err == nil
}

// killAgentMidRun runs a trainer (real Python client, 20,000 tok/s, warmup
// 1 s, 9 s) against an agent on gpuSpec, SIGKILLs the agent after 3 s and
// starts it again on the same spool 1.5 s later; it returns the run's CSV
// row once the run ended.
func killAgentMidRun(t *testing.T, run, gpuSpec string) map[string]string {
	t.Helper()
	c := startCollector(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	agentArgs := []string{"--collector", c.addr, "--socket", sock, "--node", "kill-node",
		"--gpu", gpuSpec, "--spool", filepath.Join(dir, "spool"), "--rejoin-grace", "30s"}
	first := daemon(t, "trainmeter-agent", agentArgs...)
	c.eventually("agent socket", func() bool { return dialable(sock) })
	trainer := exec.Command("python3", "../clients/python/examples/train_sim.py", "--socket", sock,
		"--run-id", run, "--model", "m", "--backend", "b", "--gpus", "0,1", "--warmup-s", "1",
		"--duration-s", "9", "--tokens-per-s", "20000", "--step-time", "0.05")
	out, err := os.CreateTemp(dir, "trainer")
	if err != nil {
		t.Fatal(err)
	}
	trainer.Stdout, trainer.Stderr = out, out
	if err := trainer.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	daemon(t, "trainmeter-agent", agentArgs...)
	if err := trainer.Wait(); err != nil {
		b, _ := os.ReadFile(out.Name())
		t.Fatalf("trainer: %v\n%s", err, b)
	}
	c.waitEnded(run)
	return c.csvRow(run)
}

// A replay trace that is not anchored starts over with each agent process,
// so its counter cannot bridge the restart: the downtime has tokens (the
// rank's tokens_total credits them) but no energy. J/token after warmup is
// taken over the time with energy, and energy_coverage says how much that
// is; dividing every token by part of the energy understated it.
func TestAgentRestartJPerTokenOverMissingEnergy(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	row := killAgentMidRun(t, "unbridged", "replay:"+writeTrace(t, 2, 300, 300, 120))
	t.Logf("energy_method %s, energy_coverage %s, tok/s %s, J/token %s", row["energy_method"], row["energy_coverage"], row["tok_per_s"], row["J_per_token"])
	// 2 GPUs at 300 W: the truth is 600 W over the trainer's tok/s.
	within(t, "J_per_token across an unbridged restart", num(t, row, "J_per_token"), 600/num(t, row, "tok_per_s"), 0.03)
	within(t, "avg_power_W over the time with energy", num(t, row, "avg_power_W"), 600, 0.03)
	if cov := num(t, row, "energy_coverage"); cov >= 0.95 || cov < 0.5 {
		t.Errorf("energy_coverage %v: want the downtime (about 2 of 8 s after warmup) uncovered", cov)
	}
}

// The simulated GPUs' counters go on across an agent restart, as a real
// GPU's does, so the demo bridges the downtime with the counter: every
// second after warmup has energy.
func TestAgentRestartSimCounterBridges(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	row := killAgentMidRun(t, "simbridged", "sim:2")
	if row["energy_method"] != "counter" || row["energy_coverage"] != "1" || row["rates_unavailable"] != "" {
		t.Errorf("energy_method %q, energy_coverage %q, rates_unavailable %q: want counter, 1, none (the counter bridged the restart)",
			row["energy_method"], row["energy_coverage"], row["rates_unavailable"])
	}
}
