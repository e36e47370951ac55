package energy

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// at converts seconds after t0 to a time, rounding to the nanosecond so that
// test times like 1.234 land exactly where they read.
func at(s float64) time.Time { return t0.Add(time.Duration(math.Round(s * 1e9))) }

const (
	tick    = 50 * time.Millisecond  // the agent's poll period
	ctrTick = 100 * time.Millisecond // how often the counter updates
)

// trace describes synthetic readings of one GPU. Power is read every tick with
// the read time as its driver timestamp; the counter, if any, updates every
// ctrTick, so every other tick repeats the previous value and timestamp, as
// NVML does.
type trace struct {
	dur     time.Duration
	start   time.Duration                   // first tick
	power   func(d time.Duration) float64   // W at d after t0; nil: no power
	counter func(d time.Duration) float64   // raw J at d after t0; nil: no counter
	edit    func(k int, s *gpu.Sample) bool // optional: change a sample; false drops it
}

func (tr trace) samples() []gpu.Sample {
	var out []gpu.Sample
	for k := 0; tr.start+time.Duration(k)*tick <= tr.dur; k++ {
		d := tr.start + time.Duration(k)*tick
		s := gpu.Sample{ReadAt: t0.Add(d)}
		if tr.power != nil {
			s.PowerW, s.PowerAt, s.PowerOK = tr.power(d), t0.Add(d), true
		}
		if tr.counter != nil {
			de := d / ctrTick * ctrTick
			s.EnergyJ, s.EnergyAt, s.EnergyOK = tr.counter(de), t0.Add(de), true
		}
		if tr.edit != nil && !tr.edit(k, &s) {
			continue
		}
		out = append(out, s)
	}
	return out
}

func sec(d time.Duration) float64 { return float64(d) / 1e9 }

func constW(w float64) func(time.Duration) float64 {
	return func(time.Duration) float64 { return w }
}

// linearJ is the raw counter of a GPU drawing w watts, starting at off J.
func linearJ(off, w float64) func(time.Duration) float64 {
	return func(d time.Duration) float64 { return off + w*sec(d) }
}

// Ramp: P(t) = 100 + 20t W, so E(t) = 100t + 10t² J.
func rampW(d time.Duration) float64 { s := sec(d); return 100 + 20*s }
func rampE(s float64) float64       { return 100*s + 10*s*s }

// rampChord is what the counter curve says for the ramp at s: the counter is
// exact at its 100 ms points and linear between them, so between points it
// reads the chord of E, not E.
func rampChord(s float64) float64 {
	a := math.Floor(s*10+1e-9) / 10
	b := a + 0.1
	return rampE(a) + (rampE(b)-rampE(a))*(s-a)/0.1
}

// Square wave: 100 W for 0.5 s, 300 W for 0.5 s, starting low.
func squareW(d time.Duration) float64 {
	if (d/(500*time.Millisecond))%2 == 0 {
		return 100
	}
	return 300
}

// squareE is the exact energy of the square wave up to d: each full second
// holds 200 J.
func squareE(d time.Duration) float64 {
	full := d / time.Second
	rem := sec(d - full*time.Second)
	e := 200 * float64(full)
	if rem <= 0.5 {
		return e + 100*rem
	}
	return e + 50 + 300*(rem-0.5)
}

func near(got, want float64) bool {
	return math.Abs(got-want) <= 1e-9*math.Max(1, math.Abs(want))
}

func checkCum(t *testing.T, label string, got Cumulative, gotOK bool, want Cumulative, wantOK bool) {
	t.Helper()
	if gotOK != wantOK ||
		got.CounterOK != want.CounterOK || got.IntegratedOK != want.IntegratedOK || got.Estimated != want.Estimated ||
		!near(got.CounterJ, want.CounterJ) || !near(got.IntegratedJ, want.IntegratedJ) || !near(got.GapS, want.GapS) {
		t.Errorf("%s:\n got  %+v ok=%v\n want %+v ok=%v", label, got, gotOK, want, wantOK)
	}
}

func feed(opt Options, ss []gpu.Sample) *Meter {
	m := NewMeter(opt)
	for _, s := range ss {
		m.Observe(s)
	}
	return m
}

type query struct {
	s    float64 // seconds after t0
	want Cumulative
	ok   bool
}

// both is a query answer where both curves cover t.
func both(counterJ, integratedJ, gapS float64) Cumulative {
	return Cumulative{CounterJ: counterJ, CounterOK: true, IntegratedJ: integratedJ, IntegratedOK: true, GapS: gapS}
}

// dup repeats every sample 25 ms later in read time with the same driver
// timestamps, as NVML does when polled faster than it updates.
func dup(ss []gpu.Sample) []gpu.Sample {
	var out []gpu.Sample
	for _, s := range ss {
		r := s
		r.ReadAt = s.ReadAt.Add(25 * time.Millisecond)
		out = append(out, s, r)
	}
	return out
}

var errRead = errors.New("nvml: GPU is lost")

// resetAt5 is the raw counter of a 300 W GPU whose driver reloaded at 5 s,
// with 12 J counted by the time of the first reading after the reload.
func resetAt5(d time.Duration) float64 {
	if d < 5*time.Second {
		return 1e6 + 300*sec(d)
	}
	return 12 + 300*sec(d-5*time.Second)
}

func TestMeter(t *testing.T) {
	tenS := 10 * time.Second
	constant := trace{dur: tenS, power: constW(300), counter: linearJ(1e6, 300)}.samples()

	cases := []struct {
		name    string
		opt     Options
		samples []gpu.Sample
		queries []query
		stats   Stats
	}{
		{
			// 201 power points 50 ms apart: 200 intervals of 300 W × 0.05 s.
			// The counter has 101 distinct points; the other 100 reads repeat.
			name:    "constant 300 W",
			samples: constant,
			queries: []query{
				{s: 0, want: both(0, 0, 0), ok: true},
				{s: 1.234, want: both(370.2, 370.2, 0), ok: true},
				{s: 5, want: both(1500, 1500, 0), ok: true},
				{s: 9.999, want: both(2999.7, 2999.7, 0), ok: true},
				{s: 10, want: both(3000, 3000, 0), ok: true},
			},
			stats: Stats{PowerPoints: 201, CounterPoints: 101, StaleCounter: 100},
		},
		{
			// Each figure is reported on its own; nothing reconciles them.
			name:    "counter says 400 W, power says 300 W",
			samples: trace{dur: tenS, power: constW(300), counter: linearJ(5e5, 400)}.samples(),
			queries: []query{
				{s: 2.5, want: both(1000, 750, 0), ok: true},
				{s: 10, want: both(4000, 3000, 0), ok: true},
			},
			stats: Stats{PowerPoints: 201, CounterPoints: 101, StaleCounter: 100},
		},
		{
			// Linear power: the trapezoid, and the interpolation between
			// points, are exact, so IntegratedJ = E(t) at any t. The counter
			// is exact at its points and a chord of E between them.
			name:    "linear ramp",
			samples: trace{dur: tenS, power: rampW, counter: func(d time.Duration) float64 { return 7e5 + rampE(sec(d)) }}.samples(),
			queries: []query{
				{s: 1.234, want: both(rampChord(1.234), rampE(1.234), 0), ok: true},
				{s: 2, want: both(rampE(2), rampE(2), 0), ok: true},
				{s: 7.777, want: both(rampChord(7.777), rampE(7.777), 0), ok: true},
				{s: 10, want: both(2000, 2000, 0), ok: true}, // 100·10 + 10·10²
			},
			stats: Stats{PowerPoints: 201, CounterPoints: 101, StaleCounter: 100},
		},
		{
			// Samples P_k at k·50 ms: 100 W for k in [0,10), 300 W for
			// [10,20), ... The trapezoid treats power as linear between
			// samples, so of every 10 intervals 9 lie on one level
			// (P·0.05 J each) and 1 straddles a switch ((100+300)/2·0.05 =
			// 10 J). Over 10 s: 10 low blocks · 9·5 J + 10 high blocks ·
			// 9·15 J + 20 switches · 10 J = 450 + 1350 + 200 = 2000 J.
			// Up to 0.5 s: 9·5 + 10 = 55 J, where the true wave has 50 J
			// (the counter's figure): the sampled ramp adds 5 J per rise.
			// At 0.475 s, halfway up the first rise, P = 200 W, so
			// I = 45 + (100+200)/2·0.025 = 48.75 J.
			name:    "square wave",
			samples: trace{dur: tenS, power: squareW, counter: squareE}.samples(),
			queries: []query{
				{s: 0.475, want: both(47.5, 48.75, 0), ok: true},
				{s: 0.5, want: both(50, 55, 0), ok: true},
				{s: 1, want: both(200, 200, 0), ok: true},
				{s: 10, want: both(2000, 2000, 0), ok: true},
			},
			stats: Stats{PowerPoints: 201, CounterPoints: 101, StaleCounter: 100},
		},
		{
			// No samples at all in (3 s, 5 s). Power is not integrated over
			// the hole but the counter still spans it.
			name: "2 s gap",
			samples: trace{dur: tenS, power: constW(300), counter: linearJ(1e6, 300), edit: func(k int, s *gpu.Sample) bool {
				return k <= 60 || k >= 100
			}}.samples(),
			queries: []query{
				{s: 3, want: both(900, 900, 0), ok: true},
				{s: 4, want: both(1200, 900, 1), ok: true},
				{s: 5, want: both(1500, 900, 2), ok: true},
				{s: 10, want: both(3000, 2400, 2), ok: true},
			},
			stats: Stats{PowerPoints: 162, CounterPoints: 82, StaleCounter: 80, Gaps: 1, GapS: 2},
		},
		{
			// Power missing at 1.05–1.2 s: a 250 ms interval (= MaxGap) is
			// still integrated. Power missing at 3.05–3.25 s: 300 ms is a gap.
			name: "gap boundary at MaxGap",
			samples: trace{dur: 5 * time.Second, power: constW(300), counter: linearJ(0, 300), edit: func(k int, s *gpu.Sample) bool {
				if (k > 20 && k < 25) || (k > 60 && k < 66) {
					s.PowerOK = false
				}
				return true
			}}.samples(),
			queries: []query{
				{s: 1.25, want: both(375, 375, 0), ok: true},
				{s: 3.15, want: both(945, 900, 0.15), ok: true},
				{s: 5, want: both(1500, 1410, 0.3), ok: true},
			},
			stats: Stats{PowerPoints: 101 - 9, CounterPoints: 51, StaleCounter: 50, Gaps: 1, GapS: 0.3},
		},
		{
			// The driver reloads just before 5.0 s: the raw counter drops from
			// 1e6+1470 J to 12 J and counts on from there. Power covers
			// [4.9 s, 5.0 s], so that interval's 30 J comes from it and the
			// corrected curve runs on at 300 W as if nothing happened.
			name: "counter reset, bridged by power",
			samples: trace{dur: tenS, power: constW(300), counter: func(d time.Duration) float64 {
				if d < 5*time.Second {
					return 1e6 + 300*sec(d)
				}
				return 12 + 300*sec(d-5*time.Second)
			}}.samples(),
			queries: []query{
				{s: 4.95, want: both(1485, 1485, 0), ok: true},
				{s: 5, want: both(1500, 1500, 0), ok: true},
				{s: 10, want: both(3000, 3000, 0), ok: true},
			},
			stats: Stats{PowerPoints: 201, CounterPoints: 101, StaleCounter: 100, CounterResets: 1},
		},
		{
			// As above, but power is missing from 4.95 s to 5.45 s, so the
			// power curve has a 0.6 s gap (4.9 → 5.5) across the reset. The
			// interval's energy is then the new raw value, 12 J: K(5.0) =
			// 1470 + 12 = 1482 J, and K(10) = 1482 + 300·5 = 2982 J.
			name: "counter reset inside a power gap",
			samples: trace{dur: tenS, power: constW(300), counter: func(d time.Duration) float64 {
				if d < 5*time.Second {
					return 1e6 + 300*sec(d)
				}
				return 12 + 300*sec(d-5*time.Second)
			}, edit: func(k int, s *gpu.Sample) bool {
				if k > 98 && k < 110 {
					s.PowerOK = false
				}
				return true
			}}.samples(),
			queries: []query{
				{s: 5, want: both(1482, 1470, 0.1), ok: true},
				{s: 10, want: both(2982, 2820, 0.6), ok: true},
			},
			stats: Stats{PowerPoints: 190, CounterPoints: 101, StaleCounter: 100, CounterResets: 1, Gaps: 1, GapS: 0.6},
		},
		{
			// The counter could not be read from 4.95 s to 5.95 s and the
			// driver reloaded at 5.0 s; power covers the whole counter
			// interval [4.9 s, 6.0 s] without a gap, so its 330 J bridge it.
			name: "counter reset while the counter was unreadable",
			samples: trace{dur: tenS, power: constW(300), counter: resetAt5, edit: func(k int, s *gpu.Sample) bool {
				if k > 98 && k < 120 {
					s.EnergyOK = false
				}
				return true
			}}.samples(),
			queries: []query{
				{s: 5.5, want: both(1650, 1650, 0), ok: true},
				{s: 6, want: both(1800, 1800, 0), ok: true},
				{s: 10, want: both(3000, 3000, 0), ok: true},
			},
			stats: Stats{PowerPoints: 201, CounterPoints: 91, StaleCounter: 89, CounterResets: 1},
		},
		{
			// As above, but power also has a 0.6 s gap (4.9 → 5.5 s) inside
			// the counter interval: power no longer covers it, so the
			// interval's energy is the new raw value, 312 J (12 J + 300 W ·
			// 1 s): K(6) = 1470 + 312 = 1782 J, K(10) = 1782 + 1200 J.
			name: "counter reset across a power gap that power has passed",
			samples: trace{dur: tenS, power: constW(300), counter: resetAt5, edit: func(k int, s *gpu.Sample) bool {
				if k > 98 && k < 120 {
					s.EnergyOK = false
				}
				if k > 98 && k < 110 {
					s.PowerOK = false
				}
				return true
			}}.samples(),
			queries: []query{
				{s: 6, want: both(1782, 1620, 0.6), ok: true}, // power: 300 W · (6 − 0.6) s
				{s: 10, want: both(2982, 2820, 0.6), ok: true},
			},
			stats: Stats{PowerPoints: 190, CounterPoints: 91, StaleCounter: 89, CounterResets: 1, Gaps: 1, GapS: 0.6},
		},
		{
			// Every reading arrives twice with the same driver timestamps:
			// the repeats are counted stale and change nothing.
			name:    "stale repeated samples",
			samples: dup(constant),
			queries: []query{
				{s: 1.234, want: both(370.2, 370.2, 0), ok: true},
				{s: 10, want: both(3000, 3000, 0), ok: true},
			},
			stats: Stats{PowerPoints: 201, CounterPoints: 101, StalePower: 201, StaleCounter: 100 + 201},
		},
		{
			// At 2.0 s power could not be read but the counter could (Err
			// set); at 2.05 s Err is set but both readings are valid. The
			// ramp is linear, so skipping a point loses nothing.
			name: "power missing for a tick, counter present",
			samples: trace{dur: tenS, power: rampW, counter: func(d time.Duration) float64 { return rampE(sec(d)) }, edit: func(k int, s *gpu.Sample) bool {
				switch k {
				case 40:
					s.PowerOK, s.PowerW, s.Err = false, 0, errRead
				case 41:
					s.Err = errRead
				}
				return true
			}}.samples(),
			queries: []query{
				{s: 2, want: both(rampE(2), rampE(2), 0), ok: true},
				{s: 2.02, want: both(rampChord(2.02), rampE(2.02), 0), ok: true},
				{s: 10, want: both(2000, 2000, 0), ok: true},
			},
			stats: Stats{PowerPoints: 200, CounterPoints: 101, StaleCounter: 100},
		},
		{
			// Readings from 1 s to 3.05 s at 300 W. The counter's newest
			// point is 3.0 s (it repeats at 3.05 s), so it lags power.
			name:    "before the first point and after the last",
			samples: trace{start: time.Second, dur: 3050 * time.Millisecond, power: constW(300), counter: linearJ(0, 300)}.samples(),
			queries: []query{
				{s: 0.5, want: Cumulative{Estimated: true}, ok: true},
				{s: 1, want: both(0, 0, 0), ok: true},
				{s: 3, want: both(600, 600, 0), ok: true},
				// Power covers 3.05 s, the counter does not yet.
				{s: 3.05, want: Cumulative{CounterJ: 615, IntegratedJ: 615, IntegratedOK: true, Estimated: true}, ok: false},
				// 0.45 s past the newest power point (more than MaxGap):
				// a gap, as it will be if the next point comes that late,
				// not 300 W invented for it.
				{s: 3.5, want: Cumulative{CounterJ: 750, IntegratedJ: 615, GapS: 0.45, Estimated: true}, ok: false},
			},
			stats: Stats{PowerPoints: 42, CounterPoints: 21, StaleCounter: 21},
		},
		{
			// No counter (pre-Volta): ok depends on power alone.
			name:    "power only",
			samples: trace{dur: 2 * time.Second, power: constW(250)}.samples(),
			queries: []query{
				{s: 1.5, want: Cumulative{IntegratedJ: 375, IntegratedOK: true}, ok: true},
				{s: 2.5, want: Cumulative{IntegratedJ: 500, GapS: 0.5, Estimated: true}, ok: false},
			},
			stats: Stats{PowerPoints: 41},
		},
		{
			// No power readings at all: the counter alone decides ok, and
			// extrapolates with its own last slope.
			name:    "counter only",
			samples: trace{dur: 2 * time.Second, counter: linearJ(100, 250)}.samples(),
			queries: []query{
				{s: 1.55, want: Cumulative{CounterJ: 387.5, CounterOK: true}, ok: true},
				{s: 2.5, want: Cumulative{CounterJ: 625, Estimated: true}, ok: false},
			},
			stats: Stats{CounterPoints: 21, StaleCounter: 20},
		},
		{
			// The agent's read times jitter by up to 20 ms, but the driver's
			// timestamps are on the grid; only the latter are used.
			name: "driver timestamps, not read times",
			samples: trace{dur: tenS, power: rampW, counter: func(d time.Duration) float64 { return rampE(sec(d)) }, edit: func(k int, s *gpu.Sample) bool {
				s.ReadAt = s.ReadAt.Add(time.Duration(k*7%20) * time.Millisecond)
				return true
			}}.samples(),
			queries: []query{
				{s: 3.21, want: both(rampChord(3.21), rampE(3.21), 0), ok: true},
				{s: 10, want: both(2000, 2000, 0), ok: true},
			},
			stats: Stats{PowerPoints: 201, CounterPoints: 101, StaleCounter: 100},
		},
		{
			// Zero driver timestamps fall back to the read time.
			name: "read time when the driver gives none",
			samples: trace{dur: tenS, power: constW(300), counter: linearJ(0, 300), edit: func(k int, s *gpu.Sample) bool {
				s.PowerAt = time.Time{}
				if k%2 == 1 {
					return false // keep only the ticks where the counter moved
				}
				s.EnergyAt = time.Time{}
				return true
			}}.samples(),
			queries: []query{
				{s: 4.321, want: both(1296.3, 1296.3, 0), ok: true},
				{s: 10, want: both(3000, 3000, 0), ok: true},
			},
			stats: Stats{PowerPoints: 101, CounterPoints: 101},
		},
		{
			// NaN and infinite readings are dropped and counted.
			name: "non-finite readings",
			samples: trace{dur: time.Second, power: constW(300), counter: linearJ(0, 300), edit: func(k int, s *gpu.Sample) bool {
				if k == 5 {
					s.PowerW = math.NaN()
				}
				if k == 6 {
					s.EnergyJ = math.Inf(1)
				}
				return true
			}}.samples(),
			queries: []query{
				{s: 1, want: both(300, 300, 0), ok: true},
			},
			// The counter's 0.3 s point is dropped at k=6 but its repeat at
			// k=7 is finite, so all 11 counter points still get in.
			stats: Stats{PowerPoints: 20, CounterPoints: 11, StaleCounter: 9, Invalid: 2},
		},
		{
			name:    "empty meter",
			queries: []query{{s: 1, want: Cumulative{Estimated: true}, ok: false}},
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := feed(tc.opt, tc.samples)
			for _, q := range tc.queries {
				c, ok := m.At(at(q.s))
				checkCum(t, "At("+time.Duration(math.Round(q.s*1e9)).String()+")", c, ok, q.want, q.ok)
			}
			got := m.Stats()
			wantGapS, gotGapS := tc.stats.GapS, got.GapS
			got.GapS, tc.stats.GapS = 0, 0
			if got != tc.stats || !near(gotGapS, wantGapS) {
				got.GapS, tc.stats.GapS = gotGapS, wantGapS
				t.Errorf("Stats:\n got  %+v\n want %+v", got, tc.stats)
			}
		})
	}
}

func TestStaleSamplesChangeNothing(t *testing.T) {
	ss := trace{dur: 10 * time.Second, power: squareW, counter: squareE}.samples()
	plain, doubled := feed(Options{}, ss), feed(Options{}, dup(ss))
	for s := 0.0; s <= 10.5; s += 0.0173 {
		a, aok := plain.At(at(s))
		b, bok := doubled.At(at(s))
		if a != b || aok != bok {
			t.Fatalf("At(%v): without repeats %+v %v, with %+v %v", s, a, aok, b, bok)
		}
	}
}

func TestLatestAndOldest(t *testing.T) {
	m := NewMeter(Options{})
	if !m.Latest().IsZero() || !m.Oldest().IsZero() {
		t.Fatalf("empty meter: Latest %v Oldest %v, want zero", m.Latest(), m.Oldest())
	}
	ss := trace{start: time.Second, dur: 3050 * time.Millisecond, power: constW(300), counter: linearJ(0, 300)}.samples()
	for _, s := range ss {
		m.Observe(s)
	}
	// The counter's newest point is 3.0 s, behind power's 3.05 s.
	if got, want := m.Latest(), at(3); !got.Equal(want) {
		t.Errorf("Latest = %v, want %v", got, want)
	}
	if got, want := m.Oldest(), at(1); !got.Equal(want) {
		t.Errorf("Oldest = %v, want %v", got, want)
	}
	if _, ok := m.At(m.Latest()); !ok {
		t.Errorf("At(Latest()) not ok")
	}

	p := feed(Options{}, trace{dur: time.Second, power: constW(1)}.samples())
	if got, want := p.Latest(), at(1); !got.Equal(want) {
		t.Errorf("power only: Latest = %v, want %v", got, want)
	}
	c := feed(Options{}, trace{dur: 1050 * time.Millisecond, counter: linearJ(0, 1)}.samples())
	if got, want := c.Latest(), at(1); !got.Equal(want) {
		t.Errorf("counter only: Latest = %v, want %v", got, want)
	}
}

// Window energy At(b) − At(a) at arbitrary a, b must equal the analytic
// energy: exactly for integrated ramp power, and for a constant-power counter.
func TestWindowEnergy(t *testing.T) {
	ramp := feed(Options{}, trace{dur: 10 * time.Second, power: rampW, counter: linearJ(3e6, 400)}.samples())
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		a, b := rng.Float64()*10, rng.Float64()*10
		if a > b {
			a, b = b, a
		}
		ca, oka := ramp.At(at(a))
		cb, okb := ramp.At(at(b))
		if !oka || !okb {
			t.Fatalf("window [%v, %v]: ok %v %v", a, b, oka, okb)
		}
		w := cb.Sub(ca)
		// Nanosecond rounding of a and b is part of the expected value.
		sa, sb := sec(at(a).Sub(t0)), sec(at(b).Sub(t0))
		if !near(w.IntegratedJ, rampE(sb)-rampE(sa)) || !near(w.CounterJ, 400*(sb-sa)) ||
			!w.CounterOK || !w.IntegratedOK || w.Estimated || w.GapS != 0 {
			t.Fatalf("window [%v, %v] = %+v, want integrated %v counter %v",
				a, b, w, rampE(sb)-rampE(sa), 400*(sb-sa))
		}
	}
}

func TestSubFlags(t *testing.T) {
	a := Cumulative{CounterJ: 10, CounterOK: true, IntegratedJ: 20, IntegratedOK: false, GapS: 1}
	b := Cumulative{CounterJ: 15, CounterOK: true, IntegratedJ: 29, IntegratedOK: true, GapS: 1.5, Estimated: true}
	want := Cumulative{CounterJ: 5, CounterOK: true, IntegratedJ: 9, IntegratedOK: false, GapS: 0.5, Estimated: true}
	if got := b.Sub(a); got != want {
		t.Errorf("Sub = %+v, want %+v", got, want)
	}
}

// Pruning must not change At for any t within History of the newest point,
// and must keep the number of retained points bounded.
func TestPruningKeepsResults(t *testing.T) {
	ss := trace{dur: 60 * time.Second, power: squareW, counter: func(d time.Duration) float64 {
		return 9e5 + squareE(d)
	}}.samples()
	full := feed(Options{History: time.Hour}, ss)
	pruned := feed(Options{History: 2 * time.Second}, ss)

	// Newest point is 60 s; everything from 58 s on must be identical,
	// including extrapolation past the end.
	for s := 58.0; s <= 60.3; s += 0.0071 {
		a, aok := full.At(at(s))
		b, bok := pruned.At(at(s))
		if a != b || aok != bok {
			t.Fatalf("At(%v): full %+v %v, pruned %+v %v", s, a, aok, b, bok)
		}
	}
	if got, want := pruned.Oldest(), at(58); !got.Equal(want) {
		t.Errorf("Oldest = %v, want %v", got, want)
	}
	if n := len(pruned.power.live()); n != 41 {
		t.Errorf("retained power points = %d, want 41 (2 s at 50 ms, both ends)", n)
	}
	if n := len(pruned.counter.live()); n != 21 {
		t.Errorf("retained counter points = %d, want 21", n)
	}
	// Before the oldest retained point the values are clamped to it and
	// flagged; waiting would not help, so ok stays true.
	c, ok := pruned.At(at(50))
	want, _ := full.At(at(58))
	want.CounterOK, want.IntegratedOK, want.Estimated = false, false, true
	checkCum(t, "At(50s) after pruning", c, ok, want, true)
	if full.Stats() != pruned.Stats() {
		t.Errorf("Stats differ: full %+v, pruned %+v", full.Stats(), pruned.Stats())
	}
}

// An hour of 50 ms ticks with the default 30 s history: memory stays bounded
// and, once the buffers have grown, Observe does not allocate.
func TestMemoryBounded(t *testing.T) {
	m := NewMeter(Options{})
	const ticks = 3600 * 20
	s := gpu.Sample{PowerOK: true, EnergyOK: true}
	k := 0
	step := func() {
		d := time.Duration(k) * tick
		s.ReadAt, s.PowerAt, s.EnergyAt = t0.Add(d), t0.Add(d), t0.Add(d/ctrTick*ctrTick)
		s.PowerW, s.EnergyJ = 300, 300*sec(d/ctrTick*ctrTick)
		m.Observe(s)
		k++
	}
	for k < ticks {
		step()
	}
	// 30 s at 50 ms is 601 points; the ring may hold up to 4× that.
	if n, c := len(m.power.live()), cap(m.power.buf); n != 601 || c > 4*601 {
		t.Errorf("power: %d live points in capacity %d", n, c)
	}
	if n, c := len(m.counter.live()), cap(m.counter.buf); n != 301 || c > 4*301 {
		t.Errorf("counter: %d live points in capacity %d", n, c)
	}
	if a := testing.AllocsPerRun(10000, step); a != 0 {
		t.Errorf("Observe allocates %v times per call in steady state", a)
	}
	c, ok := m.At(at(sec(time.Duration(k-1)*tick) - 12.345))
	if !ok || !near(c.IntegratedJ, 300*(sec(time.Duration(k-1)*tick)-12.345)) {
		t.Errorf("after an hour: %+v %v", c, ok)
	}
}

func TestRingCompaction(t *testing.T) {
	var r ring[int]
	for i := range 10000 {
		r.push(i)
		for len(r.live()) > 5 {
			r.head++
		}
		live := r.live()
		for j, v := range live {
			if v != i-len(live)+1+j {
				t.Fatalf("after push %d: live = %v", i, live)
			}
		}
	}
	if cap(r.buf) > 16 {
		t.Errorf("capacity %d for 5 live elements", cap(r.buf))
	}
}

// Trapezoid, the oracle of the Meter tests, integrates power samples with the same rules as Meter: samples
// whose time is not after the previous accepted sample are stale and skipped,
// non-finite values are skipped, and intervals longer than maxGap are not
// integrated but returned as gap seconds. maxGap <= 0 means DefaultMaxGap, as
// in Options. Only the first min(len(ts), len(powerW)) samples are used.
func Trapezoid(ts []time.Time, powerW []float64, maxGap time.Duration) (joules, gapS float64) {
	if maxGap <= 0 {
		maxGap = DefaultMaxGap
	}
	n := min(len(ts), len(powerW))
	prev := -1
	for k := 0; k < n; k++ {
		if !finite(powerW[k]) {
			continue
		}
		if prev < 0 {
			prev = k
			continue
		}
		dt := int64(ts[k].Sub(ts[prev]))
		if dt <= 0 {
			continue
		}
		if dt > int64(maxGap) {
			gapS += seconds(dt)
		} else {
			joules += (powerW[prev] + powerW[k]) / 2 * seconds(dt)
		}
		prev = k
	}
	return joules, gapS
}

func TestTrapezoid(t *testing.T) {
	grid := func(n int, step time.Duration) []time.Time {
		ts := make([]time.Time, n)
		for k := range ts {
			ts[k] = t0.Add(time.Duration(k) * step)
		}
		return ts
	}
	fill := func(ts []time.Time, f func(time.Duration) float64) []float64 {
		p := make([]float64, len(ts))
		for k, x := range ts {
			p[k] = f(x.Sub(t0))
		}
		return p
	}
	g201 := grid(201, tick)
	// A 2 s hole between 3 s and 5 s.
	holed := append(append([]time.Time{}, g201[:61]...), g201[100:]...)
	// Repeated timestamps (stale readings) with different values: the
	// repeats must be ignored, not averaged in.
	staleTs := []time.Time{at(0), at(0), at(1), at(1), at(2)}
	staleP := []float64{100, 999, 100, 999, 100}

	cases := []struct {
		name         string
		ts           []time.Time
		p            []float64
		maxGap       time.Duration
		joules, gapS float64
	}{
		{name: "empty"},
		{name: "single point", ts: g201[:1], p: []float64{300}},
		{name: "constant 300 W for 10 s", ts: g201, p: fill(g201, constW(300)), joules: 3000},
		{name: "ramp is exact", ts: g201, p: fill(g201, rampW), joules: 2000},
		{name: "square wave (see TestMeter)", ts: g201, p: fill(g201, squareW), joules: 2000},
		{name: "2 s hole", ts: holed, p: fill(holed, constW(300)), joules: 2400, gapS: 2},
		{name: "hole integrated with a large MaxGap", ts: holed, p: fill(holed, constW(300)), maxGap: 3 * time.Second, joules: 3000},
		{name: "1 s steps exceed the default MaxGap", ts: grid(3, time.Second), p: []float64{1, 2, 3}, gapS: 2},
		{name: "1 s steps within MaxGap", ts: grid(3, time.Second), p: []float64{1, 2, 3}, maxGap: time.Second, joules: 4},
		{name: "stale repeats skipped", ts: staleTs, p: staleP, maxGap: time.Second, joules: 200},
		{name: "NaN skipped", ts: grid(3, tick), p: []float64{100, math.NaN(), 100}, joules: 10},
		{name: "lengths differ: shorter wins", ts: g201[:3], p: []float64{100, 100, 100, 5000}, joules: 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j, g := Trapezoid(tc.ts, tc.p, tc.maxGap)
			if !near(j, tc.joules) || !near(g, tc.gapS) {
				t.Errorf("Trapezoid = %v J, %v s gap; want %v J, %v s", j, g, tc.joules, tc.gapS)
			}
		})
	}
}

// The meter's integrated curve at its newest point equals Trapezoid over the
// same readings, whatever the timing.
func TestMeterMatchesTrapezoid(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var ts []time.Time
	var p []float64
	m := NewMeter(Options{})
	d := time.Duration(0)
	for range 5000 {
		d += time.Duration(rng.IntN(400)) * time.Millisecond // 0 ms steps are stale
		w := 50 + 400*rng.Float64()
		ts, p = append(ts, t0.Add(d)), append(p, w)
		m.Observe(gpu.Sample{ReadAt: t0.Add(d), PowerW: w, PowerOK: true})
	}
	j, g := Trapezoid(ts, p, 0)
	c, ok := m.At(t0.Add(d))
	if !ok || !near(c.IntegratedJ, j) || !near(c.GapS, g) {
		t.Errorf("meter %+v ok=%v; Trapezoid %v J %v s", c, ok, j, g)
	}
	if s := m.Stats(); !near(s.GapS, g) || s.PowerPoints+s.StalePower != 5000 {
		t.Errorf("Stats %+v", s)
	}
}

// BenchmarkObserve is one GPU's tick: a fresh power reading and a counter that
// moves every other tick, with pruning in steady state.
func BenchmarkObserve(b *testing.B) {
	m := NewMeter(Options{})
	s := gpu.Sample{PowerOK: true, EnergyOK: true}
	k := 0
	step := func() {
		d := time.Duration(k) * tick
		de := d / ctrTick * ctrTick
		s.ReadAt, s.PowerAt, s.EnergyAt = t0.Add(d), t0.Add(d), t0.Add(de)
		s.PowerW, s.EnergyJ = 300+float64(k%7), 300*sec(de)
		m.Observe(s)
		k++
	}
	for range 2000 { // past the 30 s history, so pruning runs
		step()
	}
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
}

func BenchmarkAt(b *testing.B) {
	m := feed(Options{}, trace{dur: 60 * time.Second, power: rampW, counter: func(d time.Duration) float64 { return rampE(sec(d)) }}.samples())
	q := at(45.678)
	b.ReportAllocs()
	for b.Loop() {
		m.At(q)
	}
}
