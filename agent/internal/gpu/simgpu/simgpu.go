// Package simgpu provides deterministic synthetic GPUs for the demo, tests and
// benchmarks. Their power follows the load set with SetLoad through a
// first-order lag, with seeded noise, and they expose a cumulative energy
// counter the way NVML does: it integrates exactly the power the sim reports,
// but its value and timestamp only move every 100 ms.
//
// Everything is computed from the `now` values passed to Read, never from the
// wall clock, so two backends with the same seed, the same SetLoad calls and
// the same sequence of nows produce identical samples.
package simgpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// Parameters of the simulated board.
const (
	Name        = "Simulated H100 80GB HBM3"
	MemTotalMiB = 81559
	PowerLimitW = 700.0

	BusyFraction  = 0.93                   // share of the power limit a fully busy GPU draws
	IdleMemMiB    = 450.0                  // memory used by an idle GPU (driver, context)
	PowerTau      = 300 * time.Millisecond // time constant of the power lag
	MemTau        = 1 * time.Second        // time constant of the memory lag
	CounterPeriod = 100 * time.Millisecond // how often the energy counter (and its timestamp) moves

	powerNoise = 0.015 // ±1.5 %
	utilNoise  = 2.0   // ± percentage points
	memNoise   = 0.002 // ±0.2 %
)

// Backend is a set of simulated GPUs. It implements gpu.Backend,
// gpu.LoadSetter, gpu.CounterResumer (not gpu.ProcessLister: its GPUs run
// no processes). It is safe for concurrent use.
type Backend struct {
	mu   sync.Mutex
	devs []gpu.Device
	st   []simState
}

type simState struct {
	rng *rand.Rand

	idleW      float64 // idle power of this board
	memBusyMiB float64 // memory used when fully busy

	load float64 // set by SetLoad, 0..1

	started bool
	last    time.Time // now of the previous Read
	lagW    float64   // lagged (noise-free) power
	lagMem  float64   // lagged (noise-free) memory used
	powerW  float64   // last reported power
	integJ  float64   // trapezoid integral of the reported power up to last

	// The exposed counter: value and timestamp, updated on a 100 ms grid
	// anchored at the first Read.
	t0        time.Time
	counterK  int64 // grid index of the exposed value
	counterJ  float64
	counterAt time.Time

	// resumeAt is when integJ was read by a previous backend
	// (ResumeCounter); zero when not resumed.
	resumeAt time.Time
}

// counterBaseJ is where the simulated counters start: like a real driver that
// has been up for a while, the counter is not zero at the first read.
const counterBaseJ = 1.0e6

// New returns n simulated GPUs (n >= 1) whose per-board constants and noise
// derive from seed.
func New(n int, seed int64) *Backend {
	n = max(n, 1)
	b := &Backend{devs: make([]gpu.Device, n), st: make([]simState, n)}
	boards := rand.New(rand.NewPCG(uint64(seed), 0x5a1d))
	for i := range n {
		b.devs[i] = gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-5a1d0000-0000-4000-8000-%012d", i), Name: Name,
			MemTotalMiB: MemTotalMiB, PowerLimitW: PowerLimitW, HasEnergyCounter: true, HasInstantPower: true}
		idle := 60 + 20*boards.Float64()
		memFrac := 0.60 + 0.10*boards.Float64()
		b.st[i] = simState{rng: rand.New(rand.NewPCG(uint64(seed), uint64(i)+1)), idleW: idle, memBusyMiB: memFrac * MemTotalMiB,
			lagW: idle, lagMem: IdleMemMiB, integJ: counterBaseJ + 1000*float64(i)}
	}
	return b
}

// Devices implements gpu.Backend.
func (b *Backend) Devices() []gpu.Device { return slices.Clone(b.devs) }

// SetLoad implements gpu.LoadSetter. load is clamped to 0..1; an index out of
// range is ignored.
func (b *Backend) SetLoad(index int, load float64) {
	if math.IsNaN(load) {
		load = 0
	}
	load = min(max(load, 0), 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if index < 0 || index >= len(b.st) {
		return
	}
	b.st[index].load = load
}

// ResumeCounter implements gpu.CounterResumer. Between at and the first
// Read the board is counted at its idle power: no agent drove its load
// meanwhile. Once read, a backend's counter is not moved.
func (b *Backend) ResumeCounter(index int, counterJ float64, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if index < 0 || index >= len(b.st) || b.st[index].started || math.IsNaN(counterJ) || math.IsInf(counterJ, 0) || counterJ < 0 {
		return
	}
	b.st[index].integJ, b.st[index].resumeAt = counterJ, at
}

// Close implements gpu.Backend.
func (b *Backend) Close() error { return nil }

// Read implements gpu.Backend. A now earlier than the previous Read's is
// treated as no time passing.
func (b *Backend) Read(now time.Time, dst []gpu.Sample) error {
	if len(dst) != len(b.devs) {
		return fmt.Errorf("simgpu: Read: len(dst) = %d, want %d", len(dst), len(b.devs))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.st {
		dst[i] = b.st[i].step(i, now)
	}
	return nil
}

func (s *simState) step(index int, readAt time.Time) gpu.Sample {
	now := readAt
	var dt time.Duration
	if s.started {
		if now.Before(s.last) {
			now = s.last // the sim's clock never runs backwards
		}
		dt = now.Sub(s.last)
	}

	target := s.idleW + s.load*(BusyFraction*PowerLimitW-s.idleW)
	s.lagW = target + (s.lagW-target)*decay(dt, PowerTau)
	memTarget := IdleMemMiB + s.load*(s.memBusyMiB-IdleMemMiB)
	s.lagMem = memTarget + (s.lagMem-memTarget)*decay(dt, MemTau)

	// Noise is drawn in a fixed order on every Read, so the stream depends
	// only on the number of Reads.
	nP := s.rng.Float64()*2 - 1
	nU := s.rng.Float64()*2 - 1
	nM := s.rng.Float64()*2 - 1

	p := min(max(s.lagW*(1+powerNoise*nP), 0), PowerLimitW)
	mem := min(max(s.lagMem*(1+memNoise*nM), 0), MemTotalMiB)
	util := 0.0
	if s.load > 0 {
		util = min(max(s.load*100+utilNoise*nU, 0), 100)
	}

	if !s.started {
		if !s.resumeAt.IsZero() && now.After(s.resumeAt) {
			s.integJ += s.idleW * now.Sub(s.resumeAt).Seconds()
		}
		s.started, s.t0 = true, now
		s.counterK, s.counterJ, s.counterAt = 0, s.integJ, now
	} else {
		prevJ, prevP, prevT := s.integJ, s.powerW, s.last
		s.integJ += (prevP + p) / 2 * dt.Seconds()
		// Move the exposed counter to the latest grid point <= now, with
		// the integral at that point (power is linear between reads, so the
		// trapezoid integral there is exact for the piecewise-linear curve).
		if k := int64(now.Sub(s.t0) / CounterPeriod); k > s.counterK {
			g := s.t0.Add(time.Duration(k) * CounterPeriod)
			a := g.Sub(prevT).Seconds()
			pg := prevP
			if dt > 0 {
				pg = prevP + (p-prevP)*a/dt.Seconds()
			}
			s.counterK, s.counterJ, s.counterAt = k, prevJ+(prevP+pg)/2*a, g
		}
	}
	s.last, s.powerW = now, p

	return gpu.Sample{Index: index, ReadAt: readAt,
		PowerW: p, PowerAt: now, PowerOK: true,
		EnergyJ: s.counterJ, EnergyAt: s.counterAt, EnergyOK: true,
		MemUsedMiB: mem, MemTotalMiB: MemTotalMiB, MemOK: true,
		UtilPct: util, UtilOK: true}
}

// decay is exp(-dt/tau), the share of the gap to the target left after dt.
func decay(dt, tau time.Duration) float64 {
	if dt <= 0 {
		return 1
	}
	return math.Exp(-dt.Seconds() / tau.Seconds())
}

var (
	_ gpu.Backend    = (*Backend)(nil)
	_ gpu.LoadSetter = (*Backend)(nil)

	_ gpu.CounterResumer = (*Backend)(nil)
)
