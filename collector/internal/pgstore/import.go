package pgstore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/internal/plural"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Import copies a whole store (storage.Dump; `trainmeter migrate`) into
// this database, in one transaction: all of it or nothing. It copies the
// state and rows, not the batches that made them (raw records may be past
// their retention while their aggregates are kept): the runs' aggregates
// and the nodes' statuses through the writes ingest uses (queueRun with
// the run's report at the store's pricer, as ingest writes it; queueNode),
// the rest with COPY into the columns of importSQL, into the day
// partitions of the days it writes (makeDays). The per-minute rollups and
// the daily usage rollups are built from the raw records copied by the
// accumulators ingest adds a batch's records with (rollupRows, dayUsage),
// so the database is as ingest would have left it, raw_horizon included
// (nothing dropped). A database with any row in any table (but a fresh
// raw_horizon) is refused (ErrNotEmpty), whatever its schema version:
// Open has brought an older one to this trainmeter's, and refused a newer
// one. progress, when set, is told every progressRows rows of a kind and
// at its end.
//
// Memory stays flat: rows go in chunks of at most chunkRows rows or
// batchBytes, and the rollups are written as each node's (and run's)
// minute ends, since a dump yields raw records in (run,) node, time order.
//
// The nodes' new-run buckets are not copied: the BadgerDB store keeps
// them in memory only, full at every start, and a NULL bucket is full.
// Batch keys whose window start the dump does not know (BadgerDB's dedup
// marks) are stored as starting now: kept for the whole dedup retention
// from the move, never less.
func (s *Store) Import(ctx context.Context, d storage.Dump, progress func(Count)) (Counts, error) {
	if progress == nil {
		progress = func(Count) {}
	}
	var out Counts
	var made map[int64]bool
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		out = nil
		// Two imports at once: the second finds the first's rows.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(importLock)); err != nil {
			return err
		}
		if err := checkEmpty(ctx, tx); err != nil {
			return err
		}
		im := importer{ctx: ctx, tx: tx, progress: progress, now: s.clk.Now().UnixNano(), pricing: s.reportPricing(),
			nodeGPU: map[string]string{}, days: map[int64]bool{}, rolled: map[string]int64{}}
		for _, step := range []func() error{
			func() error { return im.runs(d.Runs()) },
			func() error { return im.nodes(d.Nodes()) },
			func() error { return im.applied(d.AppliedBatches()) },
			func() error { return im.raw(d) },
			func() error { return im.records(d.Records()) },
			im.rolledNodes,
		} {
			if err := step(); err != nil {
				return err
			}
		}
		out = im.counts
		made = im.days
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: import: %w", err)
	}
	for d := range made {
		s.days.Store(d, true)
	}
	return out, nil
}

// ErrNotEmpty refuses an import into a database holding data.
var ErrNotEmpty = errors.New("the database is not empty")

// importLock is the advisory lock key an import holds.
const importLock = 0x74726d696d706f72 // "trmimpor"

// progressRows is how often Import reports progress.
const progressRows = 100_000

// Counts are the rows Import copied, per kind, in the order copied.
type Counts []Count

// Count is the rows of a kind copied; What names one ("run window").
type Count struct {
	What string
	Rows int64
}

// String is "3 run windows".
func (c Count) String() string {
	head, last := "", c.What
	if i := strings.LastIndexByte(c.What, ' '); i >= 0 {
		head, last = c.What[:i+1], c.What[i+1:]
	}
	return fmt.Sprintf("%d %s%s", c.Rows, head, plural.Noun(c.Rows, last))
}

func (c Counts) String() string {
	parts := make([]string, len(c))
	for i, n := range c {
		parts[i] = n.String()
	}
	return strings.Join(parts, ", ")
}

// importSQL is every table and column Import writes but through queueRun
// and queueNode: a column renamed in migrations/ is renamed here.
var importSQL = struct {
	insertRun      string
	liveRuns       copyInto
	applied        copyInto
	stageApplied   string
	mergeApplied   string
	raw            map[storage.RawKind]copyInto
	rawRow         map[storage.RawKind]func(r storage.RawRecord) []any
	records        copyInto
	tablesWithRows string
	freshHorizon   string
}{
	insertRun: `INSERT INTO runs (run_id) VALUES ($1)`,
	liveRuns:  copyInto{"live run", "live_runs", []string{"node", "run_id"}},
	// A batch may be yielded twice (by its raw record and by a dedup
	// mark): staged, then merged once with its earliest start, the known
	// one (the unknown is the move's time).
	applied:      copyInto{"applied batch", "import_applied", []string{"node", "boot", "seq", "start_ns"}},
	stageApplied: `CREATE TEMP TABLE import_applied (LIKE applied_batches) ON COMMIT DROP`,
	mergeApplied: `INSERT INTO applied_batches SELECT DISTINCT ON (node, boot, seq) * FROM import_applied
		ORDER BY node, boot, seq, start_ns ON CONFLICT DO NOTHING`,
	raw: map[storage.RawKind]copyInto{
		storage.RawRunWindows:     {"run window", "run_windows", []string{"run_id", "node", "start_ns", "seq", "i", "w"}},
		storage.RawRunEvents:      {"run event", "run_events", []string{"run_id", "node", "t_ns", "seq", "i", "e"}},
		storage.RawNodeWindows:    {"node window record", "node_windows", []string{"node", "start_ns", "seq", "b"}},
		storage.RawSamples:        {"raw-sample record", "raw_samples", []string{"node", "start_ns", "seq", "b"}},
		storage.RawNodeLosses:     {"node loss record", "node_losses", []string{"node", "start_ns", "seq", "b"}},
		storage.RawDeletedWindows: {"deleted run window", "deleted_windows", []string{"node", "start_ns", "seq", "i", "deletion", "d"}},
	},
	rawRow: map[storage.RawKind]func(r storage.RawRecord) []any{
		storage.RawRunWindows: func(r storage.RawRecord) []any {
			return []any{r.Run, r.Node, r.Start, int64(r.Seq), int32(r.I), r.Value}
		},
		storage.RawRunEvents: func(r storage.RawRecord) []any {
			return []any{r.Run, r.Node, r.Start, int64(r.Seq), int32(r.I), r.Value}
		},
		storage.RawNodeWindows: perBatchRow,
		storage.RawSamples:     perBatchRow,
		storage.RawNodeLosses:  perBatchRow,
		storage.RawDeletedWindows: func(r storage.RawRecord) []any {
			return []any{r.Node, r.Start, int64(r.Seq), int32(r.I), int64(r.Deletion), r.Value}
		},
	},
	records: copyInto{"record", "records", []string{"ns", "k", "v"}},
	// Every table of the schema but the migrations' own and raw_horizon
	// (one row from the start), partitions within their tables.
	tablesWithRows: `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
		AND c.relname NOT IN ('schema_version', 'raw_horizon') ORDER BY 1`,
	freshHorizon: `SELECT from_ns = -9223372036854775808 FROM raw_horizon`,
}

func perBatchRow(r storage.RawRecord) []any { return []any{r.Node, r.Start, int64(r.Seq), r.Value} }

// copyInto is a COPY's table and columns, and what its rows are called.
type copyInto struct {
	what, table string
	cols        []string
}

// checkEmpty fails with ErrNotEmpty, naming the tables with rows, unless
// every table is empty.
func checkEmpty(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, importSQL.tablesWithRows)
	if err != nil {
		return err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var full []string
	var fresh bool
	if err := tx.QueryRow(ctx, importSQL.freshHorizon).Scan(&fresh); err != nil {
		return err
	}
	if !fresh {
		full = append(full, "raw_horizon")
	}
	for _, t := range tables {
		var has bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{t}.Sanitize()+`)`).Scan(&has); err != nil {
			return err
		}
		if has {
			full = append(full, t)
		}
	}
	if len(full) > 0 {
		return fmt.Errorf("%w (rows in %s): migrate moves a store into an empty database only", ErrNotEmpty, strings.Join(full, ", "))
	}
	return nil
}

type importer struct {
	ctx      context.Context
	tx       pgx.Tx
	progress func(Count)
	now      int64 // the window start of batch keys without one
	counts   Counts
	live     [][]any // (node, run) of the runs live on a node
	// pricing: the runs' reports and deleted runs' usage, as ingest's.
	pricing aggregate.Pricing
	nodeGPU map[string]string // node → its GPUs' name (fold.NodeGPUName)
	days    map[int64]bool    // days whose partitions are made
	q       pgx.Batch         // rollup writes, sent after each chunk
	rolled  map[string]int64  // node → past its newest record the rollups hold
}

// runs writes every run through ingest's queueRun, keeping the node
// states in the aggregate (this store's form), and notes the live ones.
func (im *importer) runs(seq iter.Seq2[*aggregate.State, error]) error {
	b := &batcher{im: im, what: "run"}
	for st, err := range seq {
		if err != nil {
			return err
		}
		st.NodesApart = false
		b.q.Queue(importSQL.insertRun, st.RunId)
		if err := queueRun(&b.q, st, st.Report(im.pricing)); err != nil {
			return fmt.Errorf("run %q: %w", st.RunId, err)
		}
		for _, node := range st.LiveNodes() {
			im.live = append(im.live, []any{node, st.RunId})
		}
		if err := b.added(proto.Size(st.Aggregate)); err != nil {
			return err
		}
	}
	if err := b.done(); err != nil {
		return err
	}
	c := importSQL.liveRuns
	n, err := im.tx.CopyFrom(im.ctx, pgx.Identifier{c.table}, c.cols, pgx.CopyFromRows(im.live))
	if err != nil {
		return fmt.Errorf("%s: %w", c.what, err)
	}
	im.count(c.what, n)
	return nil
}

func (im *importer) nodes(seq iter.Seq2[*trainmeterv1.NodeStatus, error]) error {
	b := &batcher{im: im, what: "node"}
	for ns, err := range seq {
		if err != nil {
			return err
		}
		im.nodeGPU[ns.GetNode()] = fold.NodeGPUName(ns)
		if err := queueNode(&b.q, ns); err != nil {
			return err
		}
		if err := b.added(proto.Size(ns)); err != nil {
			return err
		}
	}
	return b.done()
}

// A batcher sends the writes of runs or nodes one pgx.Batch at a time, of
// batchRows rows or batchBytes of encoded rows, whichever comes first (a
// run on a thousand nodes encodes to about a megabyte).
type batcher struct {
	im          *importer
	what        string
	q           pgx.Batch
	n, told     int64
	rows, bytes int
}

const (
	batchRows  = 500
	batchBytes = 16 << 20
)

// added notes a row queued, of size bytes.
func (b *batcher) added(size int) error {
	b.n, b.rows, b.bytes = b.n+1, b.rows+1, b.bytes+size
	if b.rows < batchRows && b.bytes < batchBytes {
		return nil
	}
	if err := b.send(); err != nil {
		return err
	}
	if b.n/progressRows > b.told/progressRows {
		b.im.progress(Count{b.what, b.n})
		b.told = b.n
	}
	return nil
}

func (b *batcher) send() error {
	if b.q.Len() > 0 {
		if err := b.im.tx.SendBatch(b.im.ctx, &b.q).Close(); err != nil {
			return fmt.Errorf("%s: %w", b.what, err)
		}
		b.q = pgx.Batch{}
	}
	b.rows, b.bytes = 0, 0
	return nil
}

// done sends what is queued and counts the rows.
func (b *batcher) done() error {
	if err := b.send(); err != nil {
		return err
	}
	b.im.count(b.what, b.n)
	return nil
}

func (im *importer) applied(seq iter.Seq2[storage.AppliedBatch, error]) error {
	if _, err := im.tx.Exec(im.ctx, importSQL.stageApplied); err != nil {
		return err
	}
	days := map[int64]bool{}
	if _, err := copySeq(im, importSQL.applied, seq, func(a storage.AppliedBatch) []any {
		start := a.Start
		if !a.StartKnown {
			start = im.now
		}
		days[dayOf(start)] = true
		return []any{a.Node, a.Boot, int64(a.Seq), start}
	}); err != nil {
		return err
	}
	if err := im.makeDays(days); err != nil {
		return err
	}
	tag, err := im.tx.Exec(im.ctx, importSQL.mergeApplied)
	if err != nil {
		return fmt.Errorf("applied batches: %w", err)
	}
	im.count(importSQL.applied.what, tag.RowsAffected())
	return nil
}

func (im *importer) raw(d storage.Dump) error {
	for _, kind := range storage.RawKinds {
		if err := im.copyRaw(kind, d.Raw(kind)); err != nil {
			return err
		}
	}
	return nil
}

// chunkRows is the most raw rows one COPY of an import sends.
const chunkRows = 10_000

// copyRaw copies every raw record of a kind, a chunk at a time: the
// partitions of the chunk's days made, its rows copied, then the rollup
// rows the accumulators finished written.
func (im *importer) copyRaw(kind storage.RawKind, seq iter.Seq2[storage.RawRecord, error]) error {
	c, row := importSQL.raw[kind], importSQL.rawRow[kind]
	acc := &accumulator{im: im}
	var chunk [][]any
	days := map[int64]bool{}
	var n int64
	size := 0
	send := func() error {
		if err := im.makeDays(days); err != nil {
			return err
		}
		if _, err := im.tx.CopyFrom(im.ctx, pgx.Identifier{c.table}, c.cols, pgx.CopyFromRows(chunk)); err != nil {
			return fmt.Errorf("%s: %w", c.what, err)
		}
		chunk, size = chunk[:0], 0
		if im.q.Len() > 0 {
			if err := im.tx.SendBatch(im.ctx, &im.q).Close(); err != nil {
				return fmt.Errorf("%s rollups: %w", c.what, err)
			}
			im.q = pgx.Batch{}
		}
		return nil
	}
	for r, err := range seq {
		if err != nil {
			return fmt.Errorf("%s: %w", c.what, err)
		}
		r.Value = bytes.Clone(r.Value) // valid until the next record only
		if kind != storage.RawDeletedWindows {
			days[dayOf(r.Start)] = true
		}
		if err := acc.add(kind, r); err != nil {
			return fmt.Errorf("%s: %w", c.what, err)
		}
		im.rolled[r.Node] = max(im.rolled[r.Node], r.Start+1)
		chunk, size, n = append(chunk, row(r)), size+len(r.Value), n+1
		if n%progressRows == 0 {
			im.progress(Count{c.what, n})
		}
		if len(chunk) >= chunkRows || size >= batchBytes {
			if err := send(); err != nil {
				return err
			}
		}
	}
	if err := acc.flush(); err != nil {
		return fmt.Errorf("%s: %w", c.what, err)
	}
	if err := send(); err != nil {
		return err
	}
	im.count(c.what, n)
	return nil
}

// rolledNodes sets every node's rolled_ns past its records, which the
// import added to the rollups (rollbehind.go), and past the import's time.
func (im *importer) rolledNodes() error {
	var nodes []string
	var at []int64
	for n, r := range im.rolled {
		if r > im.now {
			nodes, at = append(nodes, n), append(at, r)
		}
	}
	var q pgx.Batch
	q.Queue(`UPDATE nodes SET rolled_ns = $1`, im.now)
	q.Queue(`UPDATE nodes n SET rolled_ns = t.r FROM unnest($1::text[], $2::int8[]) AS t(node, r) WHERE n.node = t.node`, nodes, at)
	return im.tx.SendBatch(im.ctx, &q).Close()
}

// makeDays makes the partitions of days not made yet (layout.go).
func (im *importer) makeDays(days map[int64]bool) error {
	var need []int64
	for d := range days {
		if !im.days[d] {
			need = append(need, d)
		}
	}
	slices.Sort(need)
	if err := makeDays(im.ctx, im.tx, need); err != nil {
		return err
	}
	for _, d := range need {
		im.days[d] = true
	}
	return nil
}

// An accumulator adds raw records of one kind, in the dump's order, to
// the rollups ingest adds them to in a batch's transaction: the minute
// rollups (rollupRows) and the daily usage (dayUsage). A minute's rollup
// rows are queued on im.q when its records end (the next is of another
// node, run or minute); daily usage rows add up (dayUsage.queue), so they
// are queued at each node's, run's or day's end.
type accumulator struct {
	im      *importer
	roll    *rollupRows
	rollAt  groupKey
	usage   *dayUsage
	usageAt groupKey
}

// groupKey is where records of a group end: the run (run windows only),
// the node, and the minute (rollups) or day (usage).
type groupKey struct {
	run, node string
	at        int64
}

func (a *accumulator) rollup(k groupKey, r rollups) error {
	if a.roll != nil && a.rollAt != k {
		// A rollup row is written whole: a group seen again would
		// replace what it held.
		if cmp.Or(cmp.Compare(k.run, a.rollAt.run), cmp.Compare(k.node, a.rollAt.node), cmp.Compare(k.at, a.rollAt.at)) < 0 {
			return fmt.Errorf("raw records out of order: %q %q at %d after %q %q at %d", k.run, k.node, k.at, a.rollAt.run, a.rollAt.node, a.rollAt.at)
		}
		if err := a.roll.queue(&a.im.q, a.rollAt.node); err != nil {
			return err
		}
		a.roll = nil
	}
	if a.roll == nil {
		a.roll, a.rollAt = newRollupRows(), k
	}
	a.roll.add(r)
	return nil
}

func (a *accumulator) day(k groupKey) *dayUsage {
	if a.usage != nil && a.usageAt != k {
		a.usage.queue(&a.im.q)
		a.usage = nil
	}
	if a.usage == nil {
		a.usage, a.usageAt = newDayUsage(k.node), k
	}
	return a.usage
}

// flush queues what is left.
func (a *accumulator) flush() error {
	if a.roll != nil {
		if err := a.roll.queue(&a.im.q, a.rollAt.node); err != nil {
			return err
		}
	}
	if a.usage != nil {
		a.usage.queue(&a.im.q)
	}
	a.roll, a.usage = nil, nil
	return nil
}

// add adds r as ingest added the record when it stored it (apply).
func (a *accumulator) add(kind storage.RawKind, r storage.RawRecord) error {
	switch kind {
	case storage.RawRunWindows:
		w := &trainmeterv1.RunWindow{}
		if err := proto.Unmarshal(r.Value, w); err != nil {
			return err
		}
		if err := a.rollup(groupKey{r.Run, r.Node, runRollKeyOf(w).start}, rollups{runs: []*trainmeterv1.RunWindow{w}}); err != nil {
			return err
		}
		a.day(groupKey{r.Run, r.Node, dayOf(fold.NanosOf(w.GetStart()))}).stored(w)
	case storage.RawNodeWindows:
		rec := &trainmeterv1.Batch{}
		if err := proto.Unmarshal(r.Value, rec); err != nil {
			return err
		}
		if err := a.rollup(groupKey{"", r.Node, dayMinute(rec.GetWindowStart())}, rollups{node: rec}); err != nil {
			return err
		}
		a.day(groupKey{"", r.Node, dayOf(fold.NanosOf(rec.GetWindowStart()))}).nodeRecord(rec)
	case storage.RawNodeLosses:
		rec := &trainmeterv1.Batch{}
		if err := proto.Unmarshal(r.Value, rec); err != nil {
			return err
		}
		return a.rollup(groupKey{"", r.Node, minuteOf(r.Start)}, rollups{start: r.Start, loss: rec.GetNodeLosses()})
	case storage.RawDeletedWindows:
		dw := &storev1.DeletedRunWindow{}
		if err := proto.Unmarshal(r.Value, dw); err != nil {
			return err
		}
		d := fold.Deletion{ID: dw.GetDeletion(), Price: dw.GetGpuPricePerHour(), GPUName: dw.GetGpuName()}
		a.day(groupKey{"", r.Node, dayOf(fold.NanosOf(dw.GetWindow().GetStart()))}).deleted(dw.GetWindow(), d, a.im.pricing, a.im.nodeGPU[r.Node])
	}
	return nil
}

// count notes and tells the rows of a kind copied.
func (im *importer) count(what string, n int64) {
	im.counts = append(im.counts, Count{what, n})
	im.progress(Count{what, n})
}

// records copies every record, and counts them by namespace.
func (im *importer) records(seq iter.Seq2[storage.Record, error]) error {
	byNS := map[string]int64{}
	c := importSQL.records
	n, err := copySeq(im, c, seq, func(r storage.Record) []any {
		byNS[r.NS]++
		return []any{r.NS, []byte(r.Key), r.Value}
	})
	if err != nil {
		return err
	}
	im.progress(Count{c.what, n})
	for _, ns := range slices.Sorted(maps.Keys(byNS)) {
		im.counts = append(im.counts, Count{ns + " record", byNS[ns]})
	}
	return nil
}

// copySeq copies every row of seq (as row makes it) with one COPY,
// streaming: a row is encoded before the next is read. It tells progress
// every progressRows rows; the caller tells the end.
func copySeq[T any](im *importer, c copyInto, seq iter.Seq2[T, error], row func(T) []any) (int64, error) {
	next, stop := iter.Pull2(seq)
	defer stop()
	src := &seqSource[T]{next: next, row: row, progress: func(n int64) { im.progress(Count{c.what, n}) }}
	n, err := im.tx.CopyFrom(im.ctx, pgx.Identifier{c.table}, c.cols, src)
	if err == nil {
		err = src.err
	}
	if err != nil {
		return n, fmt.Errorf("%s: %w", c.what, err)
	}
	return n, nil
}

// seqSource is a pgx.CopyFromSource over a sequence.
type seqSource[T any] struct {
	next     func() (T, error, bool)
	row      func(T) []any
	progress func(int64)
	cur      []any
	n        int64
	err      error
}

func (s *seqSource[T]) Next() bool {
	v, err, ok := s.next()
	if !ok || err != nil {
		s.err = err
		return false
	}
	s.cur = s.row(v)
	if s.n++; s.n%progressRows == 0 {
		s.progress(s.n)
	}
	return true
}

func (s *seqSource[T]) Values() ([]any, error) { return s.cur, nil }
func (s *seqSource[T]) Err() error             { return s.err }
