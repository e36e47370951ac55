package ledger

import (
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

// Attribution by process tree (run_start attribute_pid, sent by
// `trainmeter run`): the run is attributed the GPUs on which that process or
// a descendant runs compute work. The agent finds them (at most once a
// second, off the sampling path) and calls AddGPUs; the ledger only keeps
// the GPU set, cut like any other GPU-set change.
//
// Until a GPU is found such a run has no GPUs: its segments carry 0 J, 0
// GPU-seconds and counter_ok (exactly nothing was used, not an estimate).
// When the backend cannot list processes (sim, replay), the run gets every
// GPU instead, as a run_start without gpus does, and the choice is logged.

// AttributedRun is a live run whose GPUs follow a process tree.
type AttributedRun struct {
	ID  string
	PID int
}

// setWarmup applies run_start's warmup to a new run.
func (r *run) setWarmup(now time.Time, ev *trainerproto.RunStart) {
	switch {
	case ev.WarmupSteps != nil:
		r.warmupSteps = *ev.WarmupSteps
		r.warmup = 0
		r.warmupEnd = time.Time{}
		if r.warmupSteps == 0 {
			r.warmupEnd = now
		}
	case ev.WarmupS != nil:
		r.warmup = time.Duration(*ev.WarmupS * float64(time.Second))
		r.warmupSteps = 0
		r.warmupEnd = now.Add(r.warmup)
	default: // the agent's default: the earlier of its time and its steps
		r.warmupEnd = now.Add(r.warmup)
	}
	r.warmupSet = ev.WarmupSteps != nil || ev.WarmupS != nil
}

// startAttributed returns the GPUs a new run starts with.
func (l *Ledger) startAttributed(ev *trainerproto.RunStart, gpus []int, explicit bool) []int {
	if ev.AttributePID == nil || explicit {
		return gpus
	}
	if !l.cfg.ProcessAttribution {
		l.cfg.Logger.Info("run_start asks for GPU attribution by process tree, but this GPU backend cannot list GPU processes: attributing every GPU",
			"run_id", ev.Run, "attribute_pid", *ev.AttributePID, "gpus", len(gpus))
		return gpus
	}
	l.cfg.Logger.Info("run attributed by process tree: GPUs are added as its processes start compute work on them",
		"run_id", ev.Run, "attribute_pid", *ev.AttributePID)
	return nil
}

// joinAttributed returns the GPUs a joining rank adds to a run. A rank
// inside a process-attributed run that names no GPUs adds none (its GPUs are
// found through the tree, rather than every GPU of the node); one that names
// them adds them. It may also name the warmup the run's starter left out.
func (l *Ledger) joinAttributed(now time.Time, r *run, ev *trainerproto.RunStart, gpus []int, explicit bool) []int {
	if r.attributePID == 0 {
		return gpus
	}
	if !r.warmupSet && (ev.WarmupS != nil || ev.WarmupSteps != nil) {
		// `trainmeter run` leaves the warmup to the script's client unless
		// given --warmup. Counted from the join; too late once the default
		// warmup is over (segments already shipped as measured).
		if !r.warmupEnd.IsZero() && !now.Before(r.warmupEnd) {
			l.cfg.Logger.Warn("joining rank's warmup ignored: the run's default warmup is already over", "run_id", r.id)
		} else {
			r.setWarmup(now, ev)
			if r.warmupSteps == 0 {
				r.warmup = r.warmupEnd.Sub(r.start)
			}
			l.cfg.Logger.Info("run warmup set by the joining rank", "run_id", r.id, "warmup_end", r.warmupEnd, "warmup_steps", r.warmupSteps)
		}
	}
	if l.cfg.ProcessAttribution && !explicit {
		return nil
	}
	return gpus
}

// AttributedRuns lists the live runs whose GPUs follow a process tree, for
// the agent's process poller. Empty when the backend cannot list processes.
func (l *Ledger) AttributedRuns() []AttributedRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cfg.ProcessAttribution {
		return nil
	}
	var out []AttributedRun
	for _, id := range l.order {
		if r := l.runs[id]; r.attributePID > 0 && !r.ended {
			out = append(out, AttributedRun{ID: id, PID: r.attributePID})
		}
	}
	return out
}

// AddGPUs adds GPUs (device indices) to a live run from now on, as a GPU-set
// change, and returns those that were new. Unknown runs, ended runs and
// out-of-range indices are ignored.
func (l *Ledger) AddGPUs(now time.Time, id string, gpus []int) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.runs[id]
	if !ok || r.ended {
		return nil
	}
	var valid []int
	for _, g := range gpus {
		if g >= 0 && g < len(l.cfg.Devices) {
			valid = append(valid, g)
		}
	}
	last := r.gpuChanges[len(r.gpuChanges)-1]
	merged, changed := Union(last.gpus, valid)
	if !changed {
		return nil
	}
	l.changeGPUs(now, r, merged)
	var added []int
	for _, g := range merged {
		if _, had := Union(last.gpus, []int{g}); had {
			added = append(added, g)
		}
	}
	l.cfg.Logger.Info("GPUs attributed to run by process tree", "run_id", id, "added", added, "gpus", merged)
	return added
}

// commonGPUName is the model of the node's GPUs when they are all the same
// (the run_start's gpu_name for a run that has no GPU yet), else "".
func (l *Ledger) commonGPUName() string {
	name := ""
	for i, d := range l.cfg.Devices {
		if i > 0 && d.Name != name {
			return ""
		}
		name = d.Name
	}
	return name
}

// changeGPUs records r's GPU set from now on: never before the open window
// (it may have closed meanwhile) nor the previous change, so the changes
// stay ordered; a change at the previous one's instant replaces it.
func (l *Ledger) changeGPUs(now time.Time, r *run, gpus []int) {
	last := r.gpuChanges[len(r.gpuChanges)-1]
	at := now
	if l.started && at.Before(l.winStart) {
		at = l.winStart
	}
	if at.Before(last.at) {
		at = last.at
	}
	if at.Equal(last.at) {
		r.gpuChanges[len(r.gpuChanges)-1].gpus = gpus
	} else {
		r.gpuChanges = append(r.gpuChanges, gpuSet{at: at, gpus: gpus})
	}
}
