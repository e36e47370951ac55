package simgpu

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// run reads b at t0, t0+step, ... n times and returns every read.
func run(t *testing.T, b *Backend, step time.Duration, n int) [][]gpu.Sample {
	t.Helper()
	out := make([][]gpu.Sample, n)
	for k := range n {
		dst := make([]gpu.Sample, len(b.Devices()))
		if err := b.Read(t0.Add(time.Duration(k)*step), dst); err != nil {
			t.Fatal(err)
		}
		out[k] = dst
	}
	return out
}

func TestDevices(t *testing.T) {
	b := New(3, 1)
	devs := b.Devices()
	if len(devs) != 3 {
		t.Fatalf("len = %d", len(devs))
	}
	d := devs[2]
	if d.Index != 2 || d.UUID != "GPU-5a1d0000-0000-4000-8000-000000000002" || d.Name != Name ||
		d.MemTotalMiB != 81559 || d.PowerLimitW != 700 || !d.HasEnergyCounter || !d.HasInstantPower {
		t.Fatalf("device = %+v", d)
	}
	// Simulated GPUs run no processes: the simulator lists none, so the
	// agent attributes runs on it to every GPU.
	if _, ok := any(b).(gpu.ProcessLister); ok {
		t.Fatal("the simulator is a gpu.ProcessLister")
	}
	if err := b.Read(t0, make([]gpu.Sample, 2)); err == nil {
		t.Fatal("Read with short dst: want error")
	}
}

func TestDeterministic(t *testing.T) {
	drive := func(seed int64) [][]gpu.Sample {
		b := New(2, seed)
		var out [][]gpu.Sample
		for k := range 200 {
			switch k {
			case 20:
				b.SetLoad(0, 1)
			case 60:
				b.SetLoad(1, 0.5)
			case 150:
				b.SetLoad(0, 0)
			}
			dst := make([]gpu.Sample, 2)
			// irregular but reproducible tick times
			now := t0.Add(time.Duration(k)*50*time.Millisecond + time.Duration(k%7)*time.Millisecond)
			if err := b.Read(now, dst); err != nil {
				t.Fatal(err)
			}
			out = append(out, dst)
		}
		return out
	}
	a, b := drive(42), drive(42)
	for k := range a {
		for i := range a[k] {
			if a[k][i] != b[k][i] {
				t.Fatalf("read %d gpu %d differs:\n%+v\n%+v", k, i, a[k][i], b[k][i])
			}
		}
	}
	c := drive(43)
	same := true
	for k := range a {
		if a[k][0].PowerW != c[k][0].PowerW {
			same = false
		}
	}
	if same {
		t.Fatal("different seeds gave identical power")
	}
}

func TestIdle(t *testing.T) {
	for seed := range int64(20) {
		b := New(4, seed)
		for i := range 4 {
			if w := b.IdlePowerW(i); w < 60 || w > 80 {
				t.Fatalf("seed %d gpu %d idle %v W", seed, i, w)
			}
		}
		for _, s := range run(t, b, 50*time.Millisecond, 100) {
			for _, g := range s {
				if g.PowerW < 60*0.985 || g.PowerW > 80*1.015 {
					t.Fatalf("idle power %v W", g.PowerW)
				}
				if g.UtilPct != 0 || !g.UtilOK {
					t.Fatalf("idle util %v", g.UtilPct)
				}
				if math.Abs(g.MemUsedMiB-IdleMemMiB) > 5 {
					t.Fatalf("idle mem %v", g.MemUsedMiB)
				}
				if !g.PowerOK || !g.EnergyOK || !g.MemOK || g.Err != nil || g.MemTotalMiB != MemTotalMiB {
					t.Fatalf("flags %+v", g)
				}
			}
		}
	}
}

func TestBusy(t *testing.T) {
	b := New(1, 7)
	b.SetLoad(0, 1)
	b.SetLoad(5, 1)                                // out of range: ignored
	b.SetLoad(0, 1e9)                              // clamped
	samples := run(t, b, 50*time.Millisecond, 200) // 10 s
	// lag: after the first tick the power is still near idle
	if p := samples[1][0].PowerW; p > 300 {
		t.Fatalf("power after 50 ms = %v, want lagged", p)
	}
	// after 6 tau it is near 0.93*700 = 651 W
	want := BusyFraction * PowerLimitW
	for _, s := range samples[40:] {
		g := s[0]
		if math.Abs(g.PowerW-want)/want > 0.02 || g.PowerW > PowerLimitW {
			t.Fatalf("busy power %v W, want ~%v", g.PowerW, want)
		}
		if g.UtilPct < 97 || g.UtilPct > 100 {
			t.Fatalf("busy util %v", g.UtilPct)
		}
	}
	last := samples[len(samples)-1][0]
	if f := last.MemUsedMiB / MemTotalMiB; f < 0.59 || f > 0.71 {
		t.Fatalf("busy mem %v MiB (%.2f of total)", last.MemUsedMiB, f)
	}
	// and back down
	b.SetLoad(0, 0)
	dst := make([]gpu.Sample, 1)
	for k := range 60 {
		if err := b.Read(t0.Add(10*time.Second+time.Duration(k)*50*time.Millisecond), dst); err != nil {
			t.Fatal(err)
		}
	}
	if dst[0].PowerW > 82 || dst[0].UtilPct != 0 {
		t.Fatalf("after unload power %v util %v", dst[0].PowerW, dst[0].UtilPct)
	}
}

// TestCounterMatchesPower checks that the counter is the integral of the
// power the sim reports, and that it only moves every 100 ms.
func TestCounterMatchesPower(t *testing.T) {
	for _, step := range []time.Duration{50 * time.Millisecond, 37 * time.Millisecond, 230 * time.Millisecond} {
		b := New(1, 3)
		var samples []gpu.Sample
		for k := range int(20 * time.Second / step) {
			switch k {
			case 5:
				b.SetLoad(0, 1)
			case 60:
				b.SetLoad(0, 0.3)
			}
			dst := make([]gpu.Sample, 1)
			if err := b.Read(t0.Add(time.Duration(k)*step), dst); err != nil {
				t.Fatal(err)
			}
			samples = append(samples, dst[0])
		}
		// trapezoid of the reported power up to the last counter timestamp
		first, last := samples[0], samples[len(samples)-1]
		integ := 0.0
		for k := 1; k < len(samples); k++ {
			a, c := samples[k-1], samples[k]
			if !c.PowerAt.After(last.EnergyAt) {
				integ += (a.PowerW + c.PowerW) / 2 * c.PowerAt.Sub(a.PowerAt).Seconds()
				continue
			}
			// partial interval up to EnergyAt, power linear in between
			x := last.EnergyAt.Sub(a.PowerAt).Seconds()
			pe := a.PowerW + (c.PowerW-a.PowerW)*x/c.PowerAt.Sub(a.PowerAt).Seconds()
			integ += (a.PowerW + pe) / 2 * x
			break
		}
		got := last.EnergyJ - first.EnergyJ
		if math.Abs(got-integ)/integ > 0.005 {
			t.Fatalf("step %v: counter %v J, integral %v J", step, got, integ)
		}
		if step == 50*time.Millisecond && math.Abs(got-integ) > 1e-6 {
			t.Fatalf("step %v: counter %v J, integral %v J: want exact on the grid", step, got, integ)
		}

		// timestamps: on the 100 ms grid, monotone, repeated when stale
		stale := 0
		for k := 1; k < len(samples); k++ {
			a, c := samples[k-1], samples[k]
			if c.EnergyAt.Sub(t0)%CounterPeriod != 0 {
				t.Fatalf("step %v: EnergyAt %v off the 100 ms grid", step, c.EnergyAt.Sub(t0))
			}
			switch {
			case c.EnergyAt.Equal(a.EnergyAt):
				stale++
				if c.EnergyJ != a.EnergyJ {
					t.Fatalf("step %v: stale timestamp with new value", step)
				}
			case c.EnergyAt.Before(a.EnergyAt):
				t.Fatalf("step %v: EnergyAt went back", step)
			default:
				if c.EnergyAt.Sub(a.EnergyAt) < CounterPeriod || c.EnergyJ <= a.EnergyJ {
					t.Fatalf("step %v: counter moved by %v in %v", step, c.EnergyJ-a.EnergyJ, c.EnergyAt.Sub(a.EnergyAt))
				}
			}
			if !c.PowerAt.Equal(c.ReadAt) {
				t.Fatalf("PowerAt %v != ReadAt %v", c.PowerAt, c.ReadAt)
			}
		}
		if step == 50*time.Millisecond && stale != len(samples)/2 {
			t.Fatalf("50 ms polling: %d stale of %d, want every other", stale, len(samples)-1)
		}
		if step == 230*time.Millisecond && stale != 0 {
			t.Fatalf("230 ms polling: %d stale", stale)
		}
	}
}

func TestBackwardsClock(t *testing.T) {
	b := New(1, 1)
	dst := make([]gpu.Sample, 1)
	_ = b.Read(t0.Add(time.Second), dst)
	e := dst[0].EnergyJ
	_ = b.Read(t0, dst)
	if dst[0].EnergyJ != e || dst[0].ReadAt != t0 {
		t.Fatalf("backwards read: %+v", dst[0])
	}
}

func TestConcurrentSetLoad(t *testing.T) {
	b := New(2, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := range 1000 {
			b.SetLoad(k%2, float64(k%10)/10)
		}
	}()
	dst := make([]gpu.Sample, 2)
	for k := range 1000 {
		if err := b.Read(t0.Add(time.Duration(k)*time.Millisecond), dst); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
}

// A restarted agent builds a new backend; its counter goes on from the
// value the previous one read (as a real GPU's counter keeps counting
// while no agent runs), at idle power over the downtime (nothing drove the
// simulated load meanwhile), so the agent can bridge the downtime.
func TestCounterKeepsCountingAcrossAgentRestart(t *testing.T) {
	first := New(2, 7)
	first.SetLoad(0, 1)
	reads := run(t, first, 50*time.Millisecond, 41) // 2 s busy on GPU 0
	last := reads[len(reads)-1]

	second := New(2, 7)
	var _ gpu.CounterResumer = second
	for i, s := range last {
		second.ResumeCounter(i, s.EnergyJ, s.EnergyAt)
	}
	down := 5 * time.Second
	at := last[0].EnergyAt.Add(down)
	dst := make([]gpu.Sample, 2)
	if err := second.Read(at, dst); err != nil {
		t.Fatal(err)
	}
	for i := range dst {
		want := last[i].EnergyJ + second.IdlePowerW(i)*down.Seconds()
		if dst[i].EnergyJ < last[i].EnergyJ || math.Abs(dst[i].EnergyJ-want) > 1e-6 {
			t.Errorf("GPU %d: counter after the restart %v J, before %v J: want %v J (idle power over the %v down)",
				i, dst[i].EnergyJ, last[i].EnergyJ, want, down)
		}
	}
}

// IdlePowerW returns the (noise-free) idle power of GPU index.
func (b *Backend) IdlePowerW(index int) float64 {
	return b.st[index].idleW
}
