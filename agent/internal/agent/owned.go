package agent

import (
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/agent/internal/owner"
	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Every GPU-second to someone (docs/attribution.md): once a second, with
// the process-tree poll, the GPUs' compute processes that no trainer's run
// owns are given to their owner: the first source that knows them (Slurm,
// then the Kubernetes pod holding the GPU), else their Linux
// user's process group. A GPU with no process on it goes to the live jobs
// and pods its scheduler allocated it to (owner.Allocator). Each owner is a
// run the agent starts and ends itself; a GPU is idle only while no process
// is on it and no live job or pod holds it.

// ownerConnBase numbers the ledger members the agent adds for owners, far
// above the trainer socket's connection ids.
const ownerConnBase = 1 << 62

// ownedRun is an owner's run the agent started.
type ownedRun struct {
	owner owner.Owner
	peer  ledger.Peer
	gpus  []int
	// procGPUs are the GPUs a persistent owner's processes were on: it
	// keeps them while it lives, beside the idle GPUs allocated to it now.
	procGPUs []int
}

// owners is the agent's state for owners' runs; touched only by the
// attribution poller.
type owners struct {
	mu       sync.Mutex // the poller and trainers' run_starts (ownerFirst)
	sources  []owner.Source
	runs     map[string]*ownedRun
	nextConn uint64
	lastErr  time.Time
}

// pollOwners starts, extends and ends the owners' runs from the GPUs'
// processes (onGPU: PID -> GPUs). complete is false when a GPU could not be
// listed: then no run is ended on this poll (its processes may be there).
func (a *Agent) pollOwners(onGPU map[int][]int, complete bool, ppids map[int]int) {
	o := &a.owned
	o.mu.Lock()
	defer o.mu.Unlock()
	now := a.clock.Now()
	roots := a.ledger.TrainerRoots()
	migs := a.pollMIGs()
	var procs []owner.Process
	for _, pid := range slices.Sorted(maps.Keys(onGPU)) {
		if slices.ContainsFunc(roots, func(root int) bool { return inTree(a.procRoot, pid, root, ppids) }) {
			continue // a trainer's run has it
		}
		for _, g := range onGPU[pid] {
			procs = append(procs, owner.Process{PID: pid, GPU: g, GPUUUID: a.backend.Devices()[g].UUID, MIGUUID: migs[g][uint32(pid)]})
		}
	}
	found := map[int]owner.Owner{}
	for _, src := range o.sources {
		var left []owner.Process
		for _, p := range procs {
			if _, ok := found[p.PID]; !ok {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			break
		}
		maps.Copy(found, src.Owners(left))
	}
	type group struct {
		owner owner.Owner
		pids  []int
		gpus  []int // the GPUs its processes are on
		held  []int // GPUs with no process on them that its scheduler allocated to it
	}
	groups := map[string]*group{}
	for _, p := range procs {
		ow, ok := found[p.PID]
		if !ok {
			if agentconfig.Off(a.cfg.Attribution.Processes) {
				continue // attribution.processes off: its GPU time stays idle
			}
			var err error
			if ow, err = owner.ProcessOwner(owner.Proc{Root: a.procRoot}, a.cfg.Node, p.PID); err != nil {
				continue // gone since it was listed
			}
			found[p.PID] = ow
		}
		g := groups[ow.RunID]
		if g == nil {
			g = &group{owner: ow}
			groups[ow.RunID] = g
		}
		if !slices.Contains(g.pids, p.PID) {
			g.pids = append(g.pids, p.PID)
		}
		if !slices.Contains(g.gpus, p.GPU) {
			g.gpus = append(g.gpus, p.GPU)
		}
	}
	// A GPU with no process on it goes to the live jobs and pods its
	// scheduler allocated it to: a tenant who holds a GPU pays for it.
	busy := map[int]bool{}
	for _, gs := range onGPU {
		for _, g := range gs {
			busy[g] = true
		}
	}
	var devs []owner.Device
	for _, d := range a.backend.Devices() {
		devs = append(devs, owner.Device{Index: d.Index, UUID: d.UUID})
	}
	for _, src := range o.sources {
		al, ok := src.(owner.Allocator)
		if !ok {
			continue
		}
		for _, alloc := range al.Allocated(now, devs) {
			g := groups[alloc.Owner.RunID]
			if g == nil {
				g = &group{owner: alloc.Owner}
				groups[alloc.Owner.RunID] = g
			}
			for _, x := range alloc.GPUs {
				if !busy[x] && !slices.Contains(g.held, x) {
					g.held = append(g.held, x)
				}
			}
		}
	}
	for id, g := range groups {
		r := o.runs[id]
		if r != nil && !a.ledger.Live(id) {
			delete(o.runs, id) // ended otherwise (a resume took its id)
			r = nil
		}
		if r == nil {
			all, _ := ledger.Union(g.gpus, g.held)
			if len(all) == 0 {
				continue // allocated only GPUs that others' processes are on
			}
			var gpus []string
			for _, x := range all {
				gpus = append(gpus, strconv.Itoa(x))
			}
			pid := 0
			if len(g.pids) > 0 {
				pid = g.pids[0]
			}
			if r = a.startOwned(now, g.owner, pid, gpus, ""); r == nil {
				continue
			}
			r.procGPUs = slices.Sorted(slices.Values(g.gpus))
		} else if r.owner.Persistent {
			// A job or pod keeps the GPUs its processes used while it
			// lives, and holds the idle GPUs allocated to it now; a GPU
			// that could not be listed may still hold its processes, so
			// no poll with one takes GPUs away.
			r.procGPUs, _ = ledger.Union(r.procGPUs, g.gpus)
			want, _ := ledger.Union(r.procGPUs, g.held)
			if !complete {
				want, _ = ledger.Union(want, r.gpus)
			}
			if !slices.Equal(want, r.gpus) {
				a.ledger.SetGPUs(now, id, want)
				r.gpus = want
			}
		} else if !complete {
			// A GPU that could not be listed may still hold the group's
			// processes: no poll with one takes GPUs away.
			if merged, changed := ledger.Union(r.gpus, g.gpus); changed {
				a.ledger.SetGPUs(now, id, merged)
				r.gpus = merged
			}
		} else if gs := slices.Sorted(slices.Values(g.gpus)); !slices.Equal(gs, r.gpus) {
			// A process group holds the GPUs its processes are on now.
			a.ledger.SetGPUs(now, id, gs)
			r.gpus = gs
		}
		a.ledger.SetOwnedPIDs(id, g.pids)
	}
	if !complete {
		return
	}
	for id, r := range o.runs {
		if _, on := groups[id]; on {
			continue
		}
		end, reason := owner.End{Status: "ok"}, "its processes left the GPUs"
		if r.owner.Persistent {
			src := a.ownerSource(r.owner.Source)
			if src == nil {
				continue
			}
			var done bool
			if end, done = src.Ended(r.owner); !done {
				a.ledger.SetOwnedPIDs(id, nil)
				continue
			}
			reason = "the " + r.owner.Source + " job ended"
			if r.owner.Source == owner.AttrKubernetes {
				reason = "its pods left the kubelet's pod-resources list"
			}
		}
		if err := a.ledger.EndOwned(now, r.peer, id, end.Status, end.Error, reason); err != nil {
			a.log.Debug("owner's run already ended", "run_id", id, "err", err)
		}
		delete(o.runs, id)
	}
}

// ownerFirst starts the run of a trainer's scheduler job when the
// trainer's run_start names that run (a client in a Slurm job that names no
// run_id of its own derives the job's), before the trainer's start: the
// trainer then joins the job's run, which the agent ends when the job does.
// The run starts on the GPUs the trainer names.
func (a *Agent) ownerFirst(now time.Time, p ledger.Peer, e *trainerproto.RunStart) {
	o := &a.owned
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.sources) == 0 || p.PID <= 0 || a.ledger.Live(e.Run) {
		return
	}
	for _, src := range o.sources {
		if ow, ok := src.Owners([]owner.Process{{PID: int(p.PID), GPU: -1}})[int(p.PID)]; ok {
			if ow.RunID == e.Run {
				a.startOwned(now, ow, int(p.PID), e.GPUs, e.CUDAVisibleDevices)
			}
			return
		}
	}
}

// startOwned starts (or joins, when a trainer started it first) the run of
// an owner on gpus (indices or UUIDs; cvd as CUDA_VISIBLE_DEVICES; neither:
// every GPU); nil when the ledger refused it (logged).
func (a *Agent) startOwned(now time.Time, ow owner.Owner, pid int, gpus []string, cvd string) *ownedRun {
	o := &a.owned
	if o.runs == nil {
		o.runs = map[string]*ownedRun{}
	}
	o.nextConn++
	uid := max(ow.UID, 0)
	p := ledger.Peer{ConnID: ownerConnBase + o.nextConn, PID: int32(pid), UID: int32(uid)}
	zero := 0.0
	ev := &trainerproto.RunStart{
		Run:     ow.RunID,
		Start:   &trainmeterv1.RunStart{Metadata: &trainmeterv1.RunMetadata{}, Labels: maps.Clone(ow.Labels), Attribution: ow.Source},
		WarmupS: &zero, // every GPU-second of an owner's run is its measured time
		// The same owner back after its run ended (a process group that
		// left the GPU and came back) continues its run.
		Resume:             true,
		GPUs:               gpus,
		CUDAVisibleDevices: cvd,
	}
	if err := a.ledger.StartRun(now, p, ev); err != nil {
		if now.Sub(o.lastErr) > time.Minute {
			o.lastErr = now
			a.log.Warn("cannot start the run of a GPU process's owner; its GPU time stays idle", "run_id", ow.RunID, "source", ow.Source, "err", err)
		}
		return nil
	}
	a.kickSharing()
	a.log.Info("GPU processes attributed to their owner", "run_id", ow.RunID, "source", ow.Source, "uid", ow.UID, "gpus", gpus, "labels", ow.Labels)
	var idx []int
	for _, g := range gpus {
		if i, err := strconv.Atoi(g); err == nil {
			idx = append(idx, i)
		}
	}
	r := &ownedRun{owner: ow, peer: p, gpus: slices.Sorted(slices.Values(idx))}
	o.runs[ow.RunID] = r
	return r
}

func (a *Agent) ownerSource(name string) owner.Source {
	for _, s := range a.owned.sources {
		if s.Name() == name {
			return s
		}
	}
	return nil
}
