package store

import (
	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A run_start for a run that has ended on every node it ran on is refused
// unless it asks to resume (aggregate.State.Admit; docs/protocol.md,
// "Joining a run from several nodes"). The committer decides, on the
// aggregates as the batches before have left them, so two nodes' batches
// in one group are decided in the order they are applied. The refused
// start, and the node's later records of the run, never reach the run's
// aggregate or its raw records: the ended run's figures stay exactly as
// they were. The GPU time and energy of the node's dropped windows are
// booked to the node's idle, as the agent books them once it has been told
// (no run the collector accepted was on those GPUs), so usage rows still
// add up to the node.

// Refusal is a start the store refused, or a refused start whose node sent
// more records of the run (dropped): what the agent is to be told.
type Refusal struct {
	RunID  string
	Start  int64 // the refused RunStart's time, Unix ns
	Reason string
	// Records is the number of the batch's records of the run dropped.
	Records int
}

// Applied is the outcome of ApplyBatchResult.
type Applied struct {
	// Duplicate: the batch was applied before; nothing changed.
	Duplicate bool
	// Refused lists the runs whose start the batch carried was refused, or
	// whose records from a refused start on it carried were dropped.
	Refused []Refusal
}

// admitBatch decides the batch's run starts and drops the records of
// refused ones; it returns the batch to apply (b itself when nothing is
// dropped, else a copy) and the refusals.
func (s *Store) admitBatch(txn *badger.Txn, g *groupAggs, node string, b *trainmeterv1.Batch, runs []string) (*trainmeterv1.Batch, []Refusal, error) {
	refused := map[string]*Refusal{}
	var order []string
	refuse := func(st *aggregate.State) *Refusal {
		if r := refused[st.RunID]; r != nil {
			return r
		}
		rs, _ := st.RefusedOn(node)
		r := &Refusal{RunID: st.RunID, Start: rs.Latest, Reason: st.RefusalReason()}
		refused[st.RunID] = r
		order = append(order, st.RunID)
		return r
	}
	for _, e := range b.GetRunEvents() {
		ev := e.GetRunStart()
		if ev == nil {
			continue
		}
		st, err := g.get(txn, ev.GetRunId())
		if err != nil {
			return nil, nil, err
		}
		if st.Admit(node, ev) == aggregate.AdmitRefused {
			s.log.Warn("run_start refused: the run had ended on every node", "run_id", ev.GetRunId(), "node", node,
				"start", ev.GetTime().AsTime())
			refuse(st)
		}
	}
	marked := map[string]*aggregate.State{}
	for _, id := range runs {
		st, err := g.get(txn, id)
		if err != nil {
			return nil, nil, err
		}
		if _, ok := st.RefusedOn(node); ok {
			marked[id] = st
		}
	}
	if len(marked) == 0 {
		return b, nil, nil
	}
	keep := func(run string, t int64) bool {
		st := marked[run]
		return st == nil || st.Keeps(node, t)
	}
	drop := func(run string) { refuse(marked[run]).Records++ }

	nb := proto.Clone(b).(*trainmeterv1.Batch)
	nb.RunWindows = nb.RunWindows[:0]
	for _, w := range b.GetRunWindows() {
		if keep(w.GetRunId(), nanosOf(w.GetEnd())) {
			nb.RunWindows = append(nb.RunWindows, w)
			continue
		}
		drop(w.GetRunId())
		bookIdle(nb.GpuWindows, w)
	}
	nb.RunEvents = nb.RunEvents[:0]
	for _, e := range b.GetRunEvents() {
		id := eventRun(e)
		if keep(id, nanosOf(aggregate.EventTime(e))) {
			nb.RunEvents = append(nb.RunEvents, e)
			continue
		}
		drop(id)
	}
	for _, h := range nb.HostEnergy {
		kept := h.Runs[:0]
		for _, sh := range h.Runs {
			if keep(sh.GetRunId(), nanosOf(h.GetEnd())) {
				kept = append(kept, sh)
				continue
			}
			drop(sh.GetRunId())
			h.IdleCpuEnergyJ += sh.GetCpuEnergyJ()
			h.IdleDramEnergyJ += sh.GetDramEnergyJ()
		}
		h.Runs = kept
	}
	// A loss record of the run from a node whose start was refused is of
	// the refused part (the node's agent had the run from that start on).
	nb.Losses = nb.Losses[:0]
	for _, l := range b.GetLosses() {
		if marked[l.GetRunId()] == nil {
			nb.Losses = append(nb.Losses, l)
			continue
		}
		drop(l.GetRunId())
	}
	out := make([]Refusal, 0, len(order))
	for _, id := range order {
		out = append(out, *refused[id])
	}
	return nb, out, nil
}

func nanosOf(ts *timestamppb.Timestamp) int64 { return ts.AsTime().UnixNano() }

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
