package ledger

import (
	"maps"
	"slices"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A run the collector refused: its run_start reused the id of a run that
// had ended on every node (another node, or this one before the agent
// forgot it), without resume (docs/protocol.md, "Joining a run from several
// nodes"). The agent drops the run as if it had never started: no window,
// event or end of it goes out any more, and its GPUs' time is idle on this
// node from the next window on. Its trainers get the collector's reason as
// an error line (the agent's caller sends it), and their later events for
// the run are dropped without an answer each, counted.

// refusedConns are, per refused run id, the connections that were its
// trainers on this node when it was refused.
type refusedConns map[string]map[uint64]struct{}

// Refuse drops run id if it is the run that started at start (a later
// start of the same id, a resume, is another run and is kept). It returns
// the connections of the run's trainers, to tell them, and whether it
// dropped a run.
func (l *Ledger) Refuse(id string, start time.Time) ([]uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.runs[id]
	if r == nil || !r.start.Equal(start) {
		if e, ok := l.ended[id]; ok && r == nil && !e.End.Before(start) {
			// It ended here and its window closed before the refusal came:
			// the collector never took it, so it is no reason to refuse a
			// later start of the id on this node.
			l.forgetEnded(id)
		}
		return nil, false
	}
	conns := slices.Sorted(maps.Keys(r.members))
	if l.refused == nil {
		l.refused = refusedConns{}
	}
	if len(conns) > 0 {
		l.refused[id] = map[uint64]struct{}{}
		for _, c := range conns {
			l.refused[id][c] = struct{}{}
		}
	}
	if l.cfg.Load != nil && !r.ended {
		for _, g := range r.gpuChanges[len(r.gpuChanges)-1].gpus {
			l.cfg.Load.SetLoad(g, l.setSimWork(g, r.id, -1))
		}
	}
	delete(l.runs, id)
	l.order = slices.DeleteFunc(l.order, func(x string) bool { return x == id })
	l.forgetSimWork(id)
	l.hostEnergy.runs = slices.DeleteFunc(l.hostEnergy.runs, func(x *run) bool { return x == r })
	// Its events still waiting for a window (an eval, its end) go with it.
	l.pending = slices.DeleteFunc(l.pending, func(e *trainmeterv1.RunEvent) bool { return runOfEvent(e) == id })
	l.cfg.Logger.Warn("run refused by the collector: dropped; its trainers' later events for it are dropped",
		"run_id", id, "start", start, "trainers", len(conns))
	return conns, true
}

// droppedRefused reports whether an event for run id from conn is one of a
// refused run's trainers (dropped and counted; no error line for each).
func (l *Ledger) droppedRefused(id string, conn uint64) bool {
	if _, ok := l.refused[id][conn]; !ok {
		return false
	}
	l.refusedEvents++
	return true
}

// leaveRefused forgets conn as a trainer of the refused run id (it ended
// its part, disconnected, or started the id again).
func (l *Ledger) leaveRefused(id string, conn uint64) {
	set := l.refused[id]
	if set == nil {
		return
	}
	delete(set, conn)
	if len(set) == 0 {
		delete(l.refused, id)
	}
}

// RefusedEvents counts the trainer events dropped because their run had
// been refused by the collector.
func (l *Ledger) RefusedEvents() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refusedEvents
}

func runOfEvent(e *trainmeterv1.RunEvent) string {
	switch ev := e.GetEvent().(type) {
	case *trainmeterv1.RunEvent_RunStart:
		return ev.RunStart.GetRunId()
	case *trainmeterv1.RunEvent_RunEnd:
		return ev.RunEnd.GetRunId()
	case *trainmeterv1.RunEvent_Eval:
		return ev.Eval.GetRunId()
	}
	return ""
}
