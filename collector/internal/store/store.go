// Package store keeps the collector's data in BadgerDB.
//
// Keys are ordered by series and time. Identifiers (node, boot, run_id) are
// separated by a NUL byte, which ingest validation forbids inside them, so one
// id can never be a prefix of another's series; times and sequence numbers are
// fixed-width big-endian so keys sort chronologically:
//
//	b/<node>\0<boot>\0<seq:8>                      dedup mark of an applied batch that has no
//	                                               r/ record, or whose r/ record may expire
//	                                               before the mark would (see below)
//	a/<run_id>                                     run aggregate (proto storev1.Aggregate; see
//	                                               aggregate.State)
//	an/<run_id>\0<node>                            a node's state in that run, once the run has
//	                                               two nodes (storev1.Node; Aggregate.nodes_apart)
//	w/<run_id>\0<node>\0<start:8><seq:8><i:4>      raw RunWindow (proto)
//	v/<run_id>\0<node>\0<time:8><seq:8><i:4>       raw RunEvent (proto)
//	dw/<node>\0<start:8><seq:8><i:4><deletion:8>   a deleted run's RunWindow, naming no run
//	                                               (storev1.DeletedRunWindow; deleted.go)
//	r/<node>\0<start:8><seq:8>                     raw GpuWindows + HostWindow of a batch
//	                                               (proto Batch holding only those, the window
//	                                               and stored_boot_id, the sender's boot)
//	s/<node>\0<start:8><seq:8>                     raw samples of a batch (proto Batch holding
//	                                               only raw_samples and the window)
//	nl/<node>\0<start:8><seq:8>                    the node loss records a batch carried, those
//	                                               not of a batch held (proto Batch holding only
//	                                               node_losses and the window); expire like r/
//	n/<node>                                       NodeStatus (proto; connected is not stored)
//	x/<namespace>\0<key>                           the collector's own records (records.go)
//	m/format                                       the layout's version (formatVersion)
//
// Deduplication: a batch (node, boot, seq) was applied when its b/ mark
// exists, or when its r/ record (node, window_start, seq: all in the batch)
// holds stored_boot_id == boot. A batch with an r/ record writes no b/ mark
// when that record lives at least as long as a mark would (RawRetention 0,
// or ≥ DedupRetention): one key a batch fewer. An r/ record replaced by a
// batch of another boot at the same start and seq leaves a b/ mark for the
// batch it held. An in-doubt loss record names its batch's window start, so
// it finds the batch by either (lookupApplied).
//
// Writes use SyncWrites; concurrent batches share one transaction and one
// sync (group commit, commit.go).
package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/parallel"
	"github.com/trainmeter/trainmeter/internal/lifecycle"
	"github.com/trainmeter/trainmeter/pkg/clock"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

const (
	maxConflictRetries = 20
	// lockStripes: a node's batch holds its stripe until its commit is
	// durable, so nodes sharing a stripe wait for each other's commits
	// (docs/benchmarks.md).
	lockStripes = 1 << 14
)

// Store is the collector's database. It is safe for concurrent use.
type Store struct {
	db     *badger.DB
	log    *slog.Logger
	now    func() time.Time
	bands  aggregate.EnergyBands
	carbon aggregate.CarbonBooker
	pricer atomic.Pointer[pricerBox] // SetPricer; nil: windows are not priced as stored
	stripe [lockStripes]sync.Mutex

	// Group commit (commit.go).
	applyCh       chan *applyReq
	quit          chan struct{}
	committerDone chan struct{}
	closeOnce     sync.Once
	aggs          *aggCache
	nodes         *nodeCache
	aggMu         sync.Mutex // held by the committer per group, and by DeleteRun
	deleted       tombstones // runs deleted while live (deleted.go)
	starts        startCache // RunStarts' decoded run starts (runstarts.go)

	rawTTL, dedupTTL time.Duration // Options.RawRetention, DedupRetention
	commitWindow     time.Duration // Options.CommitWindow
	commits          atomic.Uint64 // groups committed (CommitStats)
	committedBatches atomic.Uint64

	limits Limits     // Options.Limits
	live   *liveIndex // runs live per node, new-run buckets (limits.go)
}

// Options configures Open.
type Options struct {
	// Logger receives badger's warnings and errors and the store's own logs.
	Logger *slog.Logger
	// Clock is the clock for node last-seen times, deletion marks and raw
	// record expiry; the wall clock if nil.
	Clock clock.Clock
	// EnergyBands, when set, books each window's energy to the tariff band
	// in force (aggregate.State.EnergyByBand); nil: no time-of-use tariff.
	EnergyBands aggregate.EnergyBands
	// Carbon, when set, books each window's energy to the carbon intensity
	// in force on its node's grid (aggregate.State.CarbonByBand); nil: no
	// carbon source.
	Carbon aggregate.CarbonBooker
	// RawRetention, when positive, is how long raw records (GPU and host
	// windows, raw samples, run windows and events) are kept: they are
	// written with that TTL and badger drops them at compaction. Run
	// aggregates and node statuses are kept regardless. Zero keeps all.
	RawRetention time.Duration
	// DedupRetention, when positive, is how long the marks that
	// deduplicate batches are kept; it must outlast any replay the
	// collector would still accept (ingest.MaxBatchAge).
	DedupRetention time.Duration
	// CommitWindow is how long the committer waits after a batch for more
	// batches to commit with it in one transaction and one sync (group
	// commit, commit.go). 0 commits only what is already waiting.
	CommitWindow time.Duration
	// Limits bounds the runs one node may start (limits.go); zero: none.
	Limits Limits
}

// Validate checks the options.
func (o Options) Validate() error {
	if o.CommitWindow < 0 || o.CommitWindow > time.Second {
		return fmt.Errorf("store: commit window must be between 0 and 1s, got %v", o.CommitWindow)
	}
	if o.RawRetention < 0 || o.DedupRetention < 0 {
		return fmt.Errorf("store: retention must be >= 0 (raw %v, dedup %v)", o.RawRetention, o.DedupRetention)
	}
	return o.Limits.Validate()
}

type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.l.Error("badger: " + trim(fmt.Sprintf(f, a...))) }
func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warn("badger: " + trim(fmt.Sprintf(f, a...))) }
func (badgerLogger) Infof(string, ...any)          {}
func (badgerLogger) Debugf(string, ...any)         {}

func trim(s string) string { return string(bytes.TrimRight([]byte(s), "\n")) }

// Open opens (or creates) the store in dir. A directory that is not a valid
// badger database, or is locked by another process, gives an error.
func Open(dir string, o Options) (s *Store, err error) {
	if dir == "" {
		return nil, errors.New("store: empty data directory")
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := time.Now
	if o.Clock != nil {
		now = o.Clock.Now
	}
	opts := badger.DefaultOptions(dir).
		WithSyncWrites(true).
		WithLogger(badgerLogger{log}).
		WithLoggingLevel(badger.WARNING)
	defer func() {
		if p := recover(); p != nil {
			s, err = nil, fmt.Errorf("store: open %s: badger panicked (corrupt data directory?): %v", dir, p)
		}
	}()
	db, err := badger.Open(opts)
	if err != nil && strings.Contains(err.Error(), "Cannot acquire directory lock") {
		// badger formats its cause into the message: nothing to unwrap.
		return nil, fmt.Errorf("store: data dir %s: %w", dir, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %s (corrupt, locked by another collector, or not a trainmeter data directory?): %w", dir, err)
	}
	if err := checkFormat(db, dir); err != nil {
		db.Close()
		return nil, err
	}
	s = &Store{db: db, log: log, now: now, bands: o.EnergyBands, carbon: o.Carbon, rawTTL: o.RawRetention, dedupTTL: o.DedupRetention, commitWindow: o.CommitWindow, applyCh: make(chan *applyReq), quit: make(chan struct{}),
		committerDone: make(chan struct{}), aggs: newAggCache(aggCacheBytes), nodes: newNodeCache(nodeCacheSize, db), limits: o.Limits}
	if err := s.loadTombstones(); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: read deleted runs: %w", err)
	}
	if s.live, err = loadLiveIndex(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: read live runs: %w", err)
	}
	go s.committer()
	return s, nil
}

// formatVersion is the layout of keys and values this package reads and
// writes. A data directory records its version under formatKey when it is
// created; one of another version, or holding data without one, is refused:
// nothing reads a layout but the trainmeter that wrote it.
const formatVersion = 1

var formatKey = []byte("m/format")

// checkFormat stamps an empty database with formatVersion and checks that
// any other holds it.
func checkFormat(db *badger.DB, dir string) error {
	return db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(formatKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			it := txn.NewIterator(badger.IteratorOptions{})
			it.Rewind()
			empty := !it.Valid()
			it.Close()
			if !empty {
				return fmt.Errorf("store: data dir %s holds data but no store format (this trainmeter reads format %d): move it aside or run the trainmeter that wrote it", dir, formatVersion)
			}
			return txn.Set(formatKey, []byte(strconv.Itoa(formatVersion)))
		}
		if err != nil {
			return fmt.Errorf("store: read the format of %s: %w", dir, err)
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return fmt.Errorf("store: read the format of %s: %w", dir, err)
		}
		if string(v) != strconv.Itoa(formatVersion) {
			return fmt.Errorf("store: data dir %s has store format %s, this trainmeter reads %d: move it aside or run the trainmeter that wrote it", dir, v, formatVersion)
		}
		return nil
	})
}

// Close stops the committer and closes the database (shut a GC down first).
// ApplyBatch calls after Close fail.
func (s *Store) Close() error {
	err := errors.New("store: already closed")
	s.closeOnce.Do(func() {
		close(s.quit)
		<-s.committerDone
		err = errors.Join(s.nodes.flushAll(), s.db.Close())
	})
	return err
}

// GC runs badger's value-log GC every Interval on Clock (the wall clock
// when nil) between Start and Shutdown; an Interval ≤ 0 runs nothing. It
// must be shut down before the store is closed.
type GC struct {
	Store    *Store
	Interval time.Duration
	Clock    clock.Clock

	mu         sync.Mutex
	stop, done chan struct{}
}

// Start starts the GC loop; a second Start is a no-op.
func (g *GC) Start(context.Context) error {
	if g.Interval <= 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stop != nil {
		return nil
	}
	clk := g.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	t := clk.NewTicker(g.Interval)
	stop, done := make(chan struct{}), make(chan struct{})
	g.stop, g.done = stop, done
	go func() {
		defer close(done)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C():
				g.Store.RunGC()
			}
		}
	}()
	return nil
}

// Shutdown stops the loop and waits for a GC pass in progress.
func (g *GC) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	stop, done := g.stop, g.done
	g.stop, g.done = nil, nil
	g.mu.Unlock()
	if stop == nil {
		return nil
	}
	close(stop)
	return lifecycle.Wait(ctx, done, "value-log GC")
}

// RunGC runs value-log GC until there is nothing left to rewrite.
func (s *Store) RunGC() {
	for i := 0; i < 100; i++ {
		err := s.db.RunValueLogGC(0.5)
		if err == nil {
			continue
		}
		if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
			s.log.Warn("value log GC", "err", err)
		}
		return
	}
}

// key helpers

func key(prefix string, parts ...string) []byte {
	b := []byte(prefix)
	for i, p := range parts {
		if i > 0 {
			b = append(b, 0)
		}
		b = append(b, p...)
	}
	return b
}

func be64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }
func be32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }

// tkey encodes a time so that keys sort chronologically (also before 1970).
func tkey(b []byte, ts *timestamppb.Timestamp) []byte {
	var n int64
	if ts != nil {
		n = ts.AsTime().UnixNano()
	}
	return be64(b, uint64(n)^(1<<63))
}

func dedupKey(node, boot string, seq uint64) []byte {
	return be64(append(key("b/", node, boot), 0), seq)
}

// startVal is a window start as its 8 key bytes read (tkey).
func startVal(ts *timestamppb.Timestamp) uint64 {
	return binary.BigEndian.Uint64(tkey(nil, ts))
}

func gpuPrefix(node string) []byte { return append(key("r/", node), 0) }

// nodeLossKey is the nl/ key of the node loss records carried by node's
// batch seq starting at start (startVal).
func nodeLossKey(node string, start, seq uint64) []byte {
	return be64(be64(append(key("nl/", node), 0), start), seq)
}

// gpuKey is the r/ key of node's batch seq starting at start (startVal).
func gpuKey(node string, start, seq uint64) []byte {
	return be64(be64(gpuPrefix(node), start), seq)
}

func aggKey(run string) []byte { return key("a/", run) }

// A run's node states, when its aggregate keeps them apart
// (aggregate.State.NodesApart): one key per node, after the run's prefix.
func aggNodeKey(run, node string) []byte { return key("an/", run, node) }
func aggNodesPrefix(run string) []byte   { return append(key("an/", run), 0) }
func nodeKey(node string) []byte         { return key("n/", node) }

func (s *Store) lockRuns(node string, runs []string) func() {
	h := func(v string) int {
		f := fnv.New32a()
		f.Write([]byte(v))
		return int(f.Sum32() % lockStripes)
	}
	order := []int{h("node\x00" + node)}
	for _, r := range runs {
		order = append(order, h("run\x00"+r))
	}
	slices.Sort(order)
	order = slices.Compact(order)
	for _, i := range order {
		s.stripe[i].Lock()
	}
	return func() {
		for j := len(order) - 1; j >= 0; j-- {
			s.stripe[order[j]].Unlock()
		}
	}
}

// ApplyBatch stores a (validated) batch from node/boot and folds it into the
// run aggregates, all in one transaction (ApplyBatchResult).
func (s *Store) ApplyBatch(node, boot string, b *trainmeterv1.Batch) (duplicate bool, err error) {
	a, err := s.ApplyBatchResult(Sender{Node: node, Boot: boot}, b)
	return a.Duplicate, err
}

// ApplyBatchResult implements storage.Ingester; refused starts: refused.go.
// A batch applied before is found by its b/ mark or its r/ record (an
// agent re-sends a batch as it spooled it and never reuses a seq).
func (s *Store) ApplyBatchResult(sender Sender, b *trainmeterv1.Batch) (a Applied, err error) {
	node, boot := sender.Node, sender.Boot
	// The node's lock keeps its batches and hellos in order; its runs are
	// the committer's alone (commit.go).
	unlock := s.lockRuns(node, nil)
	defer unlock()
	b, gone := s.dropDeleted(b)
	b = fold.ClearLocked(b)
	raw, rk, err := rawRecords(node, boot, b)
	if err == nil {
		raw, err = appendDeletedRecords(raw, node, b.GetSeq(), gone)
	}
	if err != nil {
		return Applied{}, err
	}
	req := &applyReq{sender: sender, b: b, runs: fold.BatchRuns(b), raw: raw, rk: rk, gone: gone, done: make(chan struct{})}
	select {
	case s.applyCh <- req:
		<-req.done
		a, err = Applied{Duplicate: req.dup}, req.err
		if err == nil {
			a.Refused, a.Dropped, a.Batch = req.refused, req.dropped, req.applied
		}
	case <-s.quit:
		return Applied{}, errors.New("store: closed")
	}
	if errors.Is(err, badger.ErrTxnTooBig) {
		err = fmt.Errorf("%w: %v", ErrBatchTooLarge, err)
	}
	return a, err
}

// kv is one raw record, encoded by the caller's goroutine (in parallel).
type kv struct{ k, v []byte }

// rawRecords encodes a batch's raw records under their keys, and returns
// the key of its r/ record (nil: it has none). The run windows come first,
// in the batch's order (applyTo stamps them with their prices).
func rawRecords(node, boot string, b *trainmeterv1.Batch) (out []kv, rk []byte, err error) {
	seq := b.GetSeq()
	out = make([]kv, 0, len(b.GetRunWindows())+len(b.GetRunEvents())+len(b.GetGpuWindows())+1)
	add := func(k []byte, m proto.Message) error {
		v, err := proto.Marshal(m)
		out = append(out, kv{k, v})
		return err
	}
	for i, w := range b.GetRunWindows() {
		k := tkey(append(key("w/", w.GetRunId(), node), 0), w.GetStart())
		if err := add(be32(be64(k, seq), uint32(i)), w); err != nil {
			return nil, nil, err
		}
	}
	for i, e := range b.GetRunEvents() {
		k := tkey(append(key("v/", aggregate.EventRunID(e), node), 0), aggregate.EventTime(e))
		if err := add(be32(be64(k, seq), uint32(i)), e); err != nil {
			return nil, nil, err
		}
	}
	// The node's GPU and host windows are one record, one key per batch
	// rather than per GPU (docs/benchmarks.md). It carries the sender's
	// boot: with its key it identifies the batch (deduplication).
	if fold.HasNodeRecord(b) {
		rk = gpuKey(node, startVal(b.GetWindowStart()), seq)
		if err := add(rk, fold.NodeRecord(b, boot)); err != nil {
			return nil, nil, err
		}
	}
	// Raw samples (only from agents asked for them): one record per batch.
	if raw := fold.SamplesRecord(b); raw != nil {
		if err := add(be64(tkey(append(key("s/", node), 0), b.GetWindowStart()), seq), raw); err != nil {
			return nil, nil, err
		}
	}
	return out, rk, nil
}

// applyTo writes a batch's records into txn and folds it into the group's
// aggregates and node statuses; it writes nothing for a duplicate.
func (s *Store) applyTo(txn *badger.Txn, g *groupAggs, r *applyReq) (bool, error) {
	node, boot, b, runs := r.sender.Node, r.sender.Boot, r.b, r.runs
	ne, err := g.nodeEntry(txn, node)
	if err != nil {
		return false, err
	}
	seq, start, rk := b.GetSeq(), startVal(b.GetWindowStart()), r.rk
	dk := dedupKey(node, boot, seq)
	r.refused, r.dropped, r.applied = nil, nil, nil
	dup, displaced, err := lookupApplied(txn, boot, dk, rk)
	if dup || err != nil {
		return dup, err
	}
	raw := r.raw
	nb, refused, dropped, err := fold.Admit(groupView{g, txn, g.live}, s.log, len(ne.ns.GetGpus()), node, b, runs)
	if err != nil {
		return false, err
	}
	if nb != b {
		// Records of refused starts, and records the node may not send,
		// dropped: the raw records are the kept ones.
		b, runs, r.refused, r.dropped, r.applied = nb, fold.BatchRuns(nb), refused, dropped, nb
		if raw, _, err = rawRecords(node, boot, b); err == nil {
			raw, err = appendDeletedRecords(raw, node, seq, r.gone)
		}
		if err != nil {
			return false, err
		}
	}
	if displaced != "" {
		// Our r/ record replaces one of another boot with the same start
		// and seq: that batch keeps its deduplication as a mark.
		if err := s.setTTL(txn, dedupKey(node, displaced, seq), nil, s.dedupTTL); err != nil {
			return false, err
		}
	}

	// Aggregates: read (once per group), fold; the group writes them.
	aggs := make(map[string]*aggregate.State, len(runs))
	for _, r := range runs {
		st, err := g.get(txn, r)
		if err != nil {
			return false, err
		}
		aggs[r] = st
	}
	// Data the agent's spool dropped; a record with a seq (a batch sent but
	// never acked) counts only if that batch was not applied after all.
	runLosses, err := notHeld(txn, node, boot, b.GetLosses())
	if err != nil {
		return false, err
	}
	// Each window's cost is booked at the prices in force now, and its raw
	// record carries them (usage rows are priced from it).
	pricer := s.Pricer()
	nodeGPU := fold.NodeGPUName(ne.ns)
	stamps := fold.Fold(aggs, node, nodeGPU, b, fold.Booking{Bands: s.bands, Carbon: s.carbon, Pricer: pricer}, runLosses, g.now)
	if pricer != nil {
		raw = slices.Clone(raw)
		for i, stamp := range stamps {
			if raw[i].v, err = fold.AppendStamp(raw[i].v, stamp); err != nil {
				return false, err
			}
		}
		if rk != nil {
			for i := range raw {
				if bytes.Equal(raw[i].k, rk) {
					if raw[i].v, err = fold.AppendStamp(raw[i].v, fold.IdleStamp(pricer, node, nodeGPU, b)); err != nil {
						return false, err
					}
				}
			}
		}
	}
	for _, rec := range raw {
		if err := s.setTTL(txn, rec.k, rec.v, s.rawTTL); err != nil {
			return false, err
		}
	}
	// The node's part of dropped batches, by the same rule, for usage.
	nodeLosses, err := notHeld(txn, node, boot, b.GetNodeLosses())
	if err != nil {
		return false, err
	}
	if len(nodeLosses) > 0 {
		v, err := proto.Marshal(&trainmeterv1.Batch{WindowStart: b.GetWindowStart(), NodeLosses: nodeLosses})
		if err != nil {
			return false, err
		}
		if err := s.setTTL(txn, nodeLossKey(node, start, seq), v, s.rawTTL); err != nil {
			return false, err
		}
	}
	g.live.NoteLive(node, runs, func(r string) *aggregate.State { return g.state[r] })
	ns := ne.ns
	ns.BootId = boot
	ns.LastSeq = b.GetSeq()
	ns.LastSeen = timestamppb.New(s.now())
	if rk != nil && s.recordOutlivesMark() {
		return false, nil // the r/ record is the mark
	}
	return false, s.setTTL(txn, dk, nil, s.dedupTTL)
}

// recordOutlivesMark: an r/ record lives at least as long as a b/ mark
// would (both written now), so it can stand in for one.
func (s *Store) recordOutlivesMark() bool {
	return s.rawTTL == 0 || (s.dedupTTL > 0 && s.rawTTL >= s.dedupTTL)
}

// notHeld are the loss records of ls that count: all but those of one
// batch (seq set) that the store holds after all (holdsLost).
func notHeld(txn *badger.Txn, node, boot string, ls []*trainmeterv1.DataLoss) ([]*trainmeterv1.DataLoss, error) {
	var out []*trainmeterv1.DataLoss
	for _, l := range ls {
		if l.GetSeq() != 0 {
			held, err := holdsLost(txn, node, boot, l)
			if err != nil {
				return nil, err
			}
			if held {
				continue
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// holdsLost reports whether the one batch of an in-doubt loss record
// (l.seq, of boot) was applied after all: by its b/ mark, or by its r/
// record at the batch's window_start.
func holdsLost(txn *badger.Txn, node, boot string, l *trainmeterv1.DataLoss) (bool, error) {
	var rk []byte
	if l.GetWindowStart() != nil {
		rk = gpuKey(node, startVal(l.GetWindowStart()), l.GetSeq())
	}
	held, _, err := lookupApplied(txn, boot, dedupKey(node, boot, l.GetSeq()), rk)
	return held, err
}

// lookupApplied reports whether the batch of boot whose b/ mark is dk and
// r/ key rk (nil: none) was applied, and the boot of another boot's r/
// record at rk ("" when none).
func lookupApplied(txn *badger.Txn, boot string, dk, rk []byte) (applied bool, other string, err error) {
	if found, err := exists(txn, dk); found || err != nil {
		return found, "", err
	}
	if rk == nil {
		return false, "", nil
	}
	item, err := txn.Get(rk)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, "", nil
	}
	if err != nil {
		return false, "", err
	}
	var stored string
	if err := item.Value(func(v []byte) (err error) {
		stored, err = storedBoot(v)
		return err
	}); err != nil || stored == boot {
		return err == nil, "", err
	}
	return false, stored, nil
}

func exists(txn *badger.Txn, k []byte) (bool, error) {
	_, err := txn.Get(k)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	return err == nil, err
}

// storedBoot reads stored_boot_id out of an encoded r/ record without
// decoding the rest (it is read for every record a cold node scans).
func storedBoot(v []byte) (string, error) {
	const field = 950 // Batch.stored_boot_id
	for len(v) > 0 {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 {
			return "", fmt.Errorf("store: malformed r/ record: %w", protowire.ParseError(n))
		}
		v = v[n:]
		if num == field && typ == protowire.BytesType {
			s, m := protowire.ConsumeString(v)
			if m < 0 {
				return "", fmt.Errorf("store: malformed r/ record: %w", protowire.ParseError(m))
			}
			return s, nil
		}
		m := protowire.ConsumeFieldValue(num, typ, v)
		if m < 0 {
			return "", fmt.Errorf("store: malformed r/ record: %w", protowire.ParseError(m))
		}
		v = v[m:]
	}
	return "", nil
}

// setTTL writes k=v, expiring ttl after the store clock's now when ttl is
// positive (badger's WithTTL would count from the wall clock; badger reads
// compare the expiry with the wall clock, at one-second resolution).
func (s *Store) setTTL(txn *badger.Txn, k, v []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return txn.Set(k, v)
	}
	return setExpiring(txn, rec{k, v, uint64(s.now().Add(ttl).Unix())})
}

// rec is a stored record with its expiry (0: none), read to be rewritten.
type rec struct {
	k, v      []byte
	expiresAt uint64
}

func setExpiring(txn *badger.Txn, r rec) error {
	e := badger.NewEntry(r.k, r.v)
	e.ExpiresAt = r.expiresAt
	return txn.SetEntry(e)
}

// scan calls fn with the key and value of every item under o.Prefix, from
// seek on (nil: the first), until fn returns errStop or an error. Both are
// valid only during the call.
func scan(txn *badger.Txn, o badger.IteratorOptions, seek []byte, fn func(k, v []byte) error) error {
	o.PrefetchValues = true
	it := txn.NewIterator(o)
	defer it.Close()
	if seek == nil {
		seek = o.Prefix
	}
	for it.Seek(seek); it.Valid(); it.Next() {
		item := it.Item()
		err := item.Value(func(v []byte) error { return fn(item.Key(), v) })
		if errors.Is(err, errStop) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// errStop ends a scan without an error.
var errStop = errors.New("stop")

// under is the iterator options of the keys under prefix.
func under(prefix []byte) badger.IteratorOptions { return badger.IteratorOptions{Prefix: prefix} }

// decodeAll decodes every value under prefix.
func decodeAll[T any, M interface {
	*T
	proto.Message
}](txn *badger.Txn, prefix []byte) ([]M, error) {
	var out []M
	err := scan(txn, under(prefix), nil, func(_, v []byte) error {
		m := M(new(T))
		out = append(out, m)
		return proto.Unmarshal(v, m)
	})
	return out, err
}

// view runs fn in a read transaction and returns its result.
func view[R any](s *Store, fn func(txn *badger.Txn) (R, error)) (r R, err error) {
	err = s.db.View(func(txn *badger.Txn) error {
		r, err = fn(txn)
		return err
	})
	return r, err
}

// readNodes reads the node states of run kept apart into st.
func readNodes(txn *badger.Txn, run string, st *aggregate.State) error {
	prefix := aggNodesPrefix(run)
	return scan(txn, badger.IteratorOptions{Prefix: prefix, PrefetchSize: 256}, nil, func(k, v []byte) error {
		if err := st.UnmarshalNode(string(k[len(prefix):]), v); err != nil {
			return fmt.Errorf("run %q: %w", run, err)
		}
		return nil
	})
}

// decodeAggs decodes encoded aggregates on all cores (decoding them is
// nearly all the cost of listing many runs; docs/benchmarks.md, export
// csv), then calls nodes for each that keeps its node states apart.
func decodeAggs(ids []string, vals [][]byte, nodes func(i int, st *aggregate.State) error) ([]*aggregate.State, error) {
	out := make([]*aggregate.State, len(vals))
	errs := make([]error, len(vals))
	parallel.Each(len(vals), 64, func(i int) { out[i], errs[i] = aggregate.Unmarshal(vals[i]) })
	for i, st := range out {
		if errs[i] != nil {
			return nil, fmt.Errorf("run %q: %w", ids[i], errs[i])
		}
		if st.GetNodesApart() {
			if err := nodes(i, st); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// aggsFrom reads at most limit aggregates (≤ 0: all) from seek on (nil:
// the first), their ids and encodings.
func aggsFrom(txn *badger.Txn, seek []byte, limit int) (ids []string, vals [][]byte, err error) {
	err = scan(txn, badger.IteratorOptions{Prefix: []byte("a/"), PrefetchSize: 64}, seek, func(k, v []byte) error {
		if limit > 0 && len(ids) == limit {
			return errStop
		}
		ids, vals = append(ids, string(k[len("a/"):])), append(vals, bytes.Clone(v))
		return nil
	})
	return ids, vals, err
}

func getAgg(txn *badger.Txn, run string) (*aggregate.State, error) {
	item, err := txn.Get(aggKey(run))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var st *aggregate.State
	err = item.Value(func(v []byte) error {
		var err error
		st, err = aggregate.Unmarshal(v)
		return err
	})
	if err != nil || !st.GetNodesApart() {
		return st, err
	}
	if err := readNodes(txn, run, st); err != nil {
		return nil, err
	}
	return st, nil
}

func getNode(txn *badger.Txn, node string) (*trainmeterv1.NodeStatus, error) {
	item, err := txn.Get(nodeKey(node))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	ns := &trainmeterv1.NodeStatus{}
	err = item.Value(func(v []byte) error { return proto.Unmarshal(v, ns) })
	return ns, err
}

// PutHello implements storage.Ingester.
func (s *Store) PutHello(h *trainmeterv1.Hello) error {
	unlock := s.lockRuns(h.GetNode(), nil)
	defer unlock()
	// The committer's copy is stale from now on; the database gets its
	// newest last seen and seq first.
	if err := s.nodes.drop(h.GetNode()); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		err := s.db.Update(func(txn *badger.Txn) error {
			ns, err := getNode(txn, h.GetNode())
			if errors.Is(err, ErrNotFound) {
				ns, err = &trainmeterv1.NodeStatus{Node: h.GetNode()}, nil
			}
			if err != nil {
				return err
			}
			if ns.GetBootId() != h.GetBootId() {
				ns.LastSeq = 0
			}
			ns.BootId = h.GetBootId()
			ns.Gpus = h.GetGpus()
			ns.HostEnergyStatus = h.GetHostEnergyStatus()
			ns.LastSeen = timestamppb.New(s.now())
			v, err := proto.Marshal(ns)
			if err != nil {
				return err
			}
			return txn.Set(nodeKey(h.GetNode()), v)
		})
		if !errors.Is(err, badger.ErrConflict) || attempt >= maxConflictRetries {
			return err
		}
	}
}

// deleteChunk bounds the keys one DeleteRun transaction removes.
const deleteChunk = 10000

// DeleteRun implements storage.Store: the aggregate goes first (the run
// disappears from queries at once), then its windows become the deleted
// run's (dw/) and its events go.
func (s *Store) DeleteRun(id string) (records int, err error) {
	d, err := s.newDeletion(id)
	if err != nil {
		return 0, err
	}
	return s.deleteRun(id, d)
}

func (s *Store) deleteRun(id string, d fold.Deletion) (records int, err error) {
	unlock := s.lockRuns("", []string{id})
	defer unlock()
	found := false
	// The committer writes aggregates; keep it out while this one goes.
	s.aggMu.Lock()
	s.aggs.drop(id)
	s.live.dropRun(id)
	// The node states go before the aggregate that points to them, so that
	// an interrupted delete leaves a run to delete again, never node states
	// that a new run of the same id would read as its own.
	_, err = s.deletePrefix(aggNodesPrefix(id))
	if err == nil {
		err = s.db.Update(func(txn *badger.Txn) error {
			_, err := txn.Get(aggKey(id))
			if errors.Is(err, badger.ErrKeyNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
			found = true
			if err := txn.Delete(summaryKey(id)); err != nil {
				return err
			}
			if err := dropKey(txn, liveKey(id)); err != nil {
				return err
			}
			return txn.Delete(aggKey(id))
		})
	}
	s.aggMu.Unlock()
	if err != nil {
		return 0, err
	}
	records, err = s.moveRunWindows(id, d)
	if err != nil {
		return records, err
	}
	n, err := s.deletePrefix(append(key("v/", id), 0))
	records += n
	if err != nil {
		return records, err
	}
	if !found && records == 0 {
		return 0, ErrNotFound
	}
	return records, nil
}

// deletePrefix deletes every key under prefix, deleteChunk keys per
// transaction, and returns how many it deleted.
func (s *Store) deletePrefix(prefix []byte) (deleted int, err error) {
	for {
		var keys [][]byte
		err := s.db.View(func(txn *badger.Txn) error {
			it := txn.NewIterator(under(prefix))
			defer it.Close()
			for it.Rewind(); it.Valid() && len(keys) < deleteChunk; it.Next() {
				keys = append(keys, it.Item().KeyCopy(nil))
			}
			return nil
		})
		if err != nil || len(keys) == 0 {
			return deleted, err
		}
		err = s.db.Update(func(txn *badger.Txn) error {
			for _, k := range keys {
				if err := txn.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return deleted, err
		}
		deleted += len(keys)
	}
}

// GetRun implements storage.Runs.
func (s *Store) GetRun(id string) (*aggregate.State, error) {
	return view(s, func(txn *badger.Txn) (*aggregate.State, error) { return getAgg(txn, id) })
}

// ListRuns implements storage.Runs.
func (s *Store) ListRuns(ids []string) ([]*aggregate.State, error) {
	var out []*aggregate.State
	err := s.db.View(func(txn *badger.Txn) error {
		if len(ids) > 0 {
			var missing []string
			for _, id := range ids {
				st, err := getAgg(txn, id)
				if errors.Is(err, ErrNotFound) {
					missing = append(missing, id)
					continue
				}
				if err != nil {
					return err
				}
				out = append(out, st)
			}
			if len(missing) > 0 {
				return &NotFoundError{IDs: missing}
			}
			return nil
		}
		ids, vals, err := aggsFrom(txn, nil, 0)
		if err != nil {
			return err
		}
		nodes, err := allAggNodes(txn)
		if err != nil {
			return err
		}
		out, err = decodeAggs(ids, vals, func(i int, st *aggregate.State) error {
			for _, n := range nodes[ids[i]] {
				if err := st.UnmarshalNode(n.name, n.value); err != nil {
					return fmt.Errorf("run %q: %w", ids[i], err)
				}
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RunStarts returns the RunStart of each of ids that is stored (nil: the
// run has none), decoding only that field of its aggregate; an id not
// stored is not in the map. Usage reads runs so. The starts may be shared
// with other calls (a start decoded before is kept: startCache), so the
// caller must not change them. The aggregates are read
// in key order by one iterator, which steps to the next id's key when it
// is near and seeks to it when not (a step costs less than a seek or a
// Get).
func (s *Store) RunStarts(ids []string) (map[string]*trainmeterv1.RunStart, error) {
	ids = slices.Sorted(slices.Values(ids))
	out := make(map[string]*trainmeterv1.RunStart, len(ids))
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(under([]byte("a/")))
		defer it.Close()
		it.Rewind()
		for _, id := range ids {
			want := aggKey(id)
			for steps := 0; it.Valid() && bytes.Compare(it.Item().Key(), want) < 0; steps++ {
				if steps == seekAfter {
					it.Seek(want)
					break
				}
				it.Next()
			}
			if !it.Valid() {
				break
			}
			if !bytes.Equal(it.Item().Key(), want) {
				continue
			}
			if err := it.Item().Value(func(v []byte) error {
				st, err := s.starts.runStart(id, v)
				out[id] = st
				return err
			}); err != nil {
				return fmt.Errorf("run %q: %w", id, err)
			}
		}
		return nil
	})
	return out, err
}

// aggRunStart is the field number of storev1.Aggregate's run_start.
var aggRunStart = (&storev1.Aggregate{}).ProtoReflect().Descriptor().Fields().ByName("run_start").Number()

// runStartOf decodes the run_start of an encoded Aggregate (nil: none),
// as decoding the whole message would (occurrences merged).
func runStartOf(v []byte) (*trainmeterv1.RunStart, error) {
	field := aggRunStart
	var st *trainmeterv1.RunStart
	for len(v) > 0 {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		v = v[n:]
		if num == field && typ == protowire.BytesType {
			b, n := protowire.ConsumeBytes(v)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			if st == nil {
				st = &trainmeterv1.RunStart{}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(b, st); err != nil {
				return nil, err
			}
			v = v[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, v)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		v = v[n:]
	}
	return st, nil
}

// RunsAfter returns the aggregates of at most limit runs whose ids come
// after `after` in byte order ("": from the first run), in that order: one
// page of a listing of every run. Its cost is the page's runs, not the
// store's, so that paging through many runs stays linear; the page is
// decoded on all cores, as ListRuns decodes.
func (s *Store) RunsAfter(after string, limit int) ([]*aggregate.State, error) {
	if limit <= 0 {
		return nil, nil
	}
	return view(s, func(txn *badger.Txn) ([]*aggregate.State, error) {
		seek := []byte("a/")
		if after != "" {
			seek = append(aggKey(after), 0) // the smallest key after after's
		}
		ids, vals, err := aggsFrom(txn, seek, limit)
		if err != nil {
			return nil, err
		}
		// Badger iterators are not for concurrent use in one transaction:
		// the node states are read after decoding, one run at a time.
		return decodeAggs(ids, vals, func(i int, st *aggregate.State) error { return readNodes(txn, ids[i], st) })
	})
}

type aggNode struct {
	name  string
	value []byte
}

// allAggNodes reads every run's node states kept apart, by run.
func allAggNodes(txn *badger.Txn) (map[string][]aggNode, error) {
	out := map[string][]aggNode{}
	err := scan(txn, badger.IteratorOptions{Prefix: []byte("an/"), PrefetchSize: 256}, nil, func(k, v []byte) error {
		run, name, ok := bytes.Cut(k[len("an/"):], []byte{0})
		if !ok {
			return fmt.Errorf("store: malformed node state key %q", k)
		}
		out[string(run)] = append(out[string(run)], aggNode{name: string(name), value: bytes.Clone(v)})
		return nil
	})
	return out, err
}

// Nodes implements storage.Runs.
func (s *Store) Nodes() ([]*trainmeterv1.NodeStatus, error) {
	return view(s, func(txn *badger.Txn) ([]*trainmeterv1.NodeStatus, error) {
		return decodeAll[trainmeterv1.NodeStatus](txn, []byte("n/"))
	})
}

// RunWindows returns the raw windows stored for a run, per node in time
// order (for re-aggregation and debugging).
func (s *Store) RunWindows(runID string) ([]*trainmeterv1.RunWindow, error) {
	return view(s, func(txn *badger.Txn) ([]*trainmeterv1.RunWindow, error) {
		return decodeAll[trainmeterv1.RunWindow](txn, append(key("w/", runID), 0))
	})
}

// RawSamples returns the raw-sample records stored for a node, in time
// order: each a Batch holding only the window and its raw_samples.
func (s *Store) RawSamples(node string) ([]*trainmeterv1.Batch, error) {
	return view(s, func(txn *badger.Txn) ([]*trainmeterv1.Batch, error) {
		return decodeAll[trainmeterv1.Batch](txn, append(key("s/", node), 0))
	})
}

// RunTimeline implements storage.Windows.
func (s *Store) RunTimeline(runID string) ([]NodeWindow, []NodeEvent, error) {
	var ws []NodeWindow
	var es []NodeEvent
	// Keys are prefix, node, 0, time (8), seq (8), index (4).
	const tail = 1 + 8 + 8 + 4
	err := s.db.View(func(txn *badger.Txn) error {
		scan := func(prefix []byte, fn func(node string, v []byte) error) error {
			return scan(txn, under(prefix), nil, func(k, v []byte) error {
				if len(k) < len(prefix)+tail {
					return nil
				}
				return fn(string(k[len(prefix):len(k)-tail]), v)
			})
		}
		if err := scan(append(key("w/", runID), 0), func(node string, v []byte) error {
			w := &trainmeterv1.RunWindow{}
			ws = append(ws, NodeWindow{Node: node, Window: w})
			return proto.Unmarshal(v, w)
		}); err != nil {
			return err
		}
		return scan(append(key("v/", runID), 0), func(node string, v []byte) error {
			e := &trainmeterv1.RunEvent{}
			es = append(es, NodeEvent{Node: node, Event: e})
			return proto.Unmarshal(v, e)
		})
	})
	return ws, es, err
}

// NodeGPUWindows implements storage.Windows.
func (s *Store) NodeGPUWindows(node string, from, to time.Time) ([]*trainmeterv1.Batch, error) {
	var out []*trainmeterv1.Batch
	prefix := append(key("r/", node), 0)
	end := tkey(bytes.Clone(prefix), timestamppb.New(to))
	err := s.db.View(func(txn *badger.Txn) error {
		return scan(txn, under(prefix), tkey(bytes.Clone(prefix), timestamppb.New(from)), func(k, v []byte) error {
			if bytes.Compare(k[:min(len(k), len(end))], end) > 0 {
				return errStop
			}
			b := &trainmeterv1.Batch{}
			out = append(out, b)
			return proto.Unmarshal(v, b)
		})
	})
	return out, err
}

// UsageScan implements storage.Windows: r/ records, then nl/ records
// (scanNodeLosses), w/ and dw/ records, from one snapshot. Raw records
// expire with RawRetention, so usage reaches back that far at most. The
// r/, w/ and dw/ keys hold their window's start after the node (the run
// and node for w/), so each node's (each run's) records outside the period
// are skipped by seeking, undecoded: a period costs what it holds.
func (s *Store) UsageScan(since, until time.Time, gpu func(node string, b *trainmeterv1.Batch) error,
	run func(runID, node string, w *trainmeterv1.RunWindow) error, deleted func(node string, d *storev1.DeletedRunWindow) error) error {
	in := func(ts *timestamppb.Timestamp) bool {
		t := ts.AsTime()
		return (since.IsZero() || !t.Before(since)) && (until.IsZero() || t.Before(until))
	}
	p := newPeriodKeys(since, until)
	return s.db.View(func(txn *badger.Txn) error {
		if err := scanDecoded(txn, p, "r/", 16, func(k []byte, b *trainmeterv1.Batch) error {
			if !in(b.GetWindowStart()) {
				return nil
			}
			return gpu(string(k[2:len(k)-17]), b)
		}); err != nil {
			return err
		}
		if err := scanNodeLosses(txn, in, gpu); err != nil {
			return err
		}
		if err := scanDecoded(txn, p, "w/", 20, func(k []byte, w *trainmeterv1.RunWindow) error {
			id, node, ok := bytes.Cut(k[2:len(k)-21], []byte{0})
			if !ok || !in(w.GetStart()) {
				return nil
			}
			return run(string(id), string(node), w)
		}); err != nil {
			return err
		}
		return scanDecoded(txn, p, "dw/", 28, func(k []byte, d *storev1.DeletedRunWindow) error {
			if !in(d.GetWindow().GetStart()) {
				return nil
			}
			return deleted(string(k[3:len(k)-29]), d)
		})
	})
}

// periodKeys are a period's bounds as the 8 bytes of a key's time (tkey);
// has* false: unbounded on that side.
type periodKeys struct {
	lo, hi       []byte
	hasLo, hasHi bool
}

func newPeriodKeys(since, until time.Time) periodKeys {
	var p periodKeys
	if !since.IsZero() {
		p.lo, p.hasLo = tkey(nil, timestamppb.New(since)), true
	}
	if !until.IsZero() {
		p.hi, p.hasHi = tkey(nil, timestamppb.New(until)), true
	}
	return p
}

// seekAfter is how many out-of-period keys of one group a period scan
// steps over before it seeks past them: a step costs less than a seek, so
// groups of a few records are stepped through and long ones skipped.
const seekAfter = 8

// scan calls fn with the key and value of every record under prefix
// whose key is <prefix><group>\0<start:8><tail-8 bytes> with its start
// in the period (the group being a node, or a run and a node), in key
// order. Keys out of the period are not decoded: within a group (whose
// keys are in time order) the scan seeks to the period's start, and on
// from its end to the next group. fn checks the decoded start still: the
// key's time is the window's start to the nanosecond, so this only keeps
// exact what the keys already decided.
func (p periodKeys) scan(txn *badger.Txn, prefix string, tail int, fn func(k, v []byte) error) error {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix)})
	defer it.Close()
	var group []byte // the group of the keys being stepped over
	skipped := 0
	it.Rewind()
	for it.Valid() {
		item := it.Item()
		k := item.Key()
		if len(k) < len(prefix)+1+tail {
			it.Next()
			continue
		}
		g, t := k[:len(k)-tail], k[len(k)-tail:len(k)-tail+8]
		before, after := p.hasLo && bytes.Compare(t, p.lo) < 0, p.hasHi && bytes.Compare(t, p.hi) >= 0
		if !before && !after {
			skipped = 0
			if err := item.Value(func(v []byte) error { return fn(k, v) }); err != nil {
				return err
			}
			it.Next()
			continue
		}
		if !bytes.Equal(g, group) {
			group, skipped = append(group[:0], g...), 0
		}
		if skipped++; skipped <= seekAfter {
			it.Next()
			continue
		}
		skipped = 0
		if before {
			it.Seek(append(bytes.Clone(group), p.lo...))
		} else {
			// Past every key of the group: its \0 separator raised by one.
			next := bytes.Clone(group)
			if next[len(next)-1] == 0xff {
				it.Next()
				continue
			}
			next[len(next)-1]++
			it.Seek(next)
		}
	}
	return nil
}

// decodeChunk is how many records scanDecoded decodes at once.
const decodeChunk = 4096

// scanDecoded is p.scan with each value decoded as an M: a chunk of
// records at a time, decoded on all cores (as ListRuns decodes), then
// handed to use in key order.
func scanDecoded[T any, M interface {
	*T
	proto.Message
}](txn *badger.Txn, p periodKeys, prefix string, tail int, use func(k []byte, m M) error) error {
	var keys, vals [][]byte
	flush := func() error {
		ms := make([]M, len(vals))
		errs := make([]error, len(vals))
		parallel.Each(len(vals), 64, func(i int) {
			ms[i] = M(new(T))
			errs[i] = proto.Unmarshal(vals[i], ms[i])
		})
		for i, m := range ms {
			if errs[i] != nil {
				return errs[i]
			}
			if err := use(keys[i], m); err != nil {
				return err
			}
		}
		keys, vals = keys[:0], vals[:0]
		return nil
	}
	if err := p.scan(txn, prefix, tail, func(k, v []byte) error {
		keys, vals = append(keys, bytes.Clone(k)), append(vals, bytes.Clone(v))
		if len(vals) == decodeChunk {
			return flush()
		}
		return nil
	}); err != nil {
		return err
	}
	return flush()
}

// scanNodeLosses calls gpu with a Batch holding only node_losses: the
// node's loss records whose dropped data began in the period (by
// first_window_start; the one batch's window_start, or the carrier's,
// where a record has none).
func scanNodeLosses(txn *badger.Txn, in func(*timestamppb.Timestamp) bool, gpu func(node string, b *trainmeterv1.Batch) error) error {
	return scanNodeBatches(txn, "nl/", func(node string, b *trainmeterv1.Batch) error {
		if kept := fold.LossesIn(b, in); kept != nil {
			return gpu(node, kept)
		}
		return nil
	})
}

// scanNodeBatches calls f with every Batch stored under prefix with a
// <prefix><node>\0<start:8><seq:8> key (nl/), and the node.
func scanNodeBatches(txn *badger.Txn, prefix string, f func(node string, b *trainmeterv1.Batch) error) error {
	return scan(txn, under([]byte(prefix)), nil, func(k, v []byte) error {
		if len(k) < len(prefix)+1+16 {
			return nil
		}
		b := &trainmeterv1.Batch{}
		if err := proto.Unmarshal(v, b); err != nil {
			return err
		}
		return f(string(k[len(prefix):len(k)-17]), b)
	})
}

// readRecs reads at most limit (0: all) records under prefix with their
// expiry, each value as conv makes it (nil conv: as stored; a nil value
// from conv skips the record).
func readRecs(txn *badger.Txn, prefix []byte, limit int, conv func(v []byte) ([]byte, error)) ([]rec, error) {
	var recs []rec
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true})
	defer it.Close()
	for it.Rewind(); it.Valid() && (limit == 0 || len(recs) < limit); it.Next() {
		v, err := it.Item().ValueCopy(nil)
		if err == nil && conv != nil {
			if v, err = conv(v); v == nil && err == nil {
				continue
			}
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec{it.Item().KeyCopy(nil), v, it.Item().ExpiresAt()})
	}
	return recs, nil
}
