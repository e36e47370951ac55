package replay

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// FuzzParse feeds arbitrary traces to the parser. It must return either a
// clear error (prefixed "replay:") or a backend whose GPUs are contiguous
// from 0 and whose every read, at any point of playback, gives finite,
// non-negative values with utilisation at most 100 %.
func FuzzParse(f *testing.F) {
	f.Add(header + "0,0,300,1000,5000,81559,95\n0.1,0,300,1030,5000,81559,95\n")
	f.Add(header + "0,0,300,,5000,81559,\n0,1,250,10,1,2,3\n")
	f.Add("\ufeffTime_s, GPU ,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct,extra\n# c\n0,0,1,2,3,4,5,x\n")
	f.Add(header + "1,0,300,1000,5000,81559,95\n0.5,0,300,1000,5000,81559,95\n")
	f.Add(header + "0,1,300,1000,5000,81559,95\n")
	f.Add(header + "1e300,0,NaN,1,1,1,101\n")
	f.Add(header + "\"0\",0,\"3\"00,1,1,1,1\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, trace string) {
		b, err := Parse(strings.NewReader(trace))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "replay: ") {
				t.Fatalf("error without the replay: prefix: %v", err)
			}
			return
		}
		devs := b.Devices()
		if len(devs) == 0 || len(devs) > maxGPUs {
			t.Fatalf("%d devices", len(devs))
		}
		for i, d := range devs {
			if d.Index != i {
				t.Fatalf("device %d has index %d", i, d.Index)
			}
		}
		dur := b.Duration()
		if dur < 0 {
			t.Fatalf("negative duration %v", dur)
		}
		t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		b.StartAt(t0)
		dst := make([]gpu.Sample, len(devs))
		for _, at := range []time.Duration{-time.Second, 0, dur / 2, dur, dur + time.Second} {
			if err := b.Read(t0.Add(at), dst); err != nil {
				t.Fatalf("read at %v: %v", at, err)
			}
			for _, s := range dst {
				for _, v := range []float64{s.PowerW, s.EnergyJ, s.MemUsedMiB, s.MemTotalMiB, s.UtilPct} {
					if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
						t.Fatalf("read at %v: gpu %d has value %v", at, s.Index, v)
					}
				}
				if s.UtilPct > 100 {
					t.Fatalf("gpu %d: utilisation %v over 100", s.Index, s.UtilPct)
				}
				if s.PowerOK && s.PowerAt.After(t0.Add(max(at, 0))) {
					t.Fatalf("gpu %d: a row from the future (%v) read at %v", s.Index, s.PowerAt, at)
				}
			}
		}
	})
}
