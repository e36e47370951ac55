package nvmlgpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/trainmeter/trainmeter/internal/fakenvml"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

var (
	fakeOnce sync.Once
	fakeDir  string
	fakeLib  string
	fakeErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fakeDir != "" {
		os.RemoveAll(fakeDir)
	}
	os.Exit(code)
}

// fakeNVML builds the fake libnvidia-ml.so.1 once per test binary (a second
// copy loaded RTLD_GLOBAL would shadow the first) and points it at config.
func fakeNVML(t *testing.T, config string) nvml.Interface {
	t.Helper()
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fakenvml")
		if err != nil {
			fakeErr = err
			return
		}
		fakeDir = dir
		if _, fakeErr = fakenvml.Build(dir); fakeErr == nil {
			fakeLib = filepath.Join(dir, fakenvml.LibName)
		}
	})
	if fakeErr != nil {
		t.Fatal(fakeErr)
	}
	cfg := filepath.Join(t.TempDir(), "fakenvml.conf")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakenvml.ConfigEnv, cfg)
	return nvml.New(nvml.WithLibraryPath(fakeLib))
}

// TestFakeLibraryThroughCgo runs the backend on go-nvml's real dlopen/cgo
// path against the fake library: every value must decode to what the sensor
// model (the same C code, in process) says for the driver timestamp the value
// carries, which checks the struct layouts, value types and units end to end.
func TestFakeLibraryThroughCgo(t *testing.T) {
	epoch := time.Now().Add(-time.Minute).UnixMicro()
	config := fmt.Sprintf(`
epoch_us %d
gpus 2
workload square
high_w 400
low_w 150
freq_hz 7
gpu1.name NVIDIA A100-SXM4-80GB
gpu1.uuid GPU-11111111-2222-3333-4444-555555555555
gpu1.unknown_from_ms 0
gpu1.unknown_to_ms 1e12
`, epoch)
	lib := fakeNVML(t, config)
	b, err := New(lib, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	devs := b.Devices()
	if len(devs) != 2 || devs[0].Name != "NVIDIA H100 80GB HBM3" || devs[1].UUID != "GPU-11111111-2222-3333-4444-555555555555" {
		t.Fatalf("devices = %+v", devs)
	}
	if !devs[0].HasInstantPower || !devs[0].HasEnergyCounter || devs[0].PowerLimitW != 700 || devs[0].MemTotalMiB != 81559 {
		t.Fatalf("gpu 0 = %+v", devs[0])
	}
	cfg, err := fakenvml.ParseConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	model := cfg.Models[0]
	dst := make([]gpu.Sample, 2)
	if err := b.Read(time.Now(), dst); err != nil {
		t.Fatal(err)
	}
	s := dst[0]
	if !s.PowerOK || !s.EnergyOK || s.Err != nil {
		t.Fatalf("gpu 0 sample = %+v", s)
	}
	atMs := float64(s.PowerAt.UnixMicro()-epoch) / 1000
	if wantW, wantAt := model.InstantW(atMs); s.PowerW != float64(int64(wantW*1000+0.5))/1000 || wantAt != atMs {
		t.Errorf("power %v W at %v ms, model says %v W at %v ms", s.PowerW, atMs, wantW, wantAt)
	}
	eAt := float64(s.EnergyAt.UnixMicro()-epoch) / 1000
	if int64(eAt)%model.UpdateMs() != 0 {
		t.Errorf("energy timestamp %v ms is not on a sensor update", eAt)
	}
	if wantJ, _ := model.CounterJ(eAt); s.EnergyJ != float64(int64(wantJ*1000))/1000 {
		t.Errorf("energy %v J, model says %v J", s.EnergyJ, wantJ)
	}
	if !s.MemOK || s.MemUsedMiB != 1024 || !s.UtilOK || s.UtilPct != 90 {
		t.Errorf("memory/utilisation = %+v", s)
	}
	// ERROR_UNKNOWN from the start: the probe must not mistake it for an
	// unsupported field (which would switch the GPU to the fallbacks for
	// good); the read reports it.
	if d := devs[1]; !d.HasInstantPower || !d.HasEnergyCounter {
		t.Errorf("gpu 1 failing with ERROR_UNKNOWN while probed lost its fields: %+v", d)
	}
	if !errors.Is(dst[1].Err, nvml.ERROR_UNKNOWN) || dst[1].PowerOK || dst[1].EnergyOK {
		t.Errorf("gpu 1 with ERROR_UNKNOWN injected: %+v", dst[1])
	}
}

// TestFakeLibraryFallbacks: a GPU without fields 186/83 is read through
// GetPowerUsage (the 1 s average) and GetTotalEnergyConsumption.
func TestFakeLibraryFallbacks(t *testing.T) {
	lib := fakeNVML(t, fmt.Sprintf("epoch_us %d\ngpus 1\nfield_power 0\nfield_energy 0\nhigh_w 250\n", time.Now().Add(-time.Minute).UnixMicro()))
	b, err := New(lib, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	d := b.Devices()[0]
	if d.HasInstantPower || !d.HasEnergyCounter {
		t.Fatalf("device = %+v", d)
	}
	dst := make([]gpu.Sample, 1)
	if err := b.Read(time.Now(), dst); err != nil {
		t.Fatal(err)
	}
	if s := dst[0]; !s.PowerOK || s.PowerW != 250 || !s.EnergyOK || s.EnergyJ <= 0 || s.Err != nil {
		t.Fatalf("sample = %+v", s)
	}
}

func TestFakeLibraryProcesses(t *testing.T) {
	procs := filepath.Join(t.TempDir(), "procs")
	if err := os.WriteFile(procs, []byte("0 4242 1000 50\n1 77 10 5\n0 4343 10 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := fakeNVML(t, "gpus 2\nprocs_file "+procs+"\n")
	b, err := New(lib, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pids, err := b.ComputePIDs(0)
	if err != nil || len(pids) != 2 || pids[0] != 4242 || pids[1] != 4343 {
		t.Fatalf("ComputePIDs(0) = %v, %v", pids, err)
	}
	// The per-process utilisation and memory, through go-nvml's structs.
	h, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	procInfo, ret := h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS || len(procInfo) != 2 || procInfo[0].UsedGpuMemory != 1000<<20 || procInfo[0].GpuInstanceId != 0xFFFFFFFF {
		t.Errorf("GetComputeRunningProcesses = %+v, %v", procInfo, ret)
	}
	util, ret := h.GetProcessUtilization(0)
	if ret != nvml.SUCCESS || len(util) != 2 || util[0].Pid != 4242 || util[0].SmUtil != 50 || util[1].SmUtil != 5 {
		t.Errorf("GetProcessUtilization = %+v, %v", util, ret)
	}
}

func TestFakeLibraryDiagnose(t *testing.T) {
	lib := fakeNVML(t, "gpus 1\ngpu0.mig 1\n")
	var slept time.Duration
	rep, err := Diagnose(lib, DiagnoseOptions{Gap: 150 * time.Millisecond, Sleep: func(d time.Duration) { slept = d; time.Sleep(d) }})
	if err != nil {
		t.Fatal(err)
	}
	g := rep.GPUs[0]
	if rep.DriverVersion == "" || rep.CUDAVersionString() != "12.4" || !g.MigEnabled || !g.InstantPower.Supported ||
		!g.AveragePower.Supported || !g.Energy.Supported || g.Persistence != "on" || slept != 150*time.Millisecond {
		t.Fatalf("report = %+v", rep)
	}
	if !g.Energy.FreshTimestamp() || !g.Energy.Advanced() {
		t.Errorf("after 150 ms the 100 ms sensor must have updated: %+v", g.Energy)
	}
}

// Validate against the fake both ways: a healthy sensor passes; a sensor
// whose timestamps stop (stuck fields) fails, naming the counter.
func TestFakeLibraryValidate(t *testing.T) {
	epoch := time.Now().Add(-time.Minute).UnixMicro()
	lib := fakeNVML(t, fmt.Sprintf("epoch_us %d\ngpus 2\nworkload square\nfreq_hz 7\ngpu1.stale_from_ms 0\n", epoch))
	rep, err := Validate(lib, ValidateOptions{Duration: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g0, g1 := rep.GPUs[0], rep.GPUs[1]
	t.Logf("%+v\n%+v", g0, g1)
	if g0.Verdict != VerdictPass || !g0.InstantPower || !g0.AveragePower || !g0.EnergyField ||
		g0.EnergyUpdateMs != 100 || g0.PowerUpdateMs != 100 || g0.StaleEnergyPct < 30 || g0.CounterJ <= 0 {
		t.Errorf("healthy GPU: %+v", g0)
	}
	if _, ok := g0.CallCostUs["GetFieldValues"]; !ok {
		t.Errorf("no call cost: %+v", g0.CallCostUs)
	}
	if g1.Verdict != VerdictFail || rep.Verdict != VerdictFail || len(g1.Reasons) == 0 || !strings.Contains(g1.Reasons[0], "counter is stuck") {
		t.Errorf("stuck GPU: %+v (report verdict %s)", g1, rep.Verdict)
	}
}

// TestFakeLibraryMIG: MIG devices of the fake through go-nvml's cgo path:
// each process on a MIG device is found under that device's UUID (two
// compute instances of one GPU instance apart) and carries its GPU
// instance's slices; processes outside MIG and the other GPU have none.
func TestFakeLibraryMIG(t *testing.T) {
	procs := filepath.Join(t.TempDir(), "procs")
	if err := os.WriteFile(procs, []byte("0 100 10 5 1 0\n0 101 10 5 2 0\n0 102 10 5 2 1\n1 200 10 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := fakeNVML(t, "gpus 2\nprocs_file "+procs+`
mig 0 1 0 3 MIG-aaaaaaaa-0000-4000-8000-000000000001
mig 0 2 0 4 MIG-aaaaaaaa-0000-4000-8000-000000000002
mig 0 2 1 4 MIG-aaaaaaaa-0000-4000-8000-000000000003
`)
	b, err := New(lib, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	migs, err := b.ComputeMIGs(0)
	want := map[uint32]string{100: "MIG-aaaaaaaa-0000-4000-8000-000000000001", 101: "MIG-aaaaaaaa-0000-4000-8000-000000000002", 102: "MIG-aaaaaaaa-0000-4000-8000-000000000003"}
	if err != nil || len(migs) != len(want) || migs[100] != want[100] || migs[101] != want[101] || migs[102] != want[102] {
		t.Fatalf("ComputeMIGs(0) = %v, %v; want %v", migs, err, want)
	}
	if migs, err := b.ComputeMIGs(1); err != nil || len(migs) != 0 {
		t.Fatalf("ComputeMIGs(1) = %v, %v; want none", migs, err)
	}
	use, err := b.ProcessUsage(0, time.Time{})
	if err != nil || use[100].MIGSlices != 3 || use[100].MIGInstance != 1 || use[101].MIGSlices != 4 || use[102].MIGInstance != 2 {
		t.Fatalf("ProcessUsage(0) = %+v, %v", use, err)
	}
}
