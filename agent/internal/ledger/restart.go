package ledger

import (
	"errors"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Surviving an agent restart (kill -9 included).
//
// After every closed window the agent persists a Snapshot: the end of the
// window, each GPU's raw energy counter at that instant, and the runs then
// active with the cumulative tokens their ranks had shipped. A restarted
// agent restores the runs and, for each GPU whose counter kept counting (same
// UUID, no reset), bridges the downtime with the counter difference. The
// bridge is held until a rank of the run comes back (the Python client
// reconnects and re-sends run_start): then it is shipped as segments flagged
// restart_bridge, and the rank's tokens_total credits the steps whose events
// were lost. If no rank returns within the grace period, the run is ended at
// the checkpoint and nothing is attributed to it for the downtime.

// DefaultRejoinGrace is how long a restored run waits for a rank to return.
const DefaultRejoinGrace = 60 * time.Second

// Snapshot is the ledger state a restarted agent needs.
type Snapshot struct {
	// Time is the end of the last closed window.
	Time time.Time     `json:"time"`
	GPUs []SnapshotGPU `json:"gpus"`
	Runs []SnapshotRun `json:"runs"`
}

// SnapshotGPU is one GPU's raw counter at Snapshot.Time.
type SnapshotGPU struct {
	UUID      string  `json:"uuid"`
	CounterJ  float64 `json:"counter_j"`
	CounterOK bool    `json:"counter_ok"`
}

// SnapshotRun is a run active at Snapshot.Time.
type SnapshotRun struct {
	ID          string            `json:"id"`
	Start       time.Time         `json:"start"`
	Warmup      time.Duration     `json:"warmup"`
	WarmupSteps uint64            `json:"warmup_steps"`
	WarmupEnd   time.Time         `json:"warmup_end"`
	StepEvents  uint64            `json:"step_events"`
	GPUs        []int             `json:"gpus"`
	Totals      map[string]uint64 `json:"totals"`
	// UID owns the run: after a restart only it (or root) may rejoin.
	UID    int32 `json:"uid"`
	UIDSet bool  `json:"uid_set"`
	// AttributePID is the root of the process tree whose GPUs the run
	// follows (run_start attribute_pid); 0 when none.
	AttributePID int `json:"attribute_pid,omitempty"`
	// Bridge is set when the run was itself restored and is still waiting
	// for a rank: the energy held so far, from an earlier checkpoint.
	Bridge *bridge `json:"bridge,omitempty"`
}

// bridge accumulates a restored run's energy from the checkpoint until a
// rank rejoins, split at warmup end.
type bridge struct {
	From     time.Time     `json:"from"`
	Warmup   bridgeSegment `json:"warmup"`
	Measured bridgeSegment `json:"measured"`
	// started is set once the first post-restart window added the counter
	// difference over the downtime.
	Started bool `json:"started"`
	// PerGPU is the part of the above held per GPU (GPU index).
	PerGPU map[int]*heldGPU `json:"per_gpu,omitempty"`
	// Shared is the most runs on one of the run's GPUs at once in what is
	// held; Methods how they were split (RunWindow.share_method).
	Shared  int      `json:"shared,omitempty"`
	Methods []string `json:"methods,omitempty"`
}

type bridgeSegment struct {
	Start, End  time.Time
	CounterJ    float64
	CounterOK   bool
	IntegratedJ float64
	GapS        float64
	GPUSeconds  float64
	SharedS     float64
	PerGPU      map[int]*heldGPU
	Used        bool
}

func (s *bridgeSegment) add(w *trainmeterv1.RunWindow, counterOK bool) {
	a, b := w.Start.AsTime(), w.End.AsTime()
	if !s.Used {
		s.Start, s.CounterOK, s.Used = a, counterOK, true
	}
	if s.Start.After(a) {
		s.Start = a
	}
	if b.After(s.End) {
		s.End = b
	}
	s.CounterJ += w.EnergyCounterJ
	s.CounterOK = s.CounterOK && counterOK
	s.IntegratedJ += w.EnergyIntegratedJ
	s.GapS += w.GapS
	s.GPUSeconds += w.GpuSeconds
	s.SharedS += w.SharedGpuSeconds
	s.PerGPU = holdShares(s.PerGPU, w)
}

func (s *bridgeSegment) window(id string, phase trainmeterv1.Phase, gpus []uint32) *trainmeterv1.RunWindow {
	w := &trainmeterv1.RunWindow{
		RunId: id, Start: timestamppb.New(s.Start), End: timestamppb.New(s.End), Phase: phase,
		CounterOk: s.CounterOK, EnergyIntegratedJ: s.IntegratedJ, GapS: s.GapS,
		GpuSeconds: s.GPUSeconds, Gpus: gpus, RestartBridge: true,
		// Without the counter the downtime's energy is unknown, not zero.
		EnergyEstimated:  !s.CounterOK,
		SharedGpuSeconds: s.SharedS,
	}
	if s.CounterOK {
		w.EnergyCounterJ = s.CounterJ
	}
	for _, g := range slices.Sorted(maps.Keys(s.PerGPU)) {
		h := s.PerGPU[g]
		w.GpuShares = append(w.GpuShares, gpuShare(g, s.CounterOK, h.CounterJ, h.IntegratedJ, h.GPUSeconds, h.SharedS))
	}
	return w
}

// Snapshot returns the state to persist after the batches Tick returned
// have been handed to the uplink.
func (l *Ledger) Snapshot() Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Snapshot{Time: l.winStart}
	for i, d := range l.cfg.Devices {
		s.GPUs = append(s.GPUs, SnapshotGPU{UUID: d.UUID, CounterJ: l.rawAtStart[i], CounterOK: l.rawAtStartOK[i]})
	}
	for _, id := range l.order {
		r := l.runs[id]
		if r.ended {
			continue
		}
		sr := SnapshotRun{
			ID: r.id, Start: r.start, Warmup: r.warmup, WarmupSteps: r.warmupSteps, WarmupEnd: r.warmupEnd,
			StepEvents: r.stepEvents, GPUs: r.gpusAt(l.winStart), Totals: maps.Clone(r.shipped),
			UID: r.uid, UIDSet: r.uidSet, AttributePID: r.attributePID,
		}
		if r.bridge != nil && r.rejoinAt.IsZero() {
			b := *r.bridge
			sr.Bridge = &b
		}
		s.Runs = append(s.Runs, sr)
	}
	return s
}

// Restore brings back the runs of a snapshot, before the first tick. now is
// when the agent came back; runs wait grace for a rank to rejoin.
func (l *Ledger) Restore(now time.Time, s Snapshot, grace time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return errors.New("ledger: restore after the first tick")
	}
	if s.Time.IsZero() || s.Time.After(now) {
		return errors.New("ledger: snapshot time is not before now")
	}
	if grace <= 0 {
		grace = DefaultRejoinGrace
	}
	l.grace = grace
	l.snapGPUs = s.GPUs
	l.snapTime = s.Time
	for _, sr := range s.Runs {
		if _, dup := l.runs[sr.ID]; dup || (len(sr.GPUs) == 0 && sr.AttributePID == 0) {
			continue
		}
		gpus := make([]int, 0, len(sr.GPUs))
		for _, g := range sr.GPUs {
			if g >= 0 && g < len(l.cfg.Devices) {
				gpus = append(gpus, g)
			}
		}
		r := &run{
			id: sr.ID, start: sr.Start, warmup: sr.Warmup, warmupSteps: sr.WarmupSteps, warmupEnd: sr.WarmupEnd,
			stepEvents: sr.StepEvents, members: map[uint64]string{},
			gpuChanges: []gpuSet{{at: sr.Start, gpus: gpus}},
			totals:     map[string]uint64{}, shipped: map[string]uint64{},
			restored: true, restoreAt: now,
			uid: sr.UID, uidSet: sr.UIDSet,
			attributePID: sr.AttributePID, warmupSet: true,
			bridge: &bridge{From: s.Time},
		}
		if sr.Bridge != nil {
			b := *sr.Bridge
			b.Started = false
			r.bridge = &b
		}
		for k, v := range sr.Totals {
			r.totals[k], r.shipped[k] = v, v
		}
		l.runs[r.id] = r
		l.order = append(l.order, r.id)
		l.cfg.Logger.Info("run restored after agent restart; waiting for a rank to rejoin", "run_id", r.id, "since", s.Time, "grace", grace)
	}
	return nil
}

// expireRestored ends restored runs nobody came back to: at the checkpoint,
// since nothing says they ran on after it.
func (l *Ledger) expireRestored(now time.Time) {
	for _, id := range l.order {
		r := l.runs[id]
		if r.restored && !r.ended && r.rejoinAt.IsZero() && now.Sub(r.restoreAt) > l.grace {
			r.ended, r.end = true, r.bridge.From
			r.endReason = "agent restarted and no rank rejoined within " + l.grace.String()
			r.endStatus = r.finalStatus()
			l.reclaimBridge(r.bridge)
			r.bridge = nil
			l.cfg.Logger.Warn("restored run ended: no rank rejoined", "run_id", r.id, "grace", l.grace)
		}
	}
}

// holdBridge routes a restored run's segments into its bridge until the
// rejoin, and returns what to ship now.
func (l *Ledger) holdBridge(r *run, segs []*trainmeterv1.RunWindow, ws, to time.Time) []*trainmeterv1.RunWindow {
	b := r.bridge
	if !b.Started {
		// The downtime: from the checkpoint to this boot's first window,
		// from the raw counters (no power samples exist for it).
		// Runs restored on one GPU split its downtime equally: nothing
		// says what each did meanwhile.
		b.Started = true
		gpus := r.gpusAt(ws)
		first := &trainmeterv1.RunWindow{Start: timestamppb.New(b.From), End: timestamppb.New(ws)}
		ok := len(gpus) > 0
		for _, g := range gpus {
			d, gok := l.downtimeJ(g, ws)
			k := max(1, l.downtimeSharers[g])
			share := gpuShare(g, gok, d/float64(k), 0, ws.Sub(b.From).Seconds()/float64(k), 0)
			if k > 1 {
				share.SharedGpuSeconds = ws.Sub(b.From).Seconds()
				first.SharedGpuSeconds += share.SharedGpuSeconds
				b.Shared = max(b.Shared, k)
			}
			first.GpuShares = append(first.GpuShares, share)
			first.EnergyCounterJ += share.EnergyCounterJ
			first.GpuSeconds += share.GpuSeconds
			ok = ok && gok
			first.GapS += ws.Sub(b.From).Seconds()
		}
		l.bridgePhase(r, b.From).add(first, ok)
		b.PerGPU = holdShares(b.PerGPU, first)
		if b.Shared > 1 {
			b.Methods = appendNew(b.Methods, ShareEqual)
		}
	}
	var out []*trainmeterv1.RunWindow
	for _, w := range segs {
		if r.rejoinAt.IsZero() || w.Start.AsTime().Before(r.rejoinAt) {
			l.bridgePhase(r, w.Start.AsTime()).add(w, w.CounterOk)
			b.PerGPU = holdShares(b.PerGPU, w)
			b.Shared = max(b.Shared, int(w.MaxSharingRuns))
			b.Methods = appendNew(b.Methods, w.ShareMethod)
			continue
		}
		out = append(out, w)
	}
	if !r.rejoinAt.IsZero() && !r.rejoinAt.After(to) {
		var gpus []uint32
		for _, g := range r.gpusAt(b.From) {
			gpus = append(gpus, uint32(g))
		}
		var bridged []*trainmeterv1.RunWindow
		if b.Warmup.Used {
			bridged = append(bridged, b.Warmup.window(r.id, trainmeterv1.Phase_PHASE_WARMUP, gpus))
		}
		if b.Measured.Used {
			bridged = append(bridged, b.Measured.window(r.id, trainmeterv1.Phase_PHASE_MEASURED, gpus))
		}
		for _, w := range bridged {
			w.MaxSharingRuns = uint32(max(1, b.Shared))
			w.ShareMethod = combineMethods(append([]string{ShareExclusive}, b.Methods...))
		}
		out = append(bridged, out...)
		r.bridge = nil
	}
	return out
}

func (l *Ledger) bridgePhase(r *run, t time.Time) *bridgeSegment {
	if !r.warmupEnd.IsZero() && !t.Before(r.warmupEnd) {
		return &r.bridge.Measured
	}
	return &r.bridge.Warmup
}

// downtimeJ is GPU g's energy from the snapshot to t: the raw counter at
// this boot's first counter point minus the checkpointed one, plus this
// boot's curve up to t. ok is false when the counter cannot bridge it (no
// counter, another GPU at this index, or a counter reset meanwhile).
func (l *Ledger) downtimeJ(g int, t time.Time) (float64, bool) {
	if g >= len(l.snapGPUs) || g >= len(l.firstRaw) {
		return 0, false
	}
	snap := l.snapGPUs[g]
	if !snap.CounterOK || !l.firstRawOK[g] || snap.UUID != l.cfg.Devices[g].UUID || l.firstRaw[g] < snap.CounterJ {
		return 0, false
	}
	c, _ := l.meters[g].At(t)
	return l.firstRaw[g] - snap.CounterJ + c.CounterJ, true
}
