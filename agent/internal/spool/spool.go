// Package spool keeps the agent's batches on disk until the collector acks
// them, bounded in size, across collector outages and agent restarts
// (kill -9 included).
//
// # Layout of the spool directory
//
//	state        format version, boot id, next seq, pending loss report
//	             (JSON + CRC32C line), replaced atomically (write temp, fsync,
//	             rename, fsync dir)
//	acks         append-only log of acked seqs: 13-byte entries
//	             [kind u8][seq u64 LE][crc32c u32 LE], compacted on segment removal;
//	             kind 'A'+i: the i-th collector acked seq (cursor.go)
//	seg-<first seq, 20 digits>.tms
//	             segment: header [magic "TMSPOOL1", 1 the format version]
//	             [boot id len u16][boot id]
//	             [crc32c u32], then records [len u32][crc32c u32][seq u64][Batch proto],
//	             the CRC covering seq and payload; all integers little-endian
//	lock         flock'd while a spool is open, so two agents cannot share it
//
// A spool of another format version is refused (format.go), not read. The
// agent's ledger state and ended run ids live beside these; the spool does
// not read them.
//
// Records are appended to the newest segment; a new segment starts once the
// current one reaches the segment size. Acked seqs are kept in memory and in
// the ack log; a segment whose records are all acked (or dropped) is deleted
// whole. The records this process appended last are also kept in memory
// (tail.go), so sending a batch appended a moment ago opens no file.
//
// With several collectors (--collector A,B) each has a cursor over the same
// records (cursor.go): a batch is written once and held until every
// collector has acked it, and a dropped batch's loss is reported only to the
// collectors that had not acked it.
//
// # Durability
//
// Appends are not fsynced one by one: after a kill -9 the page cache still
// reaches the disk; a power loss can lose the last seconds, and the checks at
// open (length, CRC) truncate a torn record. A finished segment and, at
// Close, the active one and the ack log are fsynced; so is every state file.
//
// # When full
//
// Keep the newest data: when an Append would pass the byte bound (or the
// disk reports ENOSPC), the oldest segment is removed and its unacked
// batches are dropped and counted. What each run lost (tokens, energy, GPU
// seconds) and the dropped batches' run events go on the next batch appended
// (Batch.losses, Batch.run_events), so the collector marks the runs
// incomplete by exactly that much. A pending loss report survives restarts
// in the state file.
package spool

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

const (
	// DefaultMaxBytes bounds a spool when nothing else is configured: 1 GiB.
	// A 1 s batch of an 8-GPU node with two active runs is a 1,498-byte
	// record (TestRealisticBatchSize), so 2^30 / (1498 × 86400) ≈ 8.3 days
	// of collector outage before the oldest batch is dropped.
	DefaultMaxBytes int64 = 1 << 30
	// DefaultSegmentBytes is the size at which a new segment file starts.
	DefaultSegmentBytes int64 = 4 << 20
	// MinMaxBytes is the smallest bound Open accepts.
	MinMaxBytes int64 = 4 << 10
)

const (
	segMagic     = "TMSPOOL1" // its last byte: formatVersion's digit
	recHeader    = 16         // len u32, crc u32, seq u64
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
	// Collectors names the collectors, one cursor each, in the agent's
	// --collector order (at most MaxCollectors); nil: the spool's own list
	// (a tool that only looks, such as the doctor), else one unnamed cursor.
	// The names are persisted, so that a reordered or changed list keeps
	// each collector's acks.
	Collectors []string
	// OpenRead opens a segment to read back records the in-memory tail
	// does not hold (tail.go); default os.Open. Tests count the opens.
	OpenRead func(name string) (ReadFile, error)
	// TailBytes bounds the in-memory tail of recently appended records;
	// 0: DefaultTailBytes; negative: no tail, every read from the file.
	TailBytes int64
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
	// PendingLosses is how many loss records (the runs' and the node's) wait
	// for the next batch.
	PendingLosses int
}

type record struct {
	seg  *segment
	seq  uint64
	off  int64 // of the record header
	size int64 // header + payload
	// ackedBy has bit i set once the i-th collector acked the record.
	ackedBy uint8
	done    bool // acked by every collector, or dropped or unreadable
	sent    bool // handed to the uplink at least once (possibly applied)
	doubt   bool // present at open: a previous process may have sent it
	// data is the encoded record while the in-memory tail holds it (tail.go).
	data []byte
}

type segment struct {
	path  string
	first uint64
	size  int64
	recs  []*record
	live  int // records neither acked nor gone
}

// waits reports whether collector i has yet to get r.
func (r *record) waits(i int) bool { return !r.done && r.ackedBy&(1<<i) == 0 }

// Spool is safe for concurrent use.
type Spool struct {
	dir      string
	maxBytes int64
	segBytes int64
	// cfgSegBytes is the configured segment size (segBytes shrinks after ENOSPC).
	cfgSegBytes int64
	log         *slog.Logger
	openFile    func(string, int, os.FileMode) (WriteFile, error)
	openRead    func(string) (ReadFile, error)
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
	active       WriteFile // open append handle of segs[len-1], nil if none
	ackf         *os.File
	ackLogN      int
	bytes        int64
	stats        Stats
	losses       map[string]*trainmeterv1.DataLoss // aggregated, certain
	seqLosses    []*trainmeterv1.DataLoss          // per batch, in doubt
	events       []*trainmeterv1.RunEvent          // carried from dropped batches

	// The in-memory tail (tail.go): records holding their bytes, oldest
	// first, their total, and its bound (<= 0: none).
	tail      []*record
	tailBytes int64
	tailMax   int64

	// Cursors (cursor.go): names as configured, the mask of all of them,
	// the names the state file had at open, and per-cursor counters.
	names       []string
	all         uint8
	loadedNames []string
	cursorStats [MaxCollectors]CursorStats
	// pendingFor[i] counts the records held that collector i has not acked.
	pendingFor [MaxCollectors]int
	// before maps the previous process's cursor indices to this one's (-1:
	// gone); remapped when that is not the identity. Masks written then
	// (records below openSeq, the state's pending report) are translated.
	before   [MaxCollectors]int
	remapped bool
	openSeq  uint64
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
	if err := checkCollectors(o.Collectors); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.OpenFile == nil {
		o.OpenFile = func(name string, flag int, perm os.FileMode) (WriteFile, error) {
			return os.OpenFile(name, flag, perm)
		}
	}
	if o.OpenRead == nil {
		o.OpenRead = openReadFile
	}
	if o.TailBytes == 0 {
		o.TailBytes = DefaultTailBytes
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
		dir: dir, maxBytes: maxBytes, segBytes: seg, cfgSegBytes: seg, log: o.Logger, openFile: o.OpenFile, openRead: o.OpenRead, lock: lock,
		tailMax: o.TailBytes,
		effMax:  maxBytes, bySeq: map[uint64]*record{},
		losses: map[string]*trainmeterv1.DataLoss{},
		names:  append([]string(nil), o.Collectors...),
	}
	s.all = uint8(1)<<max(len(s.names), 1) - 1
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

// ---- append ----

// ErrClosed is returned after Close.
var ErrClosed = errors.New("spool: closed")

// Append assigns b the next sequence number, attaches any pending loss
// report and carried run events, and writes it. It takes ownership of b.
// When the batch cannot be kept (bigger than the whole spool, or a disk
// error that dropping old data did not cure) it is dropped and counted like
// any other, its loss goes into the next report, and the error says why;
// the agent carries on.
func (s *Spool) Append(b *trainmeterv1.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	seq := s.nextSeq
	b.Seq = seq
	own, ownEvents := b.Losses, b.RunEvents
	// encode puts the pending loss report and carried events on b.
	encode := func() ([]byte, error) {
		s.attachLosses(b, own)
		b.RunEvents = append(append([]*trainmeterv1.RunEvent(nil), s.events...), ownEvents...)
		return encodeRecord(b)
	}
	var data []byte
	for {
		var err error
		if data, err = encode(); err != nil {
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
			return s.dropUnwritten(b, own, ownEvents, int64(len(data)), "spool full",
				fmt.Errorf("spool: batch of %d bytes does not fit in a spool of %d bytes; dropped", len(data), s.effMax))
		}
		s.evictOldest(s.dropReason())
		s.saveState()
	}
	err := s.writeCounted(seq, data)
	if err != nil && isNoSpace(err) {
		s.effMax = max(min(s.effMax, s.bytes), MinMaxBytes)
		// Smaller segments from now on, so the next drop frees less at once.
		s.segBytes = min(s.segBytes, max(s.effMax/4, 4<<10))
		s.log.Error("spool: disk full; dropping the oldest batches and lowering the spool bound until it drains",
			"dir", s.dir, "bytes", s.bytes, "max_bytes_now", s.effMax)
		if len(s.segs) > 0 {
			s.evictOldest("disk full")
			// The batch now carries the new loss records too.
			if data, err = encode(); err == nil {
				err = s.writeCounted(seq, data)
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
	s.losses = map[string]*trainmeterv1.DataLoss{}
	s.seqLosses = nil
	s.events = nil
	s.nextSeq = seq + 1
	s.stats.Appended++
	if hadPending || s.nextSeq >= s.reserved {
		s.saveState()
	}
	return nil
}

// writeCounted is write, counting its failures.
func (s *Spool) writeCounted(seq uint64, data []byte) error {
	err := s.write(seq, data)
	if err != nil {
		s.stats.WriteErrors++
	}
	if isNoSpace(err) {
		s.stats.ENOSPC++
	}
	return err
}

// ---- ack, reject, read ----

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
	return s.Append(&trainmeterv1.Batch{WindowStart: ts, WindowEnd: ts})
}

// ReadAfter returns up to n batches with seq > after that this collector has
// not acked, in seq order, each carrying only the loss records and carried
// run events meant for this collector. A record that no longer reads back
// (CRC) is dropped and counted.
func (c *Cursor) ReadAfter(after uint64, n int) ([]*trainmeterv1.Batch, error) {
	s, i := c.s, c.i
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	var out []*trainmeterv1.Batch
	for _, g := range s.segs {
		if len(out) >= n {
			break
		}
		if len(g.recs) == 0 || g.live == 0 || g.recs[len(g.recs)-1].seq <= after {
			continue
		}
		rd := s.reader(g)
		for _, r := range g.recs {
			if len(out) >= n {
				break
			}
			if r.seq <= after || !r.waits(i) {
				continue
			}
			b, err := rd.read(r)
			if err != nil && rd.err != nil { // the file, not the record
				return out, fmt.Errorf("spool: %w", err)
			}
			if err != nil {
				s.log.Error("spool: a held batch no longer reads back; dropping it (loss unknown)", "seq", r.seq, "err", err)
				s.addPending(r, -1)
				s.forget(r)
				r.done = true
				g.live--
				s.stats.Dropped++
				s.stats.DroppedBytes += uint64(r.size)
				s.stats.CorruptRecords++
				continue
			}
			s.fromBefore(b)
			out = append(out, s.forCollector(b, i))
		}
		rd.close()
	}
	return out, nil
}

func (s *Spool) readLocked(r *record) (*trainmeterv1.Batch, error) {
	rd := s.reader(r.seg)
	defer rd.close()
	return rd.read(r)
}

// Close fsyncs and closes the spool. The data stays for the next Open.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.dropTail()
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
