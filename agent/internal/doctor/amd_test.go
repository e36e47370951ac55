package doctor

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu/amdfixture"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

const amdTestdata = "../../../internal/gpu/amdgpu/testdata"

// amdReport runs the GPU checks on a copy of fixture tree name; between
// its two reads, move (if not nil) rewrites the copy as the gap passes.
func amdReport(t *testing.T, spec, name string, move func(sys string, gap time.Duration)) *Report {
	t.Helper()
	dir := t.TempDir()
	if name != "" {
		if err := os.CopyFS(dir, os.DirFS(filepath.Join(amdTestdata, name))); err != nil {
			t.Fatal(err)
		}
	}
	sys, proc := filepath.Join(dir, "sys"), filepath.Join(dir, "proc")
	if err := os.MkdirAll(proc, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := agentconfig.DefaultConfig()
	cfg.GPU, cfg.SysfsRoot, cfg.ProcfsRoot = spec, sys, proc
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	noNVML := func() nvml.Interface {
		s := mockNVML()
		s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
		return s
	}
	o := Options{Config: cfg, NVML: noNVML, Gap: 200 * time.Millisecond,
		Clock: clk,
		Wait: func(d time.Duration) {
			clk.Advance(d)
			if move != nil {
				move(sys, d)
			}
		}}
	r := &Report{OK: true}
	checkGPU(o, r)
	return r
}

// advance moves card's accumulator on by watts over gap.
func advance(t *testing.T, sys string, b amdfixture.Board, watts float64, gap time.Duration) {
	t.Helper()
	spec := *b.Metrics
	spec.EnergyRaw += uint64(watts * gap.Seconds() * 65536)
	if err := amdfixture.SetMetrics(sys, b.Card, spec); err != nil {
		t.Fatal(err)
	}
}

func TestAMDMI300XCounterAgreesOnOneBoardNotTheOther(t *testing.T) {
	boards := amdfixture.Trees["mi300x"].Boards
	r := amdReport(t, "amd", "mi300x", func(sys string, gap time.Duration) {
		advance(t, sys, boards[0], 350, gap) // as its power says
		advance(t, sys, boards[1], 3.4, gap) // a hundredth of its 340 W
	})
	want(t, r, SectionGPU, "amdgpu", OK, "2 amdgpu cards", "card0 (0000:0c:00.0)", "card1 (0000:22:00.0)")
	want(t, r, SectionGPU, "gpu 0", OK, "AMD Instinct MI300X OAM", "AMD-a3f1c0d2e4b59687", "196608 MiB", "power cap 750 W", "gpu_metrics v1.5")
	want(t, r, SectionGPU, "gpu 0 power", OK, "hwmon power1_input 350.0 W")
	want(t, r, SectionGPU, "gpu 0 energy", OK, "+70.000 J in 200 ms", "power says 70.000 J", "uses the counter")
	want(t, r, SectionGPU, "gpu 1 energy", Warn, "+0.680 J in 200 ms", "power says 68.000 J", "drops it and integrates power")
	want(t, r, SectionGPU, "process usage", OK, "readable for all 3 processes")
	want(t, r, SectionGPU, "amd-smi", OK, "not needed")
	if !r.OK {
		t.Errorf("report not OK: %+v", r.Checks)
	}
}

func TestAMDConsumerCardAPUAndMissingFiles(t *testing.T) {
	r := amdReport(t, "amd", "rx7900xtx", nil)
	want(t, r, SectionGPU, "gpu 0", OK, "AMD Radeon RX 7900 XTX/XT", "AMD-PCI-0000:03:00.0", "gpu_metrics v1.3")
	want(t, r, SectionGPU, "gpu 0 power", Warn, "power1_average 250.0 W", "1 s average")
	want(t, r, SectionGPU, "gpu 0 energy", Warn, "v1.3 has no energy accumulator, or the firmware leaves it unfilled", "integrated from power")
	want(t, r, SectionGPU, "amd-smi", Warn, "not installed, and without it these cards have no energy counter (their energy is the power integral): card0", "libamd_smi.so")

	r = amdReport(t, "amd", "apu-v3", nil)
	want(t, r, SectionGPU, "gpu 0 power", Warn, "from gpu_metrics' socket power: 25.0 W")
	want(t, r, SectionGPU, "gpu 0 energy", Warn, "v3.0 has no energy accumulator")

	r = amdReport(t, "amd", "missing", nil)
	want(t, r, SectionGPU, "gpu 0 power", Fail, "no power reading", "no hwmon directory")
	want(t, r, SectionGPU, "gpu 0 energy", Fail, "gpu_metrics unreadable", "will be zero")
	if r.OK {
		t.Error("a card whose energy cannot be measured left the report OK")
	}

	r = amdReport(t, "amd", "", nil)
	want(t, r, SectionGPU, "amdgpu", Fail, "no AMD GPU found", "lsmod | grep amdgpu")
}

func TestAMDUnreadableHwmonFails(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads files whatever their mode")
	}
	r := amdReport(t, "amd", "rx7900xtx", func(sys string, _ time.Duration) {
		if err := os.Chmod(filepath.Join(sys, "class/drm/card0/device/hwmon/hwmon0/power1_average"), 0); err != nil {
			t.Fatal(err)
		}
	})
	want(t, r, SectionGPU, "gpu 0", Fail, "cannot be read", "permission denied", "world-readable", "runtime-suspended")
}

func TestAMDAutoPicksAMDOnlyWithoutNVIDIA(t *testing.T) {
	r := amdReport(t, "auto", "rx7900xtx", nil)
	want(t, r, SectionGPU, "amdgpu", OK, "--gpu auto found no NVIDIA GPU and uses amd", "1 amdgpu card")

	r = amdReport(t, "auto", "nvidia-and-amd", nil)
	if _, ok := r.Find(SectionGPU, "amdgpu"); ok {
		t.Errorf("auto checked amd on a node with an NVIDIA GPU: %+v", r.Checks)
	}
	want(t, r, SectionGPU, "nvml", Fail, "--gpu auto found no usable NVIDIA GPU")
}
