package ledger

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Peer identifies the trainer connection an event came from.
type Peer struct {
	ConnID   uint64
	PID, UID int32
}

type run struct {
	id          string
	start       time.Time
	warmup      time.Duration // time-based warmup
	warmupSteps uint64        // step-based warmup (0: none)
	// warmupEnd is zero until known. With both warmups (the agent's
	// default) it is the time-based end until the warmup_steps-th step
	// comes first.
	warmupEnd time.Time
	// uid is the uid of the process that started the run (SO_PEERCRED);
	// events from other uids are refused (root excepted). uidSet is false
	// only for a run that no peer has claimed yet (restored after a restart).
	uid    int32
	uidSet bool
	// members maps each joined connection to its rank key (client_id, or
	// the connection when the client sends none).
	members map[uint64]string
	// peerPIDs maps each joined connection to its peer's PID (SO_PEERCRED),
	// whose process tree is the run's on the GPUs (share.go).
	peerPIDs map[uint64]int32
	// stepping: the members (connections) that have reported a step, for
	// the windows' step_ranks.
	stepping   map[uint64]struct{}
	gpuChanges []gpuSet // ascending by at; the first is at start
	ended      bool
	end        time.Time
	endReason  string
	// The end status (lifecycle.go): rankStatus is the first status of a
	// rank's run_end that was not ok; anyRunEnd is whether any rank sent
	// run_end; stopCause is set once the collector asked the run to stop.
	// rankError is the cause that rank sent with rankStatus.
	rankStatus string
	rankError  string
	anyRunEnd  bool
	stopCause  string
	endStatus  string
	// endSent: the RunEnd event already went out (a resume came before the
	// window of the end closed).
	endSent bool
	// resume: the run_start that started this run asked to resume an
	// ended one; its RunStart says so and it has no second warmup.
	resume bool
	meta   *trainmeterv1.RunMetadata // of the run_start that started it; joins must agree
	// attributePID, when > 0, is the root of the process tree whose GPUs
	// the run is attributed (run_start attribute_pid; attribute.go).
	attributePID int
	// warmupSet is true when the run's warmup was named (warmup_s or
	// warmup_steps) rather than the agent's default; attribute.go lets the
	// first joining rank name it otherwise.
	warmupSet bool
	// starter is the merged run_start of a run started by `trainmeter run`
	// (attribute_pid), which joining clients fill (fill.go); nil for other
	// runs and for runs restored after a restart. starterKey/starterPeer
	// name the wrapper that sent it.
	starter     *trainerproto.RunStart
	starterKey  string
	starterPeer Peer
	// implicit: the agent started the run for the owner of GPU processes
	// that no trainer's run owns (a Slurm job, a pod, a user's process
	// group; owned.go); ownedPIDs are those processes as last listed.
	implicit  bool
	ownedPIDs []int

	ticks []tickStat
	steps []stepStat
	// stepEvents counts step events, for warmup_steps when steps carry no number.
	stepEvents uint64
	// rankSteps counts each connection's step events. An eval carries its
	// sender's, so the collector counts an epoch's steps exactly
	// (Eval.rank_steps). Events, not step numbers: a run resumed from a
	// checkpoint numbers its steps from there.
	rankSteps map[uint64]uint64
	// totals is each rank's latest cumulative tokens_total; shipped is the
	// same as of the last closed window (what a checkpoint may promise).
	totals, shipped map[string]uint64

	// A run restored from a checkpoint after an agent restart waits for a
	// rank to rejoin; until then its energy is held in bridge.
	restored  bool
	restoreAt time.Time
	rejoinAt  time.Time // zero until a rank rejoins
	bridge    *bridge
}

type gpuSet struct {
	at   time.Time
	gpus []int
}

type stepStat struct {
	t                 time.Time
	conn              uint64 // the connection that reported it
	rank              string
	total             uint64 // the rank's tokens_total after this step; 0 if not sent
	recovered         uint64
	tokens, samples   uint64
	dataWait, compute float64
	loss              *float64 // nil: the step sent none
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

func (r *run) endEvent() *trainmeterv1.RunEvent {
	e := &trainmeterv1.RunEnd{RunId: r.id, Time: timestamppb.New(r.end), Reason: r.endReason, EndStatus: r.endStatus,
		EndError: r.endError()}
	if !r.warmupEnd.IsZero() && !r.warmupEnd.After(r.end) {
		e.WarmupEnd = timestamppb.New(r.warmupEnd)
	}
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunEnd{RunEnd: e}}
}

// StartRun handles run_start: the first one on this node starts the run, later
// ones (other ranks) join it and may add GPUs.
func (l *Ledger) StartRun(now time.Time, p Peer, ev *trainerproto.RunStart) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open(now)
	l.leaveRefused(ev.Run, p.ConnID) // a new attempt, decided afresh
	gpus, explicit, err := l.resolveGPUs(ev)
	if err != nil {
		return err
	}
	// resuming: a resume of a run this node saw end. resume=true for an id
	// it does not know starts a run as usual, warmup included: a script
	// that always asks to resume must not lose its first run's warmup.
	resuming := false
	if r, ok := l.runs[ev.Run]; ok && r.ended {
		resuming = true
		if !ev.Resume {
			return reuseError(ev.Run, r.end, r.endStatus)
		}
		if err := r.checkOwner("run_start", p); err != nil {
			return err
		}
		// Its window has not closed yet: send its end now, before the
		// resume's start, and let the window close it under another key.
		l.pending = append(l.pending, r.endEvent())
		r.endSent = true
		key := ev.Run + "\x00ended"
		l.runs[key] = r
		for i, id := range l.order {
			if id == ev.Run {
				l.order[i] = key
			}
		}
		delete(l.runs, ev.Run)
	} else if e, ok := l.ended[ev.Run]; ok {
		if !ev.Resume {
			return reuseError(ev.Run, e.End, e.Status)
		}
		resuming = true
	}
	if r, ok := l.runs[ev.Run]; ok {
		if err := r.checkOwner("run_start", p); err != nil {
			return err
		}
		var filled bool
		var conflicts []string
		if r.starter != nil {
			filled, conflicts = fillFrom(r.starter.Start, ev.Start)
		} else if err := conflict(r.meta, ev.Start.GetMetadata()); err != nil {
			return errorf("run_start", "metadata conflicts with run %q: %v", ev.Run, err)
		}
		r.members[p.ConnID] = rankKey(p, ev)
		r.addPeer(p)
		if isImplicit(ev) {
			// The agent's owner joins: a run a trainer of the same job
			// started, or one restored after a restart (owned.go).
			r.implicit = true
		}
		gpus = l.joinAttributed(now, r, ev, gpus, explicit)
		if filled {
			// The same start (time, node) again with the fields filled in:
			// the collector fills what its copy of the run lacks.
			l.pending = append(l.pending, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunStart{
				RunStart: l.runStartEvent(r.start, r.starterPeer, r.starter, r, r.gpuChanges[0].gpus)}})
			l.cfg.Logger.Info("run metadata filled by the joining client", "run_id", r.id, "model", r.starter.Start.Metadata.Model)
		}
		var conflict error
		if len(conflicts) > 0 {
			c := &MetadataConflict{Run: r.id, Fields: conflicts}
			c.StarterConn, c.StarterFound = r.starterConn()
			l.cfg.Logger.Warn("joining client's metadata differs from trainmeter run's; keeping the command line's", "run_id", r.id, "fields", conflicts)
			conflict = c
		}
		if r.restored && r.rejoinAt.IsZero() {
			r.rejoinAt = now
			l.cfg.Logger.Info("run rejoined after agent restart", "run_id", r.id, "down", now.Sub(r.bridge.From))
		}
		if merged, changed := Union(r.gpuChanges[len(r.gpuChanges)-1].gpus, gpus); changed {
			r.gpuChanges = append(r.gpuChanges, gpuSet{at: now, gpus: merged})
		}
		return conflict
	}
	gpus = l.startAttributed(ev, gpus, explicit)
	l.forgetEnded(ev.Run)
	r := &run{
		resume:      resuming,
		id:          ev.Run,
		start:       now,
		warmup:      l.cfg.DefaultWarmup,
		warmupSteps: l.cfg.DefaultWarmupSteps,
		members:     map[uint64]string{p.ConnID: rankKey(p, ev)},
		uid:         p.UID,
		uidSet:      true,
		totals:      map[string]uint64{},
		shipped:     map[string]uint64{},
		gpuChanges:  []gpuSet{{at: now, gpus: gpus}},
		meta:        proto.CloneOf(ev.Start.GetMetadata()),
	}
	if ev.AttributePID != nil {
		r.attributePID = int(*ev.AttributePID)
		r.starter, r.starterKey, r.starterPeer = starterCopy(ev), rankKey(p, ev), p
	}
	if isImplicit(ev) {
		// A trainer that joins it (a client in a Slurm job) fills in the
		// metadata, as one joining trainmeter run's run does.
		r.implicit = true
		r.starter, r.starterKey, r.starterPeer = starterCopy(ev), rankKey(p, ev), p
	}
	r.addPeer(p)
	r.setWarmup(now, ev)
	if r.resume {
		// The collector measures a resumed run from its first warmup on
		// (docs/measurement.md, "Resumed runs"): a second warmup would
		// leave measured time without its energy.
		r.warmup, r.warmupSteps, r.warmupEnd, r.warmupSet = 0, 0, now, true
	}
	l.runs[ev.Run] = r
	l.order = append(l.order, ev.Run)
	l.trackHostRun(r)
	l.pending = append(l.pending, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunStart{RunStart: l.runStartEvent(now, p, ev, r, gpus)}})
	l.cfg.Logger.Info("run started", "run_id", ev.Run, "gpus", gpus, "pid", p.PID, "warmup", r.warmup, "warmup_steps", r.warmupSteps)
	return nil
}

func (l *Ledger) runStartEvent(now time.Time, p Peer, ev *trainerproto.RunStart, r *run, gpus []int) *trainmeterv1.RunStart {
	rs := startOf(ev)
	rs.RunId, rs.Time = ev.Run, timestamppb.New(now)
	rs.WarmupS, rs.WarmupSteps = r.warmup.Seconds(), r.warmupSteps
	rs.Pid, rs.Uid, rs.User = uint32(p.PID), uint32(p.UID), l.userName(p.UID)
	rs.Resume = r.resume
	// Also when this node did not see the run end: it may have ended on
	// another node, and the collector then takes the start as a resume
	// rather than refusing it.
	rs.ResumeRequested = ev.Resume
	for _, g := range gpus {
		d := l.cfg.Devices[g]
		rs.Gpus = append(rs.Gpus, uint32(g))
		rs.GpuUuids = append(rs.GpuUuids, d.UUID)
		if rs.GpuName == "" {
			rs.GpuName = d.Name
		}
	}
	if rs.GpuName == "" {
		rs.GpuName = l.commonGPUName() // a process-attributed run, no GPU found yet
	}
	return rs
}

func rankKey(p Peer, ev *trainerproto.RunStart) string {
	if ev.ClientID != "" {
		return "client:" + ev.ClientID
	}
	return "conn:" + strconv.FormatUint(p.ConnID, 10)
}

// resolveGPUs maps run_start's gpus (NVML indices or UUIDs), else
// CUDA_VISIBLE_DEVICES, to device indices. With neither, the run gets every
// GPU on the node: a run with no GPUs would report no energy at all, which is
// a worse default than over-attributing on a box dedicated to one job.
// explicit is false in that last case.
func (l *Ledger) resolveGPUs(ev *trainerproto.RunStart) (gpus []int, explicit bool, err error) {
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
		return all, false, nil
	}
	var out []int
	for _, id := range ids {
		idx, err := lookupGPU(l.cfg.Devices, id)
		if err != nil {
			return nil, false, errorf("run_start", "%s: %v", source, err)
		}
		out, _ = Union(out, []int{idx})
	}
	return out, true, nil
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

// Union returns the sorted union of a (without duplicates) and b, and
// whether b added anything.
func Union(a, b []int) ([]int, bool) {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	slices.Sort(out)
	return out, len(out) > len(a)
}

// Step records one training step of a run.
func (l *Ledger) Step(now time.Time, p Peer, ev *trainerproto.Step) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.droppedRefused(ev.Run, p.ConnID) {
		return nil
	}
	r, err := l.liveRunOf("step", ev.Run, p)
	if err != nil {
		return err
	}
	s := stepStat{t: now, conn: p.ConnID, tokens: ev.Tokens}
	if _, ok := r.members[p.ConnID]; ok {
		if r.stepping == nil {
			r.stepping = map[uint64]struct{}{}
		}
		r.stepping[p.ConnID] = struct{}{}
	}
	if key, ok := r.members[p.ConnID]; ok && ev.TokensTotal != nil {
		s.rank, s.total = key, *ev.TokensTotal
		// A rank's cumulative total covers steps whose events never arrived
		// (lost in an agent restart, or dropped by the client while it
		// could not connect): credit them here. A rank first seen now gets
		// no credit for earlier steps, which another boot may have shipped.
		if last, seen := r.totals[key]; seen && s.total > last && s.total-last > s.tokens {
			s.recovered = s.total - last - s.tokens
			s.tokens += s.recovered
		}
		r.totals[key] = max(r.totals[key], s.total)
	}
	if r.restored && r.rejoinAt.IsZero() {
		// A raw client may resume with steps and no run_start.
		r.rejoinAt = now
	}
	s.samples, s.dataWait, s.compute, s.loss = deref(ev.Samples), deref(ev.DataWaitS), deref(ev.ComputeS), ev.Loss
	r.steps = append(r.steps, s)
	r.stepEvents++
	if r.rankSteps == nil {
		r.rankSteps = map[uint64]uint64{}
	}
	r.rankSteps[p.ConnID]++
	if r.warmupSteps > 0 && (r.warmupEnd.IsZero() || now.Before(r.warmupEnd)) {
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
		// Runs sharing a simulated GPU each report their load: it is their
		// utilisation of it (the split), and the GPU is as busy as their sum.
		for _, g := range r.gpusAt(now) {
			l.cfg.Load.SetLoad(g, l.setSimWork(g, r.id, load))
			l.lastStep[g] = now
		}
	}
	return nil
}

// Eval records an evaluation result; it goes to the collector as an event.
func (l *Ledger) Eval(now time.Time, p Peer, ev *trainerproto.Eval) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.droppedRefused(ev.Run, p.ConnID) {
		return nil
	}
	r, err := l.liveRunOf("eval", ev.Run, p)
	if err != nil {
		return err
	}
	e := &trainmeterv1.Eval{RunId: ev.Run, Time: timestamppb.New(now), RankSteps: r.rankSteps[p.ConnID]}
	e.Epoch, e.ValLoss, e.Accuracy = ev.Epoch, ev.ValLoss, ev.Accuracy
	if ev.NumWorkers != nil {
		e.LoaderNumWorkers = proto.Uint32(uint32(min(*ev.NumWorkers, math.MaxUint32)))
		if ev.PrefetchFactor != nil {
			e.LoaderPrefetchFactor = uint32(min(*ev.PrefetchFactor, math.MaxUint32))
		}
	}
	l.pending = append(l.pending, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: e}})
	return nil
}

// EndRun handles run_end from one rank; the run ends on this node when the
// last rank that joined it has ended or gone.
func (l *Ledger) EndRun(now time.Time, p Peer, ev *trainerproto.RunEnd) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.droppedRefused(ev.Run, p.ConnID) {
		l.leaveRefused(ev.Run, p.ConnID)
		return nil
	}
	r, err := l.liveRunOf("run_end", ev.Run, p)
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
	r.anyRunEnd = true
	if st := normalizeStatus(ev.Status); st != StatusOK && r.rankStatus == "" {
		r.rankStatus, r.rankError = st, endCause(ev)
	}
	l.leave(now, r, p.ConnID, reason)
	return nil
}

// Disconnected ends the connection's share of every run it joined.
func (l *Ledger) Disconnected(now time.Time, p Peer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.refused {
		l.leaveRefused(id, p.ConnID)
	}
	for _, id := range l.order {
		r := l.runs[id]
		if _, ok := r.members[p.ConnID]; ok && !r.ended {
			l.leave(now, r, p.ConnID, "trainer disconnected without run_end")
		}
	}
}

// deref is *p, or the zero value when p is nil.
func deref[T any](p *T) T {
	var v T
	if p != nil {
		v = *p
	}
	return v
}

func (r *run) addPeer(p Peer) {
	if r.peerPIDs == nil {
		r.peerPIDs = map[uint64]int32{}
	}
	r.peerPIDs[p.ConnID] = p.PID
}

func (l *Ledger) leave(now time.Time, r *run, conn uint64, reason string) {
	delete(r.members, conn)
	delete(r.peerPIDs, conn)
	delete(r.stepping, conn)
	if len(r.members) > 0 {
		return
	}
	r.ended, r.end, r.endReason = true, now, reason
	r.endStatus = r.finalStatus()
	if l.cfg.Load != nil {
		for _, g := range r.gpusAt(now) {
			l.cfg.Load.SetLoad(g, l.setSimWork(g, r.id, -1))
		}
	}
	l.cfg.Logger.Info("run ended", "run_id", r.id, "status", r.endStatus, "reason", reason, "wall", now.Sub(r.start))
}

// liveRunOf is liveRun for an event from p, which must be the run's owner.
func (l *Ledger) liveRunOf(event, id string, p Peer) (*run, error) {
	r, err := l.liveRun(event, id)
	if err != nil {
		return nil, err
	}
	return r, r.checkOwner(event, p)
}

// checkOwner refuses an event for r from a uid other than the one that
// started it (root may act on any run). A run nobody owns yet is claimed by
// the first non-root peer.
func (r *run) checkOwner(event string, p Peer) error {
	switch {
	case p.UID == 0:
	case !r.uidSet:
		r.uid, r.uidSet = p.UID, true
	case r.uid != p.UID:
		return errorf(event, "run %q belongs to another user", r.id)
	}
	return nil
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
