package energy

import (
	"math"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// A garbled reading (a counter that jumps by terajoules for one read, an
// all-ones power value) is dropped: the energy over it is what the GPU drew,
// and the reading is counted as implausible. Kept, the counter spike became
// the window's energy (1.8e13 J), which the collector refuses, and with it
// the node's whole batch.
func TestGarbledReadingsAreDropped(t *testing.T) {
	const w = 300.0
	garbled := map[int]func(s *gpu.Sample){
		40: func(s *gpu.Sample) { s.EnergyJ = 1.8e13 },              // counter spike, back at the next update
		60: func(s *gpu.Sample) { s.PowerW = math.MaxUint32 / 1e3 }, // all-ones mW
		61: func(s *gpu.Sample) { s.PowerW = -5 },
	}
	ss := trace{dur: 10 * time.Second, power: constW(w), counter: linearJ(5e5, w), edit: func(k int, s *gpu.Sample) bool {
		if f := garbled[k]; f != nil {
			f(s)
		}
		return true
	}}.samples()
	m := feed(Options{}, ss)
	c1, ok1 := m.At(at(1))
	c9, ok9 := m.At(at(9))
	if !ok1 || !ok9 {
		t.Fatal("curves do not cover 1..9 s")
	}
	checkCum(t, "energy over the garbled readings", c9.Sub(c1), true, both(8*w, 8*w, 0), true)
	if st := m.Stats(); st.Implausible != 3 || st.CounterResets != 0 || st.Invalid != 0 {
		t.Errorf("stats %+v, want 3 implausible readings and no reset", st)
	}
}

// The counter advances in steps, so reads close together may see a whole
// step in a millisecond: 1 kW × 100 ms in 1 ms is 100 kW for that interval,
// and must still count.
func TestCounterStepBetweenCloseReadsCounts(t *testing.T) {
	m := NewMeter(Options{})
	obs := func(s float64, j float64) {
		m.Observe(gpu.Sample{ReadAt: at(s), PowerW: 1000, PowerAt: at(s), PowerOK: true, EnergyJ: j, EnergyAt: at(s), EnergyOK: true})
	}
	obs(0, 1000)
	obs(0.099, 1000)
	obs(0.100, 1100) // 100 J in 1 ms
	obs(0.150, 1100)
	obs(0.200, 1200)
	c0, _ := m.At(at(0))
	c, ok := m.At(at(0.2))
	if !ok || !near(c.Sub(c0).CounterJ, 200) {
		t.Errorf("counter energy %v (ok %v), want 200 J", c.Sub(c0).CounterJ, ok)
	}
	if st := m.Stats(); st.Implausible != 0 {
		t.Errorf("stats %+v, want no implausible reading", st)
	}
}
