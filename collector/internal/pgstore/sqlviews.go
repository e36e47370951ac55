package pgstore

import (
	"cmp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The plain columns the SQL views read (migrations/0002_views.sql,
// docs/sql.md): a run's report figures on its runs row, and the daily usage
// rollups, both written in the transaction that writes what they are of.

// reportPricing is the pricing a run's report columns are computed at: the
// collector's (its pricer is its aggregate.Pricing), as report --json's.
func (s *Store) reportPricing() aggregate.Pricing {
	p, _ := s.pricerNow().(aggregate.Pricing)
	return p
}

// queueRun queues the write of a run's aggregate and, from r (its report,
// as report --json shows it), the plain columns.
func queueRun(q *pgx.Batch, st *aggregate.State, r *trainmeterv1.RunReport) error {
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
	var model, gpuName *string
	if m := r.GetMetadata().GetModel(); m != "" {
		model = &m
	}
	if g := r.GetGpuName(); g != "" {
		gpuName = &g
	}
	var labels map[string]string
	if len(r.GetLabels()) > 0 {
		labels = r.GetLabels()
	}
	var uid *int64
	if r.Uid != nil {
		u := int64(r.GetUid())
		uid = &u
	}
	q.Queue(`UPDATE runs SET state = $2, start_ns = $3, end_status = $4, user_name = $5, status = $6, end_ns = $7, ended = $8,
		uid = $9, model = $10, gpu_name = $11, labels = $12, gpus = $13, nodes = $14, tokens = $15, wall_s = $16, energy_j = $17,
		energy_total_j = $18, gpu_hours = $19, cost_usd = $20, energy_cost_usd = $21, total_cost_usd = $22, j_per_token = $23,
		co2_kg = $24, incomplete = $25 WHERE run_id = $1`,
		st.RunId, val, start, nonEmpty(st.EndStatus()), nonEmpty(r.GetUser()), report.EndStatus(r), end, r.GetEnded(),
		uid, model, gpuName, labels, int32(r.GetGpus()), int32(r.GetNodes()), int64(r.GetTokensProcessed()), r.GetWallS(), r.GetEnergyJ(),
		r.GetEnergyTotalJ(), r.GetGpuHours(), r.CostUsd, r.EnergyCostUsd, r.TotalCostUsd, r.JPerToken,
		r.Co2Kg, r.GetIncomplete())
	return nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// dayKey is a usage_daily row's key but for its node.
type dayKey struct {
	day       string // YYYY-MM-DD, UTC
	kind, ref string
	gpu       int64
}

type dayPart struct {
	gpuS, energyJ, costUSD float64
	unpriced               int32
}

type dayNode struct {
	gpuS, energyJ, idleS, idleJ, hostJ, idleHostJ float64
}

// dayUsage is a node's usage_daily and usage_daily_nodes additions of one
// transaction: each record's parts as `trainmeter usage` (query.Usage)
// splits and prices them, by the UTC day of the record's start.
type dayUsage struct {
	node  string
	parts map[dayKey]*dayPart
	nodes map[string]*dayNode
}

func newDayUsage(node string) *dayUsage {
	return &dayUsage{node: node, parts: map[dayKey]*dayPart{}, nodes: map[string]*dayNode{}}
}

func dateOf(ns int64) string { return time.Unix(0, ns).UTC().Format(time.DateOnly) }

// pricer is what a part costs, as usage prices it; ok false: no price.
type pricer func(gpuS, energyJ float64) (usd float64, ok bool)

// locked prices at a record's stored price (locked_*); a record stored
// without one (priced false) usage prices when it reads it, with prices
// this SQL does not know: unknown.
func locked(priced, hasGPU, hasEnergy bool, perHour, perJ float64) pricer {
	return func(gpuS, energyJ float64) (float64, bool) {
		if !priced || (!hasGPU && !hasEnergy) {
			return 0, false
		}
		return gpuS/3600*perHour + energyJ*perJ, true
	}
}

func windowLock(w *trainmeterv1.RunWindow) pricer {
	return locked(w.GetPriceLocked(), w.LockedUsdPerGpuHour != nil, w.LockedUsdPerJoule != nil, w.GetLockedUsdPerGpuHour(), w.GetLockedUsdPerJoule())
}

func (u *dayUsage) add(k dayKey, gpuS, energyJ float64, price pricer) {
	p := u.parts[k]
	if p == nil {
		p = &dayPart{}
		u.parts[k] = p
	}
	p.gpuS += gpuS
	p.energyJ += energyJ
	usd, ok := price(gpuS, energyJ)
	if !ok {
		p.unpriced++
		return
	}
	p.costUSD += usd
}

func bestEnergy(counterOK bool, counterJ, integratedJ float64) float64 {
	if counterOK {
		return counterJ
	}
	return integratedJ
}

// runWindow adds a run window (kind run or deleted) with its stored price
// lock: by GPU share, or whole for a window without shares.
func (u *dayUsage) runWindow(kind, ref string, w *trainmeterv1.RunWindow, l pricer) {
	day := dateOf(fold.NanosOf(w.GetStart()))
	if len(w.GetGpuShares()) == 0 {
		gpu := int64(-1)
		if len(w.GetGpus()) == 1 {
			gpu = int64(w.GetGpus()[0])
		}
		u.add(dayKey{day, kind, ref, gpu}, w.GetGpuSeconds(), bestEnergy(w.GetCounterOk(), w.GetEnergyCounterJ(), w.GetEnergyIntegratedJ()), l)
		return
	}
	for _, sh := range w.GetGpuShares() {
		u.add(dayKey{day, kind, ref, int64(sh.GetGpu())}, sh.GetGpuSeconds(), bestEnergy(w.GetCounterOk(), sh.GetEnergyCounterJ(), sh.GetEnergyIntegratedJ()), l)
	}
}

// stored adds a run window as stored (run_windows: its price stamp, if
// any, in it), by ingest or by an import.
func (u *dayUsage) stored(w *trainmeterv1.RunWindow) {
	u.runWindow("run", w.GetRunId(), w, windowLock(w))
}

// deleted adds a deleted run's window as its deleted_windows record holds
// it. Unless it holds a price, usage prices it when it reads it, at the
// run's price (the deletion's): here p's, the collector's prices now.
func (u *dayUsage) deleted(w *trainmeterv1.RunWindow, d fold.Deletion, p aggregate.Pricing, nodeGPU string) {
	price := windowLock(w)
	if !w.GetPriceLocked() {
		price = func(gpuS, energyJ float64) (float64, bool) {
			perHour, _, ok := p.GPUPrice(d.Price, u.node, cmp.Or(d.GPUName, nodeGPU))
			energyUSD, _, eok := p.EnergyCost(nil, energyJ)
			return gpuS/3600*perHour + energyUSD, ok || eok
		}
	}
	u.runWindow("deleted", strconv.FormatUint(d.ID, 16), w, price)
}

// nodeRecord adds a node_windows record as stored (its price stamp, if
// any, in it), by ingest or by an import: the node's totals and its idle
// parts.
func (u *dayUsage) nodeRecord(rec *trainmeterv1.Batch) {
	day := dateOf(fold.NanosOf(rec.GetWindowStart()))
	n := u.nodes[day]
	if n == nil {
		n = &dayNode{}
		u.nodes[day] = n
	}
	l := locked(rec.GetPriceLocked(), rec.LockedUsdPerGpuHour != nil, rec.LockedUsdPerJoule != nil, rec.GetLockedUsdPerGpuHour(), rec.GetLockedUsdPerJoule())
	for _, gw := range rec.GetGpuWindows() {
		idleJ := bestEnergy(gw.GetCounterOk(), gw.GetIdleEnergyCounterJ(), gw.GetIdleEnergyIntegratedJ()) + gw.GetDowntimeIdleEnergyCounterJ()
		idleS := gw.GetIdleGpuSeconds() + gw.GetDowntimeIdleGpuSeconds()
		n.gpuS += gw.GetGpuSeconds() + gw.GetDowntimeGpuSeconds()
		n.energyJ += bestEnergy(gw.GetCounterOk(), gw.GetEnergyCounterJ(), gw.GetEnergyIntegratedJ()) + gw.GetDowntimeEnergyCounterJ()
		n.idleS += idleS
		n.idleJ += idleJ
		if idleS > 0 || idleJ > 0 {
			u.add(dayKey{day, "idle", "", int64(gw.GetGpu())}, idleS, idleJ, l)
		}
	}
	for _, h := range rec.GetHostEnergy() {
		n.hostJ += h.GetCpuEnergyJ() + h.GetDramEnergyJ()
		n.idleHostJ += h.GetIdleCpuEnergyJ() + h.GetIdleDramEnergyJ()
	}
}

// queue queues the additions.
func (u *dayUsage) queue(q *pgx.Batch) {
	for k, p := range u.parts {
		q.Queue(`INSERT INTO usage_daily (node, day, kind, ref, gpu, gpu_seconds, energy_j, cost_usd, unpriced)
			VALUES ($1, $2::date, $3, $4, $5, $6, $7, $8, $9)
			ON CONFLICT (node, day, kind, ref, gpu) DO UPDATE SET gpu_seconds = usage_daily.gpu_seconds + EXCLUDED.gpu_seconds,
			energy_j = usage_daily.energy_j + EXCLUDED.energy_j, cost_usd = usage_daily.cost_usd + EXCLUDED.cost_usd,
			unpriced = usage_daily.unpriced + EXCLUDED.unpriced`,
			u.node, k.day, k.kind, k.ref, k.gpu, p.gpuS, p.energyJ, p.costUSD, p.unpriced)
	}
	for day, n := range u.nodes {
		q.Queue(`INSERT INTO usage_daily_nodes (node, day, gpu_seconds, energy_j, idle_gpu_seconds, idle_energy_j, host_energy_j, idle_host_energy_j)
			VALUES ($1, $2::date, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (node, day) DO UPDATE SET gpu_seconds = usage_daily_nodes.gpu_seconds + EXCLUDED.gpu_seconds,
			energy_j = usage_daily_nodes.energy_j + EXCLUDED.energy_j, idle_gpu_seconds = usage_daily_nodes.idle_gpu_seconds + EXCLUDED.idle_gpu_seconds,
			idle_energy_j = usage_daily_nodes.idle_energy_j + EXCLUDED.idle_energy_j, host_energy_j = usage_daily_nodes.host_energy_j + EXCLUDED.host_energy_j,
			idle_host_energy_j = usage_daily_nodes.idle_host_energy_j + EXCLUDED.idle_host_energy_j`,
			u.node, day, n.gpuS, n.energyJ, n.idleS, n.idleJ, n.hostJ, n.idleHostJ)
	}
}

// runRollup is a run's usage_daily rows rebuilt from all its windows (a
// reprice changes their prices), on every node.
type runRollup struct {
	id    string
	nodes map[string]*dayUsage
}

func newRunRollup(id string) *runRollup { return &runRollup{id: id, nodes: map[string]*dayUsage{}} }

func (r *runRollup) window(node string, w *trainmeterv1.RunWindow) {
	u := r.nodes[node]
	if u == nil {
		u = newDayUsage(node)
		r.nodes[node] = u
	}
	u.runWindow("run", r.id, w, windowLock(w))
}

// queue replaces the run's rows of the days its windows cover (days whose
// raw windows are gone keep theirs).
func (r *runRollup) queue(q *pgx.Batch) {
	for node, u := range r.nodes {
		days := map[string]bool{}
		for k := range u.parts {
			days[k.day] = true
		}
		for day := range days {
			q.Queue(`DELETE FROM usage_daily WHERE node = $1 AND day = $2::date AND kind = 'run' AND ref = $3`, node, day, r.id)
		}
		u.queue(q)
	}
}

// queueRunDeleted makes a deleted run's usage rows the deletion's, as its
// windows become deleted_windows records.
func queueRunDeleted(q *pgx.Batch, id string, d fold.Deletion) {
	q.Queue(`UPDATE usage_daily SET kind = 'deleted', ref = $2 WHERE kind = 'run' AND ref = $1`, id, strconv.FormatUint(d.ID, 16))
}
