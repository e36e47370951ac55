package spool

// Loss accounting: what each run lost when batches are dropped (eviction,
// unwritable batches), carried to the collector on the next batch.

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/internal/batchcheck"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// evictOldest removes the oldest segment, dropping its unacked batches.
func (s *Spool) evictOldest(reason string) {
	if len(s.segs) == 0 {
		return
	}
	g := s.segs[0]
	var dropped, droppedBytes int
	var lagging uint8 // the collectors that lose something
	rd := s.reader(g)
	for _, r := range g.recs {
		if r.done {
			continue
		}
		dropped++
		droppedBytes += int(r.size)
		b, err := rd.read(r)
		if err != nil {
			s.log.Error("spool: a dropped batch could not be read back; its loss is unknown", "seq", r.seq)
			continue
		}
		s.fromBefore(b)
		// Only the collectors that had not acked it lose it.
		forMask := s.all &^ r.ackedBy
		lagging |= forMask
		s.account(b, reason, r.sent || r.doubt, true, forMask)
	}
	rd.close()
	s.stats.Dropped += uint64(dropped)
	s.stats.DroppedBytes += uint64(droppedBytes)
	if dropped > 0 {
		s.log.Warn("spool: dropped the oldest batches to make room", "reason", reason, "batches", dropped,
			"bytes", droppedBytes, "first_seq", g.first, "dropped_total", s.stats.Dropped, "lost_for", s.maskNames(lagging))
	}
	if i := slices.Index(s.segs, g); i >= 0 {
		s.removeSegment(i)
	}
}

// dropUnwritten counts a batch that never reached the disk. Its seq is
// reused by the next batch, so no gap appears for it.
func (s *Spool) dropUnwritten(b *trainmeterv1.Batch, own []*trainmeterv1.DataLoss, ownEvents []*trainmeterv1.RunEvent, size int64, reason string, err error) error {
	// The pending records it was to carry are still pending: not lost with it.
	b.Losses, b.NodeLosses = own, nil
	b.RunEvents = ownEvents
	s.stats.Dropped++
	s.stats.DroppedBytes += uint64(size)
	s.account(b, reason, false, true, s.all)
	s.log.Error(err.Error(), "runs_affected", runIDs(b))
	s.saveState()
	return err
}

func runIDs(b *trainmeterv1.Batch) []string {
	var out []string
	for _, w := range b.GetRunWindows() {
		if !slices.Contains(out, w.GetRunId()) {
			out = append(out, w.GetRunId())
		}
	}
	return out
}

// account adds what batch b held to the pending loss report of the
// collectors in forMask (the others had acked b). inDoubt: b was sent and may
// have been applied; it gets its own record with its seq. carry: b's run
// events go on with the next batch.
func (s *Spool) account(b *trainmeterv1.Batch, reason string, inDoubt, carry bool, forMask uint8) {
	// Loss records b already carried (from earlier drops) are lost with it,
	// for those of their collectors that lose b.
	for _, l := range slices.Concat(b.GetLosses(), b.GetNodeLosses()) {
		m, ok := s.narrow(l.GetSpoolCollectors(), forMask)
		if !ok {
			continue
		}
		if l.GetSeq() != 0 && len(s.seqLosses) < maxPerSeqRec {
			c := proto.Clone(l).(*trainmeterv1.DataLoss)
			c.SpoolCollectors = m
			s.seqLosses = append(s.seqLosses, c)
			continue
		}
		s.mergeLoss(l.GetRunId(), m, l)
	}
	if carry {
		for _, e := range b.GetRunEvents() {
			m, ok := s.narrow(e.GetSpoolCollectors(), forMask)
			if !ok {
				continue
			}
			if len(s.events) >= maxCarriedEvents {
				s.log.Error("spool: too many run events carried from dropped batches; dropping one", "event", e.String())
				continue
			}
			e.SpoolCollectors = m
			s.events = append(s.events, e)
		}
	}
	own, _ := s.narrow(0, forMask)
	var recs []*trainmeterv1.DataLoss // one per run, in order of appearance
	lossOf := func(id string) *trainmeterv1.DataLoss {
		if i := slices.IndexFunc(recs, func(l *trainmeterv1.DataLoss) bool { return l.RunId == id }); i >= 0 {
			return recs[i]
		}
		recs = append(recs, &trainmeterv1.DataLoss{RunId: id, Batches: 1, Reason: reason})
		return recs[len(recs)-1]
	}
	// A garbled figure (NaN, negative, past the collector's limit) is left
	// out of the record, which still reports the batch lost for the run.
	garbled := false
	for _, w := range b.GetRunWindows() {
		if batchcheck.ID("run_id", w.GetRunId()) != nil {
			s.log.Error("spool: a dropped window's run id is malformed; its loss is not reported", "seq", b.GetSeq())
			continue
		}
		l := lossOf(w.GetRunId())
		l.Tokens += w.GetTokens()
		e := w.GetEnergyIntegratedJ()
		if w.GetCounterOk() {
			e = w.GetEnergyCounterJ()
		}
		if plausible(e, w.GetGpuSeconds()) {
			l.EnergyJ += e
			l.GpuSeconds += w.GetGpuSeconds()
		} else {
			garbled = true
		}
	}
	// The runs' CPU+DRAM shares go with the batch too. A run's last host
	// interval may come a batch after its end, so a share alone makes a
	// loss record of the run.
	for _, h := range b.GetHostEnergy() {
		for _, sh := range h.GetRuns() {
			if batchcheck.ID("run_id", sh.GetRunId()) != nil {
				s.log.Error("spool: a dropped host energy share's run id is malformed; its loss is not reported", "seq", b.GetSeq())
				continue
			}
			l := lossOf(sh.GetRunId())
			if plausible(sh.GetCpuEnergyJ(), sh.GetDramEnergyJ()) {
				l.HostEnergyJ += sh.GetCpuEnergyJ() + sh.GetDramEnergyJ()
			} else {
				garbled = true
			}
		}
	}
	// The node's record (run id "") goes the same ways as the runs'.
	node, nodeGarbled := nodeLoss(b, reason)
	recs = append(recs, node)
	if garbled || nodeGarbled {
		s.log.Error("spool: a dropped batch has garbled figures; its loss is reported without them", "seq", b.GetSeq())
	}
	for _, l := range recs {
		if inDoubt && len(s.seqLosses) < maxPerSeqRec {
			// With its window start the collector finds the batch by its
			// GPU/host record, which is all it keeps of most batches.
			l.Seq, l.SpoolCollectors, l.WindowStart = b.GetSeq(), own, b.GetWindowStart()
			s.seqLosses = append(s.seqLosses, l)
			continue
		}
		s.mergeLoss(l.RunId, own, l)
	}
}

// nodeLoss is what b held for the node as a whole: every GPU's energy and
// time (runs + idle, downtime bridged included, as the collector's usage
// adds them up) and the CPU+DRAM energy, each with its idle part. A GPU's
// or the host's garbled figures are left out (garbled says so).
func nodeLoss(b *trainmeterv1.Batch, reason string) (l *trainmeterv1.DataLoss, garbled bool) {
	l = &trainmeterv1.DataLoss{Batches: 1, Reason: reason, FirstWindowStart: b.GetWindowStart()}
	for _, gw := range b.GetGpuWindows() {
		e, idle := gw.GetEnergyIntegratedJ(), gw.GetIdleEnergyIntegratedJ()
		if gw.GetCounterOk() {
			e, idle = gw.GetEnergyCounterJ(), gw.GetIdleEnergyCounterJ()
		}
		e += gw.GetDowntimeEnergyCounterJ()
		idle += gw.GetDowntimeIdleEnergyCounterJ()
		secs := gw.GetGpuSeconds() + gw.GetDowntimeGpuSeconds()
		idleSecs := gw.GetIdleGpuSeconds() + gw.GetDowntimeIdleGpuSeconds()
		if plausible(e, idle, secs, idleSecs) {
			l.EnergyJ += e
			l.IdleEnergyJ += idle
			l.GpuSeconds += secs
			l.IdleGpuSeconds += idleSecs
		} else {
			garbled = true
		}
	}
	for _, h := range b.GetHostEnergy() {
		e, idle := h.GetCpuEnergyJ()+h.GetDramEnergyJ(), h.GetIdleCpuEnergyJ()+h.GetIdleDramEnergyJ()
		if plausible(e, idle) {
			l.HostEnergyJ += e
			l.IdleHostEnergyJ += idle
		} else {
			garbled = true
		}
	}
	return l, garbled
}

// plausible says whether figures may go in a loss record: ones the
// collector refuses (batchcheck.Phys) would get the batch carrying the
// record refused.
func plausible(figures ...float64) bool {
	for _, v := range figures {
		if batchcheck.Phys("figure", v) != nil {
			return false
		}
	}
	return true
}

// mergeLoss adds the figures and reason of add to the pending loss record
// of run for collectors.
func (s *Spool) mergeLoss(run string, collectors uint32, add *trainmeterv1.DataLoss) {
	k := lossKey(run, collectors)
	l := s.losses[k]
	if l == nil {
		l = &trainmeterv1.DataLoss{RunId: run, SpoolCollectors: collectors}
		s.losses[k] = l
	}
	l.Batches += add.GetBatches()
	l.Tokens += add.GetTokens()
	l.EnergyJ += add.GetEnergyJ()
	l.GpuSeconds += add.GetGpuSeconds()
	l.HostEnergyJ += add.GetHostEnergyJ()
	l.IdleEnergyJ += add.GetIdleEnergyJ()
	l.IdleGpuSeconds += add.GetIdleGpuSeconds()
	l.IdleHostEnergyJ += add.GetIdleHostEnergyJ()
	if f := add.GetFirstWindowStart(); f != nil && (l.FirstWindowStart == nil || f.AsTime().Before(l.FirstWindowStart.AsTime())) {
		l.FirstWindowStart = f
	}
	l.Reason = addReason(l.Reason, add.GetReason())
}

// attachLosses puts the pending loss records on b after own (the records
// b came with): the runs' in losses, the node's (run id "") in node_losses.
// A record the collector would refuse is left out: the refusal would take
// the whole batch, and the records it carried would go on with the next
// batch to be refused again, so that no batch got through any more.
func (s *Spool) attachLosses(b *trainmeterv1.Batch, own []*trainmeterv1.DataLoss) {
	b.Losses, b.NodeLosses = nil, nil
	// The pending records are copies, in a stable order: they are cleared
	// only once a batch carrying them is written.
	pending := slices.Concat(own, s.sortedLosses(), s.seqLosses)
	for i, l := range pending[len(own):] {
		pending[len(own)+i] = proto.Clone(l).(*trainmeterv1.DataLoss)
	}
	for _, l := range pending {
		check, to := batchcheck.Loss, &b.Losses
		if l.GetRunId() == "" {
			check, to = batchcheck.NodeLoss, &b.NodeLosses
		}
		if err := check(l); err != nil {
			s.log.Error("spool: a loss record is not one a collector accepts; it is not reported", "run_id", l.GetRunId(), "err", err)
			continue
		}
		*to = append(*to, l)
	}
}

// sortedLosses is the pending aggregated loss records by key.
func (s *Spool) sortedLosses() []*trainmeterv1.DataLoss {
	var out []*trainmeterv1.DataLoss
	for _, k := range slices.Sorted(maps.Keys(s.losses)) {
		out = append(out, s.losses[k])
	}
	return out
}

func addReason(have, r string) string {
	if r == "" {
		return have
	}
	parts := strings.Split(have, "; ")
	if have == "" {
		parts = nil
	}
	for _, p := range parts {
		if p == r || p == "…" {
			return have
		}
	}
	if len(parts) >= maxReasons {
		return have + "; …"
	}
	// Valid UTF-8 and cut at a rune: a reason the collector cannot store
	// gets the batch carrying it refused (attachLosses).
	r = strings.ToValidUTF8(r, "\uFFFD")
	if len(r) > 200 {
		cut := 200
		for cut > 0 && !utf8.RuneStart(r[cut]) {
			cut--
		}
		r = r[:cut]
	}
	return strings.Join(append(parts, r), "; ")
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Reject drops seq for this collector for good (it refused the batch) and
// reports the loss to it alone; the other collectors still get the batch.
func (c *Cursor) Reject(seq uint64, reason string) {
	s, i := c.s, c.i
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.bySeq[seq]
	if s.closed || r == nil || !r.waits(i) {
		return
	}
	b, rerr := s.readLocked(r)
	if rerr == nil {
		s.fromBefore(b)
	}
	// Out of the spool first: the state write below may drop old segments
	// to make room, and must not count this batch a second time.
	if s.ackLocked(i, seq) {
		s.stats.Rejected++
		s.cursorStats[i].Rejected++
	}
	if rerr == nil {
		// The collector stored nothing of it: certainly lost there.
		// Its events are not carried on: they may be what was refused.
		s.account(b, "rejected: "+reason, false, false, 1<<i)
		s.saveState()
	}
}
