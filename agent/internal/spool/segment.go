package spool

// Segment files (layout in spool.go): scanning at open, appending, removing.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"

	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// scanRecords walks the records of a segment from off and returns those that
// are whole, CRC-valid and in seq order after prevSeq, the offset where they
// end, and why the scan stopped early ("" when it reached the end). What it
// keeps is always a prefix of data.
func scanRecords(data []byte, off int64, prevSeq uint64) (recs []*record, end int64, bad string) {
	prev := prevSeq
	for off < int64(len(data)) {
		rest := data[off:]
		if len(rest) < recHeader {
			return recs, off, "short record header"
		}
		n := int64(binary.LittleEndian.Uint32(rest[0:4]))
		crc := binary.LittleEndian.Uint32(rest[4:8])
		seq := binary.LittleEndian.Uint64(rest[8:16])
		if n > maxRecord || int64(len(rest)) < recHeader+n {
			return recs, off, "short record"
		}
		if crc32.Checksum(rest[8:recHeader+n], castagnoli) != crc {
			return recs, off, "bad CRC"
		}
		if seq <= prev {
			return recs, off, fmt.Sprintf("seq %d not after %d", seq, prev)
		}
		recs = append(recs, &record{seq: seq, off: off, size: recHeader + n})
		prev = seq
		off += recHeader + n
	}
	return recs, off, ""
}

func segHeader(boot string) []byte {
	b := append([]byte(segMagic), 0, 0)
	binary.LittleEndian.PutUint16(b[len(segMagic):], uint16(len(boot)))
	b = append(b, boot...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// segVersion is the format version a segment's magic names, 0 when the
// magic is not a spool's.
func segVersion(data []byte) uint32 {
	n := len(segMagic) - 1
	if len(data) < len(segMagic) || string(data[:n]) != segMagic[:n] || data[n] < '1' || data[n] > '9' {
		return 0
	}
	return uint32(data[n] - '0')
}

func parseSegHeader(data []byte) (boot string, size int, ok bool) {
	if len(data) < len(segMagic)+2 || string(data[:len(segMagic)]) != segMagic {
		return "", 0, false
	}
	n := int(binary.LittleEndian.Uint16(data[len(segMagic):]))
	end := len(segMagic) + 2 + n
	if len(data) < end+4 || crc32.Checksum(data[:end], castagnoli) != binary.LittleEndian.Uint32(data[end:]) {
		return "", 0, false
	}
	return string(data[len(segMagic)+2 : end]), end + 4, true
}

// readSegment parses a segment and truncates it at the first bad record.
// It returns nil for a segment whose header is unreadable (removed).
func (s *Spool) readSegment(path string, first, prevSeq uint64, last bool) (*segment, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("spool: %w", err)
	}
	if v := segVersion(data); v != 0 && v != formatVersion {
		return nil, "", s.formatError(path, v)
	}
	boot, hdr, ok := parseSegHeader(data)
	if !ok {
		s.log.Error("spool: segment header is corrupt; discarding the segment", "segment", path, "bytes", len(data))
		s.stats.CorruptBytes += uint64(len(data))
		_ = os.Remove(path)
		return nil, "", nil
	}
	g := &segment{path: path, first: first}
	var off int64
	var bad string
	g.recs, off, bad = scanRecords(data, int64(hdr), prevSeq)
	if bad != "" {
		cut := int64(len(data)) - off
		// A torn tail cannot say how many records it held; count at least one.
		s.stats.CorruptRecords++
		s.stats.CorruptBytes += uint64(cut)
		where := "tail"
		if !last {
			where = "middle segment"
		}
		s.log.Warn("spool: truncating a corrupt or torn record and everything after it in its segment",
			"segment", path, "where", where, "reason", bad, "offset", off, "bytes_discarded", cut, "records_kept", len(g.recs))
		if err := os.Truncate(path, off); err != nil {
			return nil, "", fmt.Errorf("spool: truncating %s: %w", path, err)
		}
	}
	g.size = off
	g.live = len(g.recs)
	return g, boot, nil
}

func (s *Spool) addSegment(g *segment) {
	s.segs = append(s.segs, g)
	for _, r := range g.recs {
		s.bySeq[r.seq] = r
		r.seg = g
	}
	s.bytes += g.size
}

func encodeRecord(b *trainmeterv1.Batch) ([]byte, error) {
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	if err != nil {
		return nil, err
	}
	if len(payload) > maxRecord {
		return nil, fmt.Errorf("batch of %d bytes is larger than a record may be", len(payload))
	}
	rec := make([]byte, recHeader, recHeader+len(payload))
	binary.LittleEndian.PutUint32(rec[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint64(rec[8:16], b.Seq)
	rec = append(rec, payload...)
	binary.LittleEndian.PutUint32(rec[4:8], crc32.Checksum(rec[8:], castagnoli))
	return rec, nil
}

func (s *Spool) needSegment(recSize int64) bool {
	if s.active == nil || len(s.segs) == 0 {
		return true
	}
	g := s.segs[len(s.segs)-1]
	return len(g.recs) > 0 && g.size+recSize > s.segBytes
}

// write appends a record, starting a segment when needed. On a failed write
// the segment is cut back to its previous size, so no torn record stays.
func (s *Spool) write(seq uint64, data []byte) error {
	if s.needSegment(int64(len(data))) {
		if err := s.startSegment(seq); err != nil {
			return err
		}
	}
	g := s.segs[len(s.segs)-1]
	n, err := s.active.Write(data)
	if err == nil && n != len(data) {
		err = io.ErrShortWrite
	}
	if err != nil {
		if terr := s.active.Truncate(g.size); terr != nil {
			s.log.Error("spool: cutting back a failed write", "segment", g.path, "err", terr)
		}
		return err
	}
	r := &record{seg: g, seq: seq, off: g.size, size: int64(len(data))}
	s.remember(r, data)
	g.recs = append(g.recs, r)
	g.live++
	s.addPending(r, 1)
	g.size += int64(len(data))
	s.bytes += int64(len(data))
	s.bySeq[seq] = r
	return nil
}

func (s *Spool) startSegment(seq uint64) error {
	if s.active != nil {
		if err := s.active.Sync(); err != nil {
			s.log.Warn("spool: fsync of a finished segment", "err", err)
		}
		_ = s.active.Close()
		s.active = nil
	}
	path := filepath.Join(s.dir, fmt.Sprintf("%s%020d%s", segPrefix, seq, segSuffix))
	// O_APPEND: after a failed write is cut back, the next one lands at the
	// new end, not past a hole.
	f, err := s.openFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	hdr := segHeader(s.bootID)
	if n, err := f.Write(hdr); err != nil || n != len(hdr) {
		_ = f.Close()
		_ = os.Remove(path)
		if err == nil {
			err = io.ErrShortWrite
		}
		return err
	}
	s.active = f
	g := &segment{path: path, first: seq, size: int64(len(hdr))}
	s.segs = append(s.segs, g)
	s.bytes += g.size
	return nil
}

// removeSegment deletes segs[i]. The in-memory lists change first, so a
// state write that makes room on a full disk (and so removes another
// segment) sees them consistent. The state is written before the file goes
// when the segment holds the newest record (the next seq must survive),
// after it otherwise (the removal may be what frees the space).
func (s *Spool) removeSegment(i int) {
	g := s.segs[i]
	newest := i == len(s.segs)-1
	if newest && s.active != nil {
		_ = s.active.Close()
		s.active = nil
	}
	for _, r := range g.recs {
		s.forget(r)
		s.addPending(r, -1)
		delete(s.bySeq, r.seq)
	}
	s.bytes -= g.size
	s.segs = slices.Delete(s.segs, i, i+1)
	if newest && !s.inStateWrite {
		s.saveState()
	}
	if err := os.Remove(g.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("spool: removing a segment", "segment", g.path, "err", err)
	}
	if !newest && !s.inStateWrite {
		s.saveState()
	}
}

// removeDeadSegments deletes segments with nothing live, except the one
// being appended to.
func (s *Spool) removeDeadSegments() bool {
	removed := false
	for i := 0; i < len(s.segs); {
		g := s.segs[i]
		isActive := i == len(s.segs)-1 && s.active != nil
		if g.live == 0 && !isActive && (len(g.recs) > 0 || i < len(s.segs)-1) {
			s.removeSegment(i)
			removed = true
			continue
		}
		i++
	}
	return removed
}
