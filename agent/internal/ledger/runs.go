package ledger

import (
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	pb "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Peer identifies the trainer connection an event came from.
type Peer struct {
	ConnID   uint64
	PID, UID int32
}

type run struct {
	id          string
	start       time.Time
	warmup      time.Duration // time-based warmup, when warmupSteps == 0
	warmupSteps uint64
	warmupEnd   time.Time // zero until known
	members     map[uint64]struct{}
	gpuChanges  []gpuSet // ascending by at; the first is at start
	ended       bool
	end         time.Time
	endReason   string

	ticks []tickStat
	steps []stepStat
	// stepEvents counts step events, for warmup_steps when steps carry no number.
	stepEvents uint64
}

type gpuSet struct {
	at   time.Time
	gpus []int
}

type stepStat struct {
	t                 time.Time
	tokens, samples   uint64
	dataWait, compute float64
	loss              float64
	hasLoss           bool
}

func (r *run) gpusAt(t time.Time) []int {
	cur := r.gpuChanges[0].gpus
	for _, c := range r.gpuChanges[1:] {
		if c.at.After(t) {
			break
		}
		cur = c.gpus
	}
	return cur
}

func (r *run) endEvent() *pb.RunEvent {
	e := &pb.RunEnd{RunId: r.id, Time: timestamppb.New(r.end), Reason: r.endReason}
	if !r.warmupEnd.IsZero() && !r.warmupEnd.After(r.end) {
		e.WarmupEnd = timestamppb.New(r.warmupEnd)
	}
	return &pb.RunEvent{Event: &pb.RunEvent_RunEnd{RunEnd: e}}
}

// StartRun handles run_start: the first one on this node starts the run, later
// ones (other ranks) join it and may add GPUs.
func (l *Ledger) StartRun(now time.Time, p Peer, ev *trainerproto.RunStart) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open(now)
	gpus, err := l.resolveGPUs(ev)
	if err != nil {
		return err
	}
	if r, ok := l.runs[ev.Run]; ok {
		if r.ended {
			return errorf("run_start", "run %q already ended on this node; use a new run_id", ev.Run)
		}
		r.members[p.ConnID] = struct{}{}
		if merged, changed := union(r.gpuChanges[len(r.gpuChanges)-1].gpus, gpus); changed {
			r.gpuChanges = append(r.gpuChanges, gpuSet{at: now, gpus: merged})
		}
		return nil
	}
	r := &run{
		id:         ev.Run,
		start:      now,
		warmup:     l.cfg.DefaultWarmup,
		members:    map[uint64]struct{}{p.ConnID: {}},
		gpuChanges: []gpuSet{{at: now, gpus: gpus}},
	}
	switch {
	case ev.WarmupSteps != nil:
		r.warmupSteps = *ev.WarmupSteps
		r.warmup = 0
		if r.warmupSteps == 0 {
			r.warmupEnd = now
		}
	case ev.WarmupS != nil:
		r.warmup = time.Duration(*ev.WarmupS * float64(time.Second))
	}
	if r.warmupSteps == 0 {
		r.warmupEnd = now.Add(r.warmup)
	}
	l.runs[ev.Run] = r
	l.order = append(l.order, ev.Run)
	l.pending = append(l.pending, &pb.RunEvent{Event: &pb.RunEvent_RunStart{RunStart: l.runStartEvent(now, p, ev, r, gpus)}})
	l.cfg.Logger.Info("run started", "run_id", ev.Run, "gpus", gpus, "pid", p.PID, "warmup", r.warmup, "warmup_steps", r.warmupSteps)
	return nil
}

func (l *Ledger) runStartEvent(now time.Time, p Peer, ev *trainerproto.RunStart, r *run, gpus []int) *pb.RunStart {
	md := &pb.RunMetadata{
		Model: ev.Model, Dataset: ev.Dataset, Backend: ev.Backend, Optimizer: ev.Optimizer,
		Precision: ev.Precision, Notes: ev.Notes,
	}
	if ev.BatchSize != nil {
		md.BatchSize, md.HasBatchSize = *ev.BatchSize, true
	}
	if ev.GradAccum != nil {
		md.GradAccum, md.HasGradAccum = *ev.GradAccum, true
	}
	if ev.SeqLen != nil {
		md.SeqLen, md.HasSeqLen = *ev.SeqLen, true
	}
	if ev.Seed != nil {
		md.Seed, md.HasSeed = *ev.Seed, true
	}
	rs := &pb.RunStart{
		RunId:       ev.Run,
		Time:        timestamppb.New(now),
		Metadata:    md,
		WarmupS:     r.warmup.Seconds(),
		WarmupSteps: r.warmupSteps,
		Pid:         uint32(p.PID),
		Uid:         uint32(p.UID),
		BudgetScope: ev.BudgetScope,
		Labels:      ev.Labels,
	}
	if ev.GPUPricePerHour != nil {
		rs.GpuPricePerHour = *ev.GPUPricePerHour
	}
	if ev.PlannedSteps != nil {
		rs.PlannedSteps = *ev.PlannedSteps
	}
	if ev.NumWorkers != nil {
		rs.NumWorkers = uint32(*ev.NumWorkers)
	}
	if ev.PrefetchFactor != nil {
		rs.PrefetchFactor = uint32(*ev.PrefetchFactor)
	}
	for _, g := range gpus {
		d := l.cfg.Devices[g]
		rs.Gpus = append(rs.Gpus, uint32(g))
		rs.GpuUuids = append(rs.GpuUuids, d.UUID)
		if rs.GpuName == "" {
			rs.GpuName = d.Name
		}
	}
	return rs
}

// resolveGPUs maps run_start's gpus (NVML indices or UUIDs), else
// CUDA_VISIBLE_DEVICES, to device indices. With neither, the run gets every
// GPU on the node: a run with no GPUs would report no energy at all, which is
// a worse default than over-attributing on a box dedicated to one job.
func (l *Ledger) resolveGPUs(ev *trainerproto.RunStart) ([]int, error) {
	ids := ev.GPUs
	source := "gpus"
	if len(ids) == 0 && ev.CUDAVisibleDevices != "" {
		source = "cuda_visible_devices"
		for _, f := range strings.Split(ev.CUDAVisibleDevices, ",") {
			if f = strings.TrimSpace(f); f != "" {
				ids = append(ids, f)
			}
		}
	}
	if len(ids) == 0 {
		all := make([]int, len(l.cfg.Devices))
		for i := range all {
			all[i] = i
		}
		return all, nil
	}
	var out []int
	for _, id := range ids {
		idx, err := lookupGPU(l.cfg.Devices, id)
		if err != nil {
			return nil, errorf("run_start", "%s: %v", source, err)
		}
		out, _ = union(out, []int{idx})
	}
	return out, nil
}

func lookupGPU(devs []gpu.Device, id string) (int, error) {
	if n, err := strconv.Atoi(id); err == nil {
		if n < 0 || n >= len(devs) {
			return 0, errorf("gpu "+id, "not on this node (it has %d GPUs)", len(devs))
		}
		return n, nil
	}
	for i, d := range devs {
		if strings.EqualFold(d.UUID, id) {
			return i, nil
		}
	}
	return 0, errorf("gpu "+id, "no GPU with this UUID on this node")
}

// union returns the sorted union of a and b and whether b added anything.
func union(a, b []int) ([]int, bool) {
	seen := make(map[int]bool, len(a))
	out := append([]int(nil), a...)
	for _, x := range a {
		seen[x] = true
	}
	changed := false
	for _, x := range b {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
			changed = true
		}
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, changed
}

// Step records one training step of a run.
func (l *Ledger) Step(now time.Time, p Peer, ev *trainerproto.Step) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.liveRun("step", ev.Run)
	if err != nil {
		return err
	}
	s := stepStat{t: now, tokens: ev.Tokens}
	if ev.Samples != nil {
		s.samples = *ev.Samples
	}
	if ev.DataWaitS != nil {
		s.dataWait = *ev.DataWaitS
	}
	if ev.ComputeS != nil {
		s.compute = *ev.ComputeS
	}
	if ev.Loss != nil {
		s.loss, s.hasLoss = *ev.Loss, true
	}
	r.steps = append(r.steps, s)
	r.stepEvents++
	if r.warmupEnd.IsZero() && r.warmupSteps > 0 {
		// "step" is the number of steps completed (1-based, as HF's
		// global_step), so warmup_steps = N ends when step N is reported.
		// Without step numbers, the N-th step event ends it.
		n := r.stepEvents
		if ev.Step != nil {
			n = *ev.Step
		}
		if n >= r.warmupSteps {
			r.warmupEnd = now
		}
	}
	if l.cfg.Load != nil {
		load := 1.0
		if s.compute+s.dataWait > 0 {
			load = s.compute / (s.compute + s.dataWait)
		}
		for _, g := range r.gpusAt(now) {
			l.cfg.Load.SetLoad(g, load)
			l.lastStep[g] = now
		}
	}
	return nil
}

// Eval records an evaluation result; it goes to the collector as an event.
func (l *Ledger) Eval(now time.Time, p Peer, ev *trainerproto.Eval) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.liveRun("eval", ev.Run); err != nil {
		return err
	}
	e := &pb.Eval{RunId: ev.Run, Time: timestamppb.New(now)}
	if ev.Epoch != nil {
		e.Epoch = *ev.Epoch
	}
	if ev.ValLoss != nil {
		e.ValLoss, e.HasValLoss = *ev.ValLoss, true
	}
	if ev.Accuracy != nil {
		e.Accuracy, e.HasAccuracy = *ev.Accuracy, true
	}
	l.pending = append(l.pending, &pb.RunEvent{Event: &pb.RunEvent_Eval{Eval: e}})
	return nil
}

// EndRun handles run_end from one rank; the run ends on this node when the
// last rank that joined it has ended or gone.
func (l *Ledger) EndRun(now time.Time, p Peer, ev *trainerproto.RunEnd) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.liveRun("run_end", ev.Run)
	if err != nil {
		return err
	}
	if _, ok := r.members[p.ConnID]; !ok {
		return errorf("run_end", "this connection did not join run %q (send run_start first)", ev.Run)
	}
	reason := "run_end"
	if ev.Status != "" {
		reason = "run_end: " + ev.Status
	}
	l.leave(now, r, p.ConnID, reason)
	return nil
}

// Disconnected ends the connection's share of every run it joined.
func (l *Ledger) Disconnected(now time.Time, p Peer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range l.order {
		r := l.runs[id]
		if _, ok := r.members[p.ConnID]; ok && !r.ended {
			l.leave(now, r, p.ConnID, "trainer disconnected without run_end")
		}
	}
}

func (l *Ledger) leave(now time.Time, r *run, conn uint64, reason string) {
	delete(r.members, conn)
	if len(r.members) > 0 {
		return
	}
	r.ended, r.end, r.endReason = true, now, reason
	if l.cfg.Load != nil {
		for _, g := range r.gpusAt(now) {
			l.cfg.Load.SetLoad(g, 0)
			l.lastStep[g] = time.Time{}
		}
	}
	l.cfg.Logger.Info("run ended", "run_id", r.id, "reason", reason, "wall", now.Sub(r.start))
}

func (l *Ledger) liveRun(event, id string) (*run, error) {
	r, ok := l.runs[id]
	if !ok {
		return nil, errorf(event, "unknown run_id %q (send run_start first)", id)
	}
	if r.ended {
		return nil, errorf(event, "run %q has ended", id)
	}
	return r, nil
}
