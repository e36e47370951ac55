package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A group applied as a group (docs/storage.md, "One transaction, shared"):
// a fixed number of round trips whatever the group's size.
//
//  1. One pipeline of reads and locks: the keys of the loss records' batches
//     already applied; every batch key inserted into applied_batches at once
//     (RETURNING the new ones: the others are duplicates); the node rows made
//     and locked, then the run rows (the lock order of commit.go); the
//     deleted runs' tombstones; with a bound on live runs, the nodes' live
//     run counts; the minute rollup rows the batches can add to.
//  2. In Go, every new batch in group order through the same rules as one
//     batch alone (package fold) over state shared by the group: each run's
//     aggregate decoded once, each node's status, bucket and live runs (one
//     fold.Live, as the BadgerDB store has it), tombstones, rollups, daily
//     usage. A batch sees what the group's earlier batches did, as it would
//     in the transaction of the per-batch path.
//  3. One pipeline of writes: each raw table's rows in one multi-row insert,
//     each run row, node row, rollup row and usage row written once.
//
// Anything that fails (a statement, a stored value that does not decode, a
// batch that fold refuses as a whole) fails the attempt, and commitGroup
// applies the group again through the per-batch path (apply, a savepoint
// each), which gives each batch its own outcome.

// batchKey is a batch's key but for its window start.
type batchKey struct {
	node, boot string
	seq        int64
}

// groupNode is a node's share of a group: its locked row, as fold and
// the writes need it.
type groupNode struct {
	ns      *trainmeterv1.NodeStatus
	saved   savedStatus // what of ns the node's row holds
	bucket  fold.Bucket
	rolled  int64 // rolledOf the node's rolled_ns: records before it add to the rollups here
	count   int   // live runs (live_runs rows) before the group, when limits bound them
	written bool  // a batch of the group applied
	usage   *dayUsage
	rr      *rollupRows // the rollup rows the group adds to, as written
	// The rollup rows read, which the group's additions start from.
	haveRuns  map[runRollKey]*trainmeterv1.RunWindow
	haveNodes map[nodeRollKey]*trainmeterv1.Batch
}

// newGroupNode is a node's share of a group before its row is read: no
// records rolled up (rolled_ns NULL), no rollup rows read.
func newGroupNode(node string) *groupNode {
	return &groupNode{ns: &trainmeterv1.NodeStatus{Node: node}, rolled: math.MinInt64, haveRuns: map[runRollKey]*trainmeterv1.RunWindow{},
		haveNodes: map[nodeRollKey]*trainmeterv1.Batch{}, rr: newRollupRows(), usage: newDayUsage(node)}
}

// addMinute notes minute m of the rollup rows under k (a node, or a node
// and run), as queueRollupReads takes them.
func addMinute[K comparable](set map[K]map[int64]bool, k K, m int64) {
	if set[k] == nil {
		set[k] = map[int64]bool{}
	}
	set[k][m] = true
}

// groupState is what a group's batches share in Go, and fold.View and
// fold.LiveBase over it.
type groupState struct {
	now      time.Time
	nodes    map[string]*groupNode
	state    map[string]*aggregate.State // the locked runs' aggregates; nil: none yet
	write    map[string]bool
	order    []string        // runs to write, in order of first Get
	noted    map[string]bool // runs a batch of the group brought an event or loss record
	baseLive map[fold.LiveKey]bool
	*fold.Live
}

func (g *groupState) Peek(run string) (*aggregate.State, error) { return g.state[run], nil }
func (g *groupState) Get(run string) (*aggregate.State, error) {
	st := g.state[run]
	if st == nil {
		st = aggregate.New(run)
		g.state[run] = st
	}
	if !g.write[run] {
		g.write[run] = true
		g.order = append(g.order, run)
	}
	return st, nil
}
func (g *groupState) Now() time.Time { return g.now }

// groupBase is the committed liveness the group starts from.
type groupBase struct{ g *groupState }

func (b groupBase) IsLive(node, run string) bool {
	return b.g.baseLive[fold.LiveKey{Node: node, Run: run}]
}
func (b groupBase) LiveRuns(node string) int {
	if n := b.g.nodes[node]; n != nil {
		return n.count
	}
	return 0
}
func (b groupBase) Bucket(node string) fold.Bucket {
	if n := b.g.nodes[node]; n != nil {
		return n.bucket
	}
	return fold.Bucket{}
}

// rawRows are one raw table's rows of a group, as columns.
type rawRows struct {
	node   []string
	start  []int64
	seq    []int64
	val    [][]byte
	run    []string // run_windows, run_events
	i      []int32  // run_windows, run_events, deleted_windows
	delID  []int64  // deleted_windows
	insert string
}

func (r *rawRows) queue(q *pgx.Batch) {
	if len(r.node) == 0 {
		return
	}
	switch {
	case r.delID != nil:
		q.Queue(r.insert, r.node, r.start, r.seq, r.i, r.delID, bytesArray(r.val))
	case r.run != nil:
		q.Queue(r.insert, r.run, r.node, r.start, r.seq, r.i, bytesArray(r.val))
	default:
		q.Queue(r.insert, r.node, r.start, r.seq, bytesArray(r.val))
	}
}

func perBatchRows(table string) *rawRows {
	return &rawRows{insert: `INSERT INTO ` + table + ` (node, start_ns, seq, b)
		SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::bytea[])`}
}

// applyGroupAsOne applies the group in tx as described above; an error
// fails the whole attempt. fresh receives the rollup rows and aggregates to cache
// (rollcache.go) once the transaction commits.
func (s *Store) applyGroupAsOne(tx pgx.Tx, group []*applyReq, fresh *groupCache) error {
	ctx := context.Background()
	g := &groupState{now: s.clk.Now(), nodes: map[string]*groupNode{}, state: map[string]*aggregate.State{},
		write: map[string]bool{}, baseLive: map[fold.LiveKey]bool{}, noted: map[string]bool{}}
	g.Live = fold.NewLive(groupBase{g}, s.limits, g.now)

	var nodes, runs []string
	var kNode, kBoot []string
	var kSeq, kStart []int64
	var hNode, hBoot []string
	var hSeq []int64
	starts := map[string]bool{} // nodes whose batches start runs
	for _, r := range group {
		r.a, r.err = storage.Applied{}, nil
		node, boot := r.sender.Node, r.sender.Boot
		nodes = append(nodes, node)
		runs = append(runs, fold.BatchRuns(r.b)...)
		kNode, kBoot = append(kNode, node), append(kBoot, boot)
		kSeq, kStart = append(kSeq, int64(r.b.GetSeq())), append(kStart, fold.NanosOf(r.b.GetWindowStart()))
		for _, l := range slices.Concat(r.b.GetLosses(), r.b.GetNodeLosses()) {
			if l.GetSeq() != 0 {
				hNode, hBoot, hSeq = append(hNode, node), append(hBoot, boot), append(hSeq, int64(l.GetSeq()))
			}
		}
		if startsRun(r.b) {
			starts[node] = true
		}
	}
	nodes, runs = sortedSet(nodes), sortedSet(runs)
	for _, n := range nodes {
		g.nodes[n] = newGroupNode(n)
	}

	// The cached rollup rows: keys they hold are not read unless the
	// xmins read below say another transaction wrote them.
	cached := s.rcache.take(nodes)
	nodeX := map[string]string{}
	runX := map[string]string{}

	// 1. Reads and locks.
	held := map[batchKey]bool{}
	isNew := map[fullKey]bool{}
	tombs := map[string]fold.Deletion{}
	var q pgx.Batch
	if len(hNode) > 0 {
		q.Queue(`SELECT DISTINCT a.node, a.boot, a.seq FROM unnest($1::text[], $2::text[], $3::int8[]) AS k(node, boot, seq)
			CROSS JOIN LATERAL (SELECT * FROM applied_batches WHERE node = k.node AND boot = k.boot AND seq = k.seq OFFSET 0) a`,
			hNode, hBoot, hSeq).Query(func(rows pgx.Rows) error {
			var k batchKey
			_, err := pgx.ForEachRow(rows, []any{&k.node, &k.boot, &k.seq}, func() error { held[k] = true; return nil })
			return err
		})
	}
	// In key order, as another replica's group holding some of the same
	// keys (an agent's batch sent again elsewhere) inserts them: the two
	// wait for each other's commit on the key, not in a cycle.
	q.Queue(`INSERT INTO applied_batches (node, boot, seq, start_ns) SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[])
		ORDER BY 1, 2, 3, 4 ON CONFLICT DO NOTHING RETURNING node, boot, seq, start_ns`, kNode, kBoot, kSeq, kStart).Query(func(rows pgx.Rows) error {
		var k batchKey
		var start int64
		_, err := pgx.ForEachRow(rows, []any{&k.node, &k.boot, &k.seq, &start}, func() error { isNew[keyOf(k, start)] = true; return nil })
		return err
	})
	// The node rows and run rows locked, in the order commit.go gives;
	// rows missing (a new node, a new run) are made and locked in the
	// second pipeline. A run's aggregate is read only where this process
	// holds none as of the row's xmin (scache).
	lockNodes := func(q *pgx.Batch, nodes []string) {
		q.Queue(`SELECT node, status, new_runs_tokens, new_runs_at, rolled_ns, xmin::text FROM nodes WHERE node = ANY($1) ORDER BY node FOR UPDATE`, nodes).Query(func(rows pgx.Rows) error {
			var node, x string
			var tokens *float64
			var at, rolled *int64
			_, err := pgx.ForEachRow(rows, []any{&node, nil, &tokens, &at, &rolled, &x}, func() error {
				n := g.nodes[node]
				if n == nil {
					return nil
				}
				nodeX[node] = x
				n.rolled = rolledOf(rolled)
				if tokens != nil && at != nil {
					n.bucket = fold.Bucket{Tokens: *tokens, At: time.Unix(0, *at)}
				}
				if c := cached[node]; c != nil && c.status != nil && c.nodeX == x {
					n.ns, n.saved = c.status, c.saved
					return nil
				}
				if err := proto.Unmarshal(rows.RawValues()[1], n.ns); err != nil {
					return err
				}
				n.saved = savedOf(n.ns)
				return nil
			})
			return err
		})
	}
	states := s.scache.take(runs)
	var readState []string // runs whose aggregate is to be read
	lockRuns := func(q *pgx.Batch, runs []string) {
		q.Queue(`SELECT run_id, state IS NULL, xmin::text FROM runs WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE`, runs).Query(func(rows pgx.Rows) error {
			var id, x string
			var none bool
			_, err := pgx.ForEachRow(rows, []any{&id, &none, &x}, func() error {
				runX[id] = x
				switch c, ok := states[id]; {
				case none:
				case ok && c.x == x:
					g.state[id] = c.st
				default:
					readState = append(readState, id)
				}
				return nil
			})
			return err
		})
	}
	lockNodes(&q, nodes)
	if len(runs) > 0 {
		lockRuns(&q, runs)
		keys := make([][]byte, len(runs))
		for i, r := range runs {
			keys[i] = []byte(r)
		}
		q.Queue(`SELECT k, v FROM records WHERE ns = $1 AND k = ANY($2)`, fold.DeletedNS, keys).Query(func(rows pgx.Rows) error {
			var k, val []byte
			_, err := pgx.ForEachRow(rows, []any{&k, &val}, func() error {
				if d, ok := fold.ParseTombstone(string(val)); ok {
					tombs[string(k)] = d
				}
				return nil
			})
			return err
		})
	}
	// The live runs of nodes whose batches start runs, counted under the
	// node's lock: for a node made in the second pipeline, again there.
	countLive := func(q *pgx.Batch, nodes []string) {
		if s.limits.MaxLiveRunsPerNode <= 0 || len(nodes) == 0 {
			return
		}
		q.Queue(`SELECT node, count(*) FROM live_runs WHERE node = ANY($1) GROUP BY node`, nodes).Query(func(rows pgx.Rows) error {
			var node string
			var n int
			_, err := pgx.ForEachRow(rows, []any{&node, &n}, func() error {
				if gn := g.nodes[node]; gn != nil {
					gn.count = n
				}
				return nil
			})
			return err
		})
	}
	countLive(&q, mapKeys(starts))
	if err := tx.SendBatch(ctx, &q).Close(); err != nil {
		return err
	}
	var again pgx.Batch
	if missing := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return nodeX[n] != "" }); len(missing) > 0 {
		empties, err := emptyNodeStatuses(missing)
		if err != nil {
			return err
		}
		again.Queue(`INSERT INTO nodes (node, status) SELECT * FROM unnest($1::text[], $2::bytea[]) ORDER BY 1 ON CONFLICT DO NOTHING`, missing, empties)
		lockNodes(&again, missing)
		countLive(&again, slices.DeleteFunc(slices.Clone(missing), func(n string) bool { return !starts[n] }))
	}
	readStates := func(q *pgx.Batch, sql string, runs []string) {
		q.Queue(sql, runs).Query(func(rows pgx.Rows) error {
			var id, x string
			var val []byte
			_, err := pgx.ForEachRow(rows, []any{&id, &val, &x}, func() error {
				runX[id] = x
				if val == nil {
					return nil
				}
				st, err := aggregate.Unmarshal(val)
				if err != nil {
					return fmt.Errorf("run %q: %w", id, err)
				}
				g.state[id] = st
				return nil
			})
			return err
		})
	}
	if missing := slices.DeleteFunc(slices.Clone(runs), func(r string) bool { return runX[r] != "" }); len(missing) > 0 {
		// Made here or by another transaction since the first pipeline:
		// locked with their aggregates.
		again.Queue(`INSERT INTO runs (run_id) SELECT unnest($1::text[]) ORDER BY 1 ON CONFLICT DO NOTHING`, missing)
		readStates(&again, `SELECT run_id, state, xmin::text FROM runs WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE`, missing)
	}
	if len(readState) > 0 {
		readStates(&again, `SELECT run_id, state, xmin::text FROM runs WHERE run_id = ANY($1)`, readState)
	}
	// The rollup rows the group adds to: those of its records that start
	// before their node's rolled_ns (late ones; the roll-up adds the
	// others). Each row is taken from the cache where the node's row (and
	// the run's) is as this process's commit left it, else read.
	runRoll := map[[2]string]map[int64]bool{} // (node, run) → minutes
	nodeMin := map[string]map[int64]bool{}
	for _, r := range group {
		node := r.sender.Node
		rolled := g.nodes[node].rolled
		for _, w := range r.b.GetRunWindows() {
			if fold.NanosOf(w.GetStart()) >= rolled {
				continue
			}
			addMinute(runRoll, [2]string{node, w.GetRunId()}, dayMinute(w.GetStart()))
		}
		if start := fold.NanosOf(r.b.GetWindowStart()); start < rolled {
			addMinute(nodeMin, node, minuteOf(start))
		}
	}
	stale := false // a row cached, but written since by another transaction
	cachedRow := func(node, run string, m int64) bool {
		e := cached[node]
		if e == nil {
			return false
		}
		if run == "" && !e.nodeDone[m] || run != "" && !e.runDone[runMinute{run, m}] {
			return false
		}
		ok := e.nodeX == nodeX[node]
		if run != "" {
			ok = ok && e.runX[run] != "" && e.runX[run] == runX[run]
		}
		if !ok {
			stale = true
			return false
		}
		gn := g.nodes[node]
		if run == "" {
			for k, b := range e.nodes {
				if k.start == m {
					gn.haveNodes[k] = b
				}
			}
		} else {
			for k, w := range e.runs {
				if k.run == run && k.start == m {
					gn.haveRuns[k] = w
				}
			}
		}
		return true
	}
	if queueRollupReads(&again, g, runRoll, nodeMin, cachedRow) && stale {
		s.rollupRereads.Add(1)
	}
	if again.Len() > 0 {
		if err := tx.SendBatch(ctx, &again).Close(); err != nil {
			return err
		}
	}
	// The liveness the group starts from, before any batch folds.
	for _, r := range group {
		for _, run := range fold.BatchRuns(r.b) {
			if st := g.state[run]; st != nil && st.LiveOn(r.sender.Node) {
				g.baseLive[fold.LiveKey{Node: r.sender.Node, Run: run}] = true
			}
		}
	}

	// 2. The batches, in group order.
	w := newGroupWrites()
	var untomb [][]byte
	pricer := s.pricerNow()
	reportPricing := s.reportPricing()
	for _, r := range group {
		k := batchKey{r.sender.Node, r.sender.Boot, int64(r.b.GetSeq())}
		nk := keyOf(k, fold.NanosOf(r.b.GetWindowStart()))
		if !isNew[nk] {
			r.err = errDuplicate
			continue
		}
		delete(isNew, nk) // a second copy in the group is a duplicate
		held[k] = true    // as the per-batch path: its own key is in applied_batches
		restarted, err := s.foldOne(g, w, r, tombs, held, pricer, reportPricing)
		if err != nil {
			return err
		}
		for _, id := range restarted {
			delete(tombs, id)
			untomb = append(untomb, []byte(id))
		}
	}

	// 3. Writes.
	var out pgx.Batch
	if len(untomb) > 0 {
		out.Queue(`DELETE FROM records WHERE ns = $1 AND k = ANY($2)`, fold.DeletedNS, untomb)
	}
	for _, rr := range w.raw {
		rr.queue(&out)
	}
	if err := s.queueGroupRollups(&out, g, nodes); err != nil {
		return err
	}
	// A run's report columns are written with its aggregate unless it is
	// live, this process wrote them less than reportEvery ago, and the
	// group brought it windows only (no event, no loss record): a live
	// run's columns trail its aggregate by at most reportEvery, an ended
	// run's are exact.
	var rr, ro runRows
	reported := map[string]time.Time{}
	for _, run := range g.order {
		st := g.state[run]
		c, held := states[run]
		if held && c.st == st && !st.Ended() && !g.noted[run] && g.now.Sub(c.reportedAt) < reportEvery {
			if err := ro.addState(st); err != nil {
				return err
			}
			reported[run] = c.reportedAt
			continue
		}
		if err := rr.add(st, st.Report(reportPricing)); err != nil {
			return err
		}
		reported[run] = g.now
	}
	lockX := maps.Clone(nodeX)
	clear(nodeX)
	clear(runX)
	rr.queue(&out, g.now, runX)
	ro.queueState(&out, g.now, runX)
	queueGroupUsage(&out, g, nodes)
	var sNode []string
	var sVal [][]byte
	buckets := g.Buckets()
	for _, n := range nodes {
		gn := g.nodes[n]
		if !gn.written {
			continue
		}
		// The row is written when the status is due, and whenever the
		// group writes the node's rollup rows or bucket, so that the row's
		// xmin says so to the rows held (rollcache.go).
		_, bucket := buckets[n]
		if !gn.saved.due(gn.ns) && len(gn.rr.runs) == 0 && len(gn.rr.nodes) == 0 && !bucket {
			continue
		}
		val, err := proto.Marshal(gn.ns)
		if err != nil {
			return err
		}
		sNode, sVal = append(sNode, n), append(sVal, val)
		gn.saved = savedOf(gn.ns)
	}
	if len(sNode) > 0 {
		// The rows exist: the group locked them.
		out.Queue(`UPDATE nodes SET status = u.status FROM unnest($1::text[], $2::bytea[]) AS u(node, status)
			WHERE nodes.node = u.node RETURNING nodes.node, nodes.xmin::text`, sNode, bytesArray(sVal)).Query(func(rows pgx.Rows) error {
			var node, x string
			_, err := pgx.ForEachRow(rows, []any{&node, &x}, func() error { nodeX[node] = x; return nil })
			return err
		})
	}
	queueLive(&out, g.Live)
	// The rows locked for runs no batch made go again (rows the group
	// made, or made before by a transaction that then failed).
	var unmade []string
	for _, run := range runs {
		if g.state[run] == nil {
			unmade = append(unmade, run)
		}
	}
	if len(unmade) > 0 {
		out.Queue(`DELETE FROM runs WHERE run_id = ANY($1) AND state IS NULL`, unmade)
	}
	if err := tx.SendBatch(ctx, &out).Close(); err != nil {
		return err
	}
	// What this commit leaves: the rows the group wrote, for the nodes
	// and runs whose rows it wrote.
	fresh.rolls, fresh.states = map[string]*rollCache{}, map[string]cachedState{}
	for _, run := range g.order {
		if x := runX[run]; x != "" {
			fresh.states[run] = cachedState{x, g.state[run], reported[run]}
		}
	}
	for _, node := range nodes {
		gn := g.nodes[node]
		if nodeX[node] == "" && gn.written {
			nodeX[node] = lockX[node] // the status not due: the row as locked
		}
		if nodeX[node] == "" {
			continue
		}
		// Every row of each (run, minute) and node minute the group read
		// or took from the cache, as written: all of them, whatever their
		// lock, so that a later group may trust the set as complete.
		e := &rollCache{nodeX: nodeX[node], status: gn.ns, saved: gn.saved, runX: map[string]string{}, runDone: map[runMinute]bool{}, nodeDone: map[int64]bool{},
			runs: gn.haveRuns, nodes: gn.haveNodes}
		for k, w := range gn.rr.runs {
			e.runs[k] = w
		}
		for k, b := range gn.rr.nodes {
			e.nodes[k] = b
		}
		for k, ms := range runRoll {
			if x := runX[k[1]]; k[0] == node && x != "" {
				e.runX[k[1]] = x
				for m := range ms {
					e.runDone[runMinute{k[1], m}] = true
				}
			}
		}
		for k := range e.runs {
			if !e.runDone[runMinute{k.run, k.start}] {
				delete(e.runs, k)
			}
		}
		for m := range nodeMin[node] {
			e.nodeDone[m] = true
		}
		fresh.rolls[node] = e
	}
	return nil
}

// queueRollupReads queues the reads of the rollup rows the group adds to,
// every row of a node's run and minute (run "": of the node's minute)
// but those skip says are had, and says whether it queued any.
func queueRollupReads(q *pgx.Batch, g *groupState, runRoll map[[2]string]map[int64]bool, nodeMin map[string]map[int64]bool,
	skip func(node, run string, m int64) bool) bool {
	var rNode, rRun []string
	var rStart []int64
	for k, ms := range runRoll {
		for m := range ms {
			if skip(k[0], k[1], m) {
				continue
			}
			rNode, rRun, rStart = append(rNode, k[0]), append(rRun, k[1]), append(rStart, m)
		}
	}
	if len(rNode) > 0 {
		// One index lookup per key (LATERAL … OFFSET 0 is not flattened
		// into a join), whatever the table's statistics: a new table's
		// would make a hash join over all of it.
		q.Queue(`SELECT r.node, r.run_id, r.start_ns, r.lock, r.w FROM unnest($1::text[], $2::text[], $3::int8[]) AS k(node, run_id, start_ns)
			CROSS JOIN LATERAL (SELECT * FROM run_rollups WHERE node = k.node AND run_id = k.run_id AND start_ns = k.start_ns OFFSET 0) r`,
			rNode, rRun, rStart).Query(func(rows pgx.Rows) error {
			var node string
			var k runRollKey
			var lock, val []byte
			_, err := pgx.ForEachRow(rows, []any{&node, &k.run, &k.start, &lock, &val}, func() error {
				k.lock = string(lock)
				w := &trainmeterv1.RunWindow{}
				g.nodes[node].haveRuns[k] = w
				return proto.Unmarshal(val, w)
			})
			return err
		})
	}
	var nNode []string
	var nStart []int64
	for node, ms := range nodeMin {
		for m := range ms {
			if skip(node, "", m) {
				continue
			}
			nNode, nStart = append(nNode, node), append(nStart, m)
		}
	}
	if len(nNode) == 0 {
		return len(rNode) > 0
	}
	q.Queue(`SELECT r.node, r.start_ns, r.lock, r.b FROM unnest($1::text[], $2::int8[]) AS k(node, start_ns)
		CROSS JOIN LATERAL (SELECT * FROM node_rollups WHERE node = k.node AND start_ns = k.start_ns OFFSET 0) r`, nNode, nStart).Query(func(rows pgx.Rows) error {
		var node string
		var k nodeRollKey
		var lock, val []byte
		_, err := pgx.ForEachRow(rows, []any{&node, &k.start, &lock, &val}, func() error {
			k.lock = string(lock)
			b := &trainmeterv1.Batch{}
			g.nodes[node].haveNodes[k] = b
			return proto.Unmarshal(val, b)
		})
		return err
	})
	return true
}

// fullKey is an applied_batches key.
type fullKey struct {
	batchKey
	start int64
}

func keyOf(k batchKey, start int64) fullKey { return fullKey{k, start} }

func mapKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// groupWrites are the raw rows of a group, by table. They are inserted
// without ON CONFLICT: a new batch's raw keys are new but where a node
// reuses a window start and seq under a new boot, and an upsert's
// speculative insertion cost the database a tenth of its CPU. A key
// already there fails the group, which is then applied batch by batch
// (commitGroupWith), whose statements replace the row (apply).
type groupWrites struct {
	runWindows, runEvents, nodeWindows, rawSamples, nodeLosses, deleted *rawRows
	raw                                                                 []*rawRows
}

func newGroupWrites() *groupWrites {
	w := &groupWrites{
		runWindows: &rawRows{run: []string{}, i: []int32{}, insert: `INSERT INTO run_windows (run_id, node, start_ns, seq, i, w)
			SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int4[], $6::bytea[])`},
		runEvents: &rawRows{run: []string{}, i: []int32{}, insert: `INSERT INTO run_events (run_id, node, t_ns, seq, i, e)
			SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int4[], $6::bytea[])`},
		nodeWindows: perBatchRows("node_windows"),
		rawSamples:  perBatchRows("raw_samples"),
		nodeLosses:  perBatchRows("node_losses"),
		deleted: &rawRows{i: []int32{}, delID: []int64{}, insert: `INSERT INTO deleted_windows (node, start_ns, seq, i, deletion, d)
			SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int4[], $5::int8[], $6::bytea[])`},
	}
	w.raw = []*rawRows{w.runWindows, w.runEvents, w.nodeWindows, w.rawSamples, w.nodeLosses, w.deleted}
	return w
}

func (r *rawRows) add(run, node string, start, seq int64, i int, val []byte) {
	if r.run != nil {
		r.run = append(r.run, run)
	}
	if r.i != nil {
		r.i = append(r.i, int32(i))
	}
	r.node, r.start, r.seq, r.val = append(r.node, node), append(r.start, start), append(r.seq, seq), append(r.val, val)
}

// errRefused fails a group attempt when fold refuses a batch as a whole:
// the per-batch path gives that batch its error alone.
var errRefused = errors.New("pgstore: a batch of the group failed alone")

// foldOne is apply's work on one new batch over the group's state: the
// same decisions, with every read from g and every write added to g and w.
// It returns the runs the batch started afresh after a deletion.
func (s *Store) foldOne(g *groupState, w *groupWrites, r *applyReq, tombs map[string]fold.Deletion, held map[batchKey]bool,
	pricer aggregate.Pricer, reportPricing aggregate.Pricing) ([]string, error) {
	node, boot, seq := r.sender.Node, r.sender.Boot, int64(r.b.GetSeq())
	gn := g.nodes[node]
	ns := gn.ns
	b := r.b
	runs := fold.BatchRuns(b)
	nb, gone, restarted := fold.DropDeleted(b, runs, func(id string) (fold.Deletion, bool) {
		d, ok := tombs[id]
		return d, ok
	})
	b = fold.ClearLocked(nb)
	runs = fold.BatchRuns(b)
	nb, refused, dropped, err := fold.Admit(g, s.log, len(ns.GetGpus()), node, b, runs)
	if err != nil {
		return nil, errors.Join(errRefused, err)
	}
	if nb != b {
		b, runs, r.a.Refused, r.a.Dropped, r.a.Batch = nb, fold.BatchRuns(nb), refused, dropped, nb
	}
	aggs := make(map[string]*aggregate.State, len(runs))
	for _, run := range runs {
		aggs[run], _ = g.Get(run)
	}
	for _, e := range b.GetRunEvents() {
		g.noted[aggregate.EventRunID(e)] = true
	}
	for _, l := range b.GetLosses() {
		g.noted[l.GetRunId()] = true
	}
	notHeld := func(ls []*trainmeterv1.DataLoss) []*trainmeterv1.DataLoss {
		var out []*trainmeterv1.DataLoss
		for _, l := range ls {
			if l.GetSeq() != 0 && held[batchKey{node, boot, int64(l.GetSeq())}] {
				continue
			}
			out = append(out, l)
		}
		return out
	}
	nodeGPU := fold.NodeGPUName(ns)
	stamps := fold.Fold(aggs, node, nodeGPU, b, fold.Booking{Bands: s.bands, Carbon: s.carbon, Pricer: pricer}, notHeld(b.GetLosses()), g.now)
	g.NoteLive(node, runs, func(run string) *aggregate.State { return aggs[run] })

	roll := rollups{start: fold.NanosOf(b.GetWindowStart())}
	for i, rw := range b.GetRunWindows() {
		val, err := proto.Marshal(rw)
		if err == nil && pricer != nil {
			val, err = fold.AppendStamp(val, stamps[i])
		}
		if err != nil {
			return nil, err
		}
		if fold.NanosOf(rw.GetStart()) < gn.rolled {
			stored := rw
			if pricer != nil {
				stored = &trainmeterv1.RunWindow{}
				if err := proto.Unmarshal(val, stored); err != nil {
					return nil, err
				}
			}
			roll.runs = append(roll.runs, stored)
			gn.usage.stored(stored)
		}
		w.runWindows.add(rw.GetRunId(), node, fold.NanosOf(rw.GetStart()), seq, i, val)
	}
	for i, e := range b.GetRunEvents() {
		val, err := proto.Marshal(e)
		if err != nil {
			return nil, err
		}
		w.runEvents.add(aggregate.EventRunID(e), node, fold.NanosOf(aggregate.EventTime(e)), seq, i, val)
	}
	start := fold.NanosOf(b.GetWindowStart())
	perBatch := func(rows *rawRows, m proto.Message, stamp proto.Message) ([]byte, error) {
		val, err := proto.Marshal(m)
		if err == nil && stamp != nil {
			val, err = fold.AppendStamp(val, stamp)
		}
		rows.add("", node, start, seq, 0, val)
		return val, err
	}
	if fold.HasNodeRecord(b) {
		var stamp proto.Message
		if pricer != nil {
			stamp = fold.IdleStamp(pricer, node, nodeGPU, b)
		}
		val, err := perBatch(w.nodeWindows, fold.NodeRecord(b, boot), stamp)
		if err != nil {
			return nil, err
		}
		if start < gn.rolled {
			roll.node = &trainmeterv1.Batch{}
			if err := proto.Unmarshal(val, roll.node); err != nil {
				return nil, err
			}
			gn.usage.nodeRecord(roll.node)
		}
	}
	if rs := fold.SamplesRecord(b); rs != nil {
		if _, err := perBatch(w.rawSamples, rs, nil); err != nil {
			return nil, err
		}
	}
	if nodeLosses := notHeld(b.GetNodeLosses()); len(nodeLosses) > 0 {
		if _, err := perBatch(w.nodeLosses, &trainmeterv1.Batch{WindowStart: b.GetWindowStart(), NodeLosses: nodeLosses}, nil); err != nil {
			return nil, err
		}
		if start < gn.rolled {
			roll.loss = nodeLosses
		}
	}
	gn.addRollups(roll)
	for _, d := range gone {
		val, err := fold.DeletedRecord(d.W, d.D)
		if err != nil {
			return nil, err
		}
		if fold.NanosOf(d.W.GetStart()) < gn.rolled {
			gn.usage.deleted(d.W, d.D, reportPricing, nodeGPU)
		}
		w.deleted.delID = append(w.deleted.delID, int64(d.D.ID))
		w.deleted.add("", node, fold.NanosOf(d.W.GetStart()), seq, d.I, val)
	}
	ns.BootId, ns.LastSeq, ns.LastSeen = boot, b.GetSeq(), timestamppb.New(g.now)
	gn.written = true
	return restarted, nil
}

// addRollups adds a batch's additions to the node's rollup rows, each row
// starting from the row read.
func (gn *groupNode) addRollups(r rollups) {
	for _, w := range r.runs {
		k := runRollKeyOf(w)
		if _, ok := gn.rr.runs[k]; !ok {
			gn.rr.runs[k] = gn.haveRuns[k]
		}
	}
	if r.node != nil {
		if k := r.nodeKey(); gn.rr.nodes[k] == nil {
			gn.rr.nodes[k] = gn.haveNodes[k]
		}
	}
	if len(r.loss) > 0 {
		if k := r.lossKey(); gn.rr.nodes[k] == nil {
			gn.rr.nodes[k] = gn.haveNodes[k]
		}
	}
	gn.rr.add(r)
}

// queueGroupRollups queues the rollup rows the group added to, each
// replacing the row it was read as, one statement per table.
func (s *Store) queueGroupRollups(q *pgx.Batch, g *groupState, nodes []string) error {
	var rn, rr []string
	var rs []int64
	var rl, rv [][]byte
	var nn []string
	var ns []int64
	var nl, nv [][]byte
	for _, node := range nodes {
		gn := g.nodes[node]
		for k, w := range gn.rr.runs {
			val, err := proto.Marshal(w)
			if err != nil {
				return err
			}
			rn, rr, rs, rl, rv = append(rn, node), append(rr, k.run), append(rs, k.start), append(rl, []byte(k.lock)), append(rv, val)
		}
		for k, b := range gn.rr.nodes {
			val, err := proto.Marshal(b)
			if err != nil {
				return err
			}
			nn, ns, nl, nv = append(nn, node), append(ns, k.start), append(nl, []byte(k.lock)), append(nv, val)
		}
	}
	if len(rn) > 0 {
		q.Queue(`INSERT INTO run_rollups (node, run_id, start_ns, lock, w)
			SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::bytea[], $5::bytea[])
			ON CONFLICT (node, run_id, start_ns, lock) DO UPDATE SET w = EXCLUDED.w`, rn, rr, rs, bytesArray(rl), bytesArray(rv))
	}
	if len(nn) > 0 {
		q.Queue(`INSERT INTO node_rollups (node, start_ns, lock, b)
			SELECT * FROM unnest($1::text[], $2::int8[], $3::bytea[], $4::bytea[])
			ON CONFLICT (node, start_ns, lock) DO UPDATE SET b = EXCLUDED.b`, nn, ns, bytesArray(nl), bytesArray(nv))
	}
	return nil
}

// queueGroupUsage queues the group's daily usage additions, one statement
// per table.
func queueGroupUsage(q *pgx.Batch, g *groupState, nodes []string) {
	var pNode, pDay, pKind, pRef []string
	var pGPU []int64
	var pS, pJ, pUSD []float64
	var pUnpriced []int32
	var dNode, dDay []string
	var dS, dJ, dIdleS, dIdleJ, dHost, dIdleHost []float64
	for _, node := range nodes {
		u := g.nodes[node].usage
		for k, p := range u.parts {
			pNode, pDay, pKind, pRef, pGPU = append(pNode, node), append(pDay, k.day), append(pKind, k.kind), append(pRef, k.ref), append(pGPU, k.gpu)
			pS, pJ, pUSD, pUnpriced = append(pS, p.gpuS), append(pJ, p.energyJ), append(pUSD, p.costUSD), append(pUnpriced, p.unpriced)
		}
		for day, n := range u.nodes {
			dNode, dDay = append(dNode, node), append(dDay, day)
			dS, dJ, dIdleS, dIdleJ, dHost, dIdleHost = append(dS, n.gpuS), append(dJ, n.energyJ), append(dIdleS, n.idleS), append(dIdleJ, n.idleJ),
				append(dHost, n.hostJ), append(dIdleHost, n.idleHostJ)
		}
	}
	if len(pNode) > 0 {
		q.Queue(`INSERT INTO usage_daily (node, day, kind, ref, gpu, gpu_seconds, energy_j, cost_usd, unpriced)
			SELECT n, d::date, k, r, g::int, s, j, c, u FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[],
				$6::float8[], $7::float8[], $8::float8[], $9::int4[]) AS t(n, d, k, r, g, s, j, c, u)
			ON CONFLICT (node, day, kind, ref, gpu) DO UPDATE SET gpu_seconds = usage_daily.gpu_seconds + EXCLUDED.gpu_seconds,
			energy_j = usage_daily.energy_j + EXCLUDED.energy_j, cost_usd = usage_daily.cost_usd + EXCLUDED.cost_usd,
			unpriced = usage_daily.unpriced + EXCLUDED.unpriced`,
			pNode, pDay, pKind, pRef, pGPU, pS, pJ, pUSD, pUnpriced)
	}
	if len(dNode) > 0 {
		q.Queue(`INSERT INTO usage_daily_nodes (node, day, gpu_seconds, energy_j, idle_gpu_seconds, idle_energy_j, host_energy_j, idle_host_energy_j)
			SELECT n, d::date, s, j, is_, ij, h, ih FROM unnest($1::text[], $2::text[], $3::float8[], $4::float8[], $5::float8[], $6::float8[],
				$7::float8[], $8::float8[]) AS t(n, d, s, j, is_, ij, h, ih)
			ON CONFLICT (node, day) DO UPDATE SET gpu_seconds = usage_daily_nodes.gpu_seconds + EXCLUDED.gpu_seconds,
			energy_j = usage_daily_nodes.energy_j + EXCLUDED.energy_j, idle_gpu_seconds = usage_daily_nodes.idle_gpu_seconds + EXCLUDED.idle_gpu_seconds,
			idle_energy_j = usage_daily_nodes.idle_energy_j + EXCLUDED.idle_energy_j, host_energy_j = usage_daily_nodes.host_energy_j + EXCLUDED.host_energy_j,
			idle_host_energy_j = usage_daily_nodes.idle_host_energy_j + EXCLUDED.idle_host_energy_j`,
			dNode, dDay, dS, dJ, dIdleS, dIdleJ, dHost, dIdleHost)
	}
}

// runRows are the run rows a group writes, as columns: what queueRun
// writes of one run.
type runRows struct {
	id                                          []string
	state                                       [][]byte
	start, end, uid                             []*int64
	endStatus, user, model, gpuName, labels     []*string
	status                                      []string
	ended, incomplete                           []bool
	gpus, nodes                                 []int32
	tokens                                      []int64
	wallS, energyJ, energyTotalJ, gpuHours      []float64
	cost, energyCost, totalCost, jPerToken, co2 []*float64
}

func (rr *runRows) add(st *aggregate.State, r *trainmeterv1.RunReport) error {
	val, err := st.Marshal()
	if err != nil {
		return err
	}
	var start, end *int64
	if t, ok := st.StartNanos(); ok {
		start = &t
	}
	if r.GetEnd() != nil {
		t := r.GetEnd().AsTime().UnixNano()
		end = &t
	}
	var labels *string
	if len(r.GetLabels()) > 0 {
		b, err := json.Marshal(r.GetLabels())
		if err != nil {
			return err
		}
		l := string(b)
		labels = &l
	}
	var uid *int64
	if r.Uid != nil {
		u := int64(r.GetUid())
		uid = &u
	}
	rr.id, rr.state, rr.start, rr.end, rr.uid = append(rr.id, st.RunId), append(rr.state, val), append(rr.start, start), append(rr.end, end), append(rr.uid, uid)
	rr.endStatus, rr.user = append(rr.endStatus, nonEmpty(st.EndStatus())), append(rr.user, nonEmpty(r.GetUser()))
	rr.model, rr.gpuName, rr.labels = append(rr.model, nonEmpty(r.GetMetadata().GetModel())), append(rr.gpuName, nonEmpty(r.GetGpuName())), append(rr.labels, labels)
	rr.status, rr.ended, rr.incomplete = append(rr.status, report.EndStatus(r)), append(rr.ended, r.GetEnded()), append(rr.incomplete, r.GetIncomplete())
	rr.gpus, rr.nodes, rr.tokens = append(rr.gpus, int32(r.GetGpus())), append(rr.nodes, int32(r.GetNodes())), append(rr.tokens, int64(r.GetTokensProcessed()))
	rr.wallS, rr.energyJ, rr.energyTotalJ, rr.gpuHours = append(rr.wallS, r.GetWallS()), append(rr.energyJ, r.GetEnergyJ()), append(rr.energyTotalJ, r.GetEnergyTotalJ()), append(rr.gpuHours, r.GetGpuHours())
	rr.cost, rr.energyCost, rr.totalCost = append(rr.cost, r.CostUsd), append(rr.energyCost, r.EnergyCostUsd), append(rr.totalCost, r.TotalCostUsd)
	rr.jPerToken, rr.co2 = append(rr.jPerToken, r.JPerToken), append(rr.co2, r.Co2Kg)
	return nil
}

// addState adds a run whose aggregate alone is written (queueState).
func (rr *runRows) addState(st *aggregate.State) error {
	val, err := st.Marshal()
	rr.id, rr.state = append(rr.id, st.RunId), append(rr.state, val)
	return err
}

// queueState queues the UPDATE of the runs' aggregates alone (their report
// columns as they were), which also notes that they got data at now; each
// row's new xmin goes to xmins.
func (rr *runRows) queueState(q *pgx.Batch, now time.Time, xmins map[string]string) {
	if len(rr.id) == 0 {
		return
	}
	q.Queue(`UPDATE runs SET state = u.state, data_at_ns = $3 FROM unnest($1::text[], $2::bytea[]) AS u(run_id, state)
		WHERE runs.run_id = u.run_id RETURNING runs.run_id, runs.xmin::text`, rr.id, bytesArray(rr.state), now.UnixNano()).Query(func(rows pgx.Rows) error {
		var id, x string
		_, err := pgx.ForEachRow(rows, []any{&id, &x}, func() error { xmins[id] = x; return nil })
		return err
	})
}

// queue queues the runs' UPDATE, which also notes that they got data at
// now; each row's new xmin goes to xmins.
func (rr *runRows) queue(q *pgx.Batch, now time.Time, xmins map[string]string) {
	if len(rr.id) == 0 {
		return
	}
	q.Queue(`UPDATE runs SET state = u.state, start_ns = u.start_ns, end_status = u.end_status, user_name = u.user_name, status = u.status,
		end_ns = u.end_ns, ended = u.ended, uid = u.uid, model = u.model, gpu_name = u.gpu_name, labels = u.labels::jsonb, gpus = u.gpus,
		nodes = u.nodes, tokens = u.tokens, wall_s = u.wall_s, energy_j = u.energy_j, energy_total_j = u.energy_total_j, gpu_hours = u.gpu_hours,
		cost_usd = u.cost_usd, energy_cost_usd = u.energy_cost_usd, total_cost_usd = u.total_cost_usd, j_per_token = u.j_per_token,
		co2_kg = u.co2_kg, incomplete = u.incomplete, data_at_ns = $26
		FROM unnest($1::text[], $2::bytea[], $3::int8[], $4::text[], $5::text[], $6::text[], $7::int8[], $8::bool[], $9::int8[], $10::text[],
			$11::text[], $12::text[], $13::int4[], $14::int4[], $15::int8[], $16::float8[], $17::float8[], $18::float8[], $19::float8[],
			$20::float8[], $21::float8[], $22::float8[], $23::float8[], $24::float8[], $25::bool[])
		AS u(run_id, state, start_ns, end_status, user_name, status, end_ns, ended, uid, model, gpu_name, labels, gpus, nodes, tokens, wall_s,
			energy_j, energy_total_j, gpu_hours, cost_usd, energy_cost_usd, total_cost_usd, j_per_token, co2_kg, incomplete)
		WHERE runs.run_id = u.run_id RETURNING runs.run_id, runs.xmin::text`,
		rr.id, bytesArray(rr.state), rr.start, rr.endStatus, rr.user, rr.status, rr.end, rr.ended, rr.uid, rr.model, rr.gpuName, rr.labels,
		rr.gpus, rr.nodes, rr.tokens, rr.wallS, rr.energyJ, rr.energyTotalJ, rr.gpuHours, rr.cost, rr.energyCost, rr.totalCost,
		rr.jPerToken, rr.co2, rr.incomplete, now.UnixNano()).Query(func(rows pgx.Rows) error {
		var id, x string
		_, err := pgx.ForEachRow(rows, []any{&id, &x}, func() error { xmins[id] = x; return nil })
		return err
	})
}
