package nvmlgpu

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// advance returns a Sleep for Diagnose that moves every fake's counters on
// by gap at power W, as a real GPU would between the two reads.
func advance(fakes []*fake, stale ...int) func(time.Duration) {
	return func(gap time.Duration) {
		for i, f := range fakes {
			isStale := false
			for _, s := range stale {
				isStale = isStale || s == i
			}
			f.set(func(f *fake) {
				if isStale {
					return
				}
				f.energyMJ += uint64(float64(f.powerMW) * gap.Seconds())
				f.energyTS += gap.Microseconds()
				f.powerTS += gap.Microseconds()
				f.powerMW += 500
			})
		}
	}
}

func TestDiagnoseReportsDriverGPUsFieldsAndLiveReadings(t *testing.T) {
	s, fakes := newServer(t, 2)
	s.DriverVersion, s.NvmlVersion, s.CudaDriverVersion = "570.86.15", "12.570.86.15", 12080
	for i := range 2 {
		d := s.Devices[i].(*dgxa100.Device)
		d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS }
	}
	// GPU 1 has no energy counter at all (field 83 and the call both fail).
	fakes[1].set(func(f *fake) { f.energyRet, f.totalRet = nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED })

	var slept time.Duration
	sleep := advance(fakes)
	r, err := Diagnose(s, DiagnoseOptions{Sleep: func(d time.Duration) { slept = d; sleep(d) }})
	if err != nil {
		t.Fatal(err)
	}
	if slept != DefaultDiagnoseGap {
		t.Errorf("slept %v between reads, want %v", slept, DefaultDiagnoseGap)
	}
	if r.Init != nvml.SUCCESS || r.DriverVersion != "570.86.15" || r.NVMLVersion != "12.570.86.15" || r.CUDAVersionString() != "12.8" {
		t.Fatalf("report %+v", r)
	}
	if len(r.GPUs) != 2 {
		t.Fatalf("gpus %+v", r.GPUs)
	}
	g := r.GPUs[0]
	if g.UUID != s.Devices[0].(*dgxa100.Device).UUID || g.Name != "Mock NVIDIA A100-SXM4-40GB" || g.MemTotalMiB != 40960 ||
		g.MemUsedMiB != 10240 || g.PowerLimitW != 400 || g.Persistence != "on" || !g.MigSupported || g.MigEnabled || g.Error != "" {
		t.Fatalf("gpu 0 %+v", g)
	}
	if !g.InstantPower.Supported || g.InstantPower.First != 250 || g.InstantPower.Second != 250.5 || !g.InstantPower.FreshTimestamp() ||
		!g.InstantPower.At1.Equal(now) {
		t.Errorf("instant power %+v", g.InstantPower)
	}
	// the fake answers field 185 with ERROR_INVALID_ARGUMENT
	if g.AveragePower.Supported || g.AveragePower.Error != nvml.ERROR_INVALID_ARGUMENT.Error() {
		t.Errorf("average power %+v", g.AveragePower)
	}
	if !g.Energy.Supported || !g.Energy.Advanced() || g.Energy.First != 1_000_000 || g.Energy.Second != 1_000_050 {
		t.Errorf("energy %+v", g.Energy)
	}
	if g.PowerUsageW != 240 || g.PowerUsageError != "" || g.TotalEnergyJ != 2000 {
		t.Errorf("fallbacks %+v", g)
	}

	g1 := r.GPUs[1]
	if g1.Energy.Supported || g1.Energy.Error != nvml.ERROR_NOT_SUPPORTED.Error() || g1.TotalEnergyError == "" || !g1.InstantPower.Supported {
		t.Errorf("gpu 1 without energy counter %+v", g1)
	}
	if len(s.ShutdownCalls()) != 1 || len(s.InitCalls()) != 1 {
		t.Errorf("Init %d / Shutdown %d calls, want 1 each", len(s.InitCalls()), len(s.ShutdownCalls()))
	}
}

func TestDiagnoseSeesStaleCountersAndMIG(t *testing.T) {
	s, fakes := newServer(t, 2)
	if _, ret := s.Devices[1].SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	// GPU 0's counters do not move between the two reads.
	r, err := Diagnose(s, DiagnoseOptions{Gap: time.Millisecond, Sleep: advance(fakes, 0)})
	if err != nil {
		t.Fatal(err)
	}
	g0, g1 := r.GPUs[0], r.GPUs[1]
	if g0.Energy.Advanced() || g0.InstantPower.FreshTimestamp() || !g0.Energy.Supported {
		t.Errorf("stale gpu 0 %+v", g0)
	}
	if !g1.Energy.Advanced() || !g1.InstantPower.FreshTimestamp() {
		t.Errorf("gpu 1 %+v", g1)
	}
	if g0.MigEnabled || !g1.MigEnabled || !g1.MigPendingEnabled {
		t.Errorf("mig: gpu 0 %v, gpu 1 %v/%v", g0.MigEnabled, g1.MigEnabled, g1.MigPendingEnabled)
	}
	// No GetPersistenceModeFunc on the mock: unknown, not a crash.
	if g0.Persistence != "" {
		t.Errorf("persistence %q", g0.Persistence)
	}
}

func TestDiagnoseWithoutNVMLSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		ret  nvml.Return
		want string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found"},
		{nvml.ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"},
		{nvml.ERROR_LIB_RM_VERSION_MISMATCH, "versions differ"},
	} {
		s := dgxa100.New()
		s.InitFunc = func() nvml.Return { return tc.ret }
		r, err := Diagnose(s, DiagnoseOptions{Sleep: func(time.Duration) { t.Error("slept without NVML") }})
		if err == nil || !errors.Is(err, ErrNoNVML) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v", tc.ret, err)
		}
		if r.Init != tc.ret || !strings.Contains(r.InitError, tc.want) || len(r.GPUs) != 0 {
			t.Errorf("%v: report %+v", tc.ret, r)
		}
		if len(s.ShutdownCalls()) != 0 {
			t.Errorf("%v: Shutdown called after a failed Init", tc.ret)
		}
	}
}

func TestDiagnoseKeepsGoingPastABrokenGPU(t *testing.T) {
	s, fakes := newServer(t, 3)
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 1 {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return s.Devices[i], nvml.SUCCESS
	}
	fakes[2].set(func(f *fake) { f.callRet = nvml.ERROR_UNKNOWN })
	r, err := Diagnose(s, DiagnoseOptions{Gap: time.Millisecond, Sleep: advance(fakes)})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GPUs) != 3 || !strings.Contains(r.GPUs[1].Error, "ERROR_GPU_IS_LOST") || r.GPUs[0].Error != "" {
		t.Fatalf("gpus %+v", r.GPUs)
	}
	if r.GPUs[2].Energy.Supported || r.GPUs[2].Energy.Error != nvml.ERROR_UNKNOWN.Error() {
		t.Errorf("gpu 2 %+v", r.GPUs[2])
	}
}
