package nvmlgpu

import (
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// TestRealNVML runs against the machine's NVML when there is one, and skips
// otherwise (no driver, no GPU). It reads every GPU a few times at 50 ms.
func TestRealNVML(t *testing.T) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Skipf("NVML does not initialise here (%v): skipping the real-hardware test", ret)
	}
	defer lib.Shutdown() // balances the Init above; Backend.Close balances New's

	b, err := New(lib, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	devs := b.Devices()
	t.Logf("%d GPUs", len(devs))
	for _, d := range devs {
		t.Logf("%+v", d)
	}
	dst := make([]gpu.Sample, len(devs))
	for range 10 {
		if err := b.Read(time.Now(), dst); err != nil {
			t.Fatal(err)
		}
		for _, s := range dst {
			t.Logf("gpu %d: %.1f W at %v (ok %v), %.3f J at %v (ok %v), mem %.0f/%.0f MiB, util %.0f %%, err %v",
				s.Index, s.PowerW, s.PowerAt.Format("15:04:05.000000"), s.PowerOK,
				s.EnergyJ, s.EnergyAt.Format("15:04:05.000000"), s.EnergyOK,
				s.MemUsedMiB, s.MemTotalMiB, s.UtilPct, s.Err)
			if s.PowerOK && (s.PowerW <= 0 || s.PowerW > 2000) {
				t.Errorf("gpu %d: implausible power %v W", s.Index, s.PowerW)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
