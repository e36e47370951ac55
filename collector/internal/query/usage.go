package query

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Idle, deleted and unlabeled group names in usage rows.
const (
	IdleKey      = "(idle)"
	DeletedKey   = "(deleted)"
	UnlabeledKey = "(unlabeled)"
)

// locked is the price a record was stored with (RunWindow, Batch:
// locked_*); priced false: stored unpriced, priced when read.
type locked struct {
	priced, hasGPUPrice, hasEnergyPrice bool
	usdPerGPUHour, usdPerJoule          float64
	source                              string
}

func lockOfWindow(w *trainmeterv1.RunWindow) locked {
	return locked{priced: w.GetPriceLocked(), hasGPUPrice: w.LockedUsdPerGpuHour != nil, hasEnergyPrice: w.LockedUsdPerJoule != nil,
		usdPerGPUHour: w.GetLockedUsdPerGpuHour(), usdPerJoule: w.GetLockedUsdPerJoule(), source: w.GetLockedPriceSource()}
}

func lockOfBatch(b *trainmeterv1.Batch) locked {
	return locked{priced: b.GetPriceLocked(), hasGPUPrice: b.LockedUsdPerGpuHour != nil, hasEnergyPrice: b.LockedUsdPerJoule != nil,
		usdPerGPUHour: b.GetLockedUsdPerGpuHour(), usdPerJoule: b.GetLockedUsdPerJoule(), source: b.GetLockedPriceSource()}
}

// LabelAliases name the label keys that schedulers' runs carry
// (docs/attribution.md): --by account is --by label:slurm.account.
var LabelAliases = map[string]string{
	"account":   "label:slurm.account",
	"partition": "label:slurm.partition",
	"namespace": "label:k8s.namespace",
}

// checkBy refuses an unknown grouping and returns by with the aliases
// replaced by the label keys they name.
func checkBy(by []string) ([]string, error) {
	out := make([]string, len(by))
	for i, b := range by {
		if l, ok := LabelAliases[b]; ok {
			b = l
		}
		switch {
		case b == "node", b == "gpu", b == "model", b == "user":
		case strings.HasPrefix(b, "label:") && len(b) > len("label:"):
		default:
			return nil, fmt.Errorf("unknown grouping %q: use node, gpu, model, user, account, partition, namespace or label:KEY", b)
		}
		out[i] = b
	}
	return out, nil
}

// windowEnergy is the best energy of a window: its counter when valid.
func windowEnergy(counterOK bool, counterJ, integratedJ float64) float64 {
	if counterOK {
		return counterJ
	}
	return integratedJ
}

type usageAcc struct {
	row     *trainmeterv1.UsageRow
	runs    map[string]struct{}
	sources map[string]struct{}
	// cost is the sum of the priced parts; unpriced: a part had no price,
	// so the row's cost is unknown.
	cost     float64
	unpriced bool
}

// Usage implements QueryService.Usage: GPU time, energy and cost over a
// period, grouped, with an idle row per node and rows for deleted runs; the
// rows add up to the nodes' totals (their GPU-window figures plus any agent
// downtime bridged).
func (s *Server) Usage(_ context.Context, req *trainmeterv1.UsageRequest) (*trainmeterv1.UsageResponse, error) {
	by := req.GetBy()
	if len(by) == 0 {
		by = []string{"node"}
	}
	asked := by // the response names the groups as asked (account, not label:slurm.account)
	by, err := checkBy(by)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	since, until := timeOf(req.GetSince()), timeOf(req.GetUntil())
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return nil, status.Errorf(codes.InvalidArgument, "--since (%s) must be before --until (%s)", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	if req.GetPerDay() {
		if since.IsZero() || until.IsZero() {
			return nil, status.Error(codes.InvalidArgument, "per_day needs since and until")
		}
		if until.Sub(since) > maxUsageDays*24*time.Hour {
			return nil, status.Errorf(codes.InvalidArgument, "per_day: at most %d days", maxUsageDays)
		}
	}
	// The runs are read after the scan, only those with windows in the
	// period: the scan's records are kept in their order and added then
	// (sums of floats depend on their order).
	byRun := map[string]*usageRun{}
	// The whole period's tally, and with per_day each UTC day's: every
	// window counts in the period and in the day it starts in.
	whole := newUsageTally()
	days := map[int64]*usageTally{}
	tallies := func(ts *timestamppb.Timestamp) []*usageTally {
		if !req.GetPerDay() {
			return []*usageTally{whole}
		}
		d := ts.AsTime().Unix() / 86400
		if ts.AsTime().Unix() < 0 && ts.AsTime().Unix()%86400 != 0 {
			d--
		}
		t := days[d]
		if t == nil {
			t = newUsageTally()
			days[d] = t
		}
		return []*usageTally{whole, t}
	}
	gpuNames := map[string]string{}
	if ns, err := s.store.Nodes(); err == nil {
		for _, n := range ns {
			for _, g := range n.GetGpus() {
				gpuNames[n.GetNode()] = g.GetName()
			}
		}
	}
	// A deleted run's windows are rows of their own ("(deleted)"): the
	// node used that GPU time and energy.
	add := func(t *usageTally, keys []string, idleNode string, deleted bool, runID string, gpuS, energyJ, runPrice float64, node, gpuName string, lock locked) {
		k := strings.Join(keys, "\x00") + "\x00" + idleNode + "\x00" + strconv.FormatBool(deleted)
		a := t.groups[k]
		if a == nil {
			a = &usageAcc{row: &trainmeterv1.UsageRow{Keys: keys, IdleNode: idleNode, Idle: idleNode != "", Deleted: deleted},
				runs: map[string]struct{}{}, sources: map[string]struct{}{}}
			t.groups[k] = a
		}
		a.row.GpuSeconds += gpuS
		a.row.EnergyJ += energyJ
		if runID != "" {
			a.runs[runID] = struct{}{}
		}
		price, src, ok := s.pricing.GPUPrice(runPrice, node, gpuName)
		energyUSD, _, eok := s.pricing.EnergyCost(nil, energyJ)
		if lock.priced {
			// Priced as stored (docs/costs.md, "Locked prices").
			price, src, ok = lock.usdPerGPUHour, lock.source, lock.hasGPUPrice
			energyUSD, eok = energyJ*lock.usdPerJoule, lock.hasEnergyPrice
		}
		if !ok && !eok {
			a.unpriced = true
			return
		}
		a.cost += gpuS/3600*price + energyUSD
		if ok {
			a.sources[src] = struct{}{}
		}
	}
	// keysFor is the keys of a row of run r; none (IdleKey, DeletedKey)
	// where there is no run to group by.
	keysFor := func(node string, gpu uint32, hasGPU bool, r *usageRun, none string) []string {
		keys := make([]string, len(by))
		for i, b := range by {
			switch {
			case b == "node":
				keys[i] = node
			case b == "gpu":
				keys[i] = node + "/" + strconv.Itoa(int(gpu))
				if !hasGPU {
					keys[i] = node + "/?"
				}
			case r == nil:
				keys[i] = none
			case b == "model":
				keys[i] = r.GetRunStart().GetMetadata().GetModel()
				if keys[i] == "" {
					keys[i] = UnlabeledKey
				}
			case b == "user":
				switch {
				case r.GetRunStart().GetUser() != "":
					keys[i] = r.GetRunStart().GetUser()
				case r.GetRunStart() != nil:
					keys[i] = "uid " + strconv.Itoa(int(r.GetRunStart().GetUid()))
				default:
					keys[i] = UnlabeledKey
				}
			default:
				v, ok := r.GetRunStart().GetLabels()[strings.TrimPrefix(b, "label:")]
				if !ok || v == "" {
					v = UnlabeledKey
				}
				keys[i] = v
			}
		}
		return keys
	}
	perGPU := slices.Contains(by, "node") || slices.Contains(by, "gpu")
	// addWindow adds a run window, by GPU share (whole GPUs for a window
	// from an agent before shares), to the rows of run r (nil: none, none
	// names the rows).
	addWindow := func(node string, w *trainmeterv1.RunWindow, r *usageRun, none string, deleted bool, runID string, price float64, name string) {
		ts := tallies(w.GetStart())
		shares := w.GetGpuShares()
		if len(shares) == 0 {
			g, has := uint32(0), len(w.GetGpus()) == 1
			if has {
				g = w.GetGpus()[0]
			}
			keys := keysFor(node, g, has, r, none)
			for _, t := range ts {
				add(t, keys, "", deleted, runID, w.GetGpuSeconds(),
					windowEnergy(w.GetCounterOk(), w.GetEnergyCounterJ(), w.GetEnergyIntegratedJ()), price, node, name, lockOfWindow(w))
			}
			return
		}
		// Without node or gpu in by, every share of the window has the
		// same keys.
		var keys []string
		for _, sh := range shares {
			if keys == nil || perGPU {
				keys = keysFor(node, sh.GetGpu(), true, r, none)
			}
			for _, t := range ts {
				add(t, keys, "", deleted, runID, sh.GetGpuSeconds(),
					windowEnergy(w.GetCounterOk(), sh.GetEnergyCounterJ(), sh.GetEnergyIntegratedJ()), price, node, name, lockOfWindow(w))
			}
		}
	}
	var replay []func()
	err = s.store.UsageScan(since, until, func(node string, b *trainmeterv1.Batch) error {
		replay = append(replay, func() { s.usageBatch(node, b, tallies, add, keysFor, gpuNames) })
		return nil
	}, func(runID, node string, w *trainmeterv1.RunWindow) error {
		byRun[runID] = nil
		replay = append(replay, func() {
			r := byRun[runID]
			var price float64
			name := gpuNames[node]
			if r != nil {
				price = r.GetRunStart().GetGpuPricePerHour()
				if r.GetRunStart().GetGpuName() != "" {
					name = r.GetRunStart().GetGpuName()
				}
			}
			addWindow(node, w, r, IdleKey, false, runID, price, name)
		})
		return nil
	}, func(node string, d *storev1.DeletedRunWindow) error {
		// As a run's window above, at the run's own price; counted by
		// its deletion, the run having no name any more.
		replay = append(replay, func() {
			addWindow(node, d.GetWindow(), nil, DeletedKey, true, "deleted:"+strconv.FormatUint(d.GetDeletion(), 16),
				d.GetGpuPricePerHour(), cmp.Or(d.GetGpuName(), gpuNames[node]))
		})
		return nil
	})
	if err != nil {
		return nil, s.storeErr(err)
	}
	if err := s.periodRuns(byRun); err != nil {
		return nil, s.storeErr(err)
	}
	for _, f := range replay {
		f()
	}
	out := &trainmeterv1.UsageResponse{By: asked, Since: req.GetSince(), Until: req.GetUntil(), LabelKeys: labelKeys(byRun)}
	out.Rows, out.Nodes = whole.finish()
	for _, d := range slices.Sorted(maps.Keys(days)) {
		t0 := time.Unix(d*86400, 0).UTC()
		day := &trainmeterv1.UsageDay{Since: timestamppb.New(maxTime(t0, since)), Until: timestamppb.New(minTime(t0.Add(24*time.Hour), until))}
		day.Rows, day.Nodes = days[d].finish()
		out.Days = append(out.Days, day)
	}
	return out, nil
}

// labelKeys is the label keys of runs, sorted.
func labelKeys(runs map[string]*usageRun) []string {
	keys := map[string]struct{}{}
	for _, r := range runs {
		for k := range r.GetRunStart().GetLabels() {
			keys[k] = struct{}{}
		}
	}
	return slices.Sorted(maps.Keys(keys))
}

// usageRun is what Usage reads of a run: its start (nil: the run has
// none); a nil *usageRun is a run not stored (any more).
type usageRun struct{ start *trainmeterv1.RunStart }

func (r *usageRun) GetRunStart() *trainmeterv1.RunStart {
	if r == nil {
		return nil
	}
	return r.start
}

// runStarter is a store that reads runs' starts alone, without decoding
// the rest of their aggregates (the BadgerDB store); Usage reads whole
// runs from a store that does not.
type runStarter interface {
	// RunStarts returns the RunStart of each of ids that is stored (nil:
	// the run has none); an id not stored is not in the map. The starts
	// may be shared with other calls: they are only read.
	RunStarts(ids []string) (map[string]*trainmeterv1.RunStart, error)
}

// periodRuns fills byRun (a key per run id with windows in the period)
// with the runs' starts; a run gone since its windows were scanned stays
// nil (its windows' rows are named as a run's without one).
func (s *Server) periodRuns(byRun map[string]*usageRun) error {
	ids := slices.Sorted(maps.Keys(byRun))
	if len(ids) == 0 {
		return nil
	}
	if rs, ok := s.store.(runStarter); ok {
		starts, err := rs.RunStarts(ids)
		if err != nil {
			return err
		}
		for id, st := range starts {
			byRun[id] = &usageRun{start: st}
		}
		return nil
	}
	runs, err := s.store.ListRuns(ids)
	var nf *storage.NotFoundError
	if errors.As(err, &nf) {
		missing := map[string]bool{}
		for _, id := range nf.IDs {
			missing[id] = true
		}
		ids = slices.DeleteFunc(ids, func(id string) bool { return missing[id] })
		if len(ids) == 0 {
			return nil
		}
		runs, err = s.store.ListRuns(ids)
	}
	if err != nil {
		return err
	}
	for _, r := range runs {
		byRun[r.RunId] = &usageRun{start: r.GetRunStart()}
	}
	return nil
}

// usageBatch adds a GPU-window record (and its node losses) to the
// tallies of its window.
func (s *Server) usageBatch(node string, b *trainmeterv1.Batch, tallies func(*timestamppb.Timestamp) []*usageTally,
	add func(t *usageTally, keys []string, idleNode string, deleted bool, runID string, gpuS, energyJ, runPrice float64, node, gpuName string, lock locked),
	keysFor func(node string, gpu uint32, hasGPU bool, r *usageRun, none string) []string, gpuNames map[string]string) {
	for _, t := range tallies(b.GetWindowStart()) {
		t.addBatch(node, b, func(keys []string, idleS, idleE float64) {
			add(t, keys, node, false, "", idleS, idleE, 0, node, gpuNames[node], lockOfBatch(b))
		}, func(gpu uint32) []string { return keysFor(node, gpu, true, nil, IdleKey) })
	}
	// Dropped on the agent: beside the node's figures, never in them
	// (nor in the rows, whose runs carry their own lost_* figures);
	// in the day of the first window they held.
	for _, l := range b.GetNodeLosses() {
		at := cmp.Or(l.GetFirstWindowStart(), l.GetWindowStart(), b.GetWindowStart())
		for _, t := range tallies(at) {
			t.addLoss(node, l)
		}
	}
}

// maxUsageDays bounds a per_day request: a day's tally each.
const maxUsageDays = 366

// usageTally is the groups and node totals of one span (the period, or a
// day of it).
type usageTally struct {
	groups map[string]*usageAcc
	nodes  map[string]*trainmeterv1.NodeUsage
}

func newUsageTally() *usageTally {
	return &usageTally{groups: map[string]*usageAcc{}, nodes: map[string]*trainmeterv1.NodeUsage{}}
}

func (t *usageTally) node(name string) *trainmeterv1.NodeUsage {
	n := t.nodes[name]
	if n == nil {
		n = &trainmeterv1.NodeUsage{Node: name}
		t.nodes[name] = n
	}
	return n
}

// addBatch adds a batch's GPU windows (idle gets a row: idle(keys, s, J))
// and host energy to the node's totals.
func (t *usageTally) addBatch(node string, b *trainmeterv1.Batch, idle func(keys []string, s, j float64), keys func(gpu uint32) []string) {
	n := t.node(node)
	for _, gw := range b.GetGpuWindows() {
		e := windowEnergy(gw.GetCounterOk(), gw.GetEnergyCounterJ(), gw.GetEnergyIntegratedJ()) + gw.GetDowntimeEnergyCounterJ()
		idleE := windowEnergy(gw.GetCounterOk(), gw.GetIdleEnergyCounterJ(), gw.GetIdleEnergyIntegratedJ()) + gw.GetDowntimeIdleEnergyCounterJ()
		idleS := gw.GetIdleGpuSeconds() + gw.GetDowntimeIdleGpuSeconds()
		n.GpuSeconds += gw.GetGpuSeconds() + gw.GetDowntimeGpuSeconds()
		n.EnergyJ += e
		n.IdleGpuSeconds += idleS
		n.IdleEnergyJ += idleE
		if idleS > 0 || idleE > 0 {
			idle(keys(gw.GetGpu()), idleS, idleE)
		}
	}
	for _, h := range b.GetHostEnergy() {
		n.HostEnergyJ += h.GetCpuEnergyJ() + h.GetDramEnergyJ()
		n.IdleHostEnergyJ += h.GetIdleCpuEnergyJ() + h.GetIdleDramEnergyJ()
	}
}

func (t *usageTally) addLoss(node string, l *trainmeterv1.DataLoss) {
	n := t.node(node)
	n.LostBatches += l.GetBatches()
	n.LostGpuSeconds += l.GetGpuSeconds()
	n.LostEnergyJ += l.GetEnergyJ()
	n.LostHostEnergyJ += l.GetHostEnergyJ()
	n.LostIdleGpuSeconds += l.GetIdleGpuSeconds()
	n.LostIdleEnergyJ += l.GetIdleEnergyJ()
	n.LostIdleHostEnergyJ += l.GetIdleHostEnergyJ()
}

// finish is the tally's rows (shares of its own totals; runs, then
// deleted runs, then idle) and node totals (by node).
func (t *usageTally) finish() ([]*trainmeterv1.UsageRow, []*trainmeterv1.NodeUsage) {
	var rows []*trainmeterv1.UsageRow
	var nodes []*trainmeterv1.NodeUsage
	for _, n := range t.nodes {
		nodes = append(nodes, n)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].GetNode() < nodes[j].GetNode() })
	// Summed in node order: floating-point sums depend on their order, and
	// every query (on every replica) must give the same shares to the bit.
	var totalS, totalJ float64
	for _, n := range nodes {
		totalS += n.GetGpuSeconds()
		totalJ += n.GetEnergyJ()
	}
	for _, a := range t.groups {
		a.row.Runs = uint32(len(a.runs))
		if totalS > 0 {
			a.row.GpuShare = a.row.GetGpuSeconds() / totalS
		}
		if totalJ > 0 {
			a.row.EnergyShare = a.row.GetEnergyJ() / totalJ
		}
		for src := range a.sources {
			a.row.PriceSource = src
		}
		if len(a.sources) > 1 {
			a.row.PriceSource = "mixed"
		}
		if !a.unpriced {
			a.row.CostUsd = &a.cost
		}
		rows = append(rows, a.row)
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.GetIdle() != b.GetIdle() {
			return !a.GetIdle()
		}
		if a.GetDeleted() != b.GetDeleted() {
			return !a.GetDeleted()
		}
		if ka, kb := strings.Join(a.GetKeys(), "\x00"), strings.Join(b.GetKeys(), "\x00"); ka != kb {
			return ka < kb
		}
		return a.GetIdleNode() < b.GetIdleNode()
	})
	return rows, nodes
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
