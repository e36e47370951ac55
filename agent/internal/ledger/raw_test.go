package ledger

import (
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// With RawSamples, every batch carries each GPU's samples of its window
// (those read in [window_start, window_end)), none twice, none lost; without
// it, none.
func TestRawSamplesCoverEachWindowExactly(t *testing.T) {
	for _, on := range []bool{false, true} {
		r := newRig(t, []float64{250, 100}, []float64{250, 100}, 0)
		devs := make([]gpu.Device, 2)
		for i := range devs {
			devs[i] = gpu.Device{Index: i, UUID: "GPU-test-" + string(rune('a'+i))}
		}
		r.l = New(Config{Devices: devs, RawSamples: on})
		r.advance(5 * time.Second)
		if len(r.batches) < 4 {
			t.Fatalf("got %d batches", len(r.batches))
		}
		for i, b := range r.batches {
			if !on {
				if len(b.RawSamples) != 0 {
					t.Fatalf("raw samples sent without RawSamples")
				}
				continue
			}
			if i == 0 {
				continue // the first window starts mid-way
			}
			if len(b.RawSamples) != 2 {
				t.Fatalf("batch %d: %d raw sample sets, want 2", i, len(b.RawSamples))
			}
			ws, we := uint64(b.WindowStart.AsTime().UnixNano()), uint64(b.WindowEnd.AsTime().UnixNano())
			for g, rs := range b.RawSamples {
				if rs.Gpu != uint32(g) || len(rs.TUnixNs) != 20 || len(rs.PowerW) != 20 || len(rs.MemoryUsedMib) != 20 {
					t.Fatalf("batch %d gpu %d: %d samples (gpu %d), want 20", i, g, len(rs.TUnixNs), rs.Gpu)
				}
				for _, ts := range rs.TUnixNs {
					if ts < ws || ts >= we {
						t.Errorf("batch %d: sample at %d outside [%d, %d)", i, ts, ws, we)
					}
				}
				if rs.PowerW[0] != float32([]float64{250, 100}[g]) || rs.MemoryUsedMib[0] != float32(1000*(g+1)) {
					t.Errorf("batch %d gpu %d: power %v mem %v", i, g, rs.PowerW[0], rs.MemoryUsedMib[0])
				}
			}
		}
	}
}
