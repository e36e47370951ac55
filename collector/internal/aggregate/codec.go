package aggregate

import (
	"encoding/json"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
)

// The store rewrites a run's aggregate at every commit that touches the run
// and decodes it for every listing, so its encoding is on the collector's
// hot path: protobuf (storev1.Aggregate), which encodes several times faster
// than encoding/json's reflection over these maps (docs/benchmarks.md).
// Aggregates written as JSON by earlier versions are still read; the next
// commit rewrites them as protobuf.

// Marshal encodes the state, node states included.
func (s *State) Marshal() ([]byte, error) { return proto.Marshal(s.toProto(true)) }

// The store keeps a run's node states apart from the rest of its aggregate,
// each under a key of its own, and writes at each commit only the nodes it
// changed: with a thousand nodes in one run, rewriting every node's state
// (~0.9 KB each, mostly open peak buckets) at every commit bounded the
// collector (docs/benchmarks.md).

// MarshalApart encodes the state without its node states; MarshalNode
// encodes those, and a state read back with Unmarshal gets them from
// UnmarshalNode.
func (s *State) MarshalApart() ([]byte, error) {
	if !s.nodesApart {
		// Stored with its nodes inside until now: every node is to be
		// written apart, changed or not.
		for name := range s.Nodes {
			s.markChanged(name)
		}
		s.nodesApart = true
	}
	a := s.toProto(false)
	a.NodesApart = true
	return proto.Marshal(a)
}

// NodesApart reports whether the state was decoded from (or last encoded
// with) MarshalApart's encoding, whose node states are read and written
// one by one (UnmarshalNode, MarshalNode).
func (s *State) NodesApart() bool { return s.nodesApart }

// MarshalNode encodes one node's state.
func (s *State) MarshalNode(name string) ([]byte, error) {
	n := s.Nodes[name]
	if n == nil {
		return nil, fmt.Errorf("aggregate: run %q has no node %q", s.RunID, name)
	}
	p := nodeToProto(n)
	p.Gpus = s.GPUs[name]
	return proto.Marshal(p)
}

// UnmarshalNode adds a node's state written by MarshalNode.
func (s *State) UnmarshalNode(name string, b []byte) error {
	var n storev1.Node
	if err := proto.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("aggregate: decode node %q: %w", name, err)
	}
	if s.Nodes == nil {
		s.Nodes = map[string]*NodeState{}
	}
	s.Nodes[name] = nodeFromProto(&n)
	if len(n.GetGpus()) > 0 {
		if s.GPUs == nil {
			s.GPUs = map[string][]uint32{}
		}
		s.GPUs[name] = n.GetGpus()
	}
	return nil
}

// TakeChangedNodes returns, sorted, the nodes whose state changed since the
// last call, and forgets them. A state decoded from an encoding that held
// its nodes inside (Marshal, or JSON) counts every node as changed, so that
// the first MarshalApart of it is followed by all of them.
func (s *State) TakeChangedNodes() []string {
	names := make([]string, 0, len(s.changed))
	for name := range s.changed {
		if s.Nodes[name] != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	clear(s.changed)
	return names
}

// ForgetChangedNodes forgets which nodes changed, for a state stored with
// its nodes inside (Marshal).
func (s *State) ForgetChangedNodes() { clear(s.changed) }

func (s *State) markChanged(name string) {
	if s.changed == nil {
		s.changed = map[string]struct{}{}
	}
	s.changed[name] = struct{}{}
}

// Unmarshal decodes a State written by Marshal (or, before protobuf, as JSON).
func Unmarshal(b []byte) (*State, error) {
	s := &State{}
	if len(b) > 0 && b[0] == '{' {
		// A protobuf encoding never starts with '{' (field 15, wire type 3:
		// a group, which proto3 does not have).
		if err := decodeJSON(b, s); err != nil {
			return nil, fmt.Errorf("aggregate: decode: %w", err)
		}
	} else {
		var m storev1.Aggregate
		if err := proto.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("aggregate: decode: %w", err)
		}
		s.fromProto(&m)
	}
	if s.Nodes == nil {
		s.Nodes = map[string]*NodeState{}
	}
	if !s.nodesApart {
		for name := range s.Nodes {
			s.markChanged(name)
		}
	}
	return s, nil
}

func (s *State) toProto(withNodes bool) *storev1.Aggregate {
	m := s.Metadata
	p := s.Plan
	a := &storev1.Aggregate{
		RunId:     s.RunID,
		HasStart:  s.HasStart,
		StartNode: s.StartNode,
		Start:     s.Start,
		Metadata: &storev1.Metadata{
			Model: m.Model, Dataset: m.Dataset, Backend: m.Backend, Optimizer: m.Optimizer,
			BatchSize: m.BatchSize, GradAccum: m.GradAccum, SeqLen: m.SeqLen, Precision: m.Precision,
			Seed: m.Seed, Notes: m.Notes, HasBatchSize: m.HasBatchSize, HasGradAccum: m.HasGradAccum,
			HasSeqLen: m.HasSeqLen, HasSeed: m.HasSeed,
		},
		GpuName:         s.GPUName,
		GpuPricePerHour: s.GPUPricePerHour,
		Plan: &storev1.Plan{
			BudgetScope: p.BudgetScope, Labels: p.Labels, PlannedSteps: p.PlannedSteps,
			PlannedTokens: p.PlannedTokens, PlannedEpochs: p.PlannedEpochs, Params: p.Params,
			DatasetSize: p.DatasetSize, NumWorkers: p.NumWorkers, PrefetchFactor: p.PrefetchFactor,
			TargetGpuUtilization: p.TargetGPUUtilization, MaxRamUsage: p.MaxRAMUsage,
			AdjustmentInterval: p.AdjustmentInterval, HasNumWorkers: p.HasNumWorkers,
		},
		HasWindow:        s.HasWindow,
		WindowStart:      s.WindowStart,
		WindowEnd:        s.WindowEnd,
		HasMeasured:      s.HasMeasured,
		FirstMeasured:    s.FirstMeasured,
		MeasuredWindows:  s.MeasuredWindows,
		CounterWindows:   s.CounterWindows,
		EnergyMeasured:   s.EnergyMeasured,
		EnergyTotal:      s.EnergyTotal,
		EnergyIntegrated: s.EnergyIntegrated,
		CounterSumOk:     s.CounterSumOK,
		IntegratedSumOk:  s.IntegratedSumOK,
		EnergyEstimated:  s.EnergyEstimated,
		GapS:             s.GapS,
		EnergyByBand:     s.EnergyByBand,
		CarbonByBand:     s.CarbonByBand,
		Tokens:           s.Tokens,
		TokensMeasured:   s.TokensMeasured,
		Steps:            s.Steps,
		Samples:          s.Samples,
		StepsMeasured:    s.StepsMeasured,
		SamplesMeasured:  s.SamplesMeasured,
		DataWaitS:        s.DataWaitS,
		ComputeS:         s.ComputeS,
		GpuSeconds:       s.GPUSeconds,
		VramPeak:         s.VRAMPeak,
		VramSum:          s.VRAMSum,
		VramSamples:      s.VRAMSamples,
		PeakFolded:       s.PeakFolded,
		MaxBucket:        s.MaxBucket,
		HasMaxBucket:     s.HasMaxBucket,
		FoldedUpTo:       s.FoldedUpTo,
		HasFolded:        s.HasFolded,
		HasLoss:          s.HasLoss,
		LastLoss:         s.LastLoss,
		LastLossAt:       s.LastLossAt,
		LastLossBy:       s.LastLossBy,
		Incomplete:       s.Incomplete,
		LostBatches:      s.LostBatches,
		LostTokens:       s.LostTokens,
		LostEnergyJ:      s.LostEnergyJ,
		LostGpuSeconds:   s.LostGPUSeconds,
		LostHostEnergyJ:  s.LostHostEnergyJ,

		LockedGpuSeconds:     s.Booked.GPUSeconds,
		UnpricedGpuSeconds:   s.Booked.UnpricedGPUSeconds,
		ComputeUsd:           s.Booked.ComputeUSD,
		PriceSources:         s.Booked.PriceSources,
		LockedEnergyJ:        s.Booked.EnergyJ,
		UnpricedEnergyJ:      s.Booked.UnpricedEnergyJ,
		EnergyUsd:            s.Booked.EnergyUSD,
		LockedBandJ:          s.Booked.BandJ,
		LockedBandUsd:        s.Booked.BandUSD,
		IncludedEnergyJ:      s.Booked.IncludedEnergyJ,
		PriorityMultiplier:   s.Booked.PriorityMultiplier,
		Repriced:             s.Booked.Repriced,
		RepricedAt:           s.Booked.RepricedAt,
		PreviousCostUsd:      s.Booked.PreviousCostUSD,
		PreviousTotalCostUsd: s.Booked.PreviousTotalCostUSD,
		RepriceReason:        s.Booked.RepriceReason,
		LostReasons:          s.LostReasons,
		PauseStarts:          s.PauseStarts,
		PauseEnds:            s.PauseEnds,
		MeasuredSpanS:        s.MeasuredSpanS,
		UncoveredSpanS:       s.UncoveredSpanS,

		SharedGpuSeconds: s.SharedGPUSeconds,
		ShareMethods:     s.ShareMethods,
		MaxSharingRuns:   s.MaxSharingRuns,
		User:             s.User,
		Uid:              s.UID,
		HasUid:           s.HasUID,

		HostCpuEnergyJ:  s.HostCPUEnergyJ,
		HostDramEnergyJ: s.HostDRAMEnergyJ,
		HasHostCpu:      s.HasHostCPU,
		HasHostDram:     s.HasHostDRAM,
		HostSplits:      s.HostSplits,
	}
	a.EndedSeenAt = s.EndedSeenAt
	if len(s.RefusedStarts) > 0 {
		a.RefusedStarts = make(map[string]*storev1.RefusedStart, len(s.RefusedStarts))
		for node, r := range s.RefusedStarts {
			a.RefusedStarts[node] = &storev1.RefusedStart{First: r.First, Latest: r.Latest}
		}
	}
	if withNodes && len(s.Nodes) > 0 {
		a.Nodes = make(map[string]*storev1.Node, len(s.Nodes))
		for name, n := range s.Nodes {
			a.Nodes[name] = nodeToProto(n)
		}
	}
	if len(s.GPUs) > 0 {
		a.Gpus = make(map[string]*storev1.GpuIndices, len(s.GPUs))
		for node, list := range s.GPUs {
			if _, apart := s.Nodes[node]; apart && !withNodes {
				continue // in the node's own record (MarshalNode)
			}
			a.Gpus[node] = &storev1.GpuIndices{Indices: list}
		}
	}
	if len(s.Evals) > 0 {
		a.Evals = make([]*storev1.Eval, len(s.Evals))
		for i, e := range s.Evals {
			a.Evals[i] = &storev1.Eval{
				Node: e.Node, Time: e.Time, Epoch: e.Epoch, ValLoss: e.ValLoss, Accuracy: e.Accuracy,
				HasValLoss: e.HasValLoss, HasAccuracy: e.HasAccuracy,
			}
		}
	}
	return a
}

func (s *State) fromProto(a *storev1.Aggregate) {
	m := a.GetMetadata()
	p := a.GetPlan()
	*s = State{
		RunID:     a.GetRunId(),
		HasStart:  a.GetHasStart(),
		StartNode: a.GetStartNode(),
		Start:     a.GetStart(),
		Metadata: Metadata{
			Model: m.GetModel(), Dataset: m.GetDataset(), Backend: m.GetBackend(), Optimizer: m.GetOptimizer(),
			BatchSize: m.GetBatchSize(), GradAccum: m.GetGradAccum(), SeqLen: m.GetSeqLen(),
			Precision: m.GetPrecision(), Seed: m.GetSeed(), Notes: m.GetNotes(),
			HasBatchSize: m.GetHasBatchSize(), HasGradAccum: m.GetHasGradAccum(),
			HasSeqLen: m.GetHasSeqLen(), HasSeed: m.GetHasSeed(),
		},
		GPUName:         a.GetGpuName(),
		GPUPricePerHour: a.GetGpuPricePerHour(),
		Plan: Plan{
			BudgetScope: p.GetBudgetScope(), Labels: p.GetLabels(), PlannedSteps: p.GetPlannedSteps(),
			PlannedTokens: p.GetPlannedTokens(), PlannedEpochs: p.GetPlannedEpochs(), Params: p.GetParams(),
			DatasetSize: p.GetDatasetSize(), NumWorkers: p.GetNumWorkers(), PrefetchFactor: p.GetPrefetchFactor(),
			TargetGPUUtilization: p.GetTargetGpuUtilization(), MaxRAMUsage: p.GetMaxRamUsage(),
			AdjustmentInterval: p.GetAdjustmentInterval(), HasNumWorkers: hasNumWorkers(p),
		},
		HasWindow:        a.GetHasWindow(),
		WindowStart:      a.GetWindowStart(),
		WindowEnd:        a.GetWindowEnd(),
		HasMeasured:      a.GetHasMeasured(),
		FirstMeasured:    a.GetFirstMeasured(),
		MeasuredWindows:  a.GetMeasuredWindows(),
		CounterWindows:   a.GetCounterWindows(),
		EnergyMeasured:   a.GetEnergyMeasured(),
		EnergyTotal:      a.GetEnergyTotal(),
		EnergyIntegrated: a.GetEnergyIntegrated(),
		CounterSumOK:     a.GetCounterSumOk(),
		IntegratedSumOK:  a.GetIntegratedSumOk(),
		EnergyEstimated:  a.GetEnergyEstimated(),
		GapS:             a.GetGapS(),
		EnergyByBand:     a.GetEnergyByBand(),
		CarbonByBand:     a.GetCarbonByBand(),
		Tokens:           a.GetTokens(),
		TokensMeasured:   a.GetTokensMeasured(),
		Steps:            a.GetSteps(),
		Samples:          a.GetSamples(),
		StepsMeasured:    a.GetStepsMeasured(),
		SamplesMeasured:  a.GetSamplesMeasured(),
		DataWaitS:        a.GetDataWaitS(),
		ComputeS:         a.GetComputeS(),
		GPUSeconds:       a.GetGpuSeconds(),
		VRAMPeak:         a.GetVramPeak(),
		VRAMSum:          a.GetVramSum(),
		VRAMSamples:      a.GetVramSamples(),
		PeakFolded:       a.GetPeakFolded(),
		MaxBucket:        a.GetMaxBucket(),
		HasMaxBucket:     a.GetHasMaxBucket(),
		FoldedUpTo:       a.GetFoldedUpTo(),
		HasFolded:        a.GetHasFolded(),
		HasLoss:          a.GetHasLoss(),
		LastLoss:         a.GetLastLoss(),
		LastLossAt:       a.GetLastLossAt(),
		LastLossBy:       a.GetLastLossBy(),
		Incomplete:       a.GetIncomplete(),
		LostBatches:      a.GetLostBatches(),
		LostTokens:       a.GetLostTokens(),
		LostEnergyJ:      a.GetLostEnergyJ(),
		LostGPUSeconds:   a.GetLostGpuSeconds(),
		LostHostEnergyJ:  a.GetLostHostEnergyJ(),

		Booked: Booking{
			GPUSeconds: a.GetLockedGpuSeconds(), UnpricedGPUSeconds: a.GetUnpricedGpuSeconds(),
			ComputeUSD: a.GetComputeUsd(), PriceSources: a.GetPriceSources(),
			EnergyJ: a.GetLockedEnergyJ(), UnpricedEnergyJ: a.GetUnpricedEnergyJ(), EnergyUSD: a.GetEnergyUsd(),
			BandJ: a.GetLockedBandJ(), BandUSD: a.GetLockedBandUsd(), IncludedEnergyJ: a.GetIncludedEnergyJ(),
			PriorityMultiplier: a.GetPriorityMultiplier(),
			Repriced:           a.GetRepriced(), RepricedAt: a.GetRepricedAt(), PreviousCostUSD: a.PreviousCostUsd,
			PreviousTotalCostUSD: a.PreviousTotalCostUsd, RepriceReason: a.GetRepriceReason(),
		},
		LostReasons:    a.GetLostReasons(),
		PauseStarts:    a.GetPauseStarts(),
		PauseEnds:      a.GetPauseEnds(),
		MeasuredSpanS:  a.GetMeasuredSpanS(),
		UncoveredSpanS: a.GetUncoveredSpanS(),

		SharedGPUSeconds: a.GetSharedGpuSeconds(),
		ShareMethods:     a.GetShareMethods(),
		MaxSharingRuns:   a.GetMaxSharingRuns(),
		User:             a.GetUser(),
		UID:              a.GetUid(),
		HasUID:           a.GetHasUid(),

		HostCPUEnergyJ:  a.GetHostCpuEnergyJ(),
		HostDRAMEnergyJ: a.GetHostDramEnergyJ(),
		HasHostCPU:      a.GetHasHostCpu(),
		HasHostDRAM:     a.GetHasHostDram(),
		HostSplits:      a.GetHostSplits(),
	}
	s.EndedSeenAt = a.GetEndedSeenAt()
	if len(a.GetRefusedStarts()) > 0 {
		s.RefusedStarts = make(map[string]RefusedStart, len(a.GetRefusedStarts()))
		for node, r := range a.GetRefusedStarts() {
			s.RefusedStarts[node] = RefusedStart{First: r.GetFirst(), Latest: r.GetLatest()}
		}
	}
	s.nodesApart = a.GetNodesApart()
	if len(a.GetNodes()) > 0 {
		s.Nodes = make(map[string]*NodeState, len(a.GetNodes()))
		for name, n := range a.GetNodes() {
			s.Nodes[name] = nodeFromProto(n)
		}
	}
	if len(a.GetGpus()) > 0 {
		s.GPUs = make(map[string][]uint32, len(a.GetGpus()))
		for node, list := range a.GetGpus() {
			s.GPUs[node] = list.GetIndices()
		}
	}
	if len(a.GetEvals()) > 0 {
		s.Evals = make([]EvalRecord, len(a.GetEvals()))
		for i, e := range a.GetEvals() {
			s.Evals[i] = EvalRecord{
				Node: e.GetNode(), Time: e.GetTime(), Epoch: e.GetEpoch(), ValLoss: e.GetValLoss(),
				Accuracy: e.GetAccuracy(), HasValLoss: e.GetHasValLoss(), HasAccuracy: e.GetHasAccuracy(),
			}
		}
	}
}

func nodeToProto(n *NodeState) *storev1.Node {
	return &storev1.Node{
		Started: n.Started, StartMin: n.StartMin, StartMax: n.StartMax, HasEnd: n.HasEnd,
		EndMax: n.EndMax, Watermark: n.Watermark, HasWindow: n.HasWindow, GpuSeconds: n.GPUSeconds,
		PeakSeconds: n.PeakSeconds, PeakWatts: n.PeakWatts, WarmupPeak: n.WarmupPeak, EndStatus: n.EndStatus,
		EndError: n.EndError,
	}
}

func nodeFromProto(n *storev1.Node) *NodeState {
	return &NodeState{
		Started: n.GetStarted(), StartMin: n.GetStartMin(), StartMax: n.GetStartMax(),
		HasEnd: n.GetHasEnd(), EndMax: n.GetEndMax(), Watermark: n.GetWatermark(),
		HasWindow: n.GetHasWindow(), GPUSeconds: n.GetGpuSeconds(),
		PeakSeconds: n.GetPeakSeconds(), PeakWatts: n.GetPeakWatts(), WarmupPeak: n.GetWarmupPeak(), EndStatus: n.GetEndStatus(),
		EndError: n.GetEndError(),
	}
}

// decodeJSON reads an aggregate of an earlier version, whose open peak
// buckets were a map of second -> node -> W.
func decodeJSON(b []byte, s *State) error {
	var legacy struct {
		*State
		PeakBuckets map[int64]map[string]float64 `json:"peak_buckets"`
	}
	legacy.State = s
	if err := json.Unmarshal(b, &legacy); err != nil {
		return err
	}
	secs := make([]int64, 0, len(legacy.PeakBuckets))
	for sec := range legacy.PeakBuckets {
		secs = append(secs, sec)
	}
	slices.Sort(secs)
	for _, sec := range secs {
		for node, w := range legacy.PeakBuckets[sec] {
			n := s.node(node)
			n.PeakSeconds = append(n.PeakSeconds, sec)
			n.PeakWatts = append(n.PeakWatts, w)
		}
	}
	return nil
}
