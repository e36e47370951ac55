package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/fakeamdsmi"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu/amdfixture"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// An AMD node end to end: the real agent runs --gpu amd on a fixture sysfs
// tree of two MI300X-like boards, the test moves the boards' energy
// accumulators while a run is open, and the collector must report exactly
// the counters' difference as the run's energy.
//
// The counters move only between two points the test has seen the agent
// read (a closed batch window after the run started, and the run's live
// energy showing the new values), so the run's start and end fall between
// readings of one value and the interpolation at its edges is exact. Power
// reads 0 W until then: the backend checks the counter against power over
// its first 3 s (internal/gpu/amdgpu), and a still counter agrees with 0 W.
func TestAMDNodeRunEnergyIsTheCountersDifference(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	boards := []amdfixture.Board{amdfixture.MI300X(0, "0000:0c:00.0", 0), amdfixture.MI300X(1, "0000:22:00.0", 0)}
	if err := amdfixture.Write(root, amdfixture.Tree{Boards: boards}); err != nil {
		t.Fatal(err)
	}
	sys, proc := filepath.Join(root, "sys"), filepath.Join(root, "proc")
	if err := os.MkdirAll(proc, 0o755); err != nil {
		t.Fatal(err)
	}

	c := startCollector(t)
	sock := c.startAgent("amd-node", "amd", "--sysfs-root", sys, "--procfs-root", proc)
	// Past the counter check's 3 s: five 1 s windows stored.
	c.eventually("five windows from amd-node", func() bool { return c.lastSeq("amd-node") >= 5 })

	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"amd-run","model":"m","backend":"b","gpus":[0,1],"warmup_s":0}`)
	tr.sync()
	c.eventually("amd-run at the collector", func() bool {
		resp, err := c.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "amd-run"})
		return err == nil && resp.GetRun().GetWallS() > 0
	})

	const card0J, card1J = 1234, 4321
	for i, addJ := range []uint64{card0J, card1J} {
		card := fmt.Sprintf("card%d", i)
		spec := *boards[i].Metrics
		spec.EnergyRaw += addJ << 16
		if err := amdfixture.SetMetrics(sys, card, spec); err != nil {
			t.Fatal(err)
		}
		if err := amdfixture.SetPower(sys, card, "power1_input", 350e6); err != nil {
			t.Fatal(err)
		}
	}
	c.eventually("the new counters in amd-run's live energy", func() bool {
		resp, err := c.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "amd-run"})
		return err == nil && resp.GetRun().GetEnergyTotalJ() == card0J+card1J
	})
	tr.send(`{"event":"run_end","run_id":"amd-run"}`)
	tr.sync()
	r := c.waitEnded("amd-run")

	if r.GetEnergyTotalJ() != card0J+card1J || r.GetEnergyJ() != card0J+card1J || r.GetEnergyMethod() != "counter" {
		t.Errorf("run energy_total_J %v, energy_J %v (method %q); want exactly %d J from the counters",
			r.GetEnergyTotalJ(), r.GetEnergyJ(), r.GetEnergyMethod(), card0J+card1J)
	}
	row := c.csvRow("amd-run")
	if row["energy_total_J"] != fmt.Sprint(card0J+card1J) || row["energy_method"] != "counter" {
		t.Errorf("CSV energy_total_J %s (%s), want %d", row["energy_total_J"], row["energy_method"], card0J+card1J)
	}

	// The collector keeps what the agent said about the GPUs.
	var nodes struct {
		Nodes []struct {
			Gpus []struct {
				Name             string `json:"name"`
				UUID             string `json:"uuid"`
				Vendor           string `json:"vendor"`
				HasEnergyCounter bool   `json:"has_energy_counter"`
			} `json:"gpus"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(c.cli("nodes", "--json")), &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes.Nodes) != 1 || len(nodes.Nodes[0].Gpus) != 2 {
		t.Fatalf("nodes: %+v", nodes)
	}
	g := nodes.Nodes[0].Gpus[0]
	if g.Vendor != "amd" || g.Name != "AMD Instinct MI300X OAM" || g.UUID != "AMD-a3f1c0d2e4b59687" || !g.HasEnergyCounter {
		t.Errorf("gpu 0 at the collector: %+v", g)
	}
	if out := c.cli("nodes"); !strings.Contains(out, "2 x AMD Instinct MI300X OAM (amd)") {
		t.Errorf("trainmeter nodes:\n%s", out)
	}
}

// A replay trace that names its vendor makes the agent report AMD GPUs, and
// the collector keeps and shows the vendor.
func TestReplayTraceNamingAMD(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct,vendor,name\n")
	for i := 0; i <= 600; i++ {
		fmt.Fprintf(&b, "%.1f,0,700,%d,1000,196608,95,amd,AMD Instinct MI300X\n", float64(i)*0.1, 1_000_000+70*i)
	}
	path := filepath.Join(t.TempDir(), "amd.csv")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCollector(t)
	c.startAgent("amd-replay", "replay:"+path)
	c.waitStreaming("amd-replay")
	if out := c.cli("nodes"); !strings.Contains(out, "1 x AMD Instinct MI300X (amd)") {
		t.Errorf("trainmeter nodes:\n%s", out)
	}
	resp, err := c.q.ListNodes(context.Background(), &trainmeterv1.ListNodesRequest{})
	if err != nil || len(resp.GetNodes()) != 1 || resp.GetNodes()[0].GetGpus()[0].GetVendor() != "amd" {
		t.Fatalf("ListNodes: %v %v", resp, err)
	}
}

// The real doctor on AMD fixture nodes: a consumer card measures (with
// WARNs); a card with nothing to read fails with a hint. (No collector
// runs here: its checks fail, and the output ends with doctor's one-line
// error after the JSON.)
func TestDoctorOnAMDFixtures(t *testing.T) {
	t.Parallel()
	fixtures := "../internal/gpu/amdgpu/testdata"
	args := func(name string) []string {
		return []string{"--json", "--gpu", "amd", "--sysfs-root", filepath.Join(fixtures, name, "sys"),
			"--procfs-root", t.TempDir(), "--collector", "127.0.0.1:1", "--socket", filepath.Join(t.TempDir(), "none.sock"), "--spool", t.TempDir()}
	}
	out, _ := doctor(t, args("rx7900xtx")...)
	var rep doctorReport
	if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if st, text := rep.check(t, "gpu", "amdgpu"); st != "OK" || !strings.Contains(text, "card0 (0000:03:00.0)") {
		t.Errorf("amdgpu: %s %s", st, text)
	}
	if st, text := rep.check(t, "gpu", "gpu 0 energy"); st != "WARN" || !strings.Contains(text, "integrated from power") {
		t.Errorf("gpu 0 energy: %s %s", st, text)
	}

	out, _ = doctor(t, args("missing")...)
	rep = doctorReport{}
	if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if st, text := rep.check(t, "gpu", "gpu 0 power"); st != "FAIL" || !strings.Contains(text, "hint: amdgpu exposes power under hwmon") {
		t.Errorf("gpu 0 power: %s %s", st, text)
	}
}

// The real agent binary loads libamd_smi.so from the library path when it
// is there (a fake one here) and its doctor says so; the collector binary
// never links it (collector/cmd/trainmeter/deps_test.go).
func TestDoctorLoadsLibAMDSMIWhereInstalled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := fakeamdsmi.Build(dir); err != nil {
		t.Skipf("no C compiler for the fake libamd_smi: %v", err)
	}
	gpus := filepath.Join(dir, "gpus")
	if err := os.WriteFile(gpus, []byte("0000:03:00.0 65536000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "trainmeter-agent"), "doctor", "--json", "--timeout", "1s", "--gpu", "amd",
		"--sysfs-root", "../internal/gpu/amdgpu/testdata/rx7900xtx/sys", "--procfs-root", t.TempDir(),
		"--collector", "127.0.0.1:1", "--socket", filepath.Join(t.TempDir(), "none.sock"), "--spool", t.TempDir())
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir, fakeamdsmi.ConfigEnv+"="+gpus)
	out, _ := cmd.CombinedOutput()
	var rep doctorReport
	if err := json.Unmarshal(out[:strings.LastIndex(string(out), "}")+1], &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if st, text := rep.check(t, "gpu", "amd-smi"); st != "OK" || !strings.Contains(text, "libamd_smi.so loaded, 1 GPU; energy counter from it for card0") {
		t.Errorf("amd-smi: %s %s", st, text)
	}
}

// A board whose accumulator disagrees with its power (here: still while
// hwmon says 300 W) is caught by the agent's check over its first 3 s, and
// the runs after it are measured by the power integral.
func TestAMDCounterThatDisagreesWithPowerIsDropped(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := amdfixture.Write(root, amdfixture.Trees["counter-disagrees"]); err != nil {
		t.Fatal(err)
	}
	c := startCollector(t)
	sock := c.startAgent("amd-bad-counter", "amd", "--sysfs-root", filepath.Join(root, "sys"), "--procfs-root", t.TempDir())
	c.eventually("five windows from amd-bad-counter", func() bool { return c.lastSeq("amd-bad-counter") >= 5 })
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"bad-counter","model":"m","backend":"b","gpus":[0],"warmup_s":0}`)
	tr.runSteps("bad-counter", 20, 100, 100*time.Millisecond)
	tr.send(`{"event":"run_end","run_id":"bad-counter"}`)
	tr.sync()
	r := c.waitEnded("bad-counter")
	if r.GetEnergyMethod() != "integrated" {
		t.Errorf("energy_method %q, want integrated (the counter was dropped)", r.GetEnergyMethod())
	}
	within(t, "energy_total_J", r.GetEnergyTotalJ(), 300*r.GetWallS(), 0.02)
}
