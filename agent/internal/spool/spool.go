// Package spool keeps the agent's batches on disk until the collector acks
// them, bounded in size, across collector outages and agent restarts
// (kill -9 included).
//
// # Layout of the spool directory
//
//	state        boot id, next seq, pending loss report (JSON + CRC32C line),
//	             replaced atomically (write temp, fsync, rename, fsync dir)
//	acks         append-only log of acked seqs: 13-byte entries
//	             [kind u8][seq u64 LE][crc32c u32 LE], compacted on segment removal
//	seg-<first seq, 20 digits>.tms
//	             segment: header [magic "TMSPOOL1"][boot id len u16][boot id]
//	             [crc32c u32], then records [len u32][crc32c u32][seq u64][Batch proto],
//	             the CRC covering seq and payload; all integers little-endian
//	lock         flock'd while a spool is open, so two agents cannot share it
//
// Records are appended to the newest segment; a new segment starts once the
// current one reaches the segment size (4 MiB, less for small spools). Acked
// seqs are kept in memory and in the ack log; a segment whose records are all
// acked (or dropped) is deleted whole.
//
// # Durability
//
// Appends are not fsynced one by one: a kill -9 of the agent leaves written
// data in the kernel's page cache, which reaches the disk anyway; only a power
// loss or kernel crash can lose the last seconds, and the tail checks at open
// (length, CRC) truncate a torn record instead of trusting it. Close fsyncs
// the segment and the ack log; the state file is always fsynced.
//
// # When full
//
// The policy is: keep the newest data. When an Append would take the spool
// past its byte bound (or the disk reports ENOSPC), the oldest segment is
// removed, and every unacked batch in it is dropped and counted. For each
// dropped batch the spool computes what each run lost (tokens, energy, GPU
// seconds from its RunWindows), carries its run events (run_start, run_end,
// eval, a few hundred bytes) forward, and attaches both to the next batch
// appended (Batch.losses, Batch.run_events), so the collector marks the runs
// incomplete by exactly that much. A pending loss report survives restarts in
// the state file.
package spool

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// DefaultMaxBytes bounds a spool when nothing else is configured: 1 GiB.
//
// A 1 s batch of an 8-GPU node with two active runs is 1,498 bytes as a spool
// record (measured by TestRealisticBatchSize: 8 GpuWindows, 2 RunWindows,
// host window, every field set, proto-encoded plus 16 bytes of framing), so
// 129 MB per day, and
//
//	days = maxBytes / (bytes per batch × 86400) = 2^30 / (1498 × 86400) ≈ 8.3 days
//
// of collector outage before the oldest batch is dropped.
const DefaultMaxBytes int64 = 1 << 30

// DefaultSegmentBytes is the size at which a new segment file starts.
const DefaultSegmentBytes int64 = 4 << 20

// MinMaxBytes is the smallest bound Open accepts.
const MinMaxBytes int64 = 4 << 10

const (
	segMagic     = "TMSPOOL1"
	recHeader    = 16 // len u32, crc u32, seq u64
	maxRecord    = 64 << 20
	ackEntry     = 13
	ackKindAck   = 'A'
	stateName    = "state"
	ackName      = "acks"
	lockName     = "lock"
	segPrefix    = "seg-"
	segSuffix    = ".tms"
	maxReasons   = 3
	maxPerSeqRec = 4096 // in-doubt losses listed one by one, at most
	// maxCarriedEvents bounds the run events carried from dropped batches
	// (the collector takes at most 10,000 per batch).
	maxCarriedEvents = 1000
	// seqReserve is how many seqs one state write reserves.
	seqReserve = 1024
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// WriteFile is what the spool writes segments through; *os.File satisfies
// it. Tests inject one that fails with ENOSPC.
type WriteFile interface {
	io.Writer
	Truncate(size int64) error
	Sync() error
	Close() error
}

// Options tunes OpenWith. The zero value is fine.
type Options struct {
	Logger *slog.Logger
	// SegmentBytes is the segment size; default min(4 MiB, max(maxBytes/16, 4 KiB)).
	SegmentBytes int64
	// OpenFile opens segments and the state file for writing; default
	// os.OpenFile.
	OpenFile func(name string, flag int, perm os.FileMode) (WriteFile, error)
}

// Stats are the spool's self-metrics. Counters are since Open.
type Stats struct {
	BootID   string
	NextSeq  uint64
	Bytes    int64 // segment files on disk
	MaxBytes int64 // the bound in force (lowered after ENOSPC until the spool drains)
	Segments int
	Unacked  int // batches held and not yet acked

	Appended uint64
	Acked    uint64
	Rejected uint64
	// Dropped batches (unacked, removed to make room or never written), and
	// the bytes of their records.
	Dropped      uint64
	DroppedBytes uint64
	// ENOSPC is how often a write hit a full disk; WriteErrors counts every
	// failed write (ENOSPC included).
	ENOSPC      uint64
	WriteErrors uint64
	// Found at open: corrupt or torn records and bytes cut away, and whether
	// the state file was unreadable.
	CorruptRecords uint64
	CorruptBytes   uint64
	StateCorrupt   bool
	// PendingLosses is how many runs' loss records wait for the next batch.
	PendingLosses int
}

type record struct {
	seq    uint64
	off    int64 // of the record header
	size   int64 // header + payload
	acked  bool
	sent   bool // handed to the uplink at least once (possibly applied)
	doubt  bool // present at open: a previous process may have sent it
	gone   bool // dropped or unreadable
	segIdx int
}

type segment struct {
	path    string
	first   uint64
	size    int64
	recs    []*record
	live    int // records neither acked nor gone
	hdrSize int64
}

// Spool is safe for concurrent use.
type Spool struct {
	dir      string
	maxBytes int64
	segBytes int64
	// cfgSegBytes is the configured segment size (segBytes shrinks after ENOSPC).
	cfgSegBytes int64
	log         *slog.Logger
	openFile    func(string, int, os.FileMode) (WriteFile, error)
	lock        *os.File

	mu       sync.Mutex
	closed   bool
	bootID   string
	nextSeq  uint64
	reserved uint64 // persisted: seqs below it may have been handed out
	// inStateWrite: a state write is making room; removals do not write it.
	inStateWrite bool
	effMax       int64
	segs         []*segment
	bySeq        map[uint64]*record
	segOf        map[*record]*segment
	active       WriteFile // open append handle of segs[len-1], nil if none
	ackf         *os.File
	ackLogN      int
	bytes        int64
	stats        Stats
	losses       map[string]*pb.DataLoss // aggregated, certain
	seqLosses    []*pb.DataLoss          // per batch, in doubt
	events       []*pb.RunEvent          // carried from dropped batches
}

// Open opens or creates the spool in dir, bounded to maxBytes (0: DefaultMaxBytes).
func Open(dir string, maxBytes int64, logger *slog.Logger) (*Spool, error) {
	return OpenWith(dir, maxBytes, Options{Logger: logger})
}

// OpenWith is Open with options.
func OpenWith(dir string, maxBytes int64, o Options) (*Spool, error) {
	if dir == "" {
		return nil, errors.New("spool: directory is empty")
	}
	if maxBytes == 0 {
		maxBytes = DefaultMaxBytes
	}
	if maxBytes < MinMaxBytes {
		return nil, fmt.Errorf("spool: max bytes %d is below the minimum %d", maxBytes, MinMaxBytes)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.OpenFile == nil {
		o.OpenFile = func(name string, flag int, perm os.FileMode) (WriteFile, error) {
			return os.OpenFile(name, flag, perm)
		}
	}
	seg := o.SegmentBytes
	if seg <= 0 {
		seg = min(DefaultSegmentBytes, max(maxBytes/16, 4<<10))
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	lock, err := lockDir(filepath.Join(dir, lockName))
	if err != nil {
		return nil, fmt.Errorf("spool %s: %w", dir, err)
	}
	s := &Spool{
		dir: dir, maxBytes: maxBytes, segBytes: seg, cfgSegBytes: seg, log: o.Logger, openFile: o.OpenFile, lock: lock,
		effMax: maxBytes, bySeq: map[uint64]*record{}, segOf: map[*record]*segment{},
		losses: map[string]*pb.DataLoss{},
	}
	if err := s.load(); err != nil {
		unlockDir(lock)
		return nil, err
	}
	return s, nil
}

// BootID is the agent's boot id, persisted across restarts.
func (s *Spool) BootID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bootID
}

// Bytes is the size of the segment files.
func (s *Spool) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// Stats returns a snapshot of the self-metrics.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.BootID = s.bootID
	st.NextSeq = s.nextSeq
	st.Bytes = s.bytes
	st.MaxBytes = s.effMax
	st.Segments = len(s.segs)
	st.Unacked = s.unackedLocked()
	st.PendingLosses = len(s.losses) + len(s.seqLosses)
	return st
}

// Len is the number of batches held and not acked.
func (s *Spool) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unackedLocked()
}

func (s *Spool) unackedLocked() int {
	n := 0
	for _, g := range s.segs {
		n += g.live
	}
	return n
}

// ---- open ----

type stateJSON struct {
	Version int    `json:"version"`
	BootID  string `json:"boot_id"`
	NextSeq uint64 `json:"next_seq"`
	// SeqReserved: no seq at or above it was handed out. After data was
	// lost at open (a torn tail, a discarded segment) the spool continues
	// here, so a seq the collector may already hold is never reused.
	SeqReserved uint64            `json:"seq_reserved"`
	Losses      []json.RawMessage `json:"losses,omitempty"` // protojson-free: see lossJSON
	SeqLosses   []json.RawMessage `json:"seq_losses,omitempty"`
	Events      [][]byte          `json:"events,omitempty"` // RunEvent protos
}

type lossJSON struct {
	RunID      string  `json:"run_id"`
	Batches    uint64  `json:"batches"`
	Tokens     uint64  `json:"tokens"`
	EnergyJ    float64 `json:"energy_j"`
	GPUSeconds float64 `json:"gpu_seconds"`
	Reason     string  `json:"reason"`
	Seq        uint64  `json:"seq,omitempty"`
}

func (s *Spool) load() error {
	st, stErr := readState(filepath.Join(s.dir, stateName))
	if stErr != nil && !errors.Is(stErr, os.ErrNotExist) {
		s.stats.StateCorrupt = true
		s.log.Error("spool: state file is corrupt; recovering the boot id from the segments or starting a new one",
			"file", filepath.Join(s.dir, stateName), "err", stErr)
		st = nil
	}
	_ = removeTemps(s.dir)

	names, err := filepath.Glob(filepath.Join(s.dir, segPrefix+"*"+segSuffix))
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	type segName struct {
		path  string
		first uint64
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
	sort.Slice(found, func(i, j int) bool { return found[i].first < found[j].first })

	bootID := ""
	if st != nil {
		bootID = st.BootID
	}
	var lastSeq uint64
	for i, f := range found {
		last := i == len(found)-1
		g, boot, err := s.readSegment(f.path, f.first, lastSeq, last)
		if err != nil {
			return err
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
	if bootID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		bootID = hex.EncodeToString(b[:])
		if s.stats.StateCorrupt {
			s.log.Warn("spool: started a new boot id (the state file was corrupt and no segment named one)", "boot_id", bootID)
		}
	}
	s.bootID = bootID
	s.nextSeq = max(lastSeq+1, 1)
	if st != nil && st.NextSeq > s.nextSeq {
		s.nextSeq = st.NextSeq
	}
	if st != nil && (s.stats.CorruptRecords > 0 || s.stats.CorruptBytes > 0) && st.SeqReserved > s.nextSeq {
		s.log.Warn("spool: data was lost at open; skipping to the reserved seq so no seq is reused",
			"from", s.nextSeq, "to", st.SeqReserved)
		s.nextSeq = st.SeqReserved
	}
	if st != nil {
		s.reserved = st.SeqReserved
	}
	if s.reserved < s.nextSeq {
		s.reserved = s.nextSeq
	}
	// A pending loss report is still pending unless the batch meant to carry
	// it (seq = the state's next_seq) made it into a segment.
	if st != nil && st.BootID == bootID && (lastSeq < st.NextSeq || lastSeq == 0) {
		for _, raw := range st.Losses {
			if l := decodeLoss(raw); l != nil {
				s.losses[l.RunId] = l
			}
		}
		for _, raw := range st.SeqLosses {
			if l := decodeLoss(raw); l != nil {
				s.seqLosses = append(s.seqLosses, l)
			}
		}
		for _, e := range st.Events {
			ev := &pb.RunEvent{}
			if proto.Unmarshal(e, ev) == nil {
				s.events = append(s.events, ev)
			}
		}
	}
	// Everything present may have been sent by the previous process.
	for _, r := range s.bySeq {
		r.doubt = true
	}
	if err := s.loadAcks(); err != nil {
		return err
	}
	for s.bytes > s.effMax && len(s.segs) > 0 {
		s.log.Warn("spool: larger than its bound at open; dropping the oldest segment", "bytes", s.bytes, "max_bytes", s.effMax)
		s.evictOldest("spool full")
	}
	if err := s.writeState(); err != nil {
		s.log.Error("spool: writing the state file", "err", err)
	}
	if s.stats.CorruptRecords > 0 || s.stats.CorruptBytes > 0 {
		s.log.Warn("spool: discarded corrupt or torn data at open",
			"records", s.stats.CorruptRecords, "bytes", s.stats.CorruptBytes, "dir", s.dir)
	}
	s.log.Info("spool opened", "dir", s.dir, "boot_id", s.bootID, "next_seq", s.nextSeq,
		"unacked", s.unackedLocked(), "bytes", s.bytes, "max_bytes", s.maxBytes, "segments", len(s.segs),
		"pending_loss_runs", len(s.losses)+len(s.seqLosses))
	return nil
}

func decodeLoss(raw json.RawMessage) *pb.DataLoss {
	var l lossJSON
	if json.Unmarshal(raw, &l) != nil {
		return nil
	}
	return &pb.DataLoss{RunId: l.RunID, Batches: l.Batches, Tokens: l.Tokens, EnergyJ: l.EnergyJ,
		GpuSeconds: l.GPUSeconds, Reason: l.Reason, Seq: l.Seq}
}

func encodeLoss(l *pb.DataLoss) json.RawMessage {
	b, _ := json.Marshal(lossJSON{RunID: l.RunId, Batches: l.Batches, Tokens: l.Tokens, EnergyJ: l.EnergyJ,
		GPUSeconds: l.GpuSeconds, Reason: l.Reason, Seq: l.Seq})
	return b
}

func readState(path string) (*stateJSON, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	body, sum, ok := bytes.Cut(bytes.TrimRight(b, "\n"), []byte("\n"))
	if !ok {
		return nil, errors.New("no checksum line")
	}
	want, err := strconv.ParseUint(string(sum), 16, 32)
	if err != nil {
		return nil, fmt.Errorf("checksum line %q", sum)
	}
	if crc32.Checksum(body, castagnoli) != uint32(want) {
		return nil, errors.New("checksum mismatch")
	}
	st := &stateJSON{}
	if err := json.Unmarshal(body, st); err != nil {
		return nil, err
	}
	if st.BootID == "" {
		return nil, errors.New("no boot id")
	}
	return st, nil
}

func removeTemps(dir string) error {
	tmps, _ := filepath.Glob(filepath.Join(dir, "*.tmp"))
	for _, t := range tmps {
		_ = os.Remove(t)
	}
	return nil
}

// readSegment parses a segment and truncates it at the first bad record.
// It returns nil for a segment whose header is unreadable (removed).
func (s *Spool) readSegment(path string, first, prevSeq uint64, last bool) (*segment, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("spool: %w", err)
	}
	boot, hdr, ok := parseSegHeader(data)
	if !ok {
		s.log.Error("spool: segment header is corrupt; discarding the segment", "segment", path, "bytes", len(data))
		s.stats.CorruptBytes += uint64(len(data))
		_ = os.Remove(path)
		return nil, "", nil
	}
	g := &segment{path: path, first: first, hdrSize: int64(hdr)}
	off := int64(hdr)
	prev := prevSeq
	bad := ""
	for off < int64(len(data)) {
		rest := data[off:]
		if len(rest) < recHeader {
			bad = "short record header"
			break
		}
		n := int64(binary.LittleEndian.Uint32(rest[0:4]))
		crc := binary.LittleEndian.Uint32(rest[4:8])
		seq := binary.LittleEndian.Uint64(rest[8:16])
		if n > maxRecord || int64(len(rest)) < recHeader+n {
			bad = "short record"
			break
		}
		if crc32.Checksum(rest[8:recHeader+n], castagnoli) != crc {
			bad = "bad CRC"
			break
		}
		if seq <= prev {
			bad = fmt.Sprintf("seq %d not after %d", seq, prev)
			break
		}
		g.recs = append(g.recs, &record{seq: seq, off: off, size: recHeader + n})
		prev = seq
		off += recHeader + n
	}
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

func segHeader(boot string) []byte {
	b := append([]byte(segMagic), 0, 0)
	binary.LittleEndian.PutUint16(b[len(segMagic):], uint16(len(boot)))
	b = append(b, boot...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
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

func (s *Spool) addSegment(g *segment) {
	s.segs = append(s.segs, g)
	for _, r := range g.recs {
		s.bySeq[r.seq] = r
		s.segOf[r] = g
	}
	s.bytes += g.size
}

func (s *Spool) loadAcks() error {
	path := filepath.Join(s.dir, ackName)
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("spool: %w", err)
	}
	bad := 0
	for off := 0; off+ackEntry <= len(data); off += ackEntry {
		e := data[off : off+ackEntry]
		if crc32.Checksum(e[:9], castagnoli) != binary.LittleEndian.Uint32(e[9:]) || e[0] != ackKindAck {
			bad++
			continue
		}
		if r := s.bySeq[binary.LittleEndian.Uint64(e[1:9])]; r != nil && !r.acked && !r.gone {
			r.acked = true
			s.segOf[r].live--
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
	n := 0
	for _, g := range s.segs {
		for _, r := range g.recs {
			if r.acked {
				buf = appendAck(buf, r.seq)
				n++
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
	s.ackLogN = n
	return nil
}

func appendAck(b []byte, seq uint64) []byte {
	start := len(b)
	b = append(b, ackKindAck)
	b = binary.LittleEndian.AppendUint64(b, seq)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// writeFileAtomic writes temp, fsyncs, renames and fsyncs the directory.
func (s *Spool) writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := s.openFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// writeState persists the state. On a full disk it makes room by dropping
// the oldest segment (the spool is what fills the disk) and tries once more,
// but never the newest segment: it holds the next seq and any loss report
// just written, which is what the state would say.
func (s *Spool) writeState() error {
	err := s.writeStateOnce()
	if err != nil && isNoSpace(err) && !s.inStateWrite && len(s.segs) > 1 {
		s.stats.ENOSPC++
		s.inStateWrite = true
		s.evictOldest(s.dropReason())
		s.inStateWrite = false
		err = s.writeStateOnce()
	}
	return err
}

// dropReason names why old batches go: the configured bound, or a disk that
// filled up before it.
func (s *Spool) dropReason() string {
	if s.effMax < s.maxBytes {
		return "disk full"
	}
	return "spool full"
}

func (s *Spool) writeStateOnce() error {
	if s.reserved <= s.nextSeq {
		s.reserved = s.nextSeq + seqReserve
	}
	st := stateJSON{Version: 1, BootID: s.bootID, NextSeq: s.nextSeq, SeqReserved: s.reserved}
	for _, id := range sortedKeys(s.losses) {
		st.Losses = append(st.Losses, encodeLoss(s.losses[id]))
	}
	for _, l := range s.seqLosses {
		st.SeqLosses = append(st.SeqLosses, encodeLoss(l))
	}
	for _, e := range s.events {
		b, err := proto.Marshal(e)
		if err == nil {
			st.Events = append(st.Events, b)
		}
	}
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	out := fmt.Appendf(body, "\n%08x\n", crc32.Checksum(body, castagnoli))
	return s.writeFileAtomic(filepath.Join(s.dir, stateName), out)
}

func sortedKeys(m map[string]*pb.DataLoss) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ---- append ----

// ErrClosed is returned after Close.
var ErrClosed = errors.New("spool: closed")

// Append assigns b the next sequence number, attaches any pending loss
// report and carried run events, and writes it. It takes ownership of b.
// When the batch cannot be kept (bigger than the whole spool, or a disk
// error that dropping old data did not cure) it is dropped and counted like
// any other, its loss goes into the next report, and the error says why;
// the agent carries on.
func (s *Spool) Append(b *pb.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	seq := s.nextSeq
	b.Seq = seq
	own := b.Losses
	ownEvents := b.RunEvents
	var data []byte
	dropped := false
	for {
		b.Losses = append(append([]*pb.DataLoss(nil), own...), s.takeLossesPreview()...)
		b.RunEvents = append(append([]*pb.RunEvent(nil), s.events...), ownEvents...)
		var err error
		data, err = encodeRecord(b)
		if err != nil {
			return fmt.Errorf("spool: encode batch: %w", err)
		}
		need := int64(len(data))
		if s.needSegment(need) {
			need += int64(len(segHeader(s.bootID)))
		}
		if s.bytes+need <= s.effMax {
			break
		}
		if len(s.segs) == 0 || (len(s.segs) == 1 && len(s.segs[0].recs) == 0) {
			dropped = true // bigger than the whole spool
			break
		}
		s.evictOldest(s.dropReason())
		if err := s.writeState(); err != nil {
			s.log.Error("spool: writing the state file", "err", err)
		}
	}
	if dropped {
		return s.dropUnwritten(b, own, ownEvents, int64(len(data)), "spool full",
			fmt.Errorf("spool: batch of %d bytes does not fit in a spool of %d bytes; dropped", len(data), s.effMax))
	}
	err := s.write(seq, data)
	if err != nil {
		s.stats.WriteErrors++
	}
	if err != nil && isNoSpace(err) {
		s.stats.ENOSPC++
		s.effMax = max(min(s.effMax, s.bytes), MinMaxBytes)
		// Smaller segments from now on, so the next drop frees less at once.
		s.segBytes = min(s.segBytes, max(s.effMax/4, 4<<10))
		s.log.Error("spool: disk full; dropping the oldest batches and lowering the spool bound until it drains",
			"dir", s.dir, "bytes", s.bytes, "max_bytes_now", s.effMax)
		if len(s.segs) > 0 {
			s.evictOldest("disk full")
			// The batch now carries the new loss records too.
			b.Losses = append(append([]*pb.DataLoss(nil), own...), s.takeLossesPreview()...)
			b.RunEvents = append(append([]*pb.RunEvent(nil), s.events...), ownEvents...)
			if data, err = encodeRecord(b); err == nil {
				if err = s.write(seq, data); err != nil {
					s.stats.WriteErrors++
				}
			}
			if err != nil && isNoSpace(err) {
				s.stats.ENOSPC++
			}
		}
	}
	if err != nil {
		reason := "write error"
		if isNoSpace(err) {
			reason = "disk full"
		}
		return s.dropUnwritten(b, own, ownEvents, int64(len(data)), reason, fmt.Errorf("spool: writing batch %d: %w; dropped", seq, err))
	}
	// Written: the pending report went out with it.
	hadPending := len(s.losses) > 0 || len(s.seqLosses) > 0 || len(s.events) > 0
	s.losses = map[string]*pb.DataLoss{}
	s.seqLosses = nil
	s.events = nil
	s.nextSeq = seq + 1
	s.stats.Appended++
	if hadPending || s.nextSeq >= s.reserved {
		if err := s.writeState(); err != nil {
			s.log.Error("spool: writing the state file", "err", err)
		}
	}
	return nil
}

// dropUnwritten counts a batch that never reached the disk. Its seq is
// reused by the next batch, so no gap appears for it.
func (s *Spool) dropUnwritten(b *pb.Batch, own []*pb.DataLoss, ownEvents []*pb.RunEvent, size int64, reason string, err error) error {
	b.Losses = own
	b.RunEvents = ownEvents
	s.stats.Dropped++
	s.stats.DroppedBytes += uint64(size)
	s.account(b, reason, false, true)
	s.log.Error(err.Error(), "runs_affected", runIDs(b))
	if werr := s.writeState(); werr != nil {
		s.log.Error("spool: writing the state file", "err", werr)
	}
	return err
}

func runIDs(b *pb.Batch) []string {
	seen := map[string]bool{}
	var out []string
	for _, w := range b.GetRunWindows() {
		if !seen[w.GetRunId()] {
			seen[w.GetRunId()] = true
			out = append(out, w.GetRunId())
		}
	}
	return out
}

// takeLossesPreview returns the pending loss records in a stable order
// (they are cleared only once a batch carrying them is written).
func (s *Spool) takeLossesPreview() []*pb.DataLoss {
	var out []*pb.DataLoss
	for _, id := range sortedKeys(s.losses) {
		out = append(out, proto.Clone(s.losses[id]).(*pb.DataLoss))
	}
	for _, l := range s.seqLosses {
		out = append(out, proto.Clone(l).(*pb.DataLoss))
	}
	return out
}

func encodeRecord(b *pb.Batch) ([]byte, error) {
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
	r := &record{seq: seq, off: g.size, size: int64(len(data))}
	g.recs = append(g.recs, r)
	g.live++
	g.size += int64(len(data))
	s.bytes += int64(len(data))
	s.bySeq[seq] = r
	s.segOf[r] = g
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
	g := &segment{path: path, first: seq, size: int64(len(hdr)), hdrSize: int64(len(hdr))}
	s.segs = append(s.segs, g)
	s.bytes += g.size
	return nil
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// ---- drop and loss accounting ----

// evictOldest removes the oldest segment, dropping its unacked batches.
func (s *Spool) evictOldest(reason string) {
	if len(s.segs) == 0 {
		return
	}
	g := s.segs[0]
	var dropped, droppedBytes int
	f, ferr := os.Open(g.path)
	for _, r := range g.recs {
		if r.acked || r.gone {
			continue
		}
		dropped++
		droppedBytes += int(r.size)
		var b *pb.Batch
		if ferr == nil {
			b, _ = readRecord(f, r)
		}
		if b == nil {
			s.log.Error("spool: a dropped batch could not be read back; its loss is unknown", "seq", r.seq)
			continue
		}
		s.account(b, reason, r.sent || r.doubt, true)
	}
	if f != nil {
		_ = f.Close()
	}
	s.stats.Dropped += uint64(dropped)
	s.stats.DroppedBytes += uint64(droppedBytes)
	if dropped > 0 {
		s.log.Warn("spool: dropped the oldest batches to make room", "reason", reason, "batches", dropped,
			"bytes", droppedBytes, "first_seq", g.first, "dropped_total", s.stats.Dropped)
	}
	if i := slices.Index(s.segs, g); i >= 0 {
		s.removeSegment(i)
	}
}

// account adds what batch b held to the pending loss report. inDoubt: b was
// sent and may have been applied; it gets its own record with its seq.
// carry: b's run events go on with the next batch.
func (s *Spool) account(b *pb.Batch, reason string, inDoubt, carry bool) {
	// Loss records b already carried (from earlier drops) are lost with it.
	for _, l := range b.GetLosses() {
		if l.GetSeq() != 0 && len(s.seqLosses) < maxPerSeqRec {
			s.seqLosses = append(s.seqLosses, proto.Clone(l).(*pb.DataLoss))
			continue
		}
		s.mergeLoss(l.GetRunId(), l.GetBatches(), l.GetTokens(), l.GetEnergyJ(), l.GetGpuSeconds(), l.GetReason())
	}
	if carry {
		for _, e := range b.GetRunEvents() {
			if len(s.events) >= maxCarriedEvents {
				s.log.Error("spool: too many run events carried from dropped batches; dropping one", "event", e.String())
				continue
			}
			s.events = append(s.events, e)
		}
	}
	type acc struct {
		tokens      uint64
		energy, gpu float64
	}
	per := map[string]*acc{}
	var order []string
	for _, w := range b.GetRunWindows() {
		if !plausibleWindow(w) {
			s.log.Error("spool: a dropped window is malformed; its loss is not reported", "seq", b.GetSeq(), "run_id", w.GetRunId())
			continue
		}
		a := per[w.GetRunId()]
		if a == nil {
			a = &acc{}
			per[w.GetRunId()] = a
			order = append(order, w.GetRunId())
		}
		a.tokens += w.GetTokens()
		e := w.GetEnergyIntegratedJ()
		if w.GetCounterOk() {
			e = w.GetEnergyCounterJ()
		}
		a.energy += e
		a.gpu += w.GetGpuSeconds()
	}
	for _, id := range order {
		a := per[id]
		if inDoubt && len(s.seqLosses) < maxPerSeqRec {
			s.seqLosses = append(s.seqLosses, &pb.DataLoss{RunId: id, Batches: 1, Tokens: a.tokens,
				EnergyJ: a.energy, GpuSeconds: a.gpu, Reason: reason, Seq: b.GetSeq()})
			continue
		}
		s.mergeLoss(id, 1, a.tokens, a.energy, a.gpu, reason)
	}
}

// plausibleWindow keeps a loss record from carrying what the collector
// would refuse (and so from getting the next batch rejected too).
func plausibleWindow(w *pb.RunWindow) bool {
	id := w.GetRunId()
	if id == "" || len(id) > 256 || !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
		return false
	}
	for _, v := range []float64{w.GetEnergyCounterJ(), w.GetEnergyIntegratedJ(), w.GetGpuSeconds()} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return false
		}
	}
	return true
}

func (s *Spool) mergeLoss(run string, batches, tokens uint64, energy, gpu float64, reason string) {
	l := s.losses[run]
	if l == nil {
		l = &pb.DataLoss{RunId: run}
		s.losses[run] = l
	}
	l.Batches += batches
	l.Tokens += tokens
	l.EnergyJ += energy
	l.GpuSeconds += gpu
	l.Reason = addReason(l.Reason, reason)
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
	if len(r) > 200 {
		r = r[:200]
	}
	return strings.Join(append(parts, r), "; ")
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
		delete(s.bySeq, r.seq)
		delete(s.segOf, r)
	}
	s.bytes -= g.size
	s.segs = append(s.segs[:i], s.segs[i+1:]...)
	save := func() {
		if s.inStateWrite {
			return
		}
		if err := s.writeState(); err != nil {
			s.log.Error("spool: writing the state file", "err", err)
		}
	}
	if newest {
		save()
	}
	if err := os.Remove(g.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("spool: removing a segment", "segment", g.path, "err", err)
	}
	if !newest {
		save()
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

// ---- ack, reject, read ----

// Ack marks seq delivered. Unknown seqs (already acked or dropped) are ignored.
func (s *Spool) Ack(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ackLocked(seq) {
		s.stats.Acked++
	}
}

func (s *Spool) ackLocked(seq uint64) bool {
	if s.closed {
		return false
	}
	r := s.bySeq[seq]
	if r == nil || r.acked || r.gone {
		return false
	}
	r.acked = true
	s.segOf[r].live--
	if s.effMax < s.maxBytes && s.unackedLocked() == 0 {
		// The collector took everything: the pressure that filled the
		// disk is over.
		s.log.Info("spool: drained by the collector; restoring its byte bound after a full disk", "max_bytes", s.maxBytes)
		s.effMax = s.maxBytes
		s.segBytes = s.cfgSegBytes
	}
	if s.ackf != nil {
		if _, err := s.ackf.Write(appendAck(nil, seq)); err != nil {
			s.log.Warn("spool: appending to the ack log (the batch may be re-sent after a restart)", "seq", seq, "err", err)
		}
		s.ackLogN++
	}
	if s.removeDeadSegments() && s.ackLogN > 4096 {
		if err := s.rewriteAcks(); err != nil {
			s.log.Error("spool: compacting the ack log", "err", err)
		}
	}
	return true
}

// Reject drops seq for good (the collector refused it) and reports its
// loss like a dropped batch.
func (s *Spool) Reject(seq uint64, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.bySeq[seq]
	if s.closed || r == nil || r.acked || r.gone {
		return
	}
	b, rerr := s.readLocked(r)
	// Out of the spool first: the state write below may drop old segments
	// to make room, and must not count this batch a second time.
	if s.ackLocked(seq) {
		s.stats.Rejected++
	}
	if rerr == nil {
		// The collector stored nothing of it: certainly lost.
		// Its events are not carried on: they may be what was refused.
		s.account(b, "rejected: "+reason, false, false)
		if err := s.writeState(); err != nil {
			s.log.Error("spool: writing the state file", "err", err)
		}
	}
}

// MarkSent records that seq went out on a stream, so that if it is dropped
// later its loss is reported as in doubt (the collector may hold it).
func (s *Spool) MarkSent(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.bySeq[seq]; r != nil {
		r.sent = true
	}
}

// FlushPending makes sure a pending loss report (and run events carried from
// dropped batches) is in the spool, not only in memory: when one is waiting
// it appends an empty batch at now to carry it. The agent calls it when no
// more batches will come (shutdown), so the report reaches the collector.
func (s *Spool) FlushPending(now time.Time) error {
	s.mu.Lock()
	pending := len(s.losses) > 0 || len(s.seqLosses) > 0 || len(s.events) > 0
	s.mu.Unlock()
	if !pending {
		return nil
	}
	ts := timestamppb.New(now)
	return s.Append(&pb.Batch{WindowStart: ts, WindowEnd: ts})
}

// ReadAfter returns up to n unacked batches with seq > after, in seq order.
// A record that no longer reads back (CRC) is dropped and counted.
func (s *Spool) ReadAfter(after uint64, n int) ([]*pb.Batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	var out []*pb.Batch
	for _, g := range s.segs {
		if len(out) >= n {
			break
		}
		if len(g.recs) == 0 || g.live == 0 || g.recs[len(g.recs)-1].seq <= after {
			continue
		}
		f, err := os.Open(g.path)
		if err != nil {
			return out, fmt.Errorf("spool: %w", err)
		}
		for _, r := range g.recs {
			if len(out) >= n {
				break
			}
			if r.seq <= after || r.acked || r.gone {
				continue
			}
			b, err := readRecord(f, r)
			if err != nil {
				s.log.Error("spool: a held batch no longer reads back; dropping it (loss unknown)", "seq", r.seq, "err", err)
				r.gone = true
				g.live--
				s.stats.Dropped++
				s.stats.DroppedBytes += uint64(r.size)
				s.stats.CorruptRecords++
				continue
			}
			out = append(out, b)
		}
		_ = f.Close()
	}
	return out, nil
}

// Unacked returns every batch held and not acked, in seq order.
func (s *Spool) Unacked() ([]*pb.Batch, error) { return s.ReadAfter(0, int(^uint(0)>>1)) }

func (s *Spool) readLocked(r *record) (*pb.Batch, error) {
	g := s.segOf[r]
	f, err := os.Open(g.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readRecord(f, r)
}

func readRecord(f io.ReaderAt, r *record) (*pb.Batch, error) {
	buf := make([]byte, r.size)
	if _, err := f.ReadAt(buf, r.off); err != nil {
		return nil, err
	}
	if int64(binary.LittleEndian.Uint32(buf[0:4]))+recHeader != r.size ||
		crc32.Checksum(buf[8:], castagnoli) != binary.LittleEndian.Uint32(buf[4:8]) ||
		binary.LittleEndian.Uint64(buf[8:16]) != r.seq {
		return nil, errors.New("record changed on disk (bad length, CRC or seq)")
	}
	b := &pb.Batch{}
	if err := proto.Unmarshal(buf[recHeader:], b); err != nil {
		return nil, err
	}
	return b, nil
}

// Close fsyncs and closes the spool. The data stays for the next Open.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if s.active != nil {
		errs = append(errs, s.active.Sync(), s.active.Close())
		s.active = nil
	}
	if s.ackf != nil {
		errs = append(errs, s.ackf.Sync(), s.ackf.Close())
		s.ackf = nil
	}
	if err := s.writeState(); err != nil {
		if len(s.losses) > 0 || len(s.seqLosses) > 0 || len(s.events) > 0 {
			errs = append(errs, fmt.Errorf("a loss report could not be saved: %w", err))
		} else {
			// Nothing is lost: the segments name the boot id and the
			// next seq, and hold every batch.
			s.log.Warn("spool: state file not updated at close", "err", err)
		}
	}
	unlockDir(s.lock)
	return errors.Join(errs...)
}

// abandon releases the spool's files the way a killed process would: no
// fsync, no state write. Tests use it to simulate kill -9.
func (s *Spool) abandon() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.active != nil {
		_ = s.active.Close()
		s.active = nil
	}
	if s.ackf != nil {
		_ = s.ackf.Close()
		s.ackf = nil
	}
	unlockDir(s.lock)
}
