package spool

// Acks, and the ack log that keeps them (layout in spool.go): replayed at
// open, compacted whenever a segment goes.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// ackLocked records that collector i acked seq; the record is done once
// every collector has.
func (s *Spool) ackLocked(i int, seq uint64) bool {
	if s.closed {
		return false
	}
	r := s.bySeq[seq]
	if r == nil || !r.waits(i) {
		return false
	}
	r.ackedBy |= 1 << i
	s.pendingFor[i]--
	if s.ackf != nil {
		if _, err := s.ackf.Write(appendAck(nil, i, seq)); err != nil {
			s.log.Warn("spool: appending to the ack log (the batch may be re-sent after a restart)", "seq", seq, "err", err)
		}
		s.ackLogN++
	}
	if r.ackedBy&s.all != s.all {
		return true
	}
	r.done = true
	s.forget(r)
	r.seg.live--
	if s.effMax < s.maxBytes && s.unackedLocked() == 0 {
		// The collector took everything: the pressure that filled the
		// disk is over.
		s.log.Info("spool: drained by the collector; restoring its byte bound after a full disk", "max_bytes", s.maxBytes)
		s.effMax = s.maxBytes
		s.segBytes = s.cfgSegBytes
	}
	if s.removeDeadSegments() && s.ackLogN > 4096 {
		if err := s.rewriteAcks(); err != nil {
			s.log.Error("spool: compacting the ack log", "err", err)
		}
	}
	return true
}

func (s *Spool) loadAcks() error {
	path := filepath.Join(s.dir, ackName)
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("spool: %w", err)
	}
	bad := 0
	before := map[*record]uint8{} // acks by the previous list's index
	beforeAll := uint8(1)<<max(len(s.loadedNames), 1) - 1
	for off := 0; off+ackEntry <= len(data); off += ackEntry {
		e := data[off : off+ackEntry]
		if crc32.Checksum(e[:9], castagnoli) != binary.LittleEndian.Uint32(e[9:]) || e[0] < ackKindAck || e[0] >= ackKindAck+MaxCollectors {
			bad++
			continue
		}
		r := s.bySeq[binary.LittleEndian.Uint64(e[1:9])]
		if r == nil || r.done {
			continue
		}
		old := e[0] - ackKindAck
		before[r] |= 1 << old
		if i := s.before[old]; i >= 0 {
			r.ackedBy |= 1 << i
		}
	}
	// A record every collector of the previous list had acked stays done,
	// for a collector added since too: it gets what is still pending, not
	// history.
	for r, m := range before {
		if m&beforeAll == beforeAll {
			r.ackedBy = s.all
		}
		if r.ackedBy&s.all == s.all {
			r.done = true
			r.seg.live--
		}
	}
	if bad > 0 || len(data)%ackEntry != 0 {
		s.log.Warn("spool: ack log had corrupt entries; those batches will be re-sent (the collector deduplicates)",
			"bad_entries", bad, "torn_bytes", len(data)%ackEntry)
	}
	s.removeDeadSegments()
	return s.rewriteAcks()
}

// rewriteAcks writes the ack log anew with the acks still relevant.
func (s *Spool) rewriteAcks() error {
	if s.ackf != nil {
		_ = s.ackf.Close()
		s.ackf = nil
	}
	var buf []byte
	for _, g := range s.segs {
		for _, r := range g.recs {
			for i := range s.Cursors() {
				if r.ackedBy&(1<<i) != 0 {
					buf = appendAck(buf, i, r.seq)
				}
			}
		}
	}
	path := filepath.Join(s.dir, ackName)
	if err := s.writeFileAtomic(path, buf); err != nil {
		s.log.Error("spool: rewriting the ack log", "err", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	s.ackf = f
	s.ackLogN = len(buf) / ackEntry
	return nil
}

func appendAck(b []byte, cursor int, seq uint64) []byte {
	start := len(b)
	b = append(b, ackKindAck+byte(cursor))
	b = binary.LittleEndian.AppendUint64(b, seq)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}
