package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/fold"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Rollups behind ingest (docs/storage.md): a batch's transaction stores
// its raw records and adds to the minute rollups and daily usage only the
// records that start before its node's rolled_ns (late ones). RollUp adds
// the rest a node at a time, from rolled_ns up to a cutoff, and moves
// rolled_ns there: one write per rollup row and usage row each time
// instead of one per batch (at one batch a second, 60 writes of a node's
// minute rows became one to six).
//
// Exactly once: a record is added by whichever of ingest or RollUp sees it
// on its side of rolled_ns, and both read and move rolled_ns holding the
// node's row (ingest locks it for its whole transaction). Every other
// writer of a node's raw windows, rollups or daily usage holds its row
// too: DeleteRun and Reprice lock the rows of the run's nodes before the
// run's (lockRunNodes), so a roll-up reads a node's windows either before
// such a change or after it, never half way.
//
// Ingest waits for the node rows a roll-up holds, so a roll-up holds few
// (rollChunk) for three round trips, and takes only rows no transaction
// holds (SKIP LOCKED: a node in the middle of a batch is rolled up on the
// next pass) unless told to wait for them (Maintain, before a drop).

// rollChunk is the nodes rolled up in one transaction.
const rollChunk = 64

// RollUp adds every node's records that start before until and are not in
// the rollups yet to the minute rollups and daily usage, and moves each
// node's rolled_ns to until. Nodes whose rows other transactions hold are
// passed over, and rolled up on the next call, unless wait.
func (s *Store) RollUp(ctx context.Context, until time.Time, wait bool) error {
	u := until.UnixNano()
	rows, err := s.pool.Query(ctx, `SELECT node FROM nodes WHERE rolled_ns IS NULL OR rolled_ns < $1 ORDER BY node`, u)
	if err != nil {
		return fmt.Errorf("pgstore: roll-up: %w", err)
	}
	nodes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("pgstore: roll-up: %w", err)
	}
	for len(nodes) > 0 {
		chunk := nodes[:min(rollChunk, len(nodes))]
		nodes = nodes[len(chunk):]
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.tx(pgx.TxOptions{}, func(tx pgx.Tx) error { return s.rollNodes(ctx, tx, chunk, u, wait) }); err != nil {
			return fmt.Errorf("pgstore: roll-up: %w", err)
		}
	}
	return nil
}

// rollNodes rolls up the nodes (sorted) in tx.
func (s *Store) rollNodes(ctx context.Context, tx pgx.Tx, nodes []string, until int64, wait bool) error {
	if err := lockRaw(tx); err != nil {
		return err
	}
	g := &groupState{nodes: map[string]*groupNode{}}
	var locked []string
	nodeGPU := map[string]string{}
	var runWins, nodeRecs, losses, dels []rawRecord
	lock := `SELECT node, status FROM nodes WHERE node = ANY($1) AND (rolled_ns IS NULL OR rolled_ns < $2) ORDER BY node FOR UPDATE`
	if !wait {
		lock += ` SKIP LOCKED`
	}
	rows, err := tx.Query(ctx, lock, nodes, until)
	if err != nil {
		return err
	}
	{
		var node string
		var val []byte
		if _, err := pgx.ForEachRow(rows, []any{&node, &val}, func() error {
			ns := &trainmeterv1.NodeStatus{}
			if err := proto.Unmarshal(val, ns); err != nil {
				return fmt.Errorf("node %q: %w", node, err)
			}
			locked = append(locked, node)
			nodeGPU[node] = fold.NodeGPUName(ns)
			g.nodes[node] = newGroupNode(node)
			return nil
		}); err != nil {
			return err
		}
	}
	if len(locked) == 0 {
		return nil
	}
	// The locked nodes' records: a CROSS JOIN LATERAL a node, so each
	// reads its own range by index.
	const from = `FROM nodes n CROSS JOIN LATERAL (SELECT * FROM %s WHERE node = n.node AND start_ns >= COALESCE(n.rolled_ns, -9223372036854775808)
		AND start_ns < $2 %s OFFSET 0) r WHERE n.node = ANY($1)`
	var q pgx.Batch
	read := func(table, val, where string, into *[]rawRecord) {
		q.Queue(`SELECT r.node, r.start_ns, r.`+val+` `+fmt.Sprintf(from, table, where)+` ORDER BY r.node, r.start_ns, r.seq`,
			locked, until).Query(func(rows pgx.Rows) error {
			var rec rawRecord
			_, err := pgx.ForEachRow(rows, []any{&rec.node, &rec.start, &rec.val}, func() error {
				*into = append(*into, rec)
				return nil
			})
			return err
		})
	}
	read("run_windows", "w", "", &runWins)
	read("node_windows", "b", "", &nodeRecs)
	read("node_losses", "b", "", &losses)
	read("deleted_windows", "d", "AND seq >= 0", &dels)
	if err := tx.SendBatch(ctx, &q).Close(); err != nil {
		return err
	}

	// The records as ingest adds them (foldOne), after the rows they add
	// to are read.
	type nodeRollups struct {
		node string
		r    rollups
	}
	var adds []nodeRollups
	runRoll := map[[2]string]map[int64]bool{}
	nodeMin := map[string]map[int64]bool{}
	for _, rec := range runWins {
		w := &trainmeterv1.RunWindow{}
		if err := proto.Unmarshal(rec.val, w); err != nil {
			return fmt.Errorf("node %q: run window at %d: %w", rec.node, rec.start, err)
		}
		addMinute(runRoll, [2]string{rec.node, w.GetRunId()}, dayMinute(w.GetStart()))
		g.nodes[rec.node].usage.stored(w)
		adds = append(adds, nodeRollups{rec.node, rollups{runs: []*trainmeterv1.RunWindow{w}}})
	}
	for _, rec := range nodeRecs {
		b := &trainmeterv1.Batch{}
		if err := proto.Unmarshal(rec.val, b); err != nil {
			return fmt.Errorf("node %q: node record at %d: %w", rec.node, rec.start, err)
		}
		addMinute(nodeMin, rec.node, minuteOf(rec.start))
		g.nodes[rec.node].usage.nodeRecord(b)
		adds = append(adds, nodeRollups{rec.node, rollups{node: b, start: rec.start}})
	}
	for _, rec := range losses {
		b := &trainmeterv1.Batch{}
		if err := proto.Unmarshal(rec.val, b); err != nil {
			return fmt.Errorf("node %q: loss records at %d: %w", rec.node, rec.start, err)
		}
		addMinute(nodeMin, rec.node, minuteOf(rec.start))
		adds = append(adds, nodeRollups{rec.node, rollups{loss: b.GetNodeLosses(), start: rec.start}})
	}
	pricing := s.reportPricing()
	for _, rec := range dels {
		dw := &storev1.DeletedRunWindow{}
		if err := proto.Unmarshal(rec.val, dw); err != nil {
			return fmt.Errorf("node %q: deleted window at %d: %w", rec.node, rec.start, err)
		}
		d := fold.Deletion{ID: dw.GetDeletion(), Price: dw.GetGpuPricePerHour(), GPUName: dw.GetGpuName()}
		g.nodes[rec.node].usage.deleted(dw.GetWindow(), d, pricing, nodeGPU[rec.node])
	}
	var b pgx.Batch
	if queueRollupReads(&b, g, runRoll, nodeMin, func(string, string, int64) bool { return false }) {
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
	}
	for _, a := range adds {
		g.nodes[a.node].addRollups(a.r)
	}
	var out pgx.Batch
	if err := s.queueGroupRollups(&out, g, locked); err != nil {
		return err
	}
	queueGroupUsage(&out, g, locked)
	out.Queue(`UPDATE nodes SET rolled_ns = $2 WHERE node = ANY($1)`, locked, until)
	return tx.SendBatch(ctx, &out).Close()
}

// rawRecord is a raw table's row as the roll-up reads it.
type rawRecord struct {
	node  string
	start int64
	val   []byte
}

// Roller rolls up every Interval (0: rollEvery) the records that started
// more than Interval ago: a lifecycle component the fleet's leader runs.
type Roller struct {
	Store    *Store
	Interval time.Duration
	loop     every
}

// rollEvery is how often the leader rolls up by default: the SQL views'
// daily usage trails ingest by up to twice this.
const rollEvery = 10 * time.Second

// Start starts the loop; the first roll-up is an Interval away.
func (r *Roller) Start(context.Context) error {
	interval := cmp.Or(r.Interval, rollEvery)
	r.loop.start(r.Store, interval, "roll-up", func(ctx context.Context) error {
		return r.Store.RollUp(ctx, r.Store.clk.Now().Add(-interval), false)
	})
	return nil
}

// Shutdown stops the loop, waiting for a roll-up under way.
func (r *Roller) Shutdown(ctx context.Context) error { return r.loop.shutdown(ctx) }
