package e2e

// A collector pair (docs/deploy.md): the agent streams every batch to two
// collectors, each acking on its own. One killed mid-run, or both down for
// a while, and afterwards both hold the whole run and report the same.

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/testkit"
)

// pairAgent starts an agent that streams to both collectors.
func pairAgent(t *testing.T, a, b *cluster, gpuSpec string, extra ...string) (sock string, p *proc) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "agent.sock")
	p = startProc(t, "trainmeter-agent", append([]string{"--collector", a.addr + "," + b.addr, "--socket", sock, "--node", "n",
		"--gpu", gpuSpec, "--spool", filepath.Join(t.TempDir(), "spool"), "--warmup", "30s", "--shutdown-timeout", "2s"}, extra...)...)
	a.eventually("agent socket", func() bool {
		select {
		case <-p.done:
			t.Fatalf("agent exited:\n%s", p.log())
		default:
		}
		_, err := os.Stat(sock)
		return err == nil
	})
	return sock, p
}

// samePairReport checks both collectors hold the run as a fault-free run
// gives it, and that `report --json` says exactly the same on both.
func samePairReport(t *testing.T, a, b *faultCluster, run string, tokens int) {
	t.Helper()
	a.waitEnded(run)
	b.waitEnded(run)
	checkExact(t, a.csvRow(run), tokens, 2, 300)
	checkExact(t, b.csvRow(run), tokens, 2, 300)
	ja, jb := a.cli("report", run, "--json"), b.cli("report", run, "--json")
	if ja != jb {
		t.Errorf("report --json differs between the pair:\n--- %s\n%s\n--- %s\n%s", a.addr, ja, b.addr, jb)
	}
}

// One of the pair is killed (SIGKILL) in the middle of a run and started
// again on its database: the other carries on meanwhile, the agent's spool
// keeps what the killed one missed, and afterwards both report the run
// identically. While it is down the CLI, given both, answers from the other.
func TestPairOneKilledMidRunBothReportTheSame(t *testing.T) {
	t.Parallel()
	a, b := newFaultCluster(t), newFaultCluster(t)
	status := testkit.FreeAddr(t)
	sock, _ := pairAgent(t, a.cluster, b.cluster, "replay:"+writeTrace(t, 2, 300, 300, 120), "--status-listen", status)
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"r","gpus":[0,1],"warmup_s":1}`)
	sent := steps(tr, "r", 1, 20, 512)
	b.col.stop(syscall.SIGKILL)
	sent += steps(tr, "r", 21, 15, 512)

	// The agent's status shows each collector: a keeps up, b's batches wait.
	a.eventually("agent status: a connected and caught up, b down with batches pending", func() bool {
		cs, _ := statusOf(t, status)["collectors"].([]any)
		if len(cs) != 2 {
			t.Fatalf("status collectors %v, want two", cs)
		}
		ca, cb := cs[0].(map[string]any), cs[1].(map[string]any)
		return ca["collector"] == a.addr && ca["connected"] == true && ca["batches_pending"].(float64) <= 1 &&
			cb["collector"] == b.addr && cb["connected"] == false && cb["batches_pending"].(float64) >= 3
	})

	// The CLI given both, the killed one first, uses the other.
	cmd := exec.Command(filepath.Join(binDir, "trainmeter"), "report", "r", "--json", "-v", "--collector", b.addr+","+a.addr)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("report with one of the pair down: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "collector "+a.addr+" (the first of") || !strings.Contains(stdout.String(), `"run_id": "r"`) {
		t.Errorf("report with one of the pair down: stderr %q\nstdout %s", stderr.String(), stdout.String())
	}

	b.startCollector()
	sent += steps(tr, "r", 36, 15, 512)
	tr.send(`{"event":"run_end","run_id":"r"}`)
	tr.sync()
	samePairReport(t, a, b, "r", sent)
}

// Both collectors are down for a while mid-run (stopped, started again):
// the agent keeps every batch for both, and nothing is lost on either.
func TestPairBothDownNothingLost(t *testing.T) {
	t.Parallel()
	a, b := newFaultCluster(t), newFaultCluster(t)
	sock, _ := pairAgent(t, a.cluster, b.cluster, "replay:"+writeTrace(t, 2, 300, 300, 120))
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"r","gpus":[0,1],"warmup_s":1}`)
	sent := steps(tr, "r", 1, 15, 512)
	a.col.stop(syscall.SIGTERM)
	sent += steps(tr, "r", 16, 5, 512)
	b.col.stop(syscall.SIGKILL)
	sent += steps(tr, "r", 21, 20, 512)
	a.startCollector()
	b.startCollector()
	sent += steps(tr, "r", 41, 10, 512)
	tr.send(`{"event":"run_end","run_id":"r"}`)
	tr.sync()
	samePairReport(t, a, b, "r", sent)
}

// Both of a pair run the same stop budget on the same batches, so both tell
// the agent to stop the run (their reasons may differ in the percentage):
// the trainer is told once.
func TestPairStopReachesTheTrainerOnce(t *testing.T) {
	t.Parallel()
	// 2 sim GPUs at $144/GPU-hour cost $0.08/s: $0.20 is spent in about 3 s.
	a, b := startCollector(t, "--gpu-price-per-hour", "144"), startCollector(t, "--gpu-price-per-hour", "144")
	// Given both, the CLI sets the budget on each.
	a.cli("budget", "set", "team:pair-stop", "0.20", "--policy", "stop", "--collector", a.addr+","+b.addr)
	sock, _ := pairAgent(t, a, b, "sim:2")
	a.waitStreaming("n")
	b.waitStreaming("n")
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"s","gpus":[0,1],"team":"pair-stop"}`)
	stops, deadline := 0, time.Now().Add(40*time.Second)
	var firstStop time.Time
	for step := 1; time.Now().Before(deadline); step++ {
		tr.send(`{"event":"step","run_id":"s","step":%d,"tokens":100}`, step)
		_ = tr.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		line, err := tr.rd.ReadString('\n')
		if err != nil {
			if firstStop.IsZero() || time.Since(firstStop) < 5*time.Second {
				continue // a timeout: nothing from the agent this step
			}
			break
		}
		if strings.Contains(line, `"event":"stop"`) {
			stops++
			if firstStop.IsZero() {
				firstStop = time.Now()
			}
		}
	}
	if stops != 1 {
		t.Fatalf("the trainer was told to stop %d times, want once", stops)
	}
	// Both fired the exceeded alert, under the same id (one budget id on
	// both, set by the CLI): a webhook receiver gets the same
	// Idempotency-Key from each.
	exceeded := func(c *cluster) string {
		var resp struct {
			Alerts []struct {
				ID        string  `json:"id"`
				Scope     string  `json:"scope"`
				Threshold float64 `json:"threshold"`
				Projected bool    `json:"projected"`
			} `json:"alerts"`
		}
		out := c.cli("alerts", "--kind", "budget", "--json")
		if err := json.Unmarshal([]byte(out), &resp); err != nil {
			t.Fatalf("alerts --json: %v\n%s", err, out)
		}
		for _, al := range resp.Alerts {
			if al.Scope == "team:pair-stop" && al.Threshold == 1 && !al.Projected {
				return al.ID
			}
		}
		t.Errorf("collector %s fired no exceeded alert:\n%s", c.addr, out)
		return ""
	}
	if ia, ib := exceeded(a), exceeded(b); ia != ib {
		t.Errorf("the pair's exceeded alerts have ids %q and %q, want one", ia, ib)
	}
}

// doctor checks each collector of a pair and fails naming the one that is
// down.
func TestPairDoctorChecksEachCollector(t *testing.T) {
	t.Parallel()
	a, b := startCollector(t), startCollector(t)
	spoolDir := filepath.Join(t.TempDir(), "spool")
	// The later --collector (the pair) wins over the one startAgent gives.
	sock := a.startAgent("doc-pair", "sim:1", "--spool", spoolDir, "--collector", a.addr+","+b.addr)
	a.waitStreaming("doc-pair")
	b.waitStreaming("doc-pair")
	args := []string{"--gpu", "sim:1", "--socket", sock, "--node", "doc-pair", "--spool", spoolDir}
	out, code := doctor(t, append(args, "--collector", a.addr+","+b.addr)...)
	if code != 0 {
		t.Fatalf("exit %d with both up:\n%s", code, out)
	}
	for _, addr := range []string{a.addr, b.addr} {
		if !strings.Contains(out, "TCP connection to "+addr) {
			t.Errorf("doctor did not check %s:\n%s", addr, out)
		}
	}
	down := testkit.FreeAddr(t)
	out, code = doctor(t, append(args, "--collector", a.addr+","+down)...)
	if code != 1 || !strings.Contains(out, "cannot connect to "+down) || !strings.Contains(out, "TCP connection to "+a.addr) {
		t.Errorf("exit %d with one of the pair down, want 1 naming it:\n%s", code, out)
	}
}
