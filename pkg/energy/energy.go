// Package energy keeps one GPU's cumulative-energy curves, built from the
// power readings and the driver's energy counter, so that the energy between
// any two instants can be evaluated. Run windows are cut at the times the
// trainer reports (run start, end of warmup, run end), which fall between
// sampling ticks, so the curves are interpolated rather than summed per tick.
//
// Two figures are kept side by side and never blended: the counter (the
// driver's own accumulation, which also covers sampling gaps) and the
// trapezoidal integral of power (a cross-check, and the only figure on GPUs
// without a counter). Their disagreement is for the caller to report.
package energy

import (
	"math"
	"sort"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// Defaults for a zero Options.
const (
	// DefaultMaxGap is five 50 ms ticks: a couple of late ticks are still
	// integrated, a stalled sampler is not.
	DefaultMaxGap = 250 * time.Millisecond
	// DefaultHistory comfortably covers the delay between a trainer's event
	// and the tick that lets the agent close the window on it.
	DefaultHistory = 30 * time.Second
)

// Options tune a Meter. The zero value gives the defaults.
type Options struct {
	// MaxGap: power samples further apart than this are not integrated
	// across; the interval is recorded as a gap. Default 250ms if zero.
	MaxGap time.Duration
	// History: how far back At can look; older points are pruned (memory
	// must stay bounded). Default 30s if zero.
	History time.Duration
}

// Cumulative is the state of a GPU's curves at one instant. Only differences
// between two Cumulatives mean anything (see Sub): the origin is the meter's
// first point.
type Cumulative struct {
	// CounterJ is the reset-corrected cumulative counter energy, J, since
	// the first counter point. When t is after the newest counter point it
	// holds the extrapolated value (and CounterOK is false).
	CounterJ float64
	// CounterOK: the GPU has a counter and its curve covers t.
	CounterOK bool
	// IntegratedJ is the cumulative trapezoidal integral of power, J.
	IntegratedJ float64
	// IntegratedOK: the GPU has power points and their curve covers t.
	IntegratedOK bool
	// GapS is the cumulative seconds of power-sample gaps (> MaxGap) that
	// were not integrated.
	GapS float64
	// Estimated: t was outside at least one curve and the value is
	// extrapolated (after the newest point) or clamped (before the oldest
	// retained point).
	Estimated bool
}

// Sub returns the energy of the window from earlier to c. A figure is OK only
// if it was OK at both ends, and the window is estimated if either end was.
func (c Cumulative) Sub(earlier Cumulative) Cumulative {
	return Cumulative{
		CounterJ:     c.CounterJ - earlier.CounterJ,
		CounterOK:    c.CounterOK && earlier.CounterOK,
		IntegratedJ:  c.IntegratedJ - earlier.IntegratedJ,
		IntegratedOK: c.IntegratedOK && earlier.IntegratedOK,
		GapS:         c.GapS - earlier.GapS,
		Estimated:    c.Estimated || earlier.Estimated,
	}
}

// Stats counts what a Meter has seen since it was created; pruning does not
// reduce them.
type Stats struct {
	PowerPoints   int // power points accepted
	CounterPoints int // counter points accepted
	StalePower    int // power readings with a timestamp not after the previous one
	StaleCounter  int // counter readings with a timestamp not after the previous one
	CounterResets int // decreases of the raw counter
	Gaps          int // power intervals longer than MaxGap
	GapS          float64
	Invalid       int // NaN or infinite readings, dropped
	Implausible   int // readings beyond gpu.MaxPowerW (power, or counter increase), dropped
}

type powerPoint struct {
	t int64   // ns since Meter.base
	p float64 // W
	i float64 // cumulative integrated J at t
	g float64 // cumulative gap seconds at t
}

type counterPoint struct {
	t int64   // ns since Meter.base
	c float64 // raw counter J, as the driver reported it
	k float64 // reset-corrected cumulative J at t
}

// Meter keeps one GPU's cumulative-energy curves so energy between any two
// timestamps can be evaluated by interpolation (the agent cuts run windows at
// exact run start / warmup end / run end times, not at ticks).
//
// Each point stores the cumulative values up to it, so dropping old points
// never changes what the remaining ones say.
type Meter struct {
	maxGap  int64 // ns
	history int64 // ns

	// base is the origin of the int64 ns times. It carries no monotonic
	// reading, so driver timestamps (wall clock) and the agent's times are
	// compared on one scale.
	base    time.Time
	hasBase bool

	power   ring[powerPoint]
	counter ring[counterPoint]
	stats   Stats
}

// NewMeter returns an empty Meter.
func NewMeter(opt Options) *Meter {
	if opt.MaxGap <= 0 {
		opt.MaxGap = DefaultMaxGap
	}
	if opt.History <= 0 {
		opt.History = DefaultHistory
	}
	return &Meter{maxGap: int64(opt.MaxGap), history: int64(opt.History)}
}

// Observe feeds one tick's sample of this GPU. Not safe for concurrent use
// (the agent's sampling loop owns it).
//
// Power is taken before the counter so that a counter reset seen on this tick
// can be bridged with this tick's power.
func (m *Meter) Observe(s gpu.Sample) {
	if s.PowerOK {
		m.observePower(pointTime(s.PowerAt, s.ReadAt), s.PowerW)
	}
	if s.EnergyOK {
		m.observeCounter(pointTime(s.EnergyAt, s.ReadAt), s.EnergyJ)
	}
}

func pointTime(driver, read time.Time) time.Time {
	if driver.IsZero() {
		return read
	}
	return driver
}

func (m *Meter) rel(t time.Time) int64 {
	if !m.hasBase {
		m.base = t.Round(0)
		m.hasBase = true
	}
	return int64(t.Sub(m.base))
}

func (m *Meter) observePower(t time.Time, p float64) {
	if !finite(p) {
		m.stats.Invalid++
		return
	}
	if p < 0 || p > gpu.MaxPowerW {
		m.stats.Implausible++
		return
	}
	tn := m.rel(t)
	pts := m.power.live()
	if len(pts) == 0 {
		m.power.push(powerPoint{t: tn, p: p})
		m.stats.PowerPoints++
		return
	}
	last := pts[len(pts)-1]
	if tn <= last.t {
		// NVML hands back the same value and timestamp when polled faster
		// than it updates; counting it again would double-weight it.
		m.stats.StalePower++
		return
	}
	dt := tn - last.t
	np := powerPoint{t: tn, p: p, i: last.i, g: last.g}
	if dt <= m.maxGap {
		np.i += (last.p + p) / 2 * seconds(dt)
	} else {
		// Over a long hole the power may have done anything; a straight line
		// between the two ends would be a guess presented as a measurement.
		np.g += seconds(dt)
		m.stats.Gaps++
		m.stats.GapS += seconds(dt)
	}
	m.power.push(np)
	m.stats.PowerPoints++
	pruneFront(&m.power, tn-m.history, func(p *powerPoint) int64 { return p.t })
}

func (m *Meter) observeCounter(t time.Time, c float64) {
	if !finite(c) {
		m.stats.Invalid++
		return
	}
	tn := m.rel(t)
	pts := m.counter.live()
	if len(pts) == 0 {
		m.counter.push(counterPoint{t: tn, c: c})
		m.stats.CounterPoints++
		return
	}
	last := pts[len(pts)-1]
	if tn <= last.t {
		// The counter updates about every 100 ms and we poll every 50 ms, so
		// this is the normal case every other tick.
		m.stats.StaleCounter++
		return
	}
	d := c - last.c
	if d > gpu.MaxPowerW*max(seconds(tn-last.t), 1) {
		// A garbled reading, not energy: kept, it would be reported as the
		// run's energy, or, past the collector's limit on a figure, get the
		// node's whole batch refused. The next reading is taken against the
		// last good one, so a single garbled value costs nothing. The 1 s
		// floor: the counter advances in steps (about every 100 ms on
		// NVIDIA), so two reads a millisecond apart can straddle a step.
		m.stats.Implausible++
		return
	}
	if d < 0 {
		// The counter counts mJ since the driver loaded in 64 bits, so it
		// never wraps in practice: a decrease means the driver reloaded.
		// The energy of this interval is then taken from the power integral
		// when power covers the whole interval without a gap, because that
		// includes the energy before the reload. Otherwise we fall back to
		// the new raw value, the energy since the reload assuming the
		// counter restarted from 0, which misses only the time between the
		// previous point and the reload.
		m.stats.CounterResets++
		d = c
		i0, g0, cov0 := m.evalPower(last.t)
		i1, g1, cov1 := m.evalPower(tn)
		if cov0 == covered && cov1 == covered && g1 == g0 {
			d = i1 - i0
		}
	}
	m.counter.push(counterPoint{t: tn, c: c, k: last.k + d})
	m.stats.CounterPoints++
	pruneFront(&m.counter, tn-m.history, func(p *counterPoint) int64 { return p.t })
}

// coverage says where an instant lies relative to one curve.
type coverage int8

const (
	covered coverage = iota // between the oldest retained and the newest point
	before                  // before the oldest retained point: value clamped
	after                   // after the newest point: value extrapolated
	empty                   // the curve has no points
)

// evalPower evaluates the integrated curve at tn. Power is taken as linear
// between points, which is what the trapezoid rule assumes, so the value at a
// point equals the trapezoid sum up to it and values between points are exact
// for piecewise-linear power.
func (m *Meter) evalPower(tn int64) (i, g float64, cov coverage) {
	pts := m.power.live()
	n := len(pts)
	if n == 0 {
		return 0, 0, empty
	}
	if tn < pts[0].t {
		return pts[0].i, pts[0].g, before
	}
	last := pts[n-1]
	if tn == last.t {
		return last.i, last.g, covered
	}
	if tn > last.t {
		// Past the newest point only a GPU that stopped reporting is asked
		// for (the ledger waits for points otherwise, up to seconds). No
		// energy is invented for it: the curve stays flat (so a window cut
		// there is never negative) and the time since, once longer than
		// maxGap, is a gap, as it will be if a point arrives that late.
		if tn-last.t > m.maxGap {
			return last.i, last.g + seconds(tn-last.t), after
		}
		return last.i, last.g, after
	}
	j := sort.Search(n, func(j int) bool { return pts[j].t > tn }) // 1 <= j < n: pts[0].t <= tn < last.t
	a, b := pts[j-1], pts[j]
	dt, x := b.t-a.t, tn-a.t
	if dt > m.maxGap {
		return a.i, a.g + seconds(x), covered
	}
	pt := a.p + (b.p-a.p)*float64(x)/float64(dt)
	return a.i + (a.p+pt)/2*seconds(x), a.g, covered
}

// evalCounter evaluates the corrected counter curve at tn, linearly between
// counter points: the counter only tells us the energy at its own points.
func (m *Meter) evalCounter(tn int64) (k float64, cov coverage) {
	pts := m.counter.live()
	n := len(pts)
	if n == 0 {
		return 0, empty
	}
	if tn < pts[0].t {
		return pts[0].k, before
	}
	last := pts[n-1]
	if tn == last.t {
		return last.k, covered
	}
	if tn > last.t {
		return last.k + m.lastPower()*seconds(tn-last.t), after
	}
	j := sort.Search(n, func(j int) bool { return pts[j].t > tn }) // 1 <= j < n: pts[0].t <= tn < last.t
	a, b := pts[j-1], pts[j]
	return a.k + (b.k-a.k)*float64(tn-a.t)/float64(b.t-a.t), covered
}

// lastPower is the power used to extrapolate the counter: the newest power
// reading, or on a GPU without power readings the counter's own last slope.
func (m *Meter) lastPower() float64 {
	if pts := m.power.live(); len(pts) > 0 {
		return pts[len(pts)-1].p
	}
	pts := m.counter.live()
	if n := len(pts); n >= 2 {
		a, b := pts[n-2], pts[n-1]
		return (b.k - a.k) / seconds(b.t-a.t)
	}
	return 0
}

// At returns the cumulative energies at time t (since the meter's first
// point). ok is false when t is after the latest point of a curve that is
// needed (the caller waits for a later tick, or accepts the extrapolated
// value, which is flagged Estimated), and when the meter has no points.
//
// Before the oldest retained point the values are clamped to that point's:
// zeros before the meter's first point, as the spec asks; after pruning, the
// oldest values still known. ok stays true there, since waiting would not
// help, but Estimated is set and the curve's own OK flag is false.
func (m *Meter) At(t time.Time) (c Cumulative, ok bool) {
	if !m.hasBase {
		return Cumulative{Estimated: true}, false
	}
	tn := int64(t.Sub(m.base))
	var pc, cc coverage
	c.IntegratedJ, c.GapS, pc = m.evalPower(tn)
	c.CounterJ, cc = m.evalCounter(tn)
	c.IntegratedOK = pc == covered
	c.CounterOK = cc == covered
	c.Estimated = pc == before || pc == after || cc == before || cc == after
	ok = (pc != empty || cc != empty) && pc != after && cc != after
	return c, ok
}

// Latest is the newest time covered by every curve this GPU has (min of
// newest power point and newest counter point, if it has a counter). It is
// the zero time when the meter has no points.
func (m *Meter) Latest() time.Time {
	pp, cp := m.power.live(), m.counter.live()
	switch {
	case len(pp) > 0 && len(cp) > 0:
		return m.base.Add(time.Duration(min(pp[len(pp)-1].t, cp[len(cp)-1].t)))
	case len(pp) > 0:
		return m.base.Add(time.Duration(pp[len(pp)-1].t))
	case len(cp) > 0:
		return m.base.Add(time.Duration(cp[len(cp)-1].t))
	}
	return time.Time{}
}

// Oldest is the oldest time that every curve this GPU has still covers after
// pruning; At clamps (and flags Estimated) before it. It is the zero time
// when the meter has no points.
func (m *Meter) Oldest() time.Time {
	pp, cp := m.power.live(), m.counter.live()
	switch {
	case len(pp) > 0 && len(cp) > 0:
		return m.base.Add(time.Duration(max(pp[0].t, cp[0].t)))
	case len(pp) > 0:
		return m.base.Add(time.Duration(pp[0].t))
	case len(cp) > 0:
		return m.base.Add(time.Duration(cp[0].t))
	}
	return time.Time{}
}

// Stats returns the counts since the meter was created.
func (m *Meter) Stats() Stats { return m.stats }

func seconds(ns int64) float64 { return float64(ns) / 1e9 }

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// ring is a slice whose front is dropped by advancing head. The backing array
// is compacted only when it is full and at least half of it is dead, so each
// compaction copies no more elements than pushes since the last one: O(1)
// amortised, and no allocation once the capacity fits the history.
type ring[T any] struct {
	buf  []T
	head int
}

func (r *ring[T]) live() []T { return r.buf[r.head:] }

func (r *ring[T]) push(x T) {
	if len(r.buf) == cap(r.buf) && r.head > 0 && 2*r.head >= len(r.buf) {
		n := copy(r.buf, r.buf[r.head:])
		r.buf = r.buf[:n]
		r.head = 0
	}
	r.buf = append(r.buf, x)
}

// pruneFront drops points older than cutoff but keeps the newest point at or
// before it, so that every instant from cutoff on can still be interpolated.
func pruneFront[T any](r *ring[T], cutoff int64, at func(*T) int64) {
	for len(r.buf)-r.head >= 2 && at(&r.buf[r.head+1]) <= cutoff {
		r.head++
	}
}
