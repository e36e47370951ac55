// Package fold holds the rules of applying a batch that do not depend on
// the database: which run starts are admitted, which records a node may
// send, what of a deleted run is dropped, and how a batch folds into its
// runs' aggregates. Each store (BadgerDB, PostgreSQL) reads the aggregates
// in its own transaction and calls these, so both decide alike.
package fold

import (
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Refusal is storage's.
type Refusal = storage.Refusal

// View is the aggregates and live runs as the store's transaction has them
// so far (the batches before this one in commit order folded in).
type View interface {
	// Peek returns a run's aggregate, nil when there is none, without
	// making it one to write.
	Peek(run string) (*aggregate.State, error)
	// Get returns a run's aggregate (a new one when there is none), to be
	// written when the transaction commits.
	Get(run string) (*aggregate.State, error)
	// LiveOn, SetLive, CapRefusal and NewRun: the node's live runs and
	// limits (a *Live's).
	LiveOn(node, run string) bool
	SetLive(node, run string, live bool)
	CapRefusal(node, run string, isNew bool) string
	NewRun(node string)
	// Now is the transaction's time.
	Now() time.Time
}

// A run_start for a run that has ended on every node it ran on is refused
// unless it asks to resume (aggregate.State.Admit; docs/protocol.md,
// "Joining a run from several nodes"). The refused start and the node's
// later records of the run never reach the run: its figures stay as they
// were. The GPU time and energy of the dropped windows are booked to the
// node's idle, as the agent books them once told, so usage rows still add
// up to the node.

// Admit decides the batch's run starts (membership, then the node's
// limits), drops the records the node may not send (authorize.go) and
// those of refused starts; it returns the batch to apply (b itself when
// nothing is dropped, else a copy), the refusals to tell the agent, and the
// other dropped records by run.
func Admit(g View, log *slog.Logger, gpus int, node string, b *trainmeterv1.Batch, runs []string) (*trainmeterv1.Batch, []Refusal, []Refusal, error) {
	refused := map[string]*Refusal{}
	var order []string
	refuse := func(st *aggregate.State) *Refusal {
		if r := refused[st.RunId]; r != nil {
			return r
		}
		rs, _ := st.RefusedOn(node)
		r := &Refusal{RunID: st.RunId, Start: rs.Latest, Reason: st.RefusalReason()}
		refused[st.RunId] = r
		order = append(order, st.RunId)
		return r
	}
	started := map[string]bool{} // runs with an accepted start in the batch
	capped := map[string]bool{}  // runs whose start the limits refused
	for _, e := range b.GetRunEvents() {
		switch ev := e.GetEvent().(type) {
		case *trainmeterv1.RunEvent_RunStart:
			id := ev.RunStart.GetRunId()
			if capped[id] {
				continue
			}
			st, err := g.Peek(id)
			if err != nil {
				return nil, nil, nil, err
			}
			wasLive := g.LiveOn(node, id)
			a := aggregate.AdmitNew
			if st != nil {
				a = st.Admission(node, ev.RunStart, g.Now())
			}
			if !wasLive && a != aggregate.AdmitRefused && !started[id] {
				if why := g.CapRefusal(node, id, a == aggregate.AdmitNew); why != "" {
					capped[id] = true
					refused[id] = &Refusal{RunID: id, Start: NanosOf(ev.RunStart.GetTime()), Reason: why}
					order = append(order, id)
					continue
				}
			}
			if st, err = g.Get(id); err != nil {
				return nil, nil, nil, err
			}
			if st.Admit(node, ev.RunStart, g.Now()) == aggregate.AdmitRefused {
				log.Warn("run_start refused: the run had ended on every node", "run_id", id, "node", node,
					"start", ev.RunStart.GetTime().AsTime())
				refuse(st)
				continue
			}
			if !started[id] && a == aggregate.AdmitNew {
				g.NewRun(node)
			}
			started[id] = true
			g.SetLive(node, id, true)
		case *trainmeterv1.RunEvent_RunEnd:
			// An end frees its run's place for the batch's later starts;
			// the group's view is set from the folded aggregate after.
			if id := ev.RunEnd.GetRunId(); g.LiveOn(node, id) {
				g.SetLive(node, id, false)
			}
		}
	}
	marked := map[string]*aggregate.State{}
	for _, id := range runs {
		st, err := g.Peek(id)
		if err != nil {
			return nil, nil, nil, err
		}
		if st == nil {
			continue
		}
		if _, ok := st.RefusedOn(node); ok {
			marked[id] = st
		}
	}
	az := newAuthorizer(node, gpus, started, func(id string) *aggregate.State {
		st, _ := g.Peek(id) // read above, or by the starts: no error now
		return st
	})
	dropped := map[string]*Refusal{}
	var dropOrder []string
	if len(marked) == 0 && len(refused) == 0 && az.allowsAll(b) {
		return b, nil, nil, nil
	}
	// keep reports whether the run's record at t (with energy checked for
	// a window) is applied, counting it where it is not.
	keep := func(run string, t int64, w *trainmeterv1.RunWindow) bool {
		if capped[run] && !started[run] {
			refused[run].Records++ // a start refused by the limits
			return false
		}
		if st := marked[run]; st != nil && !st.Keeps(node, t) {
			refuse(st).Records++
			return false
		}
		why := az.check(run, t, w)
		if why == "" {
			return true
		}
		d := dropped[run]
		if d == nil {
			d = &Refusal{RunID: run, Reason: why}
			dropped[run] = d
			dropOrder = append(dropOrder, run)
		}
		d.Records++
		return false
	}

	nb := proto.Clone(b).(*trainmeterv1.Batch)
	nb.RunWindows = nb.RunWindows[:0]
	for _, w := range b.GetRunWindows() {
		if keep(w.GetRunId(), NanosOf(w.GetEnd()), w) {
			nb.RunWindows = append(nb.RunWindows, w)
			continue
		}
		if Plausible(w) {
			bookIdle(nb.GpuWindows, w)
		}
	}
	nb.RunEvents = nb.RunEvents[:0]
	for _, e := range b.GetRunEvents() {
		id := aggregate.EventRunID(e)
		t := NanosOf(aggregate.EventTime(e))
		if e.GetRunStart() == nil {
			if keep(id, t, nil) {
				nb.RunEvents = append(nb.RunEvents, e)
			}
			continue
		}
		switch st := marked[id]; {
		case started[id]:
			nb.RunEvents = append(nb.RunEvents, e)
		case capped[id]:
			refused[id].Records++
		case st != nil && !st.Keeps(node, t):
			refuse(st).Records++
		default:
			nb.RunEvents = append(nb.RunEvents, e)
		}
	}
	for _, h := range nb.HostEnergy {
		kept := h.Runs[:0]
		for _, sh := range h.Runs {
			if keep(sh.GetRunId(), NanosOf(h.GetEnd()), nil) {
				kept = append(kept, sh)
				continue
			}
			h.IdleCpuEnergyJ += sh.GetCpuEnergyJ()
			h.IdleDramEnergyJ += sh.GetDramEnergyJ()
		}
		h.Runs = kept
	}
	// A loss record of the run from a node whose start was refused is of
	// the refused part (the node's agent had the run from that start on).
	// Otherwise a node's loss record of a run it started is kept whenever
	// it comes: the agent reports what its spool dropped once it can,
	// maybe long after the run ended.
	nb.Losses = nb.Losses[:0]
	for _, l := range b.GetLosses() {
		id := l.GetRunId()
		if st := marked[id]; st != nil {
			refuse(st).Records++
			continue
		}
		if keep(id, lossTime, nil) {
			nb.Losses = append(nb.Losses, l)
		}
	}
	return nb, inOrder(order, refused), inOrder(dropOrder, dropped), nil
}

// inOrder is m's refusals in the order of ids.
func inOrder(ids []string, m map[string]*Refusal) []Refusal {
	var out []Refusal
	for _, id := range ids {
		out = append(out, *m[id])
	}
	return out
}

func NanosOf(ts *timestamppb.Timestamp) int64 { return ts.AsTime().UnixNano() }

// bookIdle adds a dropped run window's share of each of its GPUs to that
// GPU's idle part of the batch (gws are the batch copy's own).
func bookIdle(gws []*trainmeterv1.GpuWindow, w *trainmeterv1.RunWindow) {
	shares := w.GetGpuShares()
	for _, sh := range shares {
		for _, gw := range gws {
			if gw.GetGpu() != sh.GetGpu() {
				continue
			}
			gw.IdleGpuSeconds += sh.GetGpuSeconds()
			gw.IdleEnergyCounterJ += sh.GetEnergyCounterJ()
			gw.IdleEnergyIntegratedJ += sh.GetEnergyIntegratedJ()
		}
	}
	if len(shares) == 0 && len(w.GetGpus()) == 1 {
		// A window from an agent before shares: the run had its GPU whole.
		for _, gw := range gws {
			if gw.GetGpu() == w.GetGpus()[0] {
				gw.IdleGpuSeconds += w.GetGpuSeconds()
				gw.IdleEnergyCounterJ += w.GetEnergyCounterJ()
				gw.IdleEnergyIntegratedJ += w.GetEnergyIntegratedJ()
			}
		}
	}
}
