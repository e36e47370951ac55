package ledger

import (
	"math"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// Readings no GPU gives (an all-ones power value, NaN, a memory byte count
// of all ones, 10^9 % utilization, a counter leap of 1.8e13 J) count as
// missing ones: the run's peak power, VRAM and energy are what the GPUs
// did, and each is counted. Before, one all-ones power reading was the
// run's peak power (4.3 MW) and entered its power average.
func TestGarbledReadingsAreNotFigures(t *testing.T) {
	r := newRig(t, []float64{300, 300}, []float64{300, 300}, 0)
	r.garble = func(tick int, s *gpu.Sample) {
		if s.Index != 0 || tick%7 != 3 {
			return
		}
		switch tick % 5 {
		case 4:
			s.EnergyJ = 1.8e13
		case 0:
			s.PowerW = math.MaxUint32 / 1e3
		case 1:
			s.PowerW = math.NaN()
		case 2:
			s.MemUsedMiB = math.MaxUint64 / (1 << 20)
		case 3:
			s.UtilPct = 1e9
		}
	}
	r.advance(time.Second)
	start := r.at(10 * time.Millisecond)
	if err := r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "r", GPUs: []string{"0", "1"}, WarmupS: ptr(0.5)}); err != nil {
		t.Fatal(err)
	}
	r.advance(6 * time.Second)
	end := r.at(20 * time.Millisecond)
	if err := r.l.EndRun(end, peer1, &trainerproto.RunEnd{Run: "r"}); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)

	got := sum(r.windows("r"))
	measured := end.Sub(start).Seconds() - 0.5
	near(t, "measured counter J", got.measuredCounterJ, 600*measured, 1e-6)
	near(t, "measured integrated J", got.measuredIntegratedJ, 600*measured, 1e-3)
	near(t, "peak W", got.peak, 600, 1e-9)
	near(t, "vram peak", got.vramPeak, 2000, 0)
	for _, b := range r.batches {
		for _, w := range b.GpuWindows {
			if w.PowerMaxW > 300 || w.PowerAvgW != 300 || w.MemoryUsedMaxMib > 2000 || w.UtilizationAvgPct != 90 {
				t.Errorf("gpu window %d: power max %v avg %v, memory max %v, utilization %v", w.Gpu, w.PowerMaxW, w.PowerAvgW, w.MemoryUsedMaxMib, w.UtilizationAvgPct)
			}
		}
	}
	if n := r.l.GarbledReadings(); n < 20 {
		t.Errorf("%d garbled readings counted, want one per spoilt tick (over 20)", n)
	}
}
