// Package ledger turns the agent's 50 ms GPU ticks and the trainers' events
// into numbered 1 s batches for the collector.
//
// Energy is never attributed tick by tick. Each GPU has an energy.Meter: a
// cumulative-energy curve that can be evaluated at any instant. A run's
// energy over a segment [a, b) is the sum over its GPUs of Meter.At(b) -
// Meter.At(a), and segments are cut exactly at run start, warmup end, GPU-set
// changes, run end and the batch boundaries. A window is closed only once the
// meters have points past its end (a settle delay), so boundaries are
// interpolated, not extrapolated.
package ledger

import (
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/pkg/energy"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Config sets up a Ledger.
type Config struct {
	Devices []gpu.Device
	// DefaultWarmup is excluded from efficiency figures when run_start names
	// neither warmup_s nor warmup_steps.
	DefaultWarmup time.Duration
	// DefaultWarmupSteps, when > 0, ends the default warmup at the run's
	// N-th step if that comes before DefaultWarmup.
	DefaultWarmupSteps uint64
	// Window is the batch length (default 1 s); windows are aligned to it.
	Window time.Duration
	// Settle is how long after a window's end it is closed, so every meter has
	// a point past the boundary (default 300 ms: NVML's counter updates about
	// every 100 ms).
	Settle time.Duration
	// MaxGap is passed to the meters: power samples further apart are a gap.
	MaxGap time.Duration
	// Load, when set, is told each GPU's busy fraction (the sim backend).
	Load   gpu.LoadSetter
	Logger *slog.Logger

	// ProcessAttribution is true when the agent can find the GPUs a process
	// tree runs on (the backend lists compute processes): a run_start with
	// attribute_pid and no gpus then starts with no GPUs, and AddGPUs adds
	// them as they are found. When false, such a run gets every GPU.
	ProcessAttribution bool

	// RawSamples adds every GPU's raw samples (time, power, utilization,
	// memory) to the batches, as RawSamples columns: for analyses that need
	// the 50 ms curve. Off by default (about 16 bytes per sample).
	RawSamples bool
}

func (c *Config) setDefaults() {
	if c.Window <= 0 {
		c.Window = time.Second
	}
	if c.Settle <= 0 {
		c.Settle = 300 * time.Millisecond
	}
	if c.MaxGap <= 0 {
		c.MaxGap = 250 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// idleAfter is how long after its last step a simulated GPU is idle again.
const idleAfter = 2 * time.Second

// Ledger is safe for concurrent use: the sampling loop calls Tick, socket
// connections call the event methods.
type Ledger struct {
	cfg Config

	mu       sync.Mutex
	meters   []*energy.Meter
	last     []gpu.Sample
	garbled  uint64 // readings dropped as ones no GPU gives (gpu.Sample.DropGarbled)
	started  bool
	winStart time.Time
	winEnd   time.Time
	// Per-GPU cumulative energy and meter stats at winStart.
	startCum   []energy.Cumulative
	startStats []energy.Stats
	// gpuAcc[0] accumulates the open window; gpuAcc[1] ticks that fall after
	// its end while it settles.
	gpuAcc [2][]gpuAcc
	// raw[0] holds the open window's raw samples, raw[1] those of ticks
	// after its end, like gpuAcc (Config.RawSamples only).
	raw      [2][]*trainmeterv1.RawSamples
	host     *trainmeterv1.HostWindow
	runs     map[string]*run
	order    []string // run ids in start order, for deterministic batches
	pending  []*trainmeterv1.RunEvent
	seq      uint64
	lastStep []time.Time

	// Raw counter per GPU at winStart, for snapshots; the first raw counter
	// of this boot; and the snapshot this boot was restored from.
	rawAtStart   []float64
	rawAtStartOK []bool
	firstRaw     []float64
	firstRawOK   []bool
	snapGPUs     []SnapshotGPU
	grace        time.Duration

	// work is each GPU's latest per-run work poll (SetWork); simWork the
	// loads runs report on simulated GPUs (share.go).
	work, simWork []map[string]RunWork
	// downtimeDone is set once the first window after a restore booked the
	// downtime; reclaim holds, per GPU, what expired restored runs had held.
	downtimeDone    bool
	downtimeSharers []int
	snapTime        time.Time
	reclaim         []gpuPart
	users           map[int32]string // uid -> name, userName's cache
	// Runs that ended on this node, by id, and their ids oldest first
	// (lifecycle.go).
	ended        map[string]EndedRun
	endedOrder   []string
	endedVersion uint64

	// hostEnergy is the host (RAPL) energy split between runs (hostenergy.go).
	hostEnergy hostState

	// Runs the collector refused, and the trainer events dropped for them
	// since (refused.go).
	refused       refusedConns
	refusedEvents uint64
}

type gpuAcc struct {
	reads, errors      uint32
	powerSum, powerMax float64
	powerN             int
	powerLast          float64
	memMax, memSum     float64
	memN               int
	memTotal           float64
	utilSum            float64
	utilN              int
}

// New returns a ledger for the given GPUs.
func New(cfg Config) *Ledger {
	cfg.setDefaults()
	n := len(cfg.Devices)
	l := &Ledger{
		cfg:        cfg,
		meters:     make([]*energy.Meter, n),
		last:       make([]gpu.Sample, n),
		startCum:   make([]energy.Cumulative, n),
		startStats: make([]energy.Stats, n),
		runs:       map[string]*run{},
		lastStep:   make([]time.Time, n),

		rawAtStart:   make([]float64, n),
		rawAtStartOK: make([]bool, n),
		firstRaw:     make([]float64, n),
		firstRawOK:   make([]bool, n),
		grace:        DefaultRejoinGrace,
		work:         make([]map[string]RunWork, n),
		simWork:      make([]map[string]RunWork, n),
		reclaim:      make([]gpuPart, n),

		downtimeSharers: make([]int, n),
	}
	for i := range l.meters {
		l.meters[i] = energy.NewMeter(energy.Options{MaxGap: cfg.MaxGap})
	}
	l.gpuAcc[0] = make([]gpuAcc, n)
	l.gpuAcc[1] = make([]gpuAcc, n)
	if cfg.RawSamples {
		l.raw[0], l.raw[1] = newRaw(n), newRaw(n)
	}
	return l
}

// SetHost records the latest host reading; it goes out with the next batch.
func (l *Ledger) SetHost(h *trainmeterv1.HostWindow) {
	l.mu.Lock()
	l.host = h
	l.mu.Unlock()
}

// Tick feeds one sampling tick (one sample per GPU, in index order) and
// returns the batches whose windows it closed, usually none or one.
func (l *Ledger) Tick(now time.Time, samples []gpu.Sample) []*trainmeterv1.Batch {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open(now)
	acc, raw := l.gpuAcc[0], l.raw[0]
	if !now.Before(l.winEnd) {
		acc, raw = l.gpuAcc[1], l.raw[1]
	}
	for i := range samples {
		if i >= len(l.meters) {
			break
		}
		s := samples[i]
		l.garbled += uint64(s.DropGarbled())
		l.meters[i].Observe(s)
		l.last[i] = s
		if s.EnergyOK && !l.firstRawOK[i] {
			l.firstRaw[i], l.firstRawOK[i] = s.EnergyJ, true
		}
		accumulate(&acc[i], &s)
		if raw != nil && s.PowerOK {
			addRaw(raw[i], &s)
		}
	}
	l.updateLoad(now)
	l.expireRestored(now)
	for _, id := range l.order {
		r := l.runs[id]
		if now.Before(r.start) || (r.ended && now.After(r.end)) {
			continue
		}
		r.ticks = append(r.ticks, l.tickStat(now, r.gpusAt(now)))
	}

	var out []*trainmeterv1.Batch
	for l.due(now) {
		out = append(out, l.closeWindow())
	}
	return out
}

// maxSettle bounds how long a window waits for a GPU that stopped reporting
// (its energy past the last point is then extrapolated and flagged).
const maxSettle = 2 * time.Second

// due reports whether the open window can close: after the settle delay, once
// every GPU's curves reach past its end, so its boundary is interpolated. A
// counter that updates more slowly than usual only delays the batch.
func (l *Ledger) due(now time.Time) bool {
	if now.Before(l.winEnd.Add(l.cfg.Settle)) {
		return false
	}
	if !now.Before(l.winEnd.Add(maxSettle)) {
		return true
	}
	for _, m := range l.meters {
		if latest := m.Latest(); !latest.IsZero() && latest.Before(l.winEnd) {
			return false
		}
	}
	return true
}

// open starts the first window at the first tick or trainer event, whichever
// comes first, so no run can begin before the window that must account it.
func (l *Ledger) open(now time.Time) {
	if l.started {
		return
	}
	l.started = true
	l.winStart = now
	l.winEnd = now.Truncate(l.cfg.Window).Add(l.cfg.Window)
}

func newRaw(n int) []*trainmeterv1.RawSamples {
	out := make([]*trainmeterv1.RawSamples, n)
	for i := range out {
		out[i] = &trainmeterv1.RawSamples{Gpu: uint32(i)}
	}
	return out
}

// addRaw appends one sample to r's columns (utilization and memory 0 when
// not read, so the columns stay aligned). Times must increase: a tick
// earlier than the last one kept (clock stepped back) is dropped.
func addRaw(r *trainmeterv1.RawSamples, s *gpu.Sample) {
	t := uint64(s.ReadAt.UnixNano())
	if n := len(r.TUnixNs); n > 0 && t <= r.TUnixNs[n-1] {
		return
	}
	var util, mem float32
	if s.UtilOK {
		util = float32(s.UtilPct)
	}
	if s.MemOK {
		mem = float32(s.MemUsedMiB)
	}
	r.TUnixNs = append(r.TUnixNs, t)
	r.PowerW = append(r.PowerW, float32(s.PowerW))
	r.UtilizationPct = append(r.UtilizationPct, util)
	r.MemoryUsedMib = append(r.MemoryUsedMib, mem)
}

func accumulate(a *gpuAcc, s *gpu.Sample) {
	a.reads++
	if s.Err != nil {
		a.errors++
	}
	if s.PowerOK {
		a.powerSum += s.PowerW
		a.powerN++
		a.powerMax = math.Max(a.powerMax, s.PowerW)
		a.powerLast = s.PowerW
	}
	if s.MemOK {
		a.memMax = math.Max(a.memMax, s.MemUsedMiB)
		a.memSum += s.MemUsedMiB
		a.memN++
		a.memTotal = s.MemTotalMiB
	}
	if s.UtilOK {
		a.utilSum += s.UtilPct
		a.utilN++
	}
}

type tickStat struct {
	t        time.Time
	powerSum float64
	memMax   float64
	memSum   float64
	memN     int
	utilSum  float64
	utilN    int
}

func (l *Ledger) tickStat(now time.Time, gpus []int) tickStat {
	ts := tickStat{t: now}
	for _, g := range gpus {
		s := &l.last[g]
		if s.PowerOK {
			ts.powerSum += s.PowerW
		}
		if s.MemOK {
			ts.memMax = math.Max(ts.memMax, s.MemUsedMiB)
			ts.memSum += s.MemUsedMiB
			ts.memN++
		}
		if s.UtilOK {
			ts.utilSum += s.UtilPct
			ts.utilN++
		}
	}
	return ts
}

// updateLoad idles simulated GPUs whose runs stopped stepping.
func (l *Ledger) updateLoad(now time.Time) {
	if l.cfg.Load == nil {
		return
	}
	for g, t := range l.lastStep {
		if !t.IsZero() && now.Sub(t) > idleAfter {
			l.cfg.Load.SetLoad(g, 0)
			l.lastStep[g] = time.Time{}
			l.simWork[g] = nil
		}
	}
}

// closeWindow emits the batch for [winStart, winEnd) and opens the next.
func (l *Ledger) closeWindow() *trainmeterv1.Batch {
	ws, we := l.winStart, l.winEnd
	l.seq++
	b := &trainmeterv1.Batch{
		Seq:         l.seq,
		WindowStart: timestamppb.New(ws),
		WindowEnd:   timestamppb.New(we),
		Host:        l.host,
	}
	occ := l.occupancy(ws, we)
	endCum := make([]energy.Cumulative, len(l.meters))
	for i, m := range l.meters {
		c, _ := m.At(we)
		endCum[i] = c
		st := m.Stats()
		gw := l.gpuWindow(i, c, st)
		l.bookIdle(gw, i, ws, we, occ[i])
		b.GpuWindows = append(b.GpuWindows, gw)
		l.startStats[i] = st
		l.rawAtStart[i], l.rawAtStartOK[i] = l.rawAt(i, we, c)
	}
	l.bookDowntime(b, ws)
	b.HostEnergy = l.takeHostEnergy()
	b.RunEvents = l.pending
	l.pending = nil

	kept := l.order[:0]
	for _, id := range l.order {
		r := l.runs[id]
		b.RunWindows = append(b.RunWindows, l.runWindows(occ, r, ws, we)...)
		if r.ended && !r.end.After(we) {
			if !r.endSent {
				b.RunEvents = append(b.RunEvents, r.endEvent())
				l.rememberEnded(EndedRun{ID: r.id, End: r.end, Status: r.endStatus})
			}
			delete(l.runs, id)
			l.forgetSimWork(id)
			continue
		}
		kept = append(kept, id)
	}
	l.order = kept

	copy(l.startCum, endCum)
	l.gpuAcc[0], l.gpuAcc[1] = l.gpuAcc[1], l.gpuAcc[0]
	clear(l.gpuAcc[1])
	if l.cfg.RawSamples {
		for _, r := range l.raw[0] {
			if len(r.TUnixNs) > 0 {
				b.RawSamples = append(b.RawSamples, r)
			}
		}
		l.raw[0], l.raw[1] = l.raw[1], newRaw(len(l.meters))
	}
	l.winStart = we
	l.winEnd = we.Add(l.cfg.Window)
	return b
}

// rawAt is GPU i's raw (driver) counter at t, from its last raw reading and
// the curve between the two: what a restarted agent compares against.
func (l *Ledger) rawAt(i int, t time.Time, c energy.Cumulative) (float64, bool) {
	last := l.last[i]
	if !last.EnergyOK || !c.CounterOK {
		return 0, false
	}
	at := last.EnergyAt
	if at.IsZero() {
		at = last.ReadAt
	}
	cl, ok := l.meters[i].At(at)
	if !ok || !cl.CounterOK {
		return 0, false
	}
	return last.EnergyJ + c.CounterJ - cl.CounterJ, true
}

func (l *Ledger) gpuWindow(i int, end energy.Cumulative, st energy.Stats) *trainmeterv1.GpuWindow {
	a := &l.gpuAcc[0][i]
	start := l.startCum[i]
	prev := l.startStats[i]
	if l.seq == 1 {
		// The curve may reach back before this boot's first window (a
		// counter's driver timestamp precedes its read): the window, like
		// the runs in it, starts at its start.
		if c, ok := l.meters[i].At(l.winStart); ok {
			start = c
		}
	}
	w := &trainmeterv1.GpuWindow{
		Gpu:               uint32(i),
		Uuid:              l.cfg.Devices[i].UUID,
		EnergyIntegratedJ: end.IntegratedJ - start.IntegratedJ,
		CounterOk:         end.CounterOK && (start.CounterOK || prev.CounterPoints == 0),
		PowerMaxW:         a.powerMax,
		PowerLastW:        a.powerLast,
		Samples:           uint32(st.PowerPoints - prev.PowerPoints),
		StaleSamples:      uint32(st.StalePower - prev.StalePower),
		ReadErrors:        a.errors,
		GapS:              end.GapS - start.GapS,
		CounterResets:     uint32(st.CounterResets - prev.CounterResets),
		MemoryUsedMaxMib:  a.memMax,
		MemoryTotalMib:    a.memTotal,
	}
	if w.CounterOk {
		w.EnergyCounterJ = end.CounterJ - start.CounterJ
	}
	if a.powerN > 0 {
		w.PowerAvgW = a.powerSum / float64(a.powerN)
	}
	if a.memN > 0 {
		w.MemoryUsedAvgMib = a.memSum / float64(a.memN)
	}
	if a.utilN > 0 {
		w.UtilizationAvgPct = a.utilSum / float64(a.utilN)
	}
	return w
}

// runWindows cuts the run's part of [ws, we) into segments at warmup end and
// GPU-set changes, and measures each.
func (l *Ledger) runWindows(occ [][]piece, r *run, ws, we time.Time) []*trainmeterv1.RunWindow {
	from, to := later(ws, r.start), we
	if r.ended && r.end.Before(to) {
		to = r.end
	}
	if !from.Before(to) {
		return nil
	}
	cuts := []time.Time{from, to}
	if !r.warmupEnd.IsZero() && r.warmupEnd.After(from) && r.warmupEnd.Before(to) {
		cuts = append(cuts, r.warmupEnd)
	}
	for _, c := range r.gpuChanges {
		if c.at.After(from) && c.at.Before(to) {
			cuts = append(cuts, c.at)
		}
	}
	if !r.rejoinAt.IsZero() && r.rejoinAt.After(from) && r.rejoinAt.Before(to) {
		cuts = append(cuts, r.rejoinAt)
	}
	sort.Slice(cuts, func(i, j int) bool { return cuts[i].Before(cuts[j]) })

	var out []*trainmeterv1.RunWindow
	for i := 0; i+1 < len(cuts); i++ {
		a, b := cuts[i], cuts[i+1]
		if !a.Before(b) {
			continue
		}
		out = append(out, l.segment(occ, r, a, b))
	}
	if r.bridge != nil {
		out = l.holdBridge(r, out, ws, to)
	}
	// What a checkpoint may promise was shipped: totals of consumed steps.
	for _, s := range r.steps {
		if !s.t.Before(to) && !(r.ended && s.t.Equal(to)) {
			break
		}
		if s.rank != "" {
			r.shipped[s.rank] = max(r.shipped[s.rank], s.total)
		}
	}
	// Drop what this window consumed; later ticks and steps stay queued.
	r.ticks = dropBefore(r.ticks, to, func(t tickStat) time.Time { return t.t })
	r.steps = dropBefore(r.steps, to, func(s stepStat) time.Time { return s.t })
	if r.ended && !to.Before(r.end) {
		r.ticks, r.steps = nil, nil
	}
	return out
}

func dropBefore[T any](xs []T, t time.Time, at func(T) time.Time) []T {
	n := 0
	for n < len(xs) && at(xs[n]).Before(t) {
		n++
	}
	return append(xs[:0], xs[n:]...)
}

func (l *Ledger) segment(occ [][]piece, r *run, a, b time.Time) *trainmeterv1.RunWindow {
	gpus := r.gpusAt(a)
	w := &trainmeterv1.RunWindow{
		RunId: r.id,
		Start: timestamppb.New(a),
		End:   timestamppb.New(b),
		Phase: trainmeterv1.Phase_PHASE_WARMUP,
		// A segment with no GPUs (a process-attributed run before its
		// processes reach a GPU) used exactly 0 J: known, not estimated.
		CounterOk: true,
	}
	// Each GPU whose counter covers the segment contributes its counter
	// energy; one whose counter does not (lost, failing) its integrated
	// energy, so one failing GPU does not throw the others' counters away
	// for its sampled power (aliased by the sensor, docs/accuracy.md). The
	// segment is counter_ok when at least one GPU's counter covered it, and
	// estimated when any did not.
	var integratedOnly float64
	anyCounter := false
	if !r.warmupEnd.IsZero() && !a.Before(r.warmupEnd) {
		w.Phase = trainmeterv1.Phase_PHASE_MEASURED
	}
	var methods []string
	for _, g := range gpus {
		w.Gpus = append(w.Gpus, uint32(g))
		part := l.runShare(occ, r, g, a, b)
		w.EnergyIntegratedJ += part.integratedJ
		w.GapS += part.gapS
		w.GpuSeconds += part.gpuS
		w.SharedGpuSeconds += part.sharedS
		w.MaxSharingRuns = max(w.MaxSharingRuns, uint32(part.maxRuns))
		methods = append(methods, part.methods...)
		if part.counterOK {
			w.EnergyCounterJ += part.counterJ
			anyCounter = true
		} else {
			integratedOnly += part.integratedJ
			if l.meters[g].Stats().CounterPoints > 0 {
				w.EnergyEstimated = true // a counter that stopped, not a GPU without one
			}
		}
		w.EnergyEstimated = w.EnergyEstimated || part.estimated
		w.GpuShares = append(w.GpuShares, gpuShare(g, part.counterOK, part.counterJ, part.integratedJ, part.gpuS, part.sharedS))
	}
	w.ShareMethod = combineMethods(methods)
	if len(gpus) > 0 && !anyCounter {
		w.CounterOk = false
		w.EnergyCounterJ = 0
	} else {
		w.EnergyCounterJ += integratedOnly
	}
	// Segments are half-open, except that the run's last one also takes what
	// happened at the very instant of run_end (the last step is often
	// reported in the same breath as run_end).
	last := r.ended && b.Equal(r.end)
	in := func(t time.Time) bool { return !t.Before(a) && (t.Before(b) || (last && t.Equal(b))) }
	for _, t := range r.ticks {
		if !in(t.t) {
			continue
		}
		w.PeakPowerW = math.Max(w.PeakPowerW, t.powerSum)
		w.VramPeakMib = math.Max(w.VramPeakMib, t.memMax)
		w.VramSumMib += t.memSum
		w.VramSamples += uint64(t.memN)
		w.UtilizationSumPct += t.utilSum
		w.UtilizationSamples += uint64(t.utilN)
	}
	var gone []uint64
	for _, s := range r.steps {
		if !in(s.t) {
			continue
		}
		w.Tokens += s.tokens
		w.TokensRecovered += s.recovered
		if !r.warmupEnd.IsZero() && s.t.After(r.warmupEnd) {
			w.TokensMeasured += s.tokens
		}
		w.Steps++
		w.Samples += s.samples
		w.DataWaitS += s.dataWait
		w.ComputeS += s.compute
		if s.loss != nil {
			w.LastLoss = s.loss
		}
		if _, live := r.stepping[s.conn]; !live && !slices.Contains(gone, s.conn) {
			gone = append(gone, s.conn) // a rank that left after stepping here
		}
	}
	if w.Steps > 0 {
		w.StepRanks = uint32(len(r.stepping) + len(gone))
	}
	return w
}

// gpuShare is GPU g's share of a run's segment; its counter energy only
// when the counter covered it.
func gpuShare(g int, counterOK bool, counterJ, integratedJ, gpuS, sharedS float64) *trainmeterv1.GpuShare {
	share := &trainmeterv1.GpuShare{Gpu: uint32(g), CounterOk: counterOK, EnergyIntegratedJ: integratedJ,
		GpuSeconds: gpuS, SharedGpuSeconds: sharedS}
	if counterOK {
		share.EnergyCounterJ = counterJ
	}
	return share
}

// ActiveRuns lists the ids of runs not yet closed, in start order.
func (l *Ledger) ActiveRuns() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.order...)
}

// Members returns the connections that joined run id, for advisories.
func (l *Ledger) Members(id string) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.runs[id]
	if r == nil {
		return nil
	}
	out := make([]uint64, 0, len(r.members))
	for c := range r.members {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func errorf(event, format string, args ...any) error {
	return fmt.Errorf(event+": "+format, args...)
}

// GarbledReadings counts the GPU readings dropped so far as ones no GPU
// gives (NaN, negative, an all-ones value, a counter that leaps by more
// than a GPU can draw): each counts as a missing one.
func (l *Ledger) GarbledReadings() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.garbled
	for _, m := range l.meters {
		n += uint64(m.Stats().Implausible)
	}
	return n
}
