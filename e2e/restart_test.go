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
