// Package pgstore is the collector's storage.Store on PostgreSQL: any
// number of collectors share one database (docs/storage.md,
// "PostgreSQL").
//
// A batch is applied in one transaction, which concurrent batches share
// (group commit, commit.go), each under a savepoint of its own: its key (node, boot, seq) is
// inserted into applied_batches (the primary key makes a second apply a
// conflict: Duplicate), the node's status row and its runs' rows are locked
// (SELECT … FOR UPDATE, runs in id order, so two transactions never wait
// for each other in a cycle), the decisions and the fold (package fold)
// read the locked aggregates, and the raw rows and the new aggregates are
// written; ApplyBatchResult returns after the commit. A batch of a group
// reads what the group's earlier batches wrote (one transaction).
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/pkg/clock"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Store is a storage.Store on PostgreSQL, safe for concurrent use, by
// several processes too.
type Store struct {
	pool   *pgxpool.Pool
	log    *slog.Logger
	clk    clock.Clock
	bands  aggregate.EnergyBands
	carbon aggregate.CarbonBooker
	limits fold.Limits
	pricer atomic.Pointer[pricerBox]
	// rawTTL, dedupTTL: Options.RawRetention, DedupRetention.
	rawTTL, dedupTTL time.Duration
	days             sync.Map // int64 day (Unix ns) → true: its partitions made (layout.go)

	// Group commit (commit.go).
	window                                        time.Duration // Options.CommitWindow
	gmu                                           sync.Mutex
	queue                                         []*applyReq   // batches no group has taken, under gmu
	gate                                          chan struct{} // closed when the open commit window ends, under gmu
	slots                                         chan struct{} // one per group being applied
	commits, committedBatches, retries, fallbacks atomic.Uint64
	rcache                                        rollCaches    // rollcache.go
	scache                                        stateCaches   // rollcache.go
	rollupRereads                                 atomic.Uint64 // groups that read cached rollup keys again
}

var _ storage.Store = (*Store)(nil)

type pricerBox struct{ p aggregate.Pricer }

// Options configures Open; see store.Options for the BadgerDB store's
// equivalents.
type Options struct {
	Logger      *slog.Logger
	Clock       clock.Clock // the wall clock if nil
	EnergyBands aggregate.EnergyBands
	Carbon      aggregate.CarbonBooker
	// Limits bounds the runs one node may start (limits.go); zero: none.
	Limits fold.Limits
	// RawRetention, when positive, is how long raw records (run windows
	// and events, GPU and host windows, raw samples, node loss records) are
	// kept: Maintain drops the day partitions wholly older. Run aggregates,
	// per-minute rollups and deleted runs' windows are kept. Zero keeps all.
	RawRetention time.Duration
	// DedupRetention is how long the keys of applied batches are kept at
	// least (with a raw retention: the oldest batch ingest accepts, and a
	// day).
	DedupRetention time.Duration
	// CommitWindow is how long a batch waits for others to share its
	// transaction and commit (commit.go; acks up to this much later, one
	// commit and WAL flush for many batches); 0: only the batches already
	// waiting share it. At most 1s.
	CommitWindow time.Duration
	// PasswordFile, when set, holds the password (one line), which the
	// URL then leaves out.
	PasswordFile string
}

// Open connects to the database at dbURL (postgres://…; pgx reads its
// parameters: sslmode and the other TLS settings, passfile), applies the migrations it lacks and
// returns the store.
func Open(ctx context.Context, dbURL string, o Options) (*Store, error) {
	if err := o.Limits.Validate(); err != nil {
		return nil, err
	}
	if o.CommitWindow < 0 || o.CommitWindow > time.Second {
		return nil, fmt.Errorf("pgstore: commit window must be between 0 and 1s, got %v", o.CommitWindow)
	}
	if o.RawRetention < 0 || o.DedupRetention < 0 {
		return nil, fmt.Errorf("pgstore: retention must be >= 0 (raw %v, dedup %v)", o.RawRetention, o.DedupRetention)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %s: %w", Redact(dbURL), err)
	}
	if o.PasswordFile != "" {
		pw, err := os.ReadFile(o.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("pgstore: password file: %w", err)
		}
		cfg.ConnConfig.Password = strings.TrimRight(string(pw), "\r\n")
	}
	cfg.AfterConnect = registerBytesArray
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %s: %w", Redact(dbURL), err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	s := &Store{pool: pool, log: o.Logger, clk: o.Clock, bands: o.EnergyBands, carbon: o.Carbon, limits: o.Limits,
		rawTTL: o.RawRetention, dedupTTL: o.DedupRetention, window: o.CommitWindow, slots: make(chan struct{}, maxGroups)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.clk == nil {
		s.clk = clock.Real{}
	}
	return s, nil
}

// Redact is a store URL with its password, if it has one, replaced by
// "xxxxx": for logs and errors.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a store URL that does not parse)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// Close closes the connections.
func (s *Store) Close() error {
	if err := s.writeHeldStatuses(); err != nil {
		s.log.Warn("pgstore: writing the node statuses held on close", "err", err)
	}
	s.pool.Close()
	return nil
}

// closeWriteTimeout bounds writeHeldStatuses: a collector stopping with its
// database gone stops, leaving the rows up to statusEvery behind.
const closeWriteTimeout = 5 * time.Second

// writeHeldStatuses writes the node statuses this process holds ahead of
// their rows (statusEvery), where no one has written the row since.
func (s *Store) writeHeldStatuses() error {
	var nodes, xs []string
	var vals [][]byte
	s.rcache.mu.Lock()
	for n, e := range s.rcache.m {
		if e.status == nil || !e.saved.behind(e.status) {
			continue
		}
		val, err := proto.Marshal(e.status)
		if err != nil {
			s.rcache.mu.Unlock()
			return err
		}
		nodes, xs, vals = append(nodes, n), append(xs, e.nodeX), append(vals, val)
	}
	s.rcache.mu.Unlock()
	if len(nodes) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.clk.After(closeWriteTimeout):
			cancel()
		case <-ctx.Done():
		}
	}()
	_, err := s.pool.Exec(ctx, `UPDATE nodes SET status = u.status FROM unnest($1::text[], $2::bytea[], $3::text[]) AS u(node, status, x)
		WHERE nodes.node = u.node AND nodes.xmin::text = u.x`, nodes, bytesArray(vals), xs)
	return err
}

// SetPricer sets the prices windows are booked at from now on (store.Store's).
func (s *Store) SetPricer(p aggregate.Pricer) { s.pricer.Store(&pricerBox{p}) }

func (s *Store) pricerNow() aggregate.Pricer {
	if b := s.pricer.Load(); b != nil {
		return b.p
	}
	return nil
}

// maxRetries bounds the retries of a transaction that failed on a deadlock
// or a serialization failure (which PostgreSQL resolves by failing one).
const maxRetries = 10

// tx runs fn in a transaction and commits it, again on a retryable failure.
func (s *Store) tx(opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	ctx := context.Background()
	for attempt := 0; ; attempt++ {
		err := pgx.BeginTxFunc(ctx, s.pool, opts, fn)
		var pe *pgconn.PgError
		if attempt < maxRetries && errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001") {
			continue
		}
		return err
	}
}

var readOnly = pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}

// errDuplicate rolls back the transaction of a batch applied before.
var errDuplicate = errors.New("duplicate")

// batchDays are the days the batch's raw rows start in.
func batchDays(b *trainmeterv1.Batch) map[int64]bool {
	ds := map[int64]bool{dayOf(fold.NanosOf(b.GetWindowStart())): true}
	for _, w := range b.GetRunWindows() {
		ds[dayOf(fold.NanosOf(w.GetStart()))] = true
	}
	for _, e := range b.GetRunEvents() {
		ds[dayOf(fold.NanosOf(aggregate.EventTime(e)))] = true
	}
	return ds
}

func (s *Store) apply(tx pgx.Tx, sender storage.Sender, b *trainmeterv1.Batch, a *storage.Applied) error {
	ctx := context.Background()
	node, boot, seq := sender.Node, sender.Boot, int64(b.GetSeq())
	now := s.clk.Now()
	// The batch's savepoint (commit.go), released in its last pipeline.
	var first pgx.Batch
	first.Queue(`SAVEPOINT batch`)
	first.Queue(`INSERT INTO applied_batches (node, boot, seq, start_ns) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`,
		node, boot, seq, fold.NanosOf(b.GetWindowStart()))
	br := tx.SendBatch(ctx, &first)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errDuplicate
	}
	ns, bucket, rolled, err := lockNode(tx, node)
	if err != nil {
		return err
	}
	runs := fold.BatchRuns(b)
	// The group holds the rows (commit.go), and removes those no batch
	// made once all are applied.
	v, err := lockRuns(tx, runs, false)
	if err != nil {
		return err
	}
	v.now = now
	if v.Live, err = s.newLive(tx, v, node, bucket, b); err != nil {
		return err
	}
	b, gone, err := s.dropDeleted(tx, b, runs)
	if err != nil {
		return err
	}
	b = fold.ClearLocked(b)
	runs = fold.BatchRuns(b)
	nb, refused, dropped, err := fold.Admit(v, s.log, len(ns.GetGpus()), node, b, runs)
	if err != nil {
		return err
	}
	if nb != b {
		b, runs, a.Refused, a.Dropped, a.Batch = nb, fold.BatchRuns(nb), refused, dropped, nb
	}
	aggs := make(map[string]*aggregate.State, len(runs))
	for _, r := range runs {
		aggs[r], _ = v.Get(r)
	}
	runLosses, err := notHeld(tx, node, boot, b.GetLosses())
	if err != nil {
		return err
	}
	pricer := s.pricerNow()
	nodeGPU := fold.NodeGPUName(ns)
	stamps := fold.Fold(aggs, node, nodeGPU, b, fold.Booking{Bands: s.bands, Carbon: s.carbon, Pricer: pricer}, runLosses, now)
	v.NoteLive(node, runs, func(r string) *aggregate.State { return aggs[r] })

	var q pgx.Batch
	roll := rollups{start: fold.NanosOf(b.GetWindowStart())}
	usage := newDayUsage(node)
	for i, w := range b.GetRunWindows() {
		val, err := proto.Marshal(w)
		var stamp *trainmeterv1.RunWindow
		if err == nil && pricer != nil {
			stamp = stamps[i]
			val, err = fold.AppendStamp(val, stamp)
		}
		if err != nil {
			return err
		}
		if fold.NanosOf(w.GetStart()) < rolled {
			stored := w
			if pricer != nil {
				stored = &trainmeterv1.RunWindow{}
				if err := proto.Unmarshal(val, stored); err != nil {
					return err
				}
			}
			roll.runs = append(roll.runs, stored)
			usage.stored(stored)
		}
		q.Queue(`INSERT INTO run_windows (run_id, node, start_ns, seq, i, w) VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (run_id, node, start_ns, seq, i) DO UPDATE SET w = EXCLUDED.w`,
			w.GetRunId(), node, fold.NanosOf(w.GetStart()), seq, i, val)
	}
	for i, e := range b.GetRunEvents() {
		val, err := proto.Marshal(e)
		if err != nil {
			return err
		}
		q.Queue(`INSERT INTO run_events (run_id, node, t_ns, seq, i, e) VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (run_id, node, t_ns, seq, i) DO UPDATE SET e = EXCLUDED.e`,
			aggregate.EventRunID(e), node, fold.NanosOf(aggregate.EventTime(e)), seq, i, val)
	}
	start := fold.NanosOf(b.GetWindowStart())
	perBatch := func(table string, m proto.Message, stamp proto.Message) ([]byte, error) {
		val, err := proto.Marshal(m)
		if err == nil && stamp != nil {
			val, err = fold.AppendStamp(val, stamp)
		}
		q.Queue(`INSERT INTO `+table+` (node, start_ns, seq, b) VALUES ($1, $2, $3, $4)
			ON CONFLICT (node, start_ns, seq) DO UPDATE SET b = EXCLUDED.b`, node, start, seq, val)
		return val, err
	}
	if fold.HasNodeRecord(b) {
		var stamp proto.Message
		if pricer != nil {
			stamp = fold.IdleStamp(pricer, node, nodeGPU, b)
		}
		val, err := perBatch("node_windows", fold.NodeRecord(b, boot), stamp)
		if err != nil {
			return err
		}
		if start < rolled {
			roll.node = &trainmeterv1.Batch{}
			if err := proto.Unmarshal(val, roll.node); err != nil {
				return err
			}
			usage.nodeRecord(roll.node)
		}
	}
	if rs := fold.SamplesRecord(b); rs != nil {
		if _, err := perBatch("raw_samples", rs, nil); err != nil {
			return err
		}
	}
	nodeLosses, err := notHeld(tx, node, boot, b.GetNodeLosses())
	if err != nil {
		return err
	}
	if len(nodeLosses) > 0 {
		if _, err := perBatch("node_losses", &trainmeterv1.Batch{WindowStart: b.GetWindowStart(), NodeLosses: nodeLosses}, nil); err != nil {
			return err
		}
		if start < rolled {
			roll.loss = nodeLosses
		}
	}
	if !roll.empty() {
		if err := queueRollups(tx, &q, node, roll); err != nil {
			return err
		}
	}
	for _, g := range gone {
		val, err := fold.DeletedRecord(g.W, g.D)
		if err != nil {
			return err
		}
		if fold.NanosOf(g.W.GetStart()) < rolled {
			usage.deleted(g.W, g.D, s.reportPricing(), nodeGPU)
		}
		q.Queue(`INSERT INTO deleted_windows (node, start_ns, seq, i, deletion, d) VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (node, start_ns, seq, i, deletion) DO UPDATE SET d = EXCLUDED.d`,
			node, fold.NanosOf(g.W.GetStart()), seq, g.I, int64(g.D.ID), val)
	}
	reportPricing := s.reportPricing()
	for _, r := range v.order {
		if err := queueRun(&q, v.state[r], v.state[r].Report(reportPricing)); err != nil {
			return err
		}
	}
	if len(v.order) > 0 {
		q.Queue(`UPDATE runs SET data_at_ns = $2 WHERE run_id = ANY($1)`, v.order, now.UnixNano())
	}
	usage.queue(&q)
	ns.BootId, ns.LastSeq, ns.LastSeen = boot, b.GetSeq(), timestamppb.New(now)
	if err := queueNode(&q, ns); err != nil {
		return err
	}
	queueLive(&q, v.Live)
	q.Queue(`RELEASE SAVEPOINT batch`)
	return tx.SendBatch(ctx, &q).Close()
}

func queueNode(q *pgx.Batch, ns *trainmeterv1.NodeStatus) error {
	val, err := proto.Marshal(ns)
	if err != nil {
		return err
	}
	q.Queue(`INSERT INTO nodes (node, status) VALUES ($1, $2) ON CONFLICT (node) DO UPDATE SET status = EXCLUDED.status`, ns.GetNode(), val)
	return nil
}

// runView is the runs a transaction holds locked, with the node's live
// runs and limits (limits.go), as fold.Admit reads them.
type runView struct {
	state map[string]*aggregate.State // nil: no run yet
	write map[string]bool
	order []string // runs to write, in id order of first Get
	now   time.Time
	*fold.Live
}

func (v *runView) Peek(run string) (*aggregate.State, error) { return v.state[run], nil }
func (v *runView) Get(run string) (*aggregate.State, error) {
	st := v.state[run]
	if st == nil {
		st = aggregate.New(run)
		v.state[run] = st
	}
	if !v.write[run] {
		v.write[run] = true
		v.order = append(v.order, run)
	}
	return st, nil
}
func (v *runView) Now() time.Time { return v.now }

// lockRuns locks the rows of runs (sorted), making a row for each run that
// has none when create is set (state NULL, deleted before the commit unless
// the run is written), and returns their aggregates.
func lockRuns(tx pgx.Tx, runs []string, create bool) (*runView, error) {
	ctx := context.Background()
	v := &runView{state: map[string]*aggregate.State{}, write: map[string]bool{}}
	if len(runs) == 0 {
		return v, nil
	}
	if create {
		if _, err := tx.Exec(ctx, `INSERT INTO runs (run_id) SELECT unnest($1::text[]) ORDER BY 1 ON CONFLICT DO NOTHING`, runs); err != nil {
			return nil, err
		}
	}
	rows, err := tx.Query(ctx, `SELECT run_id, state FROM runs WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE`, runs)
	if err != nil {
		return nil, err
	}
	var id string
	var val []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &val}, func() error {
		if val == nil {
			return nil
		}
		st, err := aggregate.Unmarshal(val)
		if err != nil {
			return fmt.Errorf("run %q: %w", id, err)
		}
		v.state[id] = st
		return nil
	})
	return v, err
}

// dropDeleted drops the records of runs deleted while live from b
// (fold.DropDeleted), their tombstones read with the runs locked, and
// removes the tombstones of ids started afresh.
func (s *Store) dropDeleted(tx pgx.Tx, b *trainmeterv1.Batch, runs []string) (*trainmeterv1.Batch, []fold.DeletedWindow, error) {
	if len(runs) == 0 {
		return b, nil, nil
	}
	ctx := context.Background()
	keys := make([][]byte, len(runs))
	for i, r := range runs {
		keys[i] = []byte(r)
	}
	rows, err := tx.Query(ctx, `SELECT k, v FROM records WHERE ns = $1 AND k = ANY($2)`, fold.DeletedNS, keys)
	if err != nil {
		return nil, nil, err
	}
	dels := map[string]fold.Deletion{}
	var k, val []byte
	if _, err := pgx.ForEachRow(rows, []any{&k, &val}, func() error {
		if d, ok := fold.ParseTombstone(string(val)); ok {
			dels[string(k)] = d
		}
		return nil
	}); err != nil || len(dels) == 0 {
		return b, nil, err
	}
	nb, gone, restarted := fold.DropDeleted(b, runs, func(id string) (fold.Deletion, bool) {
		d, ok := dels[id]
		return d, ok
	})
	if len(restarted) > 0 {
		gone := make([][]byte, len(restarted))
		for i, r := range restarted {
			gone[i] = []byte(r)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM records WHERE ns = $1 AND k = ANY($2)`, fold.DeletedNS, gone); err != nil {
			return nil, nil, err
		}
	}
	return nb, gone, nil
}

// notHeld are the loss records of ls that count: all but those of one
// batch (seq set) that was applied after all.
func notHeld(tx pgx.Tx, node, boot string, ls []*trainmeterv1.DataLoss) ([]*trainmeterv1.DataLoss, error) {
	var out []*trainmeterv1.DataLoss
	for _, l := range ls {
		if l.GetSeq() != 0 {
			var held bool
			err := tx.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM applied_batches WHERE node = $1 AND boot = $2 AND seq = $3)`,
				node, boot, int64(l.GetSeq())).Scan(&held)
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

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// getProto reads one bytea into m, or gives ErrNotFound.
func getProto(q querier, m proto.Message, sql string, args ...any) error {
	var val []byte
	err := q.QueryRow(context.Background(), sql, args...).Scan(&val)
	if errors.Is(err, pgx.ErrNoRows) {
		return storage.ErrNotFound
	}
	if err != nil {
		return err
	}
	return proto.Unmarshal(val, m)
}

// PutHello implements storage.Ingester.
func (s *Store) PutHello(h *trainmeterv1.Hello) error {
	return s.tx(pgx.TxOptions{}, func(tx pgx.Tx) error {
		ns := &trainmeterv1.NodeStatus{Node: h.GetNode()}
		if err := getProto(tx, ns, `SELECT status FROM nodes WHERE node = $1 FOR UPDATE`, h.GetNode()); err != nil && !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		if ns.GetBootId() != h.GetBootId() {
			ns.LastSeq = 0
		}
		ns.BootId, ns.Gpus, ns.HostEnergyStatus, ns.LastSeen = h.GetBootId(), h.GetGpus(), h.GetHostEnergyStatus(), timestamppb.New(s.clk.Now())
		var q pgx.Batch
		if err := queueNode(&q, ns); err != nil {
			return err
		}
		return tx.SendBatch(context.Background(), &q).Close()
	})
}

// GetRun implements storage.Runs.
func (s *Store) GetRun(id string) (*aggregate.State, error) {
	runs, err := s.runs(s.pool, `SELECT run_id, state FROM runs WHERE run_id = $1 AND state IS NOT NULL`, id)
	if err != nil {
		return nil, err
	}
	if len(runs) == 0 {
		return nil, storage.ErrNotFound
	}
	return runs[0], nil
}

// ListRuns implements storage.Runs.
func (s *Store) ListRuns(ids []string) ([]*aggregate.State, error) {
	if len(ids) == 0 {
		return s.runs(s.pool, `SELECT run_id, state FROM runs WHERE state IS NOT NULL ORDER BY run_id`)
	}
	got, err := s.runs(s.pool, `SELECT run_id, state FROM runs WHERE run_id = ANY($1) AND state IS NOT NULL`, ids)
	if err != nil {
		return nil, err
	}
	by := make(map[string]*aggregate.State, len(got))
	for _, st := range got {
		by[st.RunId] = st
	}
	out := make([]*aggregate.State, 0, len(ids))
	var missing []string
	for _, id := range ids {
		if st := by[id]; st != nil {
			out = append(out, st)
		} else {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return nil, &storage.NotFoundError{IDs: missing}
	}
	return out, nil
}

// RunsAfter implements storage.Runs.
func (s *Store) RunsAfter(after string, limit int) ([]*aggregate.State, error) {
	if limit <= 0 {
		return nil, nil
	}
	return s.runs(s.pool, `SELECT run_id, state FROM runs WHERE run_id > $1 AND state IS NOT NULL ORDER BY run_id LIMIT $2`, after, limit)
}

func (s *Store) runs(q querier, sql string, args ...any) ([]*aggregate.State, error) {
	rows, err := q.Query(context.Background(), sql, args...)
	if err != nil {
		return nil, err
	}
	var out []*aggregate.State
	var id string
	var val []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &val}, func() error {
		st, err := aggregate.Unmarshal(val)
		if err != nil {
			return fmt.Errorf("run %q: %w", id, err)
		}
		out = append(out, st)
		return nil
	})
	return out, err
}

// RunsWithDataSince returns the ids of at most limit runs that got data
// (a window, an event, a loss record) at or after since, by the clock of
// the collector that applied it, the most recent first: what the fleet's
// leader exports OTel run series of (package telemetry).
func (s *Store) RunsWithDataSince(since time.Time, limit int) ([]string, error) {
	rows, _ := s.pool.Query(context.Background(), `SELECT run_id FROM runs WHERE data_at_ns >= $1 AND state IS NOT NULL
		ORDER BY data_at_ns DESC, run_id LIMIT $2`, since.UnixNano(), limit)
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Nodes implements storage.Runs.
func (s *Store) Nodes() ([]*trainmeterv1.NodeStatus, error) {
	return scanProtos[trainmeterv1.NodeStatus](s.pool, `SELECT status FROM nodes ORDER BY node`)
}

// scanProtos decodes the one bytea column of every row.
func scanProtos[T any, M interface {
	*T
	proto.Message
}](q querier, sql string, args ...any) ([]M, error) {
	rows, err := q.Query(context.Background(), sql, args...)
	if err != nil {
		return nil, err
	}
	var out []M
	var val []byte
	_, err = pgx.ForEachRow(rows, []any{&val}, func() error {
		m := M(new(T))
		out = append(out, m)
		return proto.Unmarshal(val, m)
	})
	return out, err
}

// RunTimeline implements storage.Windows.
func (s *Store) RunTimeline(runID string) (ws []storage.NodeWindow, es []storage.NodeEvent, err error) {
	err = s.tx(readOnly, func(tx pgx.Tx) error {
		ws, es = nil, nil
		if err := lockRaw(tx); err != nil {
			return err
		}
		from, err := rawFrom(tx)
		if err != nil {
			return err
		}
		// The minute rollups before the horizon, the raw windows from it.
		err = forRows(tx, `SELECT node, w FROM (
				SELECT node, start_ns, 0 AS raw, 0::bigint AS seq, 0 AS i, lock, w FROM run_rollups WHERE run_id = $1 AND start_ns < $2
				UNION ALL SELECT node, start_ns, 1, seq, i, '', w FROM run_windows WHERE run_id = $1 AND start_ns >= $2) t
			ORDER BY node, start_ns, raw, seq, i, lock`, []any{runID, from}, func(node string, v []byte) error {
			w := &trainmeterv1.RunWindow{}
			ws = append(ws, storage.NodeWindow{Node: node, Window: w})
			return proto.Unmarshal(v, w)
		})
		if err != nil {
			return err
		}
		return forRows(tx, `SELECT node, e FROM run_events WHERE run_id = $1 ORDER BY node, t_ns, seq, i`, []any{runID}, func(node string, v []byte) error {
			e := &trainmeterv1.RunEvent{}
			es = append(es, storage.NodeEvent{Node: node, Event: e})
			return proto.Unmarshal(v, e)
		})
	})
	return ws, es, err
}

// forRows calls fn with the (text, bytea) of every row.
func forRows(q querier, sql string, args []any, fn func(k string, v []byte) error) error {
	rows, err := q.Query(context.Background(), sql, args...)
	if err != nil {
		return err
	}
	var k string
	var v []byte
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error { return fn(k, v) })
	return err
}

// NodeGPUWindows implements storage.Windows.
func (s *Store) NodeGPUWindows(node string, from, to time.Time) ([]*trainmeterv1.Batch, error) {
	return scanProtos[trainmeterv1.Batch](s.pool, `SELECT b FROM node_windows WHERE node = $1 AND start_ns BETWEEN $2 AND $3 ORDER BY start_ns, seq`,
		node, from.UnixNano(), to.UnixNano())
}

// UsageScan implements storage.Windows, from one snapshot (REPEATABLE READ).
func (s *Store) UsageScan(since, until time.Time, gpu func(node string, b *trainmeterv1.Batch) error,
	run func(runID, node string, w *trainmeterv1.RunWindow) error, deleted func(node string, d *storev1.DeletedRunWindow) error) error {
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	if !since.IsZero() {
		lo = since.UnixNano()
	}
	if !until.IsZero() {
		hi = until.UnixNano()
	}
	in := func(ts *timestamppb.Timestamp) bool {
		t := fold.NanosOf(ts)
		return t >= lo && t < hi
	}
	return s.tx(readOnly, func(tx pgx.Tx) error {
		if err := lockRaw(tx); err != nil {
			return err
		}
		from, err := rawFrom(tx)
		if err != nil {
			return err
		}
		// Raw records from the horizon on, rollups before it.
		span := []any{max(lo, from), hi}
		old := []any{lo, min(hi, from)}
		gpuRow := func(node string, v []byte) error {
			b := &trainmeterv1.Batch{}
			if err := proto.Unmarshal(v, b); err != nil {
				return err
			}
			if len(b.GetNodeLosses()) > 0 {
				if b = fold.LossesIn(b, in); b == nil {
					return nil
				}
			}
			return gpu(node, b)
		}
		if err := forRows(tx, `SELECT node, b FROM node_rollups WHERE start_ns >= $1 AND start_ns < $2 AND lock <> '\xff' ORDER BY node, start_ns, lock`, old, gpuRow); err != nil {
			return err
		}
		if err := forRows(tx, `SELECT node, b FROM node_windows WHERE start_ns >= $1 AND start_ns < $2 ORDER BY node, start_ns, seq`, span, gpuRow); err != nil {
			return err
		}
		// Loss records by their own time (fold.LossesIn), kept by their
		// batch's: those of batches before the horizon from the rollups.
		if err := forRows(tx, `SELECT node, b FROM node_rollups WHERE start_ns < $1 AND lock = '\xff' ORDER BY node, start_ns`, []any{from}, gpuRow); err != nil {
			return err
		}
		if err := forRows(tx, `SELECT node, b FROM node_losses WHERE start_ns >= $1 ORDER BY node, start_ns, seq`, []any{from}, gpuRow); err != nil {
			return err
		}
		runRow := func(sql string, args []any) error {
			rows, err := tx.Query(context.Background(), sql, args...)
			if err != nil {
				return err
			}
			var id, node string
			var v []byte
			_, err = pgx.ForEachRow(rows, []any{&id, &node, &v}, func() error {
				w := &trainmeterv1.RunWindow{}
				if err := proto.Unmarshal(v, w); err != nil {
					return err
				}
				return run(id, node, w)
			})
			return err
		}
		if err := runRow(`SELECT run_id, node, w FROM run_rollups WHERE start_ns >= $1 AND start_ns < $2 ORDER BY run_id, node, start_ns, lock`, old); err != nil {
			return err
		}
		if err := runRow(`SELECT run_id, node, w FROM run_windows WHERE start_ns >= $1 AND start_ns < $2
			ORDER BY run_id, node, start_ns, seq, i`, span); err != nil {
			return err
		}
		return forRows(tx, `SELECT node, d FROM deleted_windows WHERE start_ns >= $1 AND start_ns < $2 ORDER BY node, start_ns, seq, i, deletion`, []any{lo, hi}, func(node string, v []byte) error {
			d := &storev1.DeletedRunWindow{}
			if err := proto.Unmarshal(v, d); err != nil {
				return err
			}
			return deleted(node, d)
		})
	})
}
