package spool

// Cursors: one per collector over the same records, each with its own acks
// (record.ackedBy, ack-log kind 'A'+i). Loss records and carried run events
// say which collectors they are for (spool_collectors, a bit per cursor, 0:
// all); ReadAfter gives each collector only its own, with the mask cleared.

import (
	"cmp"
	"fmt"
	"slices"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// MaxCollectors is how many collectors (cursors) one spool serves.
const MaxCollectors = 8

// CursorStats are one collector's counters since Open.
type CursorStats struct {
	Acked, Rejected uint64
}

// Cursor is one collector's view of the spool: what it has not acked.
// It is safe for concurrent use.
type Cursor struct {
	s *Spool
	i int
}

func checkCollectors(names []string) error {
	if len(names) > MaxCollectors {
		return fmt.Errorf("spool: %d collectors; at most %d", len(names), MaxCollectors)
	}
	for i, n := range names {
		if slices.Contains(names[:i], n) {
			return fmt.Errorf("spool: collector %q is named twice", n)
		}
	}
	return nil
}

// Cursors is the number of collectors the spool serves.
func (s *Spool) Cursors() int { return max(len(s.names), 1) }

// Cursor returns the i-th collector's cursor (0 ≤ i < Cursors()).
func (s *Spool) Cursor(i int) *Cursor {
	if i < 0 || i >= s.Cursors() {
		panic(fmt.Sprintf("spool: cursor %d of %d", i, s.Cursors()))
	}
	return &Cursor{s: s, i: i}
}

// Name is the collector's name as given in Options.Collectors ("" if none).
func (c *Cursor) Name() string {
	if c.i < len(c.s.names) {
		return c.s.names[c.i]
	}
	return ""
}

// Ack marks seq delivered to this collector. Unknown seqs (already acked or
// dropped) are ignored.
func (c *Cursor) Ack(seq uint64) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ackLocked(c.i, seq) {
		s.stats.Acked++
		s.cursorStats[c.i].Acked++
	}
}

// MarkSent records that seq went out on a stream, so that if it is dropped
// later its loss is reported as in doubt (a collector may hold it).
func (c *Cursor) MarkSent(seq uint64) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if r := c.s.bySeq[seq]; r != nil {
		r.sent = true
	}
}

// Len is the number of batches held that this collector has not acked.
func (c *Cursor) Len() int {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.pendingFor[c.i]
}

// countPending sets pendingFor from the records at open.
func (s *Spool) countPending() {
	s.pendingFor = [MaxCollectors]int{}
	for _, g := range s.segs {
		for _, r := range g.recs {
			s.addPending(r, 1)
		}
	}
}

// addPending adds d to the pending count of every collector that has not
// acked r: 1 for a record held, -1 for one that goes (dropped, unreadable).
func (s *Spool) addPending(r *record, d int) {
	for i := range s.Cursors() {
		if r.waits(i) {
			s.pendingFor[i] += d
		}
	}
}

// Stats returns this collector's counters.
func (c *Cursor) Stats() CursorStats {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.cursorStats[c.i]
}

// cursorRemap maps each cursor index of the process before (the state's
// collector names) to this spool's, -1 for a collector no longer configured;
// without names, before or now, index to index.
func (s *Spool) cursorRemap() (m [MaxCollectors]int, remapped bool) {
	for i := range m {
		m[i] = -1
	}
	n := s.Cursors()
	if len(s.loadedNames) == 0 || len(s.names) == 0 {
		for i := range n {
			m[i] = i
		}
		return m, false
	}
	for old, name := range s.loadedNames {
		if old < MaxCollectors {
			m[old] = slices.Index(s.names, name)
			remapped = remapped || m[old] != old
		}
	}
	if !slices.Equal(s.loadedNames, s.names) {
		s.log.Info("spool: the collector list changed; acks are kept per collector name, and a new collector gets the batches still pending for any of them",
			"before", s.loadedNames, "now", s.names)
	}
	return m, remapped
}

// noCollector is a mask no cursor matches: a record meant only for
// collectors no longer configured.
const noCollector = 1 << 31

// maskNow translates a mask written by the previous process (its cursor
// indices) to this one's; ok is false when none of its collectors is left.
func (s *Spool) maskNow(old uint32) (mask uint32, ok bool) {
	if !s.remapped || old == 0 {
		return old, true
	}
	var m uint8
	for i := range MaxCollectors {
		if old&(1<<i) != 0 && s.before[i] >= 0 {
			m |= 1 << s.before[i]
		}
	}
	return s.maskOf(m)
}

// maskOf turns a set of this spool's collectors into a record's mask: ok is
// false when the set is empty; 0 means all of them.
func (s *Spool) maskOf(m uint8) (mask uint32, ok bool) {
	if m == 0 {
		return 0, false
	}
	if m == s.all {
		return 0, true
	}
	return uint32(m), true
}

// fromBefore translates the masks of a batch written before this open.
func (s *Spool) fromBefore(b *trainmeterv1.Batch) {
	if !s.remapped || b.Seq >= s.openSeq {
		return
	}
	now := func(old uint32) uint32 {
		if m, ok := s.maskNow(old); ok {
			return m
		}
		return noCollector
	}
	for _, l := range slices.Concat(b.Losses, b.NodeLosses) {
		l.SpoolCollectors = now(l.SpoolCollectors)
	}
	for _, e := range b.RunEvents {
		e.SpoolCollectors = now(e.SpoolCollectors)
	}
}

// narrow restricts a record meant for have (0: every collector) to the
// collectors in to. ok is false when none is left; 0 again means all.
func (s *Spool) narrow(have uint32, to uint8) (mask uint32, ok bool) {
	eff := s.all
	if have != 0 {
		eff = uint8(have) & s.all
	}
	return s.maskOf(eff & to)
}

// forCollector keeps only the loss records and carried events of b meant
// for collector i, and clears their masks: a collector never sees one.
func (s *Spool) forCollector(b *trainmeterv1.Batch, i int) *trainmeterv1.Batch {
	notFor := func(mask uint32) bool { return mask != 0 && mask&(1<<i) == 0 }
	b.Losses = slices.DeleteFunc(b.Losses, func(l *trainmeterv1.DataLoss) bool { return notFor(l.SpoolCollectors) })
	b.NodeLosses = slices.DeleteFunc(b.NodeLosses, func(l *trainmeterv1.DataLoss) bool { return notFor(l.SpoolCollectors) })
	b.RunEvents = slices.DeleteFunc(b.RunEvents, func(e *trainmeterv1.RunEvent) bool { return notFor(e.SpoolCollectors) })
	for _, l := range slices.Concat(b.Losses, b.NodeLosses) {
		l.SpoolCollectors = 0
	}
	for _, e := range b.RunEvents {
		e.SpoolCollectors = 0
	}
	return b
}

// maskNames names the collectors in mask, for logs.
func (s *Spool) maskNames(mask uint8) []string {
	var out []string
	for i := range s.Cursors() {
		if mask&(1<<i) != 0 {
			out = append(out, cmp.Or(s.Cursor(i).Name(), "collector"))
		}
	}
	return out
}

// lossKey keys the pending aggregated loss records: per run and per set of
// collectors it is for.
func lossKey(run string, collectors uint32) string {
	if collectors == 0 {
		return run
	}
	return fmt.Sprintf("%s\x00%d", run, collectors)
}
