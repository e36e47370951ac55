package spool

// Opening a spool: load runs the steps below, in order.

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func (s *Spool) load() error {
	st, err := s.loadState()
	if err != nil {
		return err
	}
	s.loadedNames = st.Collectors
	if len(s.names) == 0 && len(st.Collectors) > 0 && checkCollectors(st.Collectors) == nil {
		// Opened without a collector list (the doctor): keep the
		// spool's, so that no collector's acks are rewritten away.
		s.names = append([]string(nil), st.Collectors...)
		s.all = uint8(1)<<len(s.names) - 1
	}
	removeTemps(s.dir)
	bootID, lastSeq, err := s.loadSegments(st.BootID)
	if err != nil {
		return err
	}
	s.bootID = s.ensureBootID(bootID)
	s.restoreSeq(st, lastSeq)
	s.openSeq = s.nextSeq
	s.before, s.remapped = s.cursorRemap()
	s.restorePendingLosses(st, lastSeq)
	// Everything present may have been sent by the previous process.
	for _, r := range s.bySeq {
		r.doubt = true
	}
	if err := s.loadAcks(); err != nil {
		return err
	}
	s.countPending()
	for s.bytes > s.effMax && len(s.segs) > 0 {
		s.log.Warn("spool: larger than its bound at open; dropping the oldest segment", "bytes", s.bytes, "max_bytes", s.effMax)
		s.evictOldest("spool full")
	}
	s.saveState()
	if s.stats.CorruptRecords > 0 || s.stats.CorruptBytes > 0 {
		s.log.Warn("spool: discarded corrupt or torn data at open",
			"records", s.stats.CorruptRecords, "bytes", s.stats.CorruptBytes, "dir", s.dir)
	}
	s.log.Info("spool opened", "dir", s.dir, "boot_id", s.bootID, "next_seq", s.nextSeq,
		"unacked", s.unackedLocked(), "bytes", s.bytes, "max_bytes", s.maxBytes, "segments", len(s.segs),
		"pending_loss_runs", len(s.losses)+len(s.seqLosses))
	return nil
}

// loadState reads the state file; an absent or corrupt one (counted) gives
// the zero state, since the segments can still name the boot id. One of
// another format is refused.
func (s *Spool) loadState() (*stateJSON, error) {
	path := filepath.Join(s.dir, stateName)
	st, err := readState(path)
	if err == nil && st.Version != formatVersion {
		return nil, s.formatError(path, st.Version)
	}
	if err == nil {
		return st, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		s.stats.StateCorrupt = true
		s.log.Error("spool: state file is corrupt; recovering the boot id from the segments or starting a new one",
			"file", path, "err", err)
	}
	return &stateJSON{}, nil
}

type segName struct {
	path  string
	first uint64
}

// listSegments returns the segment files in seq order.
func (s *Spool) listSegments() ([]segName, error) {
	names, err := filepath.Glob(filepath.Join(s.dir, segPrefix+"*"+segSuffix))
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	var found []segName
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(n), segPrefix), segSuffix)
		first, err := strconv.ParseUint(base, 10, 64)
		if err != nil {
			s.log.Warn("spool: ignoring a file with a segment-like name", "file", n)
			continue
		}
		found = append(found, segName{n, first})
	}
	slices.SortFunc(found, func(a, b segName) int { return cmp.Compare(a.first, b.first) })
	return found, nil
}

// loadSegments reads every segment, keeping those of bootID (or of the
// first readable header when the state named none), and returns the boot id
// and the last seq kept.
func (s *Spool) loadSegments(bootID string) (string, uint64, error) {
	found, err := s.listSegments()
	if err != nil {
		return "", 0, err
	}
	var lastSeq uint64
	for i, f := range found {
		last := i == len(found)-1
		g, boot, err := s.readSegment(f.path, f.first, lastSeq, last)
		if err != nil {
			return "", 0, err
		}
		if g == nil {
			continue
		}
		if bootID == "" {
			bootID = boot
			s.log.Warn("spool: boot id recovered from a segment header", "boot_id", boot, "segment", f.path)
		}
		if boot != bootID {
			s.log.Error("spool: segment belongs to another boot id; discarding it",
				"segment", f.path, "segment_boot", boot, "boot", bootID, "bytes", g.size, "records", len(g.recs))
			s.stats.CorruptRecords += uint64(len(g.recs))
			s.stats.CorruptBytes += uint64(g.size)
			_ = os.Remove(f.path)
			continue
		}
		if len(g.recs) == 0 && !last {
			_ = os.Remove(f.path)
			continue
		}
		for _, r := range g.recs {
			lastSeq = r.seq
		}
		s.addSegment(g)
	}
	return bootID, lastSeq, nil
}

// ensureBootID starts a new boot id when neither the state nor a segment
// named one.
func (s *Spool) ensureBootID(bootID string) string {
	if bootID != "" {
		return bootID
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	bootID = hex.EncodeToString(b[:])
	if s.stats.StateCorrupt {
		s.log.Warn("spool: started a new boot id (the state file was corrupt and no segment named one)", "boot_id", bootID)
	}
	return bootID
}

// restoreSeq sets the next seq and the reservation. After data was lost at
// open it continues past the reserved seqs, so no seq the collector may
// already hold is reused.
func (s *Spool) restoreSeq(st *stateJSON, lastSeq uint64) {
	s.nextSeq = max(lastSeq+1, 1, st.NextSeq)
	if (s.stats.CorruptRecords > 0 || s.stats.CorruptBytes > 0) && st.SeqReserved > s.nextSeq {
		s.log.Warn("spool: data was lost at open; skipping to the reserved seq so no seq is reused",
			"from", s.nextSeq, "to", st.SeqReserved)
		s.nextSeq = st.SeqReserved
	}
	s.reserved = max(st.SeqReserved, s.nextSeq)
}

// restorePendingLosses takes back the state's loss report and carried
// events. A pending report is still pending unless the batch meant to carry
// it (seq = the state's next_seq) made it into a segment.
func (s *Spool) restorePendingLosses(st *stateJSON, lastSeq uint64) {
	if st.BootID != s.bootID || (lastSeq >= st.NextSeq && lastSeq != 0) {
		return
	}
	// Masks are in the previous process's cursor indices.
	for i, raw := range slices.Concat(st.Losses, st.SeqLosses) {
		l := decodeLoss(raw)
		if l == nil {
			continue
		}
		if m, ok := s.maskNow(l.SpoolCollectors); ok && i < len(st.Losses) {
			s.mergeLoss(l.RunId, m, l)
		} else if ok {
			l.SpoolCollectors = m
			s.seqLosses = append(s.seqLosses, l)
		}
	}
	for _, e := range st.Events {
		ev := &trainmeterv1.RunEvent{}
		if proto.Unmarshal(e, ev) == nil {
			if m, ok := s.maskNow(ev.SpoolCollectors); ok {
				ev.SpoolCollectors = m
				s.events = append(s.events, ev)
			}
		}
	}
}
