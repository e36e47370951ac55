package fold

import (
	"fmt"
	"math"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Ingest authorization (docs/security.md, "What a node's token can
// change"): a node's records of a run are applied only when the node
// started the run (an accepted run_start of its own, in this batch or
// before) and, for records with a time, only while the run is live on the
// node or up to EndGrace after its end there; a run window's energy must
// be one the node's GPUs can draw. Anything else is dropped and counted,
// and the rest of the batch applied: refusing the whole batch would stop
// the node's stream on one record. A store decides on the aggregates as the
// batches before (in commit order) left them.

// EndGrace is how long after a node's end of a run (by the agent's clock:
// a record's time against the run_end's) the node's records of the run
// are still applied: the end's own window and host energy interval close
// up to a window (1 s) after the run_end, and come in the same batch or
// the next. 10 s is ten agent windows.
const EndGrace = 10 * time.Second

// lossTime stands for the time of a loss record, which has none: a loss
// record of a run the node started is applied whenever it comes (the
// agent reports what its spool dropped once it can, maybe long after the
// run ended).
const lossTime = math.MinInt64

// maxWindowGPUSlack is the GPU-seconds a window may hold beyond its
// length times the node's GPUs (rounding of the agent's segment times).
const maxWindowGPUSlack = 1.0

type authorizer struct {
	node    string
	gpus    int             // the node's GPUs, as its Hello named them
	started map[string]bool // runs with an accepted start of the node in the batch
	state   func(run string) *aggregate.State
	cache   map[string]runAuth
}

// runAuth is what the node may send of a run.
type runAuth struct {
	member   bool  // the node started the run
	live     bool  // the run is live on the node
	endLimit int64 // when not live: the last time (Unix ns) a record is applied
	endAt    int64
}

func newAuthorizer(node string, gpus int, started map[string]bool, state func(string) *aggregate.State) *authorizer {
	return &authorizer{node: node, gpus: gpus, started: started, state: state, cache: map[string]runAuth{}}
}

func (a *authorizer) run(id string) runAuth {
	if r, ok := a.cache[id]; ok {
		return r
	}
	var r runAuth
	st := a.state(id)
	switch {
	case a.started[id]:
		r = runAuth{member: true, live: true}
	case st != nil && st.StartedOn(a.node):
		r.member = true
		if end, ended := st.EndedOn(a.node); ended {
			r.endAt, r.endLimit = end, end+int64(EndGrace)
		} else {
			r.live = true
		}
	}
	a.cache[id] = r
	return r
}

// check returns why the node's record of run at t (lossTime: a loss record;
// w: a run window, whose energy is checked) is refused, "" when it is not.
func (a *authorizer) check(run string, t int64, w *trainmeterv1.RunWindow) string {
	r := a.run(run)
	if !r.member {
		return fmt.Sprintf("run %q: node %s did not start it (no accepted run_start of it from this node): its records are refused", run, a.node)
	}
	if !r.live && t != lossTime && t > r.endLimit {
		return fmt.Sprintf("run %q ended on node %s at %s: its records from more than %s after that are refused",
			run, a.node, time.Unix(0, r.endAt).UTC().Format(time.RFC3339Nano), EndGrace)
	}
	if w != nil {
		return a.energy(w)
	}
	return ""
}

// energy checks a window against what the node's GPUs can do: GPU-seconds
// at most the window's length times the node's GPUs, and energy at most
// gpu.MaxPowerW per GPU-second (as the agent bounds each reading, with at
// least one second per GPU of the window), for the window and each share.
func (a *authorizer) energy(w *trainmeterv1.RunWindow) string {
	length := w.GetEnd().AsTime().Sub(w.GetStart().AsTime()).Seconds()
	gpus := a.gpus
	if gpus == 0 {
		gpus = max(len(w.GetGpus()), 1) // a node whose Hello the store has not seen
	}
	if gs, most := w.GetGpuSeconds(), length*float64(gpus)+maxWindowGPUSlack; gs > most {
		return fmt.Sprintf("run %q: a window of %.3g s holds %.6g GPU-s, more than node %s's %d GPUs can (%.6g)",
			w.GetRunId(), length, gs, a.node, gpus, most)
	}
	if !Plausible(w) {
		return fmt.Sprintf("run %q: a window's energy (%.6g J) is more than its %.6g GPU-s can draw at %d W per GPU",
			w.GetRunId(), max(w.GetEnergyCounterJ(), w.GetEnergyIntegratedJ()), w.GetGpuSeconds(), gpu.MaxPowerW)
	}
	return ""
}

// Plausible reports whether a window's energy, and each share's, is at
// most gpu.MaxPowerW per GPU-second (at least one second per GPU).
func Plausible(w *trainmeterv1.RunWindow) bool {
	ok := func(counter, integrated, gpuSeconds float64, gpus int) bool {
		most := gpu.MaxPowerW * max(gpuSeconds, float64(max(gpus, 1)))
		return counter <= most && integrated <= most
	}
	if !ok(w.GetEnergyCounterJ(), w.GetEnergyIntegratedJ(), w.GetGpuSeconds(), len(w.GetGpus())) {
		return false
	}
	for _, sh := range w.GetGpuShares() {
		if !ok(sh.GetEnergyCounterJ(), sh.GetEnergyIntegratedJ(), sh.GetGpuSeconds(), 1) {
			return false
		}
	}
	return true
}

// allowsAll reports whether every record of b naming a run is one the
// node may send (the common case: nothing to copy).
func (a *authorizer) allowsAll(b *trainmeterv1.Batch) bool {
	for _, w := range b.GetRunWindows() {
		if a.check(w.GetRunId(), NanosOf(w.GetEnd()), w) != "" {
			return false
		}
	}
	for _, e := range b.GetRunEvents() {
		if e.GetRunStart() == nil && a.check(aggregate.EventRunID(e), NanosOf(aggregate.EventTime(e)), nil) != "" {
			return false
		}
	}
	for _, h := range b.GetHostEnergy() {
		for _, sh := range h.GetRuns() {
			if a.check(sh.GetRunId(), NanosOf(h.GetEnd()), nil) != "" {
				return false
			}
		}
	}
	for _, l := range b.GetLosses() {
		if a.check(l.GetRunId(), lossTime, nil) != "" {
			return false
		}
	}
	return true
}
