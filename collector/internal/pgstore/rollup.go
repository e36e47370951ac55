package pgstore

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Per-minute rollups (0001_init.sql: node_rollups, run_rollups): what
// usage and timelines read for the time before raw_horizon. A rollup is
// the sum of the minute's records in the records' own shape, so usage and
// timelines read it as they read a raw record: energies as each window's
// best (its counter when valid), under counter_ok; a window's figures per
// GPU as GPU shares; records at different locked prices in rows apart.

const minute = int64(time.Minute)

// lossesLock is the lock column of a node's loss records rollup.
var lossesLock = []byte{0xff}

// lockOf is the locked price a record was stored with, as a key.
func lockOf(priced bool, perHour, perJ *float64, src string) []byte {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&trainmeterv1.Batch{PriceLocked: priced,
		LockedUsdPerGpuHour: perHour, LockedUsdPerJoule: perJ, LockedPriceSource: src})
	return b
}

func best(ok bool, counter, integrated float64) float64 {
	if ok {
		return counter
	}
	return integrated
}

// runRollKey is a run_rollups row of one node.
type runRollKey struct {
	run   string
	start int64
	lock  string
}

// runRollKeyOf is the row a stored window (its locked price included)
// adds to. A window from an agent before GPU shares, on several GPUs, adds
// to a row of its own ("?": its GPUs unknown to usage).
func runRollKeyOf(w *trainmeterv1.RunWindow) runRollKey {
	lock := lockOf(w.GetPriceLocked(), w.LockedUsdPerGpuHour, w.LockedUsdPerJoule, w.GetLockedPriceSource())
	if len(w.GetGpuShares()) == 0 && len(w.GetGpus()) != 1 {
		lock = append(lock, '?')
	}
	return runRollKey{w.GetRunId(), dayMinute(w.GetStart()), string(lock)}
}

func dayMinute(ts *timestamppb.Timestamp) int64 { return minuteOf(ts.AsTime().UnixNano()) }

// minuteOf is the start of the minute holding t (Unix ns).
func minuteOf(t int64) int64 {
	m := t / minute * minute
	if m > t {
		m -= minute
	}
	return m
}

// addRunWindow adds w to the rollup r (nil: a new one).
func addRunWindow(r, w *trainmeterv1.RunWindow) *trainmeterv1.RunWindow {
	e := best(w.GetCounterOk(), w.GetEnergyCounterJ(), w.GetEnergyIntegratedJ())
	if r == nil {
		r = &trainmeterv1.RunWindow{RunId: w.GetRunId(), Start: w.GetStart(), End: w.GetEnd(), CounterOk: true,
			PriceLocked: w.GetPriceLocked(), LockedUsdPerGpuHour: w.LockedUsdPerGpuHour, LockedUsdPerJoule: w.LockedUsdPerJoule,
			LockedPriceSource: w.GetLockedPriceSource(), ShareMethod: w.GetShareMethod()}
	}
	if w.GetStart().AsTime().Before(r.GetStart().AsTime()) {
		r.Start = w.GetStart()
	}
	if w.GetEnd().AsTime().After(r.GetEnd().AsTime()) {
		r.End = w.GetEnd()
		if w.LastLoss != nil {
			r.LastLoss = w.LastLoss
		}
	}
	r.Phase = max(r.GetPhase(), w.GetPhase())
	r.EnergyCounterJ += e
	r.EnergyIntegratedJ += w.GetEnergyIntegratedJ()
	r.GapS += w.GetGapS()
	r.PeakPowerW = max(r.GetPeakPowerW(), w.GetPeakPowerW())
	r.VramPeakMib = max(r.GetVramPeakMib(), w.GetVramPeakMib())
	r.VramSumMib += w.GetVramSumMib()
	r.VramSamples += w.GetVramSamples()
	r.GpuSeconds += w.GetGpuSeconds()
	r.Tokens += w.GetTokens()
	r.TokensMeasured += w.GetTokensMeasured()
	r.TokensRecovered += w.GetTokensRecovered()
	r.Steps += w.GetSteps()
	r.Samples += w.GetSamples()
	r.DataWaitS += w.GetDataWaitS()
	r.ComputeS += w.GetComputeS()
	r.UtilizationSumPct += w.GetUtilizationSumPct()
	r.UtilizationSamples += w.GetUtilizationSamples()
	r.SharedGpuSeconds += w.GetSharedGpuSeconds()
	r.MaxSharingRuns = max(r.GetMaxSharingRuns(), w.GetMaxSharingRuns())
	r.EnergyEstimated = r.GetEnergyEstimated() || w.GetEnergyEstimated()
	for _, g := range w.GetGpus() {
		if !slices.Contains(r.Gpus, g) {
			r.Gpus = append(r.Gpus, g)
		}
	}
	shares := w.GetGpuShares()
	if len(shares) == 0 && len(w.GetGpus()) == 1 {
		shares = []*trainmeterv1.GpuShare{{Gpu: w.GetGpus()[0], EnergyCounterJ: w.GetEnergyCounterJ(), EnergyIntegratedJ: w.GetEnergyIntegratedJ(),
			GpuSeconds: w.GetGpuSeconds()}}
	}
	for _, sh := range shares {
		var to *trainmeterv1.GpuShare
		for _, have := range r.GpuShares {
			if have.GetGpu() == sh.GetGpu() {
				to = have
			}
		}
		if to == nil {
			to = &trainmeterv1.GpuShare{Gpu: sh.GetGpu(), CounterOk: true}
			r.GpuShares = append(r.GpuShares, to)
		}
		to.EnergyCounterJ += best(w.GetCounterOk(), sh.GetEnergyCounterJ(), sh.GetEnergyIntegratedJ())
		to.EnergyIntegratedJ += sh.GetEnergyIntegratedJ()
		to.GpuSeconds += sh.GetGpuSeconds()
		to.SharedGpuSeconds += sh.GetSharedGpuSeconds()
	}
	return r
}

// addNodeRecord adds a stored node record (GPU and host windows) to the
// rollup r (nil: a new one).
func addNodeRecord(r, b *trainmeterv1.Batch) *trainmeterv1.Batch {
	if r == nil {
		r = &trainmeterv1.Batch{WindowStart: timestamppb.New(time.Unix(0, dayMinute(b.GetWindowStart()))), WindowEnd: b.GetWindowEnd(),
			PriceLocked: b.GetPriceLocked(), LockedUsdPerGpuHour: b.LockedUsdPerGpuHour, LockedUsdPerJoule: b.LockedUsdPerJoule,
			LockedPriceSource: b.GetLockedPriceSource()}
	}
	if b.GetWindowEnd().AsTime().After(r.GetWindowEnd().AsTime()) {
		r.WindowEnd = b.GetWindowEnd()
	}
	for _, gw := range b.GetGpuWindows() {
		var to *trainmeterv1.GpuWindow
		for _, have := range r.GpuWindows {
			if have.GetGpu() == gw.GetGpu() {
				to = have
			}
		}
		if to == nil {
			to = &trainmeterv1.GpuWindow{Gpu: gw.GetGpu(), Uuid: gw.GetUuid(), CounterOk: true, MemoryTotalMib: gw.GetMemoryTotalMib()}
			r.GpuWindows = append(r.GpuWindows, to)
		}
		ok := gw.GetCounterOk()
		to.EnergyCounterJ += best(ok, gw.GetEnergyCounterJ(), gw.GetEnergyIntegratedJ())
		to.EnergyIntegratedJ += gw.GetEnergyIntegratedJ()
		to.GpuSeconds += gw.GetGpuSeconds()
		to.IdleGpuSeconds += gw.GetIdleGpuSeconds()
		to.IdleEnergyCounterJ += best(ok, gw.GetIdleEnergyCounterJ(), gw.GetIdleEnergyIntegratedJ())
		to.IdleEnergyIntegratedJ += gw.GetIdleEnergyIntegratedJ()
		to.DowntimeGpuSeconds += gw.GetDowntimeGpuSeconds()
		to.DowntimeEnergyCounterJ += gw.GetDowntimeEnergyCounterJ()
		to.DowntimeIdleGpuSeconds += gw.GetDowntimeIdleGpuSeconds()
		to.DowntimeIdleEnergyCounterJ += gw.GetDowntimeIdleEnergyCounterJ()
		to.ReclaimedGpuSeconds += gw.GetReclaimedGpuSeconds()
		to.ReclaimedEnergyCounterJ += gw.GetReclaimedEnergyCounterJ()
		to.ReclaimedEnergyIntegratedJ += gw.GetReclaimedEnergyIntegratedJ()
		to.Samples += gw.GetSamples()
		to.PowerMaxW = max(to.GetPowerMaxW(), gw.GetPowerMaxW())
	}
	if len(b.GetHostEnergy()) > 0 {
		if len(r.HostEnergy) == 0 {
			r.HostEnergy = []*trainmeterv1.HostEnergy{{Start: r.GetWindowStart(), DramOk: true}}
		}
		h := r.HostEnergy[0]
		for _, e := range b.GetHostEnergy() {
			h.End = e.GetEnd()
			h.CpuEnergyJ += e.GetCpuEnergyJ()
			h.DramEnergyJ += e.GetDramEnergyJ()
			h.IdleCpuEnergyJ += e.GetIdleCpuEnergyJ()
			h.IdleDramEnergyJ += e.GetIdleDramEnergyJ()
		}
	}
	return r
}

// rolledOf is a node's rolled_ns (0004_rolled.sql) as a bound: the
// records starting before it are added to the rollups and daily usage by
// the transaction that stores them; NULL (none added yet) is below all.
func rolledOf(ns *int64) int64 {
	if ns == nil {
		return math.MinInt64
	}
	return *ns
}

// rollups are a batch's additions to its node's rollups.
type rollups struct {
	runs  []*trainmeterv1.RunWindow // stored windows, locked prices included
	node  *trainmeterv1.Batch       // the stored node record, or nil
	start int64                     // the batch's window start
	loss  []*trainmeterv1.DataLoss  // node loss records that count
}

// nodeRollKey is a node_rollups row of one node.
type nodeRollKey struct {
	start int64
	lock  string
}

// rollupRows are a node's rollup rows being added to: ingest's rows of
// one batch (read first, then added to), or an import's of one minute.
type rollupRows struct {
	runs  map[runRollKey]*trainmeterv1.RunWindow
	nodes map[nodeRollKey]*trainmeterv1.Batch
}

func newRollupRows() *rollupRows {
	return &rollupRows{runs: map[runRollKey]*trainmeterv1.RunWindow{}, nodes: map[nodeRollKey]*trainmeterv1.Batch{}}
}

func (r rollups) empty() bool { return len(r.runs) == 0 && r.node == nil && len(r.loss) == 0 }

func (r rollups) nodeKey() nodeRollKey {
	return nodeRollKey{dayMinute(r.node.GetWindowStart()), string(lockOf(r.node.GetPriceLocked(), r.node.LockedUsdPerGpuHour, r.node.LockedUsdPerJoule, r.node.GetLockedPriceSource()))}
}

func (r rollups) lossKey() nodeRollKey { return nodeRollKey{minuteOf(r.start), string(lossesLock)} }

// add adds a batch's additions (or an imported record's) to the rows.
func (rr *rollupRows) add(r rollups) {
	for _, w := range r.runs {
		k := runRollKeyOf(w)
		rr.runs[k] = addRunWindow(rr.runs[k], w)
	}
	if r.node != nil {
		k := r.nodeKey()
		rr.nodes[k] = addNodeRecord(rr.nodes[k], r.node)
	}
	if len(r.loss) > 0 {
		k := r.lossKey()
		lr := rr.nodes[k]
		if lr == nil {
			lr = &trainmeterv1.Batch{WindowStart: timestamppb.New(time.Unix(0, k.start))}
			rr.nodes[k] = lr
		}
		lr.NodeLosses = append(lr.NodeLosses, r.loss...)
	}
}

// queue queues the rows' writes, each replacing the row it was read as.
func (rr *rollupRows) queue(q *pgx.Batch, node string) error {
	for k, w := range rr.runs {
		val, err := proto.Marshal(w)
		if err != nil {
			return err
		}
		q.Queue(`INSERT INTO run_rollups (node, run_id, start_ns, lock, w) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (node, run_id, start_ns, lock) DO UPDATE SET w = EXCLUDED.w`, node, k.run, k.start, []byte(k.lock), val)
	}
	for k, b := range rr.nodes {
		val, err := proto.Marshal(b)
		if err != nil {
			return err
		}
		q.Queue(`INSERT INTO node_rollups (node, start_ns, lock, b) VALUES ($1, $2, $3, $4)
			ON CONFLICT (node, start_ns, lock) DO UPDATE SET b = EXCLUDED.b`, node, k.start, []byte(k.lock), val)
	}
	return nil
}

// queueRollups reads the node's rollup rows the batch adds to, adds it and
// queues their writes. The transaction holds the node's row, so no other
// transaction writes these rows meanwhile.
func queueRollups(tx pgx.Tx, q *pgx.Batch, node string, r rollups) error {
	ctx := context.Background()
	rr := newRollupRows()
	var runIDs []string
	var runStarts []int64
	for _, w := range r.runs {
		k := runRollKeyOf(w)
		if _, ok := rr.runs[k]; !ok {
			rr.runs[k] = nil
			runIDs, runStarts = append(runIDs, k.run), append(runStarts, k.start)
		}
	}
	var nodeStarts []int64
	if r.node != nil {
		k := r.nodeKey()
		rr.nodes[k] = nil
		nodeStarts = append(nodeStarts, k.start)
	}
	if len(r.loss) > 0 {
		k := r.lossKey()
		rr.nodes[k] = nil
		nodeStarts = append(nodeStarts, k.start)
	}
	var sel pgx.Batch
	sel.Queue(`SELECT run_id, start_ns, lock, w FROM run_rollups WHERE node = $1 AND run_id = ANY($2) AND start_ns = ANY($3)`,
		node, runIDs, runStarts).Query(func(rows pgx.Rows) error {
		var k runRollKey
		var lock, val []byte
		_, err := pgx.ForEachRow(rows, []any{&k.run, &k.start, &lock, &val}, func() error {
			k.lock = string(lock)
			if _, ok := rr.runs[k]; !ok {
				return nil
			}
			w := &trainmeterv1.RunWindow{}
			rr.runs[k] = w
			return proto.Unmarshal(val, w)
		})
		return err
	})
	sel.Queue(`SELECT start_ns, lock, b FROM node_rollups WHERE node = $1 AND start_ns = ANY($2)`, node, nodeStarts).Query(func(rows pgx.Rows) error {
		var k nodeRollKey
		var lock, val []byte
		_, err := pgx.ForEachRow(rows, []any{&k.start, &lock, &val}, func() error {
			k.lock = string(lock)
			if _, ok := rr.nodes[k]; !ok {
				return nil
			}
			b := &trainmeterv1.Batch{}
			rr.nodes[k] = b
			return proto.Unmarshal(val, b)
		})
		return err
	})
	if err := tx.SendBatch(ctx, &sel).Close(); err != nil {
		return err
	}
	rr.add(r)
	return rr.queue(q, node)
}
