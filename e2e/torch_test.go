package e2e

import (
	"bytes"
	"context"
	"fmt"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The interpreter that can import torch, found once per test binary.
var (
	torchOnce sync.Once
	torchExe  string
	torchErr  string
)

// torchPython returns a Python interpreter that can `import torch`:
// $TRAINMETER_TORCH_PYTHON, else the first candidate of
// scripts/torch-python.sh (Debian's python3-torch is importable only from
// Debian's own python3, which need not be the python3 on PATH). Without one
// the test is skipped, or fails where torch is required
// (TRAINMETER_REQUIRE_TORCH=1 or CI=true, as .ci/run sets).
func torchPython(t *testing.T) string {
	t.Helper()
	torchOnce.Do(func() {
		out, err := exec.Command("../scripts/torch-python.sh").Output()
		if err != nil {
			torchErr = "no python can import torch (apt-get install python3-torch); tried $TRAINMETER_TORCH_PYTHON, python3, /usr/bin/python3, python3.1x"
			return
		}
		torchExe = strings.TrimSpace(string(out))
	})
	if torchExe == "" {
		if os.Getenv("TRAINMETER_REQUIRE_TORCH") == "1" || os.Getenv("CI") == "true" {
			t.Fatal(torchErr)
		}
		t.Skip(torchErr)
	}
	return torchExe
}

func repoPath(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tinyLM keeps train_torch.py's model small: a step is milliseconds on a CPU.
var tinyLM = []string{"--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "16", "--vocab", "128",
	"--batch-size", "4", "--precision", "fp32", "--warmup-s", "0"}

const tinyTokensPerStep = 4 * 16

// rankSummary is train_torch.py's last line: what one rank reported.
type rankSummary struct {
	rank, steps, tokens int
	dataWait, compute   float64
	run                 string
}

var summaryLine = regexp.MustCompile(`train_torch: rank=(\d+) steps=(\d+) tokens=(\d+) data_wait_s=([0-9.]+) compute_s=([0-9.]+) run=(\S+)`)

func parseSummary(t *testing.T, out string) rankSummary {
	t.Helper()
	m := summaryLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary line in the trainer's output:\n%s", out)
	}
	atoi := func(s string) int { v, _ := strconv.Atoi(s); return v }
	atof := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
	return rankSummary{rank: atoi(m[1]), steps: atoi(m[2]), tokens: atoi(m[3]), dataWait: atof(m[4]), compute: atof(m[5]), run: m[6]}
}

// ddpRank starts one rank of a DDP job with the environment torchrun would
// give it (Debian's torch 1.13 torchrun fails inside its launcher on Python
// 3.11). Both ranks are children of this test process, in its process
// group: the launcher from which the client derives the shared run id.
func ddpRank(t *testing.T, py, sock, masterPort string, rank int, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(py, append([]string{repoPath(t, "clients/python/examples/train_torch.py"), "--socket", sock}, args...)...)
	cmd.Env = append(os.Environ(), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+masterPort,
		fmt.Sprintf("RANK=%d", rank), fmt.Sprintf("LOCAL_RANK=%d", rank), "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2",
		"TRAINMETER_RUN_ID=", "OMP_NUM_THREADS=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, &out
}

func freePort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(testkit.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Two DDP ranks (gloo, CPU) of the real example into one run: rank 0 waits
// for a slow loader, rank 1 does not (it waits for rank 0 in the gradient
// all-reduce instead, which is compute to its loader).
func TestTorchDDPTwoRanksOneRun(t *testing.T) {
	py := torchPython(t)
	t.Parallel()
	c := startCollector(t)
	sock := c.startAgent("ddp-node", "sim:2")
	c.waitStreaming("ddp-node")
	port := freePort(t)
	common := append([]string{"--steps", "40", "--epochs", "2", "--num-workers", "0", "--adjustment-interval", "5"}, tinyLM...)
	r0, out0 := ddpRank(t, py, sock, port, 0, append(common, "--item-delay-ms", "5")...)
	r1, out1 := ddpRank(t, py, sock, port, 1, append(common, "--item-delay-ms", "0")...)
	if err := r0.Wait(); err != nil {
		t.Fatalf("rank 0: %v\n%s", err, out0)
	}
	if err := r1.Wait(); err != nil {
		t.Fatalf("rank 1: %v\n%s", err, out1)
	}
	s0, s1 := parseSummary(t, out0.String()), parseSummary(t, out1.String())
	t.Logf("rank 0: %+v\nrank 1: %+v", s0, s1)
	if s0.run != s1.run || !strings.HasPrefix(s0.run, "ddp-") {
		t.Fatalf("ranks derived run ids %q and %q, want one ddp-… id", s0.run, s1.run)
	}
	if s0.steps != 40 || s1.steps != 40 {
		t.Fatalf("steps %d and %d, want 40 per rank", s0.steps, s1.steps)
	}
	runs, err := c.q.ListRuns(context.Background(), &trainmeterv1.ListRunsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs.Runs) != 1 {
		t.Fatalf("the collector has %d runs, want the ranks' one", len(runs.Runs))
	}
	// Exact tokens also mean the run did not end at the first rank's run_end:
	// a step after the end would not count.
	rep := c.waitEnded(s0.run)
	if want := uint64(s0.tokens + s1.tokens); rep.TokensProcessed != want || want != 2*40*tinyTokensPerStep {
		t.Errorf("collector tokens %d, want both ranks' %d + %d", rep.TokensProcessed, s0.tokens, s1.tokens)
	}
	if rep.EndStatus != "ok" {
		t.Errorf("end status %q, want ok (both ranks sent run_end)", rep.EndStatus)
	}
	// The run's data wait is both ranks' (rounding: the client sends 6 decimals).
	if want := s0.dataWait + s1.dataWait; math.Abs(rep.DataWaitS-want) > 1e-3 {
		t.Errorf("collector data wait %.4f s, want rank 0's %.4f + rank 1's %.4f", rep.DataWaitS, s0.dataWait, s1.dataWait)
	}
	// The advisor judges the share of both ranks' data wait: about half of
	// rank 0's own share here, far from rank 1's (near 0).
	h, err := c.recommendClient().DataloaderHistory(context.Background(), &trainmeterv1.DataloaderHistoryRequest{RunId: s0.run})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Evaluations) == 0 {
		t.Fatal("the advisor never evaluated the run")
	}
	both := (s0.dataWait + s1.dataWait) / (s0.dataWait + s1.dataWait + s0.compute + s1.compute)
	only0 := s0.dataWait / (s0.dataWait + s0.compute)
	only1 := s1.dataWait / (s1.dataWait + s1.compute)
	var sum float64
	for _, e := range h.Evaluations {
		sum += e.DataWaitShare
	}
	mean := sum / float64(len(h.Evaluations))
	t.Logf("%d evaluations, mean data-wait share %.3f; both ranks %.3f, rank 0 alone %.3f, rank 1 alone %.3f",
		len(h.Evaluations), mean, both, only0, only1)
	if math.Abs(mean-both) > 0.1 || math.Abs(mean-only0) < 0.15 || math.Abs(mean-only1) < 0.15 {
		t.Errorf("the advisor's data-wait share %.3f is not both ranks' %.3f (rank 0 alone %.3f, rank 1 alone %.3f)",
			mean, both, only0, only1)
	}
}

// One rank SIGKILLed mid-run: the other fails in its next all-reduce and
// ends; the run ends at the collector and keeps every token reported.
func TestTorchDDPRankKilledRunStillEnds(t *testing.T) {
	py := torchPython(t)
	t.Parallel()
	c := startCollector(t)
	sock := c.startAgent("ddp-node", "sim:2")
	c.waitStreaming("ddp-node")
	port := freePort(t)
	args := append([]string{"--steps", "100000", "--epochs", "1", "--num-workers", "0", "--dist-timeout-s", "20"}, tinyLM...)
	r0, out0 := ddpRank(t, py, sock, port, 0, args...)
	r1, out1 := ddpRank(t, py, sock, port, 1, args...)
	var run string
	var live uint64
	c.eventually("both ranks' steps at the collector", func() bool {
		runs, err := c.q.ListRuns(context.Background(), &trainmeterv1.ListRunsRequest{})
		if err != nil || len(runs.Runs) != 1 {
			return false
		}
		run, live = runs.Runs[0].RunId, runs.Runs[0].TokensProcessed
		// More than one rank could have reported alone: they step in lockstep.
		return live >= 40*tinyTokensPerStep
	})
	if err := r1.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r1.Wait()
	done := make(chan error, 1)
	go func() { done <- r0.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("rank 0 exited 0 after its peer was killed:\n%s", out0)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("rank 0 still running a minute after rank 1 was killed:\n%s\nrank 1:\n%s", out0, out1)
	}
	rep := c.waitEnded(run)
	t.Logf("run %s: %d tokens live before the kill, %d at the end, end status %q", run, live, rep.TokensProcessed, rep.EndStatus)
	if rep.TokensProcessed < live {
		t.Errorf("the ended run has %d tokens, fewer than the %d already reported", rep.TokensProcessed, live)
	}
	if rep.TokensProcessed%tinyTokensPerStep != 0 {
		t.Errorf("tokens %d are not whole steps of %d", rep.TokensProcessed, tinyTokensPerStep)
	}
	if rep.EndStatus == "ok" {
		t.Errorf("end status ok for a run one of whose ranks was killed and the other failed")
	}
}

// `trainmeter run -- <python with torch> train_torch.py …`: the example,
// unchanged, takes the run id and socket from the environment trainmeter
// run sets; the live status line shows on stderr while it trains and the
// report follows on stdout.
func TestTorchUnderTrainmeterRun(t *testing.T) {
	py := torchPython(t)
	t.Parallel()
	c := startCollector(t)
	sock := c.startAgent("run-node", "sim:1")
	c.waitStreaming("run-node")
	// 60 steps of 4 items × 10 ms: about 3 s, so the 1 s status line shows.
	args := append([]string{"--socket", sock, "--collector", c.addr, "--run-id", "torch-run", "--status-every", "1s", "--",
		py, "clients/python/examples/train_torch.py", "--steps", "60", "--epochs", "2", "--num-workers", "0", "--item-delay-ms", "10"},
		tinyLM...)
	out, errOut, code := c.trainmeterRun(args...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	s := parseSummary(t, out)
	if s.run != "torch-run" || s.steps != 60 {
		t.Errorf("train_torch ran as %q for %d steps, want torch-run, 60", s.run, s.steps)
	}
	// Live: a line a second, its token count growing while the loop runs.
	lines := regexp.MustCompile(`(?m)^trainmeter torch-run \| \d+:\d\d \| .* \| (\d+) tok`).FindAllStringSubmatch(errOut, -1)
	prev, grew := 0, false
	for _, l := range lines {
		n, _ := strconv.Atoi(l[1])
		if n < prev {
			t.Errorf("status line tokens went down from %d to %d", prev, n)
		}
		grew = grew || n > prev
		prev = n
	}
	if len(lines) < 2 || !grew {
		t.Errorf("want live status lines with a growing token count on stderr:\n%s", errOut)
	}
	if !strings.Contains(out, "run torch-run (ended: ok)") {
		t.Errorf("no final report on stdout:\n%s", out)
	}
	rep := c.waitEnded("torch-run")
	if rep.TokensProcessed != uint64(s.tokens) || s.tokens != 60*tinyTokensPerStep {
		t.Errorf("collector tokens %d, trainer reported %d, want %d", rep.TokensProcessed, s.tokens, 60*tinyTokensPerStep)
	}
	if rep.Metadata.GetModel() != "tinylm-d32-l1" || rep.Metadata.GetBackend() != "pytorch" {
		t.Errorf("metadata %v: the script's run_start did not fill the run", rep.Metadata)
	}
}
