package agent

import (
	"slices"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// Splitting a shared GPU (docs/measurement.md, "Shared GPUs and idle"): once
// a second, off the 50 ms sampling path, the agent asks the backend what
// each process did on each GPU (NVML per-process SM utilisation since the
// last poll, and GPU memory), maps the processes to runs through the process
// trees it knows (a run's attribute_pid and its ranks' socket peers), and
// hands the ledger each run's work per GPU. A replay trace states it per run.
// Simulated GPUs need no poll: the ledger uses each run's reported load.

const shareEvery = time.Second

// initSharing picks the backend's per-run, else per-process, use reader.
func (a *Agent) initSharing() bool {
	if a.runUse, _ = a.backend.(gpu.RunUsageReader); a.runUse == nil {
		a.procUse, _ = a.backend.(gpu.ProcessUsageReader)
	}
	return a.runUse != nil || a.procUse != nil
}

// pollSharing sets, for every GPU that more than one run is on, each run's
// work on it. GPUs with one run or none are not polled: nothing to split.
func (a *Agent) pollSharing() {
	now := a.clock.Now()
	runs := a.ledger.SharedRuns(now)
	on := map[int][]ledger.SharedRun{}
	for _, r := range runs {
		for _, g := range r.GPUs {
			on[g] = append(on[g], r)
		}
	}
	since := a.lastUsePoll
	a.lastUsePoll = now
	ppids := map[int]int{}
	for g, rs := range on {
		if len(rs) < 2 {
			continue
		}
		work := map[string]ledger.RunWork{}
		switch {
		case a.runUse != nil:
			for id, u := range a.runUse.RunUsage(g, now) {
				work[id] = ledger.RunWork{SMPct: u.SMPct, SMOK: u.SMOK, MemMiB: u.MemMiB, MemOK: u.MemOK}
			}
		case a.procUse != nil:
			use, err := a.procUse.ProcessUsage(g, since)
			if err != nil {
				if now.Sub(a.lastUseErr) > time.Minute {
					a.lastUseErr = now
					a.log.Warn("cannot read a GPU's per-process use; its runs split it equally", "gpu", g, "err", err)
				}
				continue
			}
			instances := map[string]map[uint32]int{} // run -> MIG instance -> slices
			for pid, u := range use {
				for _, r := range rs {
					if !slices.ContainsFunc(r.Roots, func(root int) bool { return inTree(a.procRoot, int(pid), root, ppids) }) {
						continue
					}
					w := work[r.ID]
					if u.SMOK {
						w.SMPct += u.SMPct
						w.SMOK = true
					}
					if u.MemOK {
						w.MemMiB += u.MemMiB
						w.MemOK = true
					}
					work[r.ID] = w
					if u.MIGSlices > 0 {
						if instances[r.ID] == nil {
							instances[r.ID] = map[uint32]int{}
						}
						instances[r.ID][u.MIGInstance] = u.MIGSlices
					}
					break
				}
			}
			setMIGSlices(work, instances)
		}
		a.ledger.SetWork(g, work)
	}
}

// setMIGSlices gives each run the compute slices of the MIG instances its
// processes are in, when no two runs share an instance: then the runs split
// the GPU's power by slices. Runs in one instance time-slice it, and the
// other rules apply.
func setMIGSlices(work map[string]ledger.RunWork, instances map[string]map[uint32]int) {
	owner := map[uint32]string{}
	for id, insts := range instances {
		for inst := range insts {
			if o, taken := owner[inst]; taken && o != id {
				return
			}
			owner[inst] = id
		}
	}
	for id, insts := range instances {
		w := work[id]
		for _, n := range insts {
			w.MIGSlices += n
		}
		work[id] = w
	}
}
