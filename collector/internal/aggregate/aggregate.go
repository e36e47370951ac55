// Package aggregate folds a run's events and windows, from any number of
// nodes, into the per-run figures of the CSV contract (docs/measurement.md,
// "Per-run figures"). It is pure: no I/O, no clock. The state is its stored
// protobuf (storev1.Aggregate, codec.go), kept next to the raw records.
//
// Definitions, as implemented (they are the contract):
//
//   - start: the earliest RunStart.time across nodes. The RunStart with the
//     earliest time wins for metadata (ties: lexicographically smallest node);
//     later ones join and never overwrite it. With no RunStart (should not
//     happen) start is the earliest window start.
//   - end: a node has ended when its latest RunEnd.time is at or after its
//     latest RunStart.time (so a resumed run re-opens the node). The run has
//     ended when every node that sent a RunStart has ended; end is then the
//     latest RunEnd.time. Until then ended=false and end is the latest window
//     end seen (a live report). wall_s = end − start − paused (never
//     negative).
//   - paused: a RunStart later than the end of the whole run (every node
//     ended) reopens it: [end, RunStart.time) is a pause, and the pauses are
//     taken out of wall_s and warmup_s, hence out of every rate.
//   - end_status: across nodes (by name) the first node's latest RunEnd
//     end_status that is not "ok", else "ok"; "ended" when none was sent.
//   - warmup_s = earliest start of any PHASE_MEASURED window − start − paused
//     before it; wall_s if there is no measured window.
//   - per window, energy = energy_counter_j if counter_ok else
//     energy_integrated_j. energy_J = Σ over measured windows; energy_total_J =
//     Σ over all windows; energy_J_integrated = Σ measured integrated;
//     energy_method = "counter" | "integrated" | "mixed" over measured windows
//     ("" without measured windows). energy_disagreement_pct = 100 × (Σ counter
//     − Σ integrated) / Σ counter over measured windows with counter_ok (0 if
//     none, or if Σ counter < 1 J). energy_estimated = any window estimated; gap_s = Σ gap_s.
//   - rates after warmup (avg_power_W, tok_per_s, J_per_token, steps_per_s
//     and what derives from them) need wall_s − warmup_s ≥ MinRateS and
//     MinRateSteps steps after warmup; otherwise they are unset and
//     rates_unavailable says why (see rates).
//   - energy_coverage = 1 − uncovered / Σ measured window seconds, a
//     window's uncovered part being the gap share of its GPUs' time when
//     its counter did not cover it (uncoveredShare).
//   - avg_power_W = energy_J / ((wall_s − warmup_s) × energy_coverage).
//   - peak_power_W: per node, a window's peak_power_w; across nodes, per
//     1-second bucket (window start truncated to the second) each node's max
//     in the bucket is summed, and the result is the max over buckets.
//     Measured windows only. Summing each node's peak within the same second
//     is an upper bound of the true simultaneous peak when nodes' ticks are not
//     aligned. Buckets are kept only while they can still change (see
//     PeakHorizon); a window for an already folded bucket counts alone.
//   - avg_power_total_W = energy_total_J / wall_s; peak_power_total_W =
//     max(peak_power_W, Σ over nodes of the node's highest warmup window
//     peak): the whole run, warmup included (an upper bound on several
//     nodes, whose warmup peaks need not coincide).
//   - tokens_processed = Σ tokens; tokens_measured = Σ tokens_measured; steps,
//     data_wait_s, compute_s are sums over all windows.
//   - tok_per_s = tokens_measured / (wall_s − warmup_s); J_per_token =
//     energy_J / (tokens_measured × energy_coverage) (unset when
//     tokens_measured = 0).
//   - vram_peak_MB = max vram_peak_mib over all windows; vram_avg_MB =
//     Σ vram_sum_mib / Σ vram_samples.
//   - gpus = distinct (node, gpu index) in the windows' gpus; nodes = distinct
//     nodes that sent anything for the run; gpu_name from the winning RunStart.
//   - gpu_hours = Σ gpu_seconds / 3600 (warmup included: you pay for it).
//   - cost: booked as windows are folded, at the prices then in force, and
//     changed only by Reprice (booking.go); see Pricing and Report.
//   - evals sorted by time (arrival order for equal times); last_loss from the
//     window with the latest end that has has_loss.
//   - incomplete: an agent reported data it had to drop (Batch.losses: spool
//     or disk full, a rejected batch); lost_batches, lost_tokens,
//     lost_energy_j, lost_gpu_seconds and lost_host_energy_j (the runs'
//     CPU+DRAM share) are the sums of those reports. The figures above
//     exclude the lost data: tokens_processed + lost_tokens is what the
//     trainers reported, cpu_energy_j + dram_energy_j + lost_host_energy_j
//     the run's host energy.
//
// Folding is order-independent (up to floating-point summation order) as
// long as each node's own windows arrive in that node's order, which the
// agent's sequence numbers guarantee; windows of different nodes may be
// interleaved in any order.
package aggregate

import (
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/pkg/energy"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// PeakHorizon is how far (in seconds) behind the newest bucket a peak bucket
// is kept open for other nodes' windows, at least. A bucket is folded into the
// running peak once it is older than the horizon and every node that has not
// ended has sent windows past it, or once it is older than PeakMaxLag; once
// every node has ended, all buckets are folded.
//
// Nodes the run knows of hold buckets open through their watermarks; the
// horizon is only for a node whose first data of the run is still on its way
// (an agent cut off from the collector since before the run started). A
// minute covers the agent's reconnect backoff (30 s at most, plus jitter);
// a longer horizon makes every live run's aggregate, rewritten at each
// commit, that much larger (docs/benchmarks.md).
const (
	PeakHorizon = 60
	PeakMaxLag  = 3600
)

// Pricing is the collector's configuration for costs (collector/internal/pricing/cost). Zero
// means unknown.
type Pricing = cost.Config

// MaxBandedWindow bounds the work of booking one window to tariff bands.
// Ingest accepts windows up to 30 days before their batch (an agent bridging
// its own downtime), so a longer one only comes from a caller that skipped
// validation.
const MaxBandedWindow = 40 * 24 * time.Hour

// EnergyBands books a window's energy to tariff bands (cost.Tariff does):
// add is called with each band's share of joules consumed over [start, end).
type EnergyBands interface {
	Split(start, end time.Time, joules float64, add func(band string, joules float64))
}

// CarbonBooker books a window's energy to the carbon intensity in force
// on node's grid over [start, end) (cost.Config does): add is called with
// each part's key (cost.CarbonKey) and joules.
type CarbonBooker interface {
	BookCarbon(node string, start, end time.Time, joules float64, add func(key string, joules float64))
}

// NodeState is one node's part in the run. Times are Unix nanoseconds.
type NodeState = storev1.Node

func nodeEnded(n *NodeState) bool { return n.HasEnd && n.EndMax >= n.StartMax }

// State is a run's aggregate: the stored message itself (storev1.Aggregate,
// whose comments define each field), folded by the methods here, and what
// the store needs to know of it beyond that. Use the methods to change it.
type State struct {
	*storev1.Aggregate

	// The nodes whose state changed since they were last taken for writing
	// apart (codec.go).
	changed map[string]struct{}
}

// maxLostReasons bounds the distinct loss reasons kept per run.
const maxLostReasons = 8

// AddLoss folds a loss report from node: the run is incomplete by that much.
func (s *State) AddLoss(node string, l *trainmeterv1.DataLoss) {
	s.node(node)
	s.Incomplete = true
	s.LostBatches += l.GetBatches()
	s.LostTokens += l.GetTokens()
	s.LostEnergyJ += l.GetEnergyJ()
	s.LostGpuSeconds += l.GetGpuSeconds()
	s.LostHostEnergyJ += l.GetHostEnergyJ()
	for _, r := range strings.Split(l.GetReason(), "; ") {
		if r == "" || r == "…" || slices.Contains(s.LostReasons, r) || len(s.LostReasons) >= maxLostReasons {
			continue
		}
		s.LostReasons = append(s.LostReasons, r)
	}
}

// AddHostEnergy folds the run's share of one of node's host energy
// intervals (Batch.host_energy): cpu_energy_J and dram_energy_J are the sums
// of these shares over the run's nodes.
func (s *State) AddHostEnergy(node string, h *trainmeterv1.HostEnergy, share *trainmeterv1.HostEnergyShare) {
	s.node(node)
	s.HostCpuEnergyJ += share.GetCpuEnergyJ()
	s.HasHostCpu = true
	if h.GetDramOk() {
		s.HostDramEnergyJ += share.GetDramEnergyJ()
		s.HasHostDram = true
	}
	if m := share.GetSplit(); m != "" && !slices.Contains(s.HostSplits, m) {
		s.HostSplits = append(s.HostSplits, m)
		slices.Sort(s.HostSplits)
	}
}

// New returns an empty aggregate for runID.
func New(runID string) *State {
	return &State{Aggregate: &storev1.Aggregate{RunId: runID, Nodes: map[string]*NodeState{}}}
}

func (s *State) node(name string) *NodeState {
	if s.Nodes == nil {
		s.Nodes = map[string]*NodeState{}
	}
	n := s.Nodes[name]
	if n == nil {
		n = &NodeState{}
		s.Nodes[name] = n
	}
	s.markChanged(name) // every change to a node's state goes through here or foldBuckets
	return n
}

func nanos(ts *timestamppb.Timestamp) int64 {
	if ts == nil {
		return 0
	}
	return ts.AsTime().UnixNano()
}

// AddStart folds a RunStart from node.
func (s *State) AddStart(node string, ev *trainmeterv1.RunStart) {
	t := nanos(ev.GetTime())
	if s.Ended() {
		// A run_start after the whole run ended reopens it only with
		// resume (the store refuses it otherwise: State.Admit). The time
		// in between is not run time.
		if end := s.endNanos(); t > end {
			s.PauseStarts = append(s.PauseStarts, end)
			s.PauseEnds = append(s.PauseEnds, t)
		}
	}
	n := s.node(node)
	if !n.Started || t < n.StartMin {
		n.StartMin = t
	}
	if !n.Started || t > n.StartMax {
		n.StartMax = t
	}
	n.Started = true
	if s.HasStart && (t > s.Start || (t == s.Start && node >= s.StartNode)) {
		if t == s.Start && node == s.StartNode {
			// The agent sends the run's start again when a client joining
			// a run of `trainmeter run` named fields the command line left
			// out: fill those, never overwrite.
			fillUnset(s.RunStart.ProtoReflect(), ev.ProtoReflect())
		}
		return // joins; never overwrites the winner's metadata
	}
	s.HasStart = true
	s.Start = t
	s.StartNode = node
	s.RunStart = proto.Clone(ev).(*trainmeterv1.RunStart)
	s.RunStart.Gpus, s.RunStart.GpuUuids = nil, nil // the node's, not the run's
}

// fillUnset sets each field of dst that is unset from src, recursively in
// messages both have; a map gets the keys it lacks, a list is left as it
// is. Unset is proto presence: an optional field given as 0 is set.
func fillUnset(dst, src protoreflect.Message) {
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			m := dst.Mutable(fd).Map()
			v.Map().Range(func(k protoreflect.MapKey, e protoreflect.Value) bool {
				if !m.Has(k) {
					m.Set(k, e)
				}
				return true
			})
		case fd.IsList():
		case fd.Message() != nil && dst.Has(fd):
			fillUnset(dst.Mutable(fd).Message(), v.Message())
		case !dst.Has(fd):
			dst.Set(fd, v)
		}
		return true
	})
}

// AddEnd folds a RunEnd from node.
func (s *State) AddEnd(node string, ev *trainmeterv1.RunEnd) {
	t := nanos(ev.GetTime())
	n := s.node(node)
	if !n.HasEnd || t >= n.EndMax {
		n.EndMax = t
		n.EndStatus, n.EndError = ev.GetEndStatus(), ev.GetEndError()
	}
	n.HasEnd = true
	s.foldBuckets()
}

// AddEval folds an Eval from node. Evals are kept sorted by time.
func (s *State) AddEval(node string, ev *trainmeterv1.Eval) {
	s.node(node)
	t := nanos(ev.GetTime())
	i := sort.Search(len(s.Evals), func(i int) bool { return nanos(s.Evals[i].GetTime()) > t })
	s.Evals = slices.Insert(s.Evals, i, proto.Clone(ev).(*trainmeterv1.Eval))
}

// AddWindow folds a RunWindow from node.
func (s *State) AddWindow(node string, w *trainmeterv1.RunWindow) {
	s.AddWindowBooked(node, w, nil, nil)
}

// AddWindowBooked folds a RunWindow from node and books its energy to the
// tariff bands (bands) and carbon intensities (carbon) in force over the
// window, each when not nil.
func (s *State) AddWindowBooked(node string, w *trainmeterv1.RunWindow, bands EnergyBands, carbon CarbonBooker) {
	n := s.node(node)
	start, end := nanos(w.GetStart()), nanos(w.GetEnd())
	if !s.HasWindow || start < s.WindowStart {
		s.WindowStart = start
	}
	if !s.HasWindow || end > s.WindowEnd {
		s.WindowEnd = end
	}
	s.HasWindow = true

	energy := windowEnergy(w)
	s.EnergyTotal += energy
	if (bands != nil || carbon != nil) && energy > 0 {
		from, to := windowSpan(w)
		if bands != nil {
			if s.EnergyByBand == nil {
				s.EnergyByBand = map[string]float64{}
			}
			bands.Split(from, to, energy, func(b string, j float64) { s.EnergyByBand[b] += j })
		}
		if carbon != nil {
			if s.CarbonByBand == nil {
				s.CarbonByBand = map[string]float64{}
			}
			carbon.BookCarbon(node, from, to, energy, func(k string, j float64) { s.CarbonByBand[k] += j })
		}
	}
	n.GpuSeconds += w.GetGpuSeconds()
	s.GapS += w.GetGapS()
	if w.GetEnergyEstimated() {
		s.EnergyEstimated = true
	}
	s.Tokens += w.GetTokens()
	s.TokensMeasured += w.GetTokensMeasured()
	s.Steps += w.GetSteps()
	s.Samples += w.GetSamples()
	s.DataWaitS += w.GetDataWaitS()
	s.ComputeS += w.GetComputeS()
	s.GpuSeconds += w.GetGpuSeconds()
	s.SharedGpuSeconds += w.GetSharedGpuSeconds()
	s.MaxSharingRuns = max(s.MaxSharingRuns, w.GetMaxSharingRuns())
	if m := w.GetShareMethod(); m != "" && !slices.Contains(s.ShareMethods, m) {
		s.ShareMethods = append(s.ShareMethods, m)
		slices.Sort(s.ShareMethods)
	}
	if w.GetVramPeakMib() > s.VramPeak {
		s.VramPeak = w.GetVramPeakMib()
	}
	s.VramSum += w.GetVramSumMib()
	s.VramSamples += w.GetVramSamples()
	for _, g := range w.GetGpus() {
		s.addGPU(node, g)
	}
	if w.LastLoss != nil && (!s.HasLoss || end > s.LastLossAt || (end == s.LastLossAt && node > s.LastLossBy)) {
		s.HasLoss = true
		s.LastLoss = w.GetLastLoss()
		s.LastLossAt = end
		s.LastLossBy = node
	}

	bucket := floorDiv(start, int64(time.Second))
	if !n.HasWindow || bucket > n.Watermark {
		n.Watermark = bucket
	}
	n.HasWindow = true

	if w.GetPhase() != trainmeterv1.Phase_PHASE_MEASURED {
		n.WarmupPeak = max(n.WarmupPeak, w.GetPeakPowerW())
		s.foldBuckets()
		return
	}
	if !s.HasMeasured || start < s.FirstMeasured {
		s.FirstMeasured = start
	}
	s.HasMeasured = true
	s.MeasuredWindows++
	s.StepsMeasured += w.GetSteps()
	s.SamplesMeasured += w.GetSamples()
	s.EnergyMeasured += energy
	s.EnergyIntegrated += w.GetEnergyIntegratedJ()
	if w.GetCounterOk() {
		s.CounterWindows++
		s.CounterSumOk += w.GetEnergyCounterJ()
		s.IntegratedSumOk += w.GetEnergyIntegratedJ()
	}
	span := max(0, float64(end-start)/1e9)
	s.MeasuredSpanS += span
	s.UncoveredSpanS += uncoveredShare(w) * span
	s.addPeak(node, bucket, w.GetPeakPowerW())
}

// windowEnergy is a window's energy: its counter's when that covered it.
func windowEnergy(w *trainmeterv1.RunWindow) float64 {
	if w.GetCounterOk() {
		return w.GetEnergyCounterJ()
	}
	return w.GetEnergyIntegratedJ()
}

// uncoveredShare is the part (0-1) of a window's time whose energy it does
// not hold: none when its counter covered every GPU; otherwise the share of
// its GPUs' time that was a gap (no power samples to integrate, no counter:
// an agent's downtime it could not bridge, a GPU that stopped answering).
func uncoveredShare(w *trainmeterv1.RunWindow) float64 {
	if w.GetCounterOk() && !w.GetEnergyEstimated() {
		return 0
	}
	span := w.GetEnd().AsTime().Sub(w.GetStart().AsTime()).Seconds() * float64(max(1, len(w.GetGpus())))
	if span <= 0 || w.GetGapS() <= 0 {
		return 0
	}
	return min(1, w.GetGapS()/span)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func (s *State) addGPU(node string, g uint32) {
	n := s.node(node) // a node stored apart carries its GPUs
	if i, found := slices.BinarySearch(n.Gpus, g); !found {
		n.Gpus = slices.Insert(n.Gpus, i, g)
	}
}

// Ended reports whether every node that sent a RunStart has ended it.
func (s *State) Ended() bool {
	started := false
	for _, n := range s.Nodes {
		if !n.Started {
			continue
		}
		started = true
		if !nodeEnded(n) {
			return false
		}
	}
	return started
}

// StartNanos returns the run start (Unix ns) and whether it is known.
func (s *State) StartNanos() (int64, bool) {
	if s.HasStart {
		return s.Start, true
	}
	if s.HasWindow {
		return s.WindowStart, true
	}
	return 0, false
}

func (s *State) endNanos() int64 {
	if s.Ended() {
		var end int64
		first := true
		for _, n := range s.Nodes {
			if n.Started && (first || n.EndMax > end) {
				end = n.EndMax
				first = false
			}
		}
		return end
	}
	return s.WindowEnd
}

// pausedBefore is the paused time (ns) before t.
func (s *State) pausedBefore(t int64) int64 {
	var d int64
	for i, a := range s.PauseStarts {
		b := min(s.PauseEnds[i], t)
		if b > a {
			d += b - a
		}
	}
	return d
}

// EndStatus is how the run ended: across nodes (by name), the first end
// status that is not ok, else ok; "ended" when no agent sent one (agents
// before end statuses); "" while the run is live.
func (s *State) EndStatus() string {
	st, _ := s.endStatusError()
	return st
}

// endStatusError is EndStatus and the cause that came with it: the
// EndError of the node whose status it is ("" for ok, ended and live).
func (s *State) endStatusError() (string, string) {
	if !s.Ended() {
		return "", ""
	}
	names := make([]string, 0, len(s.Nodes))
	for name, n := range s.Nodes {
		if n.Started {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	status := "ended"
	for _, name := range names {
		n := s.Nodes[name]
		switch st := n.EndStatus; st {
		case "":
		case "ok":
			status = st
		default:
			return st, n.EndError
		}
	}
	return status, ""
}

// price fills the report's cost figures (GPU time, energy, priority,
// repricing, total) with the collector's pricing; they read nothing else
// of the report, so Summary computes them alone.
func (s *State) price(p Pricing, r *trainmeterv1.RunReport) {
	r.GpuHours = s.GpuSeconds / 3600
	if !s.bookedCompute(p, r) {
		s.priceCompute(p, r)
	}
	r.EnergyKwh = s.EnergyTotal / 3.6e6
	if !s.bookedEnergy(p, r) {
		s.energyNow(p, r)
	}
	r.PriorityMultiplier = s.GetBooked().GetPriorityMultiplier()
	if r.PriorityMultiplier == 0 {
		r.PriorityMultiplier = p.PriorityMultiplier(s.GetRunStart().GetLabels())
	}
	s.reprice(r)
	if r.CostUsd != nil || r.EnergyCostUsd != nil {
		r.TotalCostUsd = ptr(r.GetCostUsd()*r.PriorityMultiplier + r.GetEnergyCostUsd())
	}
}

// Summary is what listings filter and order runs by without the whole
// report: the report's ended, end, total_cost_usd and metadata.model, as
// Report(p) gives them.
type Summary struct {
	Ended bool
	// Model is the run's metadata.model ("" when it has none).
	Model string
	// EndNanos is the report's end (Unix ns); HasEnd false when the run
	// has no start (its report has no end).
	EndNanos int64
	HasEnd   bool
	// StartNanos is the report's start (Unix ns), when HasEnd.
	StartNanos int64
	// TotalCostUSD is nil when the cost is unknown.
	TotalCostUSD *float64
}

// Summary computes the run's Summary with the collector's pricing: the
// same figures as Report(p), at a fraction of its work.
func (s *State) Summary(p Pricing) Summary {
	sum := Summary{Ended: s.Ended(), Model: s.GetRunStart().GetMetadata().GetModel()}
	if start, ok := s.StartNanos(); ok {
		sum.EndNanos, sum.HasEnd = max(s.endNanos(), start), true
		sum.StartNanos = start
	}
	r := &trainmeterv1.RunReport{}
	s.price(p, r)
	sum.TotalCostUSD = r.TotalCostUsd
	return sum
}

// Report computes the run's figures with the collector's pricing.
func (s *State) Report(p Pricing) *trainmeterv1.RunReport {
	r := &trainmeterv1.RunReport{RunId: s.RunId}
	start0 := s.GetRunStart()
	r.Metadata = &trainmeterv1.RunMetadata{}
	if m := start0.GetMetadata(); m != nil {
		r.Metadata = proto.Clone(m).(*trainmeterv1.RunMetadata)
	}
	start, hasStart := s.StartNanos()
	end := s.endNanos()
	r.Ended = s.Ended()
	if hasStart {
		r.Start = timestamppb.New(time.Unix(0, start).UTC())
		if end < start {
			end = start
		}
		r.End = timestamppb.New(time.Unix(0, end).UTC())
		r.PausedS = float64(s.pausedBefore(end)) / 1e9
		r.WallS = max(0, float64(end-start)/1e9-r.PausedS)
	}
	r.EndStatus, r.EndError = s.endStatusError()
	r.Resumes = uint32(len(s.PauseStarts))
	if s.HasMeasured {
		r.WarmupS = max(0, float64(s.FirstMeasured-start-s.pausedBefore(s.FirstMeasured))/1e9)
		if r.WarmupS > r.WallS {
			r.WarmupS = r.WallS
		}
	} else {
		r.WarmupS = r.WallS
	}
	measuredS := r.WallS - r.WarmupS

	r.TokensProcessed = s.Tokens
	r.TokensMeasured = s.TokensMeasured
	r.Steps = s.Steps
	r.DataWaitS = s.DataWaitS
	r.ComputeS = s.ComputeS
	r.GapS = s.GapS

	r.EnergyJ = s.EnergyMeasured
	r.EnergyTotalJ = s.EnergyTotal
	r.EnergyJIntegrated = s.EnergyIntegrated
	switch {
	case s.MeasuredWindows == 0:
		r.EnergyMethod = ""
	case s.CounterWindows == s.MeasuredWindows:
		r.EnergyMethod = "counter"
	case s.CounterWindows == 0:
		r.EnergyMethod = "integrated"
	default:
		r.EnergyMethod = "mixed"
	}
	// Against less than a joule of counter energy a percentage says nothing
	// and can overflow (FuzzAggregate: 9e-308 J counted, 4e9 J integrated
	// gave -Inf).
	if s.CounterWindows > 0 && s.CounterSumOk >= minDisagreementBaseJ {
		r.EnergyDisagreementPct = 100 * (s.CounterSumOk - s.IntegratedSumOk) / s.CounterSumOk
	}
	r.EnergyEstimated = s.EnergyEstimated
	rates := s.rates(r, measuredS)
	r.PeakPowerW = s.Peak()
	// The whole run's power does not depend on the warmup: a run that never
	// left it still shows what it drew.
	if r.WallS > 0 {
		r.AvgPowerTotalW = r.EnergyTotalJ / r.WallS
	}
	var warmupPeak float64
	for _, n := range s.Nodes {
		warmupPeak += n.WarmupPeak
	}
	r.PeakPowerTotalW = max(r.PeakPowerW, warmupPeak)
	r.VramPeakMb = s.VramPeak
	if s.VramSamples > 0 {
		r.VramAvgMb = s.VramSum / float64(s.VramSamples)
	}
	var gpus uint32
	for _, n := range s.Nodes {
		gpus += uint32(len(n.Gpus))
	}
	r.Gpus = gpus
	r.Nodes = uint32(len(s.Nodes))
	r.GpuName = start0.GetGpuName()
	if u := energy.UncertaintyPct(r.EnergyMethod, r.GpuName, measuredS); !math.IsNaN(u) {
		r.EnergyUncertaintyPct = &u
	}

	s.price(p, r)
	r.BudgetScope = start0.GetBudgetScope()
	if l := start0.GetLabels(); len(l) > 0 {
		r.Labels = maps.Clone(l)
	}
	r.Pue = p.EffectivePUE()
	if co2, bands, ok := p.CO2(s.CarbonByBand, s.EnergyTotal); ok {
		r.Co2Kg = &co2
		for _, b := range bands {
			r.Co2Bands = append(r.Co2Bands, &trainmeterv1.CarbonBand{Zone: b.Zone, Source: b.Source, Kwh: b.KWh, Gco2PerKwh: b.GPerKWh, Co2Kg: b.Kg})
		}
		var g float64
		g, r.Co2Source, r.CarbonZone = cost.CO2Summary(bands)
		r.Co2Gco2PerKwh = &g
	}
	s.derived(r, measuredS, rates)

	for _, e := range s.Evals {
		r.Evals = append(r.Evals, proto.Clone(e).(*trainmeterv1.Eval))
	}
	if s.HasLoss {
		r.LastLoss = ptr(s.LastLoss)
	}
	r.Incomplete = s.Incomplete
	r.LostBatches = s.LostBatches
	r.LostTokens = s.LostTokens
	r.LostEnergyJ = s.LostEnergyJ
	r.LostGpuSeconds = s.LostGpuSeconds
	r.LostHostEnergyJ = s.LostHostEnergyJ
	r.GpuShareMethod = ShareMethod(s.ShareMethods)
	r.SharedGpuS = s.SharedGpuSeconds
	r.MaxSharingRuns = s.MaxSharingRuns
	r.User = start0.GetUser()
	r.Attribution = start0.GetAttribution()
	if start0 != nil {
		r.Uid = ptr(start0.GetUid())
	}
	r.LostReasons = slices.Clone(s.LostReasons)
	s.hostEnergy(r)
	return r
}

// The reasons a rate after warmup is unknown (RunReport.rates_unavailable,
// docs/measurement.md "Rates").
const (
	// Every rate is unknown.
	RatesInWarmup    = "in_warmup"     // no measured window
	RatesTooShort    = "too_short"     // under MinRateS after warmup
	RatesTooFewSteps = "too_few_steps" // under MinRateSteps after warmup
	// Some are.
	RatesNoTokens = "no_tokens" // no tokens after warmup: tok/s and per-token figures
	RatesNoEnergy = "no_energy" // under MinRateS after warmup with energy: power and per-token figures
)

// A rate after warmup needs at least MinRateS seconds and MinRateSteps step
// events after warmup: over less, one step more or less moves it by
// anything (a run 0.1 s past its warmup reported 1,869 tok/s for a trainer
// steady at 1,000).
const (
	MinRateS     = 1.0
	MinRateSteps = 2
)

// knownRates says which rates after warmup are known.
type knownRates struct {
	period, tokens, energy bool
}

// rates sets the rates after warmup (tok/s, J/token, average power), the
// energy coverage and rates_unavailable. J/token and average power are
// taken over the part of the time after warmup whose energy was measured:
// with a part missing (an agent restart the counter could not bridge), all
// the tokens over part of the energy would understate J/token by that part.
func (s *State) rates(r *trainmeterv1.RunReport, measuredS float64) knownRates {
	var k knownRates
	coverage := 1.0
	if s.HasMeasured && s.MeasuredSpanS > 0 {
		coverage = max(0, 1-s.UncoveredSpanS/s.MeasuredSpanS)
		r.EnergyCoverage = ptr(coverage)
	}
	switch {
	case !s.HasMeasured || measuredS <= 0:
		r.RatesUnavailable = RatesInWarmup
		return k
	case measuredS < MinRateS:
		r.RatesUnavailable = RatesTooShort
		return k
	case s.StepsMeasured < MinRateSteps:
		r.RatesUnavailable = RatesTooFewSteps
		return k
	}
	k.period = true
	// The tokens of the time with energy: tokens_measured × coverage. The
	// tokens a rank's tokens_total credits after a restart arrive in a
	// window after the gap, not in the time they were processed, so which
	// window holds a token says little there; the share of the time does.
	// J/token is then avg_power_w / tok_per_s.
	tokens := float64(s.TokensMeasured) * coverage
	k.energy = s.MeasuredWindows > 0 && measuredS*coverage >= MinRateS
	k.tokens = s.TokensMeasured > 0
	if k.tokens {
		r.TokPerS = ptr(float64(s.TokensMeasured) / measuredS)
	}
	if k.energy {
		r.AvgPowerW = ptr(s.EnergyMeasured / (measuredS * coverage))
		if k.tokens && tokens >= 1 {
			r.JPerToken = ptr(s.EnergyMeasured / tokens)
		}
	}
	switch {
	case !k.tokens:
		r.RatesUnavailable = RatesNoTokens
	case r.JPerToken == nil:
		r.RatesUnavailable = RatesNoEnergy
	}
	return k
}

// hostEnergy sets the run's CPU, DRAM and node energy: node energy is the
// GPUs' whole-run energy plus CPU plus DRAM, known only where the CPU's is.
func (s *State) hostEnergy(r *trainmeterv1.RunReport) {
	if !s.HasHostCpu {
		return
	}
	r.CpuEnergyJ = ptr(s.HostCpuEnergyJ)
	node := r.EnergyTotalJ + s.HostCpuEnergyJ
	if s.HasHostDram {
		r.DramEnergyJ = ptr(s.HostDramEnergyJ)
		node += s.HostDramEnergyJ
	}
	r.NodeEnergyJ = ptr(node)
	r.HostEnergySplit = ShareMethod(s.HostSplits)
}

// priceCompute sets cost_usd (GPU-hours × price) and where the price came
// from, at p's prices now: for a run with no GPU time booked (bookedCompute).
// Each node's GPU-seconds are priced at that node's price (the
// run_start price for all, else the node's configured price, else the
// catalog's, else the default); a run with no GPU time yet gets the starting
// node's price. A run with any GPU-time that has no price has no compute
// cost.
func (s *State) priceCompute(p Pricing, r *trainmeterv1.RunReport) {
	var names []string
	for name, n := range s.Nodes {
		if n.GpuSeconds > 0 {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		names = []string{s.StartNode} // priced for no GPU time
	}
	var usd, first float64
	source := ""
	for _, name := range names {
		price, src, ok := p.GPUPrice(s.GetRunStart().GetGpuPricePerHour(), name, s.GetRunStart().GetGpuName())
		if !ok {
			return
		}
		usd += s.Nodes[name].GetGpuSeconds() / 3600 * price
		switch {
		case source == "":
			source = src
		case source != src:
			source = cost.SourceMixed
		}
		if first == 0 {
			first = price
		}
	}
	r.CostUsd = &usd
	r.PriceSource = source
	if r.GpuHours > 0 {
		first = usd / r.GpuHours // the GPU-time-weighted mean
	}
	r.GpuPricePerHour = &first
}

// energyNow prices the run's energy at p: for a run with no energy booked.
func (s *State) energyNow(p Pricing, r *trainmeterv1.RunReport) {
	usd, bands, ok := p.EnergyCost(s.EnergyByBand, s.EnergyTotal)
	if !ok {
		return
	}
	r.EnergyCostUsd = &usd
	r.EnergyIncluded = p.EnergyIncluded
	for _, b := range bands {
		r.EnergyBands = append(r.EnergyBands, &trainmeterv1.EnergyBandCost{Band: b.Band, Kwh: b.KWh, UsdPerKwh: b.USDPerKWh, CostUsd: b.USD})
	}
}

func ptr[T any](v T) *T { return &v }

// epochsDone is samples / dataset_size, else steps × planned_epochs /
// planned_steps, else the latest eval's epoch.
func (s *State) epochsDone() (float64, bool) {
	pl := s.GetRunStart()
	switch {
	case pl.GetDatasetSize() > 0 && s.Samples > 0:
		return float64(s.Samples) / float64(pl.GetDatasetSize()), true
	case pl.GetPlannedEpochs() > 0 && pl.GetPlannedSteps() > 0 && s.Steps > 0:
		return float64(s.Steps) * float64(pl.GetPlannedEpochs()) / float64(pl.GetPlannedSteps()), true
	}
	var e int64
	for _, ev := range s.Evals {
		e = max(e, ev.GetEpoch())
	}
	return float64(e), e > 0
}

// lastAccuracy is the accuracy of the latest eval that has one.
func (s *State) lastAccuracy() (float64, bool) {
	for i := len(s.Evals) - 1; i >= 0; i-- {
		if s.Evals[i].Accuracy != nil {
			return s.Evals[i].GetAccuracy(), true
		}
	}
	return 0, false
}

// derived fills the per-unit costs, the forecast and the throughput and
// compute report (docs/costs.md).
func (s *State) derived(r *trainmeterv1.RunReport, measuredS float64, k knownRates) {
	total := r.GetTotalCostUsd()
	priced := total > 0
	pl := s.GetRunStart()
	r.Samples = s.Samples
	if s.Tokens > 0 && r.TotalCostUsd != nil {
		r.UsdPerMtok = ptr(total / float64(s.Tokens) * 1e6)
	}
	if !k.period {
		measuredS = 0 // no rate after warmup is known
	}
	if priced && s.Samples > 0 {
		r.UsdPerSample = ptr(total / float64(s.Samples))
	}
	epochs, hasEpochs := s.epochsDone()
	if hasEpochs {
		r.EpochsDone = ptr(epochs)
		if priced {
			r.UsdPerEpoch = ptr(total / epochs)
		}
	}
	if acc, ok := s.lastAccuracy(); ok {
		pts := cost.AccuracyPoints(acc)
		r.AccuracyPoints = ptr(pts)
		if priced && pts > 0 {
			r.UsdPerAccuracyPoint = ptr(total / pts)
		}
	}

	var stepsPerS float64
	if measuredS > 0 && s.StepsMeasured > 0 {
		stepsPerS = float64(s.StepsMeasured) / measuredS
		r.StepsPerS = ptr(stepsPerS)
	}

	projected := total
	prog, hasPlan := cost.PlanProgress(s.Tokens, pl.GetPlannedTokens(), s.Steps, pl.GetPlannedSteps(), epochs, pl.GetPlannedEpochs())
	if hasPlan {
		r.ProjectionBasis = prog.Basis
		r.Progress = ptr(prog.Fraction())
		// The pace after warmup, in the basis's unit (0: not measured yet).
		var rate float64
		switch {
		case prog.Basis == "tokens":
			rate = r.GetTokPerS()
		case prog.Basis == "steps":
			rate = stepsPerS
		case pl.GetDatasetSize() > 0 && measuredS > 0:
			rate = float64(s.SamplesMeasured) / measuredS / float64(pl.GetDatasetSize())
		case pl.GetPlannedSteps() > 0:
			rate = stepsPerS * float64(pl.GetPlannedEpochs()) / float64(pl.GetPlannedSteps())
		}
		var remaining float64
		projected, remaining = cost.Forecast(prog, rate, r.WallS, total, r.Ended)
		if r.Start != nil {
			r.EstTotalS = ptr(r.WallS + remaining)
		}
	}
	if r.TotalCostUsd != nil {
		r.ProjectedCostUsd = &projected
	}
	switch {
	case pl.GetDatasetSize() > 0 && s.SamplesMeasured > 0 && measuredS > 0:
		r.EpochS = ptr(float64(pl.GetDatasetSize()) / (float64(s.SamplesMeasured) / measuredS))
	case pl.GetPlannedEpochs() > 0 && pl.GetPlannedSteps() > 0 && stepsPerS > 0:
		r.EpochS = ptr(float64(pl.GetPlannedSteps()) / float64(pl.GetPlannedEpochs()) / stepsPerS)
	}
	peak, hasPeak := cost.PeakTFLOPS(s.GetRunStart().GetGpuName(), s.GetRunStart().GetMetadata().GetPrecision())
	if hasPeak {
		r.PeakTflops = ptr(peak)
	}
	if pl.GetParams() == 0 {
		return
	}
	params := float64(pl.GetParams())
	if s.Tokens > 0 {
		r.FlopsTotal = ptr(cost.TrainingFLOPs(params, float64(s.Tokens)))
		if s.Steps > 0 {
			r.FlopsPerStep = ptr(cost.TrainingFLOPs(params, float64(s.Tokens)/float64(s.Steps)))
		}
	}
	if hasPeak && r.GetTokPerS() > 0 && r.Gpus > 0 {
		r.Mfu = ptr(cost.TrainingFLOPs(params, r.GetTokPerS()) / (float64(r.Gpus) * peak * 1e12))
	}
	if r.JPerToken != nil {
		// J per token over FLOPs per token: the same energy coverage.
		r.JPerPflop = ptr(r.GetJPerToken() / (cost.TrainingFLOPs(params, 1) / 1e15))
	}
}

// eventBody is what every kind of run event has.
type eventBody interface {
	GetRunId() string
	GetTime() *timestamppb.Timestamp
}

// body is the event a RunEvent holds, whichever kind it is; nil when none.
func body(e *trainmeterv1.RunEvent) eventBody {
	m := e.ProtoReflect()
	fd := m.WhichOneof(m.Descriptor().Oneofs().ByName("event"))
	if fd == nil {
		return nil
	}
	b, _ := m.Get(fd).Message().Interface().(eventBody)
	return b
}

// EventTime is a run event's time, whichever kind of event it is.
func EventTime(e *trainmeterv1.RunEvent) *timestamppb.Timestamp {
	if b := body(e); b != nil {
		return b.GetTime()
	}
	return nil
}

// EventRunID is a run event's run id, whichever kind of event it is.
func EventRunID(e *trainmeterv1.RunEvent) string {
	if b := body(e); b != nil {
		return b.GetRunId()
	}
	return ""
}

// ShareMethod names how a run's GPUs were split over its windows: exclusive
// when never shared, the one rule used when shared, mixed when several were
// (docs/measurement.md, "Shared GPUs and idle"); "" for windows from agents
// before sharing was measured.
func ShareMethod(methods []string) string {
	var shared []string
	sawExclusive := false
	for _, m := range methods {
		switch m {
		case "":
		case "exclusive":
			sawExclusive = true
		case "mixed":
			return "mixed"
		default:
			if !slices.Contains(shared, m) {
				shared = append(shared, m)
			}
		}
	}
	switch {
	case len(shared) > 1:
		return "mixed"
	case len(shared) == 1:
		return shared[0]
	case sawExclusive:
		return "exclusive"
	}
	return ""
}

// minDisagreementBaseJ is the least counter energy energy_disagreement_pct
// is taken against.
const minDisagreementBaseJ = 1.0
