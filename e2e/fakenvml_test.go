package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/fakenvml"
	"github.com/trainmeter/trainmeter/internal/oteltest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

var (
	fakeOnce sync.Once
	fakeDir  string
	fakeErr  error
)

// fakeNVML builds the fake libnvidia-ml.so.1 (once per test binary) and
// writes config for it; env is what a real binary needs to load it in place
// of the driver's library.
func fakeNVML(t *testing.T, config string) (env []string) {
	t.Helper()
	fakeOnce.Do(func() {
		// Beside the binaries: TestMain removes the directory at the end.
		dir := filepath.Join(binDir, "fakenvml")
		if fakeErr = os.Mkdir(dir, 0o755); fakeErr == nil {
			fakeDir, fakeErr = fakenvml.Build(dir)
		}
	})
	if fakeErr != nil {
		t.Fatal(fakeErr)
	}
	cfg := filepath.Join(t.TempDir(), "fakenvml.conf")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"LD_LIBRARY_PATH=" + fakeDir, fakenvml.ConfigEnv + "=" + cfg}
}

// startAgentEnv is startAgent with extra environment variables.
func (c *cluster) startAgentEnv(node, gpuSpec string, env []string, extra ...string) string {
	c.t.Helper()
	sock := filepath.Join(c.t.TempDir(), "agent.sock")
	args := append([]string{"--collector", c.addr, "--socket", sock, "--node", node, "--gpu", gpuSpec,
		"--spool", filepath.Join(c.t.TempDir(), "spool")}, extra...)
	oteltest.StartEnv(c.t, "trainmeter-agent", filepath.Join(binDir, "trainmeter-agent"), env, args...)
	c.eventually("agent socket "+sock, func() bool {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	return sock
}

// truthJ is the ground-truth energy of the given GPUs over the run's
// measured window (warmup end to run end), from the same sensor model the
// fake library runs.
func truthJ(t *testing.T, cfg *fakenvml.Config, r *trainmeterv1.RunReport, gpus []int, until time.Time) float64 {
	t.Helper()
	from := r.Start.AsTime().Add(time.Duration(r.WarmupS * float64(time.Second)))
	to := r.End.AsTime()
	if !until.IsZero() && until.Before(to) {
		to = until
	}
	ms := func(at time.Time) float64 { return float64(at.UnixMicro()-cfg.EpochUs) / 1000 }
	var sum float64
	for _, g := range gpus {
		m := cfg.Models[g]
		sum += m.TrueEnergyJ(ms(to)) - m.TrueEnergyJ(ms(from))
	}
	return sum
}

// TestFakeNVMLRealAgentSixtySeconds runs the real agent with --gpu nvml on
// the fake library (go-nvml's dlopen and cgo path, NVML's structs and
// timestamps) for one 60 s measured window, with three runs side by side:
//
//   - steady: a training-like 10 Hz square wave with data stalls on GPU 0;
//     its counter-first energy must be within 1 % of the ground truth.
//   - reset: GPU 1's energy counter restarts at zero mid-run (a driver
//     reload); the run's energy must neither lose nor double-count it.
//   - lost: GPUs 2 and 3, GPU 3 lost mid-run (ERROR_GPU_IS_LOST); the run
//     goes on on GPU 2 with the gap recorded.
func TestFakeNVMLRealAgentSixtySeconds(t *testing.T) {
	if testing.Short() {
		t.Skip("60 s of real time")
	}
	t.Parallel()
	const warmup, measured = 3 * time.Second, 60 * time.Second
	epoch := time.Now()
	// The runs start within a few seconds of the agent; the faults land in
	// the middle of the measured window.
	resetAt := 30 * time.Second
	lostAt := 35 * time.Second
	config := fmt.Sprintf(`epoch_us %d
gpus 4
sensor ampere
workload square
freq_hz 10
duty 0.6
high_w 420
low_w 180
idle_w 65
stall_every_ms 4000
stall_ms 350
gpu1.workload steps
gpu1.step_ms 7000
gpu1.reset_at_ms %d
gpu3.lost_at_ms %d
`, epoch.UnixMicro(), resetAt.Milliseconds(), lostAt.Milliseconds())
	cfg, err := fakenvml.ParseConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	env := fakeNVML(t, config)
	c := startCollector(t)
	sock := c.startAgentEnv("fake-node", "nvml", env)
	c.waitStreaming("fake-node")

	runs := map[string][]int{"fake-steady": {0}, "fake-reset": {1}, "fake-lost": {2, 3}}
	trainers := map[string]*trainer{}
	for run, gpus := range runs {
		tr := dialTrainer(t, sock)
		g := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(gpus)), ","), "[]")
		tr.send(`{"event":"run_start","run_id":%q,"model":"fake","gpus":[%s],"warmup_s":%g}`, run, g, warmup.Seconds())
		tr.sync()
		trainers[run] = tr
	}
	if time.Since(epoch) > resetAt-warmup-time.Second {
		t.Fatalf("the runs started %v after the fake's epoch: too late for the faults to be mid-run", time.Since(epoch))
	}
	deadline := time.Now().Add(warmup + measured)
	for step := 1; time.Now().Before(deadline); step++ {
		time.Sleep(500 * time.Millisecond)
		for run, tr := range trainers {
			tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":1000}`, run, step)
		}
	}
	for run, tr := range trainers {
		tr.send(`{"event":"run_end","run_id":%q}`, run)
		tr.sync()
	}

	steady := c.waitEnded("fake-steady")
	truth := truthJ(t, cfg, steady, runs["fake-steady"], time.Time{})
	errPct := 100 * (steady.EnergyJ - truth) / truth
	t.Logf("steady: %.1f J measured (%s) over %.1f s after warmup, truth %.1f J: error %+.3f %%",
		steady.EnergyJ, steady.EnergyMethod, steady.WallS-steady.WarmupS, truth, errPct)
	if steady.WallS-steady.WarmupS < 59 || steady.EnergyMethod != "counter" || math.Abs(errPct) > 1 {
		t.Errorf("steady run: %+v", steady)
	}
	// The stated uncertainty covers the true error (and is the counter's
	// band for 60 s on an H100: well under 1 %).
	if u := steady.EnergyUncertaintyPct; u == nil || *u > 1 || math.Abs(errPct) > *u {
		t.Errorf("energy_uncertainty_pct = %v for a true error of %+.3f %%", steady.EnergyUncertaintyPct, errPct)
	}
	if row := c.csvRow("fake-steady"); row["energy_uncertainty_pct"] == "" {
		t.Errorf("CSV energy_uncertainty_pct empty: %v", row)
	}

	reset := c.waitEnded("fake-reset")
	truth = truthJ(t, cfg, reset, runs["fake-reset"], time.Time{})
	errPct = 100 * (reset.EnergyJ - truth) / truth
	t.Logf("reset: %.1f J measured (%s), truth %.1f J: error %+.3f %%", reset.EnergyJ, reset.EnergyMethod, truth, errPct)
	if math.Abs(errPct) > 1 {
		t.Errorf("counter reset: %.1f J vs truth %.1f J (%+.2f %%): energy lost or counted twice", reset.EnergyJ, truth, errPct)
	}

	lost := c.waitEnded("fake-lost")
	truth2 := truthJ(t, cfg, lost, []int{2}, time.Time{})
	truth3 := truthJ(t, cfg, lost, []int{3}, epoch.Add(lostAt))
	t.Logf("lost: %.1f J measured (%s), gap %.1f s, estimated %v; truth GPU 2 %.1f J + GPU 3 until lost %.1f J",
		lost.EnergyJ, lost.EnergyMethod, lost.GapS, lost.EnergyEstimated, truth2, truth3)
	if !lost.Ended || lost.WallS < 60 {
		t.Errorf("the run with a lost GPU did not go on to its end: %+v", lost)
	}
	if lost.GapS < 10 {
		t.Errorf("GPU 3 lost for about %v of the run, but gap_s = %v", measured+warmup-lostAt, lost.GapS)
	}
	// GPU 2 is counted in full and GPU 3 up to its loss, nothing invented after.
	if d := 100 * (lost.EnergyJ - (truth2 + truth3)) / (truth2 + truth3); math.Abs(d) > 1 {
		t.Errorf("lost run: %.1f J vs truth %.1f J (%+.2f %%)", lost.EnergyJ, truth2+truth3, d)
	}
	rep := c.cli("report", "fake-lost")
	t.Logf("report:\n%s", rep)
}

// doctorEnv runs `trainmeter-agent doctor` with extra environment variables.
func doctorEnv(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "trainmeter-agent"), append([]string{"doctor", "--timeout", "3s"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("doctor %v: %v\n%s", args, err, out)
	return "", -1
}

// `doctor --gpu nvml` on a node whose agent runs on the (fake) driver passes
// every check, through the real library-loading path; with the library
// gone from the loader path it fails with the hint
// (TestDoctorWithoutDriverFailsClearly is the same without any library).
func TestFakeNVMLDoctor(t *testing.T) {
	t.Parallel()
	env := fakeNVML(t, fmt.Sprintf("epoch_us %d\ngpus 2\n", time.Now().Add(-time.Minute).UnixMicro()))
	c := startCollector(t)
	spoolDir := filepath.Join(t.TempDir(), "spool")
	sock := c.startAgentEnv("doc-fake", "nvml", env, "--spool", spoolDir)
	c.waitStreaming("doc-fake")
	args := []string{"--gpu", "nvml", "--socket", sock, "--collector", c.addr, "--node", "doc-fake", "--spool", spoolDir,
		"--sysfs-root", "../agent/internal/rapl/testdata/two-sockets"} // RAPL as on a two-socket server, so no WARN comes from the test machine
	out, code := doctorEnv(t, env, args...)
	if code != 0 || strings.Contains(out, "WARN") || strings.Contains(out, "FAIL") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"OK    nvml", "NVML loaded, driver 550.54.15", "CUDA driver 12.4", "2 GPUs",
		"OK    gpu 0 ", "NVIDIA H100 80GB HBM3", "power limit 700 W",
		"OK    gpu 1 power", "with a fresh driver timestamp", "average power (field 185) 300.0 W",
		"OK    gpu 1 energy", "(about 300 W)", "OK    gpu 0 mig", "checks OK.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("doctor on the fake driver:\n%s", out)

	missing := []string{"LD_LIBRARY_PATH=" + t.TempDir(), env[1]}
	out, code = doctorEnv(t, missing, args...)
	if code == 0 || !strings.Contains(out, "libnvidia-ml.so.1 not found") || !strings.Contains(out, "--gpu sim:2") {
		t.Errorf("without the library: exit %d:\n%s", code, out)
	}
}

// `trainmeter-agent validate` on the fake driver: a healthy sensor passes
// (exit 0, text); a GPU with a stuck counter fails (exit 1, --json says why).
func TestFakeNVMLValidate(t *testing.T) {
	t.Parallel()
	epoch := time.Now().Add(-time.Minute).UnixMicro()
	run := func(config string, args ...string) (string, int) {
		cmd := exec.Command(filepath.Join(binDir, "trainmeter-agent"), append([]string{"validate", "--duration", "2s"}, args...)...)
		cmd.Env = append(os.Environ(), fakeNVML(t, config)...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	out, code := run(fmt.Sprintf("epoch_us %d\ngpus 2\n", epoch))
	t.Logf("healthy:\n%s", out)
	if code != 0 || !strings.Contains(out, "verdict: PASS") || !strings.Contains(out, "energy counter every 100 ms") ||
		!strings.Contains(out, "186 instant power yes, 185 average power yes, 83 energy counter yes") {
		t.Errorf("healthy sensor: exit %d:\n%s", code, out)
	}
	out, code = run(fmt.Sprintf("epoch_us %d\ngpus 2\ngpu1.stale_from_ms 0\n", epoch), "--json")
	var rep struct {
		Verdict string `json:"verdict"`
		GPUs    []struct {
			Verdict string   `json:"verdict"`
			Reasons []string `json:"reasons"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if code != 1 || rep.Verdict != "fail" || rep.GPUs[0].Verdict != "pass" || rep.GPUs[1].Verdict != "fail" ||
		!strings.Contains(strings.Join(rep.GPUs[1].Reasons, " "), "counter is stuck") || !strings.Contains(out, "trainmeter-agent: validate: the sensor check failed") {
		t.Errorf("stuck sensor: exit %d:\n%s", code, out)
	}
}

// Process attribution on real NVML calls: `trainmeter run` wraps a command
// that, once started, appears as a compute process on GPU 1 of the fake
// driver (it writes its own PID into the fake's process list); the run gets
// GPU 1 alone, found through nvmlDeviceGetComputeRunningProcesses_v3 and the
// /proc parent links, and GPU 1's energy from when it was seen.
func TestFakeNVMLProcessAttribution(t *testing.T) {
	t.Parallel()
	procs := filepath.Join(t.TempDir(), "procs")
	if err := os.WriteFile(procs, []byte("0 1 10 5\n"), 0o644); err != nil { // PID 1 (init) on GPU 0: not the run's
		t.Fatal(err)
	}
	env := fakeNVML(t, fmt.Sprintf("epoch_us %d\ngpus 3\nhigh_w 300\nprocs_file %s\n", time.Now().Add(-time.Minute).UnixMicro(), procs))
	c := startCollector(t)
	sock := c.startAgentEnv("attr-node", "nvml", env)
	c.waitStreaming("attr-node")

	script := fmt.Sprintf(`echo "1 $$ 2048 70" >> %s; sleep 4`, procs)
	out, errOut, code := c.trainmeterRun("--socket", sock, "--collector", c.addr, "--run-id", "fake-attr", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	row := c.csvRow("fake-attr")
	t.Logf("gpus %s, energy_total_J %s, gpu_hours %s, wall_s %s", row["gpus"], row["energy_total_J"], row["gpu_hours"], row["wall_s"])
	if row["gpus"] != "1" {
		t.Fatalf("gpus = %q, want 1 (GPU 1, where the command runs)", row["gpus"])
	}
	// 300 W on one GPU for at most the run's wall time: more would mean a
	// GPU that is not the run's was counted.
	if e, w := num(t, row, "energy_total_J"), num(t, row, "wall_s"); e <= 0 || e > 300*w*1.01 {
		t.Errorf("energy_total_J %v for %v s of one 300 W GPU", e, w)
	}
}
