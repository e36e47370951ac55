package ledger

import (
	"slices"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Host energy (docs/measurement.md, "Host energy (CPU and DRAM)").
//
// The node's RAPL counters are read once a second (AddHostPoint). The
// energy between two reads, [a, b), is taken as spread evenly over that
// interval, which is cut into pieces at every run start and end inside it,
// like a GPU's window (share.go). A piece with no run is the node's idle
// host energy; a piece with one run is that run's whole; a piece with
// several runs is split between them by the CPU time their process trees
// used over [a, b), or equally when a run's CPU time is not known at both
// reads. So for every interval: Σ runs + idle = the node's energy, for the
// CPU packages and the DRAM alike.

// Host energy split rules, as HostEnergyShare.split and the report's
// host_energy_split: the GPU split's names where the rule is the same, so
// combineMethods names a run's rules for an interval as it does for a window.
const (
	HostSplitExclusive = ShareExclusive
	HostSplitCPUTime   = "cpu_time"
	HostSplitEqual     = ShareEqual
)

// HostZone is one RAPL zone's energy since the reader's first read.
type HostZone struct {
	Socket       int
	Domain, Name string
	EnergyUJ     uint64
}

// HostPoint is one read of the node's RAPL counters, as energy since the
// reader's first read (µJ, so differences are exact), and, while two or
// more runs are on the node, the CPU time of each run's process tree.
type HostPoint struct {
	T     time.Time
	Zones []HostZone
	// CPUUJ is Σ package zones; DRAMUJ Σ dram zones, valid when DRAMOK.
	CPUUJ  uint64
	DRAMUJ uint64
	DRAMOK bool
	// RunCPU is each run's process-tree CPU seconds (cumulative; a run
	// missing has no reading).
	RunCPU map[string]float64
}

// MaxHostGap is the longest time between two RAPL reads whose difference
// is booked: past it (reads refused or failing meanwhile) a counter may
// have wrapped more than once unseen (a Xeon's package counter wraps after
// 262 kJ, under 9 minutes at 500 W), so the gap is left unmeasured and the
// read starts anew.
const MaxHostGap = 5 * time.Minute

// hostState is the ledger's host energy bookkeeping.
type hostState struct {
	last *HostPoint
	// runs are the runs an interval from last on may overlap: every run
	// started since, live or ended after last.T (kept apart from l.runs,
	// which drops a run once its last window is out, possibly before the
	// interval of its end has been read).
	runs    []*run
	pending []*trainmeterv1.HostEnergy
}

// trackHostRun keeps r for the host energy split.
func (l *Ledger) trackHostRun(r *run) {
	if !slices.Contains(l.hostEnergy.runs, r) {
		l.hostEnergy.runs = append(l.hostEnergy.runs, r)
	}
	l.pruneHostRuns()
}

// pruneHostRuns drops the runs that ended before any interval still to
// come can start (at the last point, or at the first one yet to be read).
func (l *Ledger) pruneHostRuns() {
	l.hostEnergy.runs = slices.DeleteFunc(l.hostEnergy.runs, func(r *run) bool {
		return r.ended && (l.hostEnergy.last == nil || !r.end.After(l.hostEnergy.last.T))
	})
}

// AddHostPoint records a read of the node's RAPL counters: the interval
// since the previous read, split between the runs, goes out with the next
// batch (Batch.host_energy).
func (l *Ledger) AddHostPoint(p HostPoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range l.order { // runs restored after a restart, and any not yet seen
		if r := l.runs[id]; !slices.Contains(l.hostEnergy.runs, r) {
			l.hostEnergy.runs = append(l.hostEnergy.runs, r)
		}
	}
	last := l.hostEnergy.last
	if last != nil && p.T.Sub(last.T) > MaxHostGap {
		l.cfg.Logger.Warn("host energy: no RAPL read for too long, counters may have wrapped more than once: the gap is not measured",
			"gap", p.T.Sub(last.T), "max", MaxHostGap)
		last = nil
	}
	if last != nil && p.T.After(last.T) && len(last.Zones) == len(p.Zones) {
		l.hostEnergy.pending = append(l.hostEnergy.pending, l.hostInterval(last, &p))
	}
	if last == nil || p.T.After(last.T) {
		l.hostEnergy.last = &p
	}
	l.pruneHostRuns()
}

// takeHostEnergy returns the intervals waiting for a batch.
func (l *Ledger) takeHostEnergy() []*trainmeterv1.HostEnergy {
	out := l.hostEnergy.pending
	l.hostEnergy.pending = nil
	return out
}

func subUJ(b, a uint64) float64 {
	if b < a {
		return 0
	}
	return float64(b-a) / 1e6
}

// hostInterval splits the energy between points p and q.
func (l *Ledger) hostInterval(p, q *HostPoint) *trainmeterv1.HostEnergy {
	h := &trainmeterv1.HostEnergy{Start: timestamppb.New(p.T), End: timestamppb.New(q.T),
		CpuEnergyJ: subUJ(q.CPUUJ, p.CPUUJ), DramOk: p.DRAMOK && q.DRAMOK}
	if h.DramOk {
		h.DramEnergyJ = subUJ(q.DRAMUJ, p.DRAMUJ)
	}
	for i, z := range q.Zones {
		h.Zones = append(h.Zones, &trainmeterv1.RaplZoneEnergy{Socket: int32(z.Socket), Domain: z.Domain, Name: z.Name,
			EnergyJ: subUJ(z.EnergyUJ, p.Zones[i].EnergyUJ)})
	}

	a, b := p.T, q.T
	cuts := []time.Time{a, b}
	add := func(t time.Time) {
		if t.After(a) && t.Before(b) {
			cuts = append(cuts, t)
		}
	}
	for _, r := range l.hostEnergy.runs {
		add(r.start)
		if r.ended {
			add(r.end)
		}
	}
	sort.Slice(cuts, func(i, j int) bool { return cuts[i].Before(cuts[j]) })
	cuts = slices.CompactFunc(cuts, func(x, y time.Time) bool { return x.Equal(y) })

	type part struct {
		share   float64
		methods []string
	}
	parts := map[string]*part{}
	var order []string
	idle := 0.0
	total := float64(b.Sub(a))
	for i := 0; i+1 < len(cuts); i++ {
		x, y := cuts[i], cuts[i+1]
		frac := float64(y.Sub(x)) / total
		var on []*run
		for _, r := range l.hostEnergy.runs {
			if r.active(x) && !slices.ContainsFunc(on, func(o *run) bool { return o.id == r.id }) {
				on = append(on, r)
			}
		}
		if len(on) == 0 {
			idle += frac
			continue
		}
		weights, method := hostWeights(on, p, q)
		for j, r := range on {
			pt := parts[r.id]
			if pt == nil {
				pt = &part{}
				parts[r.id] = pt
				order = append(order, r.id)
			}
			pt.share += frac * weights[j]
			pt.methods = appendNew(pt.methods, method)
		}
	}
	for _, id := range order {
		pt := parts[id]
		s := &trainmeterv1.HostEnergyShare{RunId: id, Share: pt.share, CpuEnergyJ: h.CpuEnergyJ * pt.share,
			Split: combineMethods(pt.methods)}
		if h.DramOk {
			s.DramEnergyJ = h.DramEnergyJ * pt.share
		}
		c0, ok0 := p.RunCPU[id]
		c1, ok1 := q.RunCPU[id]
		if ok0 && ok1 {
			s.CpuS = proto.Float64(max(0, c1-c0))
		}
		h.Runs = append(h.Runs, s)
	}
	h.IdleCpuEnergyJ = h.CpuEnergyJ * idle
	if h.DramOk {
		h.IdleDramEnergyJ = h.DramEnergyJ * idle
	}
	return h
}

// hostWeights splits a piece between the runs on the node: by their CPU
// time over the interval when every one of them has a reading at both
// ends and some used the CPU, else equally.
func hostWeights(on []*run, p, q *HostPoint) ([]float64, string) {
	ws := make([]float64, len(on))
	if len(on) == 1 {
		ws[0] = 1
		return ws, HostSplitExclusive
	}
	var sum float64
	known := true
	for i, r := range on {
		c0, ok0 := p.RunCPU[r.id]
		c1, ok1 := q.RunCPU[r.id]
		if !ok0 || !ok1 {
			known = false
			break
		}
		ws[i] = max(0, c1-c0)
		sum += ws[i]
	}
	if known && sum > 0 {
		for i := range ws {
			ws[i] /= sum
		}
		return ws, HostSplitCPUTime
	}
	for i := range ws {
		ws[i] = 1 / float64(len(on))
	}
	return ws, HostSplitEqual
}
