package ledger

import (
	"slices"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

// Runs of GPU processes that no trainer's run owns (docs/attribution.md):
// the agent finds their owner (a Slurm job, a pod, a Linux user's process
// group) and starts a run for it through StartRun, as a member of its own
// (a connection id no trainer has), with RunStart.attribution naming the
// source. Such a run is a run like any other from then on: its GPUs are
// cut as GPU-set changes, it shares GPUs by its processes' use, and it ends
// when its member leaves (EndOwned) after the last trainer that joined it.

// isImplicit reports whether a run_start is the agent's own, for an owner
// of GPU processes ("run" and "" are a trainer's).
func isImplicit(ev *trainerproto.RunStart) bool {
	a := ev.Start.GetAttribution()
	return a != "" && a != "run"
}

// TrainerRoots lists the process-tree roots of the live runs that trainers
// started (attribute_pid and the members' PIDs): the processes under them
// are those runs', and no owner's.
func (l *Ledger) TrainerRoots() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int
	for _, id := range l.order {
		r := l.runs[id]
		if r.ended || r.implicit {
			continue
		}
		if r.attributePID > 0 {
			out = append(out, r.attributePID)
		}
		for _, pid := range r.peerPIDs {
			if pid > 0 && !slices.Contains(out, int(pid)) {
				out = append(out, int(pid))
			}
		}
	}
	return out
}

// Live reports whether run id is live on this node.
func (l *Ledger) Live(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.runs[id]
	return ok && !r.ended
}

// SetOwnedPIDs records the GPU processes of an owner's run as last listed:
// what its share of a shared GPU is measured by.
func (l *Ledger) SetOwnedPIDs(id string, pids []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.runs[id]; ok && !r.ended {
		r.ownedPIDs = slices.Clone(pids)
	}
}

// EndOwned ends the owner's share of its run (member p): status is a
// run_end status ("" when unknown: the run ends lost unless a trainer in it
// sent run_end), errText its cause, reason the RunEnd's reason.
func (l *Ledger) EndOwned(now time.Time, p Peer, id, status, errText, reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.liveRun("run_end", id)
	if err != nil {
		return err
	}
	if _, ok := r.members[p.ConnID]; !ok {
		return errorf("run_end", "the agent's owner member is not in run %q", id)
	}
	if status != "" {
		r.anyRunEnd = true
		ev := &trainerproto.RunEnd{Run: id, Status: status, Error: errText}
		if st := normalizeStatus(status); st != StatusOK && r.rankStatus == "" {
			r.rankStatus, r.rankError = st, endCause(ev)
		}
	}
	l.leave(now, r, p.ConnID, reason)
	return nil
}

// SetGPUs makes gpus (device indices) the GPUs of an owner's run from now
// on, as a GPU-set change: a process group's run holds only the GPUs its
// processes are on, so a GPU they left is idle. Trainers' runs and unknown
// or ended runs are left alone.
func (l *Ledger) SetGPUs(now time.Time, id string, gpus []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.runs[id]
	if !ok || r.ended || !r.implicit {
		return
	}
	var set []int
	for _, g := range gpus {
		if g >= 0 && g < len(l.cfg.Devices) && !slices.Contains(set, g) {
			set = append(set, g)
		}
	}
	slices.Sort(set)
	last := r.gpuChanges[len(r.gpuChanges)-1]
	if slices.Equal(last.gpus, set) {
		return
	}
	l.changeGPUs(now, r, set)
}
