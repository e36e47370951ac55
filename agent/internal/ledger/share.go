package ledger

import (
	"os/user"
	"slices"
	"sort"
	"strconv"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Conservation and shared GPUs (docs/measurement.md, "Shared GPUs and idle").
//
// Every closed window is cut, per GPU, into pieces during which the set of
// runs on that GPU does not change. A piece's energy and GPU-seconds go to
// those runs, split by their share of the GPU's work, or to the GPU's idle
// share when no run is on it. The shares of a piece sum to one, so for every
// GPU and window: sum over runs + idle = the GPU's energy and GPU-seconds.

// Share methods, as RunWindow.share_method and the CSV gpu_share_method.
const (
	ShareExclusive   = "exclusive"
	ShareUtilization = "utilization"
	ShareMemory      = "memory"
	ShareEqual       = "equal"
	ShareMIG         = "mig"
	ShareMixed       = "mixed"
)

// RunWork is what one run's processes did on one GPU, as last polled (off
// the sampling path): SM utilisation (NVML per-process utilisation, or the
// load the run reports on a simulated GPU) and GPU memory.
type RunWork struct {
	SMPct  float64
	SMOK   bool
	MemMiB float64
	MemOK  bool
	// MIGSlices is the compute slices of the MIG instance the run is on;
	// runs on different instances of one GPU split it by slices.
	MIGSlices int
}

// SetWork replaces GPU g's per-run work (run id -> work) with a fresh poll.
// Runs missing from work have no process known on g.
func (l *Ledger) SetWork(g int, work map[string]RunWork) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g < 0 || g >= len(l.work) {
		return
	}
	l.work[g] = work
}

// setSimWork records, on a simulated GPU, the load a run's steps report as
// its utilisation of g, and drives the GPU's load with the sum over runs.
func (l *Ledger) setSimWork(g int, id string, load float64) float64 {
	if l.simWork[g] == nil {
		l.simWork[g] = map[string]RunWork{}
	}
	// An ended run keeps its entry until the window it ended in closes (the
	// split of that window needs it) but no longer loads the GPU.
	if load >= 0 {
		l.simWork[g][id] = RunWork{SMPct: 100 * load, SMOK: true}
	}
	var sum float64
	for rid, w := range l.simWork[g] {
		if r := l.runs[rid]; r != nil && !r.ended && (load >= 0 || rid != id) {
			sum += w.SMPct / 100
		}
	}
	return min(sum, 1)
}

// forgetSimWork drops a closed run's simulated loads.
func (l *Ledger) forgetSimWork(id string) {
	for _, m := range l.simWork {
		delete(m, id)
	}
}

// piece is a stretch of a window during which the same runs are on a GPU.
type piece struct {
	a, b time.Time
	runs []*run
	// weight of each run (same order as runs) and how it was decided.
	weights []float64
	method  string
}

// active reports whether r is running at t (the same rule as its segments).
func (r *run) active(t time.Time) bool {
	return !t.Before(r.start) && (!r.ended || t.Before(r.end))
}

// occupancy cuts [ws, we) per GPU into pieces at every run start, end and
// GPU-set change, with the runs on the GPU in each and their shares.
func (l *Ledger) occupancy(ws, we time.Time) [][]piece {
	cuts := []time.Time{ws, we}
	add := func(t time.Time) {
		if t.After(ws) && t.Before(we) {
			cuts = append(cuts, t)
		}
	}
	for _, id := range l.order {
		r := l.runs[id]
		add(r.start)
		if r.ended {
			add(r.end)
		}
		for _, c := range r.gpuChanges {
			add(c.at)
		}
	}
	sort.Slice(cuts, func(i, j int) bool { return cuts[i].Before(cuts[j]) })
	cuts = slices.CompactFunc(cuts, func(x, y time.Time) bool { return x.Equal(y) })

	out := make([][]piece, len(l.meters))
	for i := 0; i+1 < len(cuts); i++ {
		a, b := cuts[i], cuts[i+1]
		on := make([][]*run, len(l.meters))
		for _, id := range l.order {
			r := l.runs[id]
			if !r.active(a) {
				continue
			}
			for _, g := range r.gpusAt(a) {
				on[g] = append(on[g], r)
			}
		}
		for g := range out {
			p := piece{a: a, b: b, runs: on[g]}
			p.weights, p.method = l.shares(g, on[g])
			out[g] = append(out[g], p)
		}
	}
	return out
}

// shares splits GPU g between runs: by MIG compute slices when the runs sit
// on different MIG instances, else by SM utilisation when every run has a
// process known on g, else by GPU memory likewise, else equally.
func (l *Ledger) shares(g int, runs []*run) ([]float64, string) {
	switch len(runs) {
	case 0:
		return nil, ""
	case 1:
		return []float64{1}, ShareExclusive
	}
	work := l.work[g]
	if len(work) == 0 {
		work = l.simWork[g]
	}
	by := func(f func(RunWork) (float64, bool)) []float64 {
		ws := make([]float64, len(runs))
		var sum float64
		for i, r := range runs {
			w, ok := work[r.id]
			v, vok := f(w)
			if !ok || !vok || v < 0 {
				return nil
			}
			ws[i] = v
			sum += v
		}
		if sum <= 0 {
			return nil
		}
		for i := range ws {
			ws[i] /= sum
		}
		return ws
	}
	if ws := by(func(w RunWork) (float64, bool) { return float64(w.MIGSlices), w.MIGSlices > 0 }); ws != nil {
		return ws, ShareMIG
	}
	if ws := by(func(w RunWork) (float64, bool) { return w.SMPct, w.SMOK }); ws != nil {
		return ws, ShareUtilization
	}
	if ws := by(func(w RunWork) (float64, bool) { return w.MemMiB, w.MemOK }); ws != nil {
		return ws, ShareMemory
	}
	ws := make([]float64, len(runs))
	for i := range ws {
		ws[i] = 1 / float64(len(runs))
	}
	return ws, ShareEqual
}

// gpuPart is a share of one GPU's energy and time.
type gpuPart struct {
	counterJ, integratedJ, gapS float64
	counterOK, estimated        bool
	gpuS, sharedS               float64
	maxRuns                     int
	methods                     []string
}

// measure adds the weight-scaled energy of GPU g over [a, b) ∩ p.
func (l *Ledger) measure(g int, a, b time.Time, w float64, part *gpuPart) {
	ca, okA := l.meters[g].At(a)
	cb, okB := l.meters[g].At(b)
	part.integratedJ += w * (cb.IntegratedJ - ca.IntegratedJ)
	part.gapS += w * (cb.GapS - ca.GapS)
	if ca.CounterOK && cb.CounterOK {
		part.counterJ += w * (cb.CounterJ - ca.CounterJ)
	} else {
		part.counterOK = false
	}
	if !okA || !okB || ca.Estimated || cb.Estimated {
		part.estimated = true
	}
	part.gpuS += w * b.Sub(a).Seconds()
}

// runShare is run r's share of GPU g over [a, b).
func (l *Ledger) runShare(occ [][]piece, r *run, g int, a, b time.Time) gpuPart {
	part := gpuPart{counterOK: true}
	if g >= len(occ) {
		return part
	}
	for _, p := range occ[g] {
		x, y := later(p.a, a), earlier(p.b, b)
		if !x.Before(y) {
			continue
		}
		i := slices.Index(p.runs, r)
		if i < 0 {
			// Not among the runs at the piece's start: cannot happen for
			// cuts taken from every run's changes; count it whole rather
			// than lose it.
			l.measure(g, x, y, 1, &part)
			continue
		}
		l.measure(g, x, y, p.weights[i], &part)
		part.maxRuns = max(part.maxRuns, len(p.runs))
		if len(p.runs) > 1 {
			part.sharedS += y.Sub(x).Seconds()
		}
		if !slices.Contains(part.methods, p.method) {
			part.methods = append(part.methods, p.method)
		}
	}
	return part
}

// idlePart is GPU g's idle share of a window: its pieces with no run.
func (l *Ledger) idlePart(g int, pieces []piece) gpuPart {
	part := gpuPart{counterOK: true}
	for _, p := range pieces {
		if len(p.runs) == 0 {
			l.measure(g, p.a, p.b, 1, &part)
		}
	}
	return part
}

func later(x, y time.Time) time.Time {
	if x.After(y) {
		return x
	}
	return y
}

func earlier(x, y time.Time) time.Time {
	if x.Before(y) {
		return x
	}
	return y
}

// combineMethods names how a run's GPUs were split over a segment or run:
// exclusive when never shared, the one rule used when shared, else mixed.
func combineMethods(ms []string) string {
	var shared []string
	for _, m := range ms {
		if m != ShareExclusive && m != "" && !slices.Contains(shared, m) {
			shared = append(shared, m)
		}
	}
	switch len(shared) {
	case 0:
		if len(ms) == 0 {
			return ""
		}
		return ShareExclusive
	case 1:
		return shared[0]
	}
	return ShareMixed
}

// bookIdle sets GPU window gw's own length and idle share, plus what expired
// restored runs had held on it (reclaimed: idle after all).
func (l *Ledger) bookIdle(gw *trainmeterv1.GpuWindow, g int, ws, we time.Time, pieces []piece) {
	gw.GpuSeconds = we.Sub(ws).Seconds()
	idle := l.idlePart(g, pieces)
	rc := l.reclaim[g]
	l.reclaim[g] = gpuPart{}
	gw.IdleGpuSeconds = idle.gpuS + rc.gpuS
	gw.IdleEnergyIntegratedJ = idle.integratedJ + rc.integratedJ
	gw.ReclaimedGpuSeconds = rc.gpuS
	gw.ReclaimedEnergyIntegratedJ = rc.integratedJ
	if gw.CounterOk {
		gw.IdleEnergyCounterJ = idle.counterJ + rc.counterJ
		gw.ReclaimedEnergyCounterJ = rc.counterJ
	}
}

// bookDowntime sets, on the first window after a restore, each GPU's energy
// and time while the agent was down (from the raw counters), and the part
// of it no restored run was on (idle). The restored runs' parts go out in
// their restart_bridge windows (holdBridge splits it between them).
func (l *Ledger) bookDowntime(b *trainmeterv1.Batch, ws time.Time) {
	if l.downtimeDone || l.snapGPUs == nil || len(l.snapGPUs) == 0 {
		return
	}
	l.downtimeDone = true
	from := l.snapTime
	if !from.Before(ws) {
		return
	}
	for g, gw := range b.GpuWindows {
		d, ok := l.downtimeJ(g, ws)
		if !ok {
			continue
		}
		secs := ws.Sub(from).Seconds()
		gw.DowntimeGpuSeconds = secs
		gw.DowntimeEnergyCounterJ = d
		l.downtimeSharers[g] = len(l.restoredOn(g))
		if l.downtimeSharers[g] == 0 {
			gw.DowntimeIdleGpuSeconds = secs
			gw.DowntimeIdleEnergyCounterJ = d
		}
	}
}

// restoredOn lists the restored runs on GPU g at the checkpoint.
func (l *Ledger) restoredOn(g int) []*run {
	var out []*run
	for _, id := range l.order {
		r := l.runs[id]
		if r.restored && r.bridge != nil && slices.Contains(r.gpusAt(r.bridge.From), g) {
			out = append(out, r)
		}
	}
	return out
}

// heldGPU is what a restored run's bridge holds of one GPU, so that it can
// be given back to the GPU's idle share if no rank returns.
type heldGPU struct {
	CounterJ    float64 `json:"counter_j"`
	IntegratedJ float64 `json:"integrated_j"`
	GPUSeconds  float64 `json:"gpu_seconds"`
	SharedS     float64 `json:"shared_s"`
}

// holdShares adds a segment's per-GPU shares to held.
func holdShares(held map[int]*heldGPU, w *trainmeterv1.RunWindow) map[int]*heldGPU {
	if held == nil {
		held = map[int]*heldGPU{}
	}
	for _, s := range w.GpuShares {
		h := held[int(s.Gpu)]
		if h == nil {
			h = &heldGPU{}
			held[int(s.Gpu)] = h
		}
		h.CounterJ += s.EnergyCounterJ
		h.IntegratedJ += s.EnergyIntegratedJ
		h.GPUSeconds += s.GpuSeconds
		h.SharedS += s.SharedGpuSeconds
	}
	return held
}

func appendNew(xs []string, x string) []string {
	if x == "" || slices.Contains(xs, x) {
		return xs
	}
	return append(xs, x)
}

// reclaimBridge books what an expired restored run held as idle.
func (l *Ledger) reclaimBridge(b *bridge) {
	for g, h := range b.PerGPU {
		if g < 0 || g >= len(l.reclaim) {
			continue
		}
		l.reclaim[g].counterJ += h.CounterJ
		l.reclaim[g].integratedJ += h.IntegratedJ
		l.reclaim[g].gpuS += h.GPUSeconds
	}
}

// userName resolves uid to a user name on this host (cached; "" when it
// has none), for usage by user.
func (l *Ledger) userName(uid int32) string {
	if uid < 0 {
		return ""
	}
	if name, ok := l.users[uid]; ok {
		return name
	}
	name := ""
	if u, err := user.LookupId(strconv.Itoa(int(uid))); err == nil {
		name = u.Username
	}
	if l.users == nil {
		l.users = map[int32]string{}
	}
	l.users[uid] = name
	return name
}

// SharedRun is a live run for the agent's share poller: the processes it
// knows (the root of its attributed tree and its ranks' socket peers) and
// its GPUs now.
type SharedRun struct {
	ID    string
	Roots []int
	GPUs  []int
}

// SharedRuns lists the live runs with their known processes and GPUs.
func (l *Ledger) SharedRuns(now time.Time) []SharedRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []SharedRun
	for _, id := range l.order {
		r := l.runs[id]
		if r.ended {
			continue
		}
		sr := SharedRun{ID: id, GPUs: append([]int(nil), r.gpusAt(now)...)}
		if r.attributePID > 0 {
			sr.Roots = append(sr.Roots, r.attributePID)
		}
		for _, pid := range r.peerPIDs {
			if pid > 0 && !slices.Contains(sr.Roots, int(pid)) {
				sr.Roots = append(sr.Roots, int(pid))
			}
		}
		for _, pid := range r.ownedPIDs {
			if !slices.Contains(sr.Roots, pid) {
				sr.Roots = append(sr.Roots, pid)
			}
		}
		out = append(out, sr)
	}
	return out
}
