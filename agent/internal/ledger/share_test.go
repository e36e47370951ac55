package ledger

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// gpuTotals is one GPU's figures over the batches: the GPU's own, the runs'
// shares of it and its idle share.
type gpuTotals struct {
	gpuJ, gpuS, runJ, runS, idleJ, idleS, downJ, downS float64
}

func conserve(bs []*trainmeterv1.Batch) map[uint32]*gpuTotals {
	out := map[uint32]*gpuTotals{}
	get := func(g uint32) *gpuTotals {
		if out[g] == nil {
			out[g] = &gpuTotals{}
		}
		return out[g]
	}
	for _, b := range bs {
		for _, gw := range b.GpuWindows {
			t := get(gw.Gpu)
			t.gpuJ += gw.EnergyCounterJ + gw.DowntimeEnergyCounterJ
			t.gpuS += gw.GpuSeconds + gw.DowntimeGpuSeconds
			t.idleJ += gw.IdleEnergyCounterJ + gw.DowntimeIdleEnergyCounterJ
			t.idleS += gw.IdleGpuSeconds + gw.DowntimeIdleGpuSeconds
			t.downJ += gw.DowntimeEnergyCounterJ
			t.downS += gw.DowntimeGpuSeconds
		}
		for _, w := range b.RunWindows {
			for _, s := range w.GpuShares {
				t := get(s.Gpu)
				t.runJ += s.EnergyCounterJ
				t.runS += s.GpuSeconds
			}
		}
	}
	return out
}

// checkConservation asserts runs + idle = the GPU, per batch (when perBatch)
// and over all batches.
func checkConservation(t *testing.T, bs []*trainmeterv1.Batch, perBatch bool) {
	t.Helper()
	if perBatch {
		for _, b := range bs {
			for g, c := range conserve([]*trainmeterv1.Batch{b}) {
				if math.Abs(c.runJ+c.idleJ-c.gpuJ) > 1e-6*math.Max(1, c.gpuJ) || math.Abs(c.runS+c.idleS-c.gpuS) > 1e-9*math.Max(1, c.gpuS) {
					t.Fatalf("batch %d gpu %d: runs %.6f J + idle %.6f J != GPU %.6f J; runs %.6f s + idle %.6f s != GPU %.6f s",
						b.Seq, g, c.runJ, c.idleJ, c.gpuJ, c.runS, c.idleS, c.gpuS)
				}
			}
		}
	}
	for g, c := range conserve(bs) {
		near(t, fmt.Sprintf("gpu %d runs+idle J", g), c.runJ+c.idleJ, c.gpuJ, 1e-9)
		near(t, fmt.Sprintf("gpu %d runs+idle GPU-s", g), c.runS+c.idleS, c.gpuS, 1e-9)
	}
}

func startOn(t *testing.T, r *rig, p Peer, id string, gpus ...string) {
	t.Helper()
	if err := r.l.StartRun(r.now, p, &trainerproto.RunStart{Run: id, GPUs: gpus, WarmupS: ptr(0.0)}); err != nil {
		t.Fatal(err)
	}
}

func endRun(t *testing.T, r *rig, p Peer, id string) {
	t.Helper()
	if err := r.l.EndRun(r.now, p, &trainerproto.RunEnd{Run: id}); err != nil {
		t.Fatal(err)
	}
}

// runGPU sums a run's share of one GPU over all its windows.
func runGPU(r *rig, id string, g uint32) (j, s, shared float64, methods map[string]bool, maxRuns uint32) {
	methods = map[string]bool{}
	for _, w := range r.windows(id) {
		methods[w.ShareMethod] = true
		maxRuns = max(maxRuns, w.MaxSharingRuns)
		for _, sh := range w.GpuShares {
			if sh.Gpu == g {
				j += sh.EnergyCounterJ
				s += sh.GpuSeconds
				shared += sh.SharedGpuSeconds
			}
		}
	}
	return
}

var peer2 = Peer{ConnID: 2, PID: 200, UID: 1000}

// The case: two runs on one 300 W GPU for 6 s are billed 1,800 J
// together, not 1,800 J each.
func TestTwoRunsOnOneGPUSplitItsEnergyAndTime(t *testing.T) {
	for _, tc := range []struct {
		name   string
		work   map[string]RunWork
		method string
		shareA float64
	}{
		{"equal", nil, ShareEqual, 0.5},
		{"utilization", map[string]RunWork{"a": {SMPct: 60, SMOK: true}, "b": {SMPct: 20, SMOK: true}}, ShareUtilization, 0.75},
		// A run with no SM sample for its processes: memory decides.
		{"memory", map[string]RunWork{"a": {SMPct: 60, SMOK: true, MemMiB: 1000, MemOK: true}, "b": {MemMiB: 4000, MemOK: true}}, ShareMemory, 0.2},
		{"mig", map[string]RunWork{"a": {MIGSlices: 3, SMPct: 99, SMOK: true}, "b": {MIGSlices: 4, SMPct: 1, SMOK: true}}, ShareMIG, 3.0 / 7},
		// One run's processes unknown on the GPU: no basis but equal.
		{"equal when a run has no process", map[string]RunWork{"a": {SMPct: 60, SMOK: true}}, ShareEqual, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, []float64{300}, []float64{300}, 0)
			r.advance(time.Second)
			if tc.work != nil {
				r.l.SetWork(0, tc.work)
			}
			startOn(t, r, peer1, "a", "0")
			startOn(t, r, peer2, "b", "0")
			r.advance(6 * time.Second)
			endRun(t, r, peer1, "a")
			endRun(t, r, peer2, "b")
			r.advance(2 * time.Second)

			ja, sa, sharedA, methodsA, maxA := runGPU(r, "a", 0)
			jb, sb, _, _, _ := runGPU(r, "b", 0)
			near(t, "a+b energy", ja+jb, 1800, 1e-6)
			near(t, "a+b GPU-s", sa+sb, 6, 1e-9)
			near(t, "a's energy", ja, 1800*tc.shareA, 1e-6)
			near(t, "a's GPU-s", sa, 6*tc.shareA, 1e-9)
			near(t, "a's shared GPU-s", sharedA, 6, 1e-9)
			if !methodsA[tc.method] || len(methodsA) != 1 || maxA != 2 {
				t.Errorf("a's methods %v, max runs %d; want only %s, 2", methodsA, maxA, tc.method)
			}
			// The run's own totals (what the collector sums) agree.
			near(t, "a's window energy", sum(r.windows("a")).counterJ, ja, 1e-9)
			checkConservation(t, r.batches, true)
		})
	}
}

func TestExclusiveRunAndIdleGPU(t *testing.T) {
	r := newRig(t, []float64{300, 100}, []float64{300, 100}, 0)
	r.advance(time.Second)
	startOn(t, r, peer1, "a", "0")
	r.advance(3 * time.Second)
	endRun(t, r, peer1, "a")
	r.advance(2 * time.Second)
	j, s, shared, methods, maxRuns := runGPU(r, "a", 0)
	near(t, "a's energy", j, 900, 1e-6)
	near(t, "a's GPU-s", s, 3, 1e-9)
	if shared != 0 || !methods[ShareExclusive] || len(methods) != 1 || maxRuns != 1 {
		t.Errorf("exclusive run: shared %v s, methods %v, max runs %d", shared, methods, maxRuns)
	}
	c := conserve(r.batches)
	// GPU 1 had no run: all of it is idle.
	near(t, "gpu 1 idle J", c[1].idleJ, c[1].gpuJ, 1e-12)
	near(t, "gpu 1 idle s", c[1].idleS, c[1].gpuS, 1e-12)
	if c[1].gpuS < 4.9 {
		t.Fatalf("gpu 1 accounted %.2f s", c[1].gpuS)
	}
	checkConservation(t, r.batches, true)
}

// A run joins a GPU in the middle of a window: before it the first run has
// the GPU alone, after it they split it.
func TestRunJoiningMidWindow(t *testing.T) {
	r := newRig(t, []float64{400}, []float64{400}, 0)
	r.advance(time.Second)
	startOn(t, r, peer1, "a", "0")
	r.advance(1300 * time.Millisecond) // b joins 0.3 s into a window
	startOn(t, r, peer2, "b", "0")
	r.advance(2 * time.Second)
	endRun(t, r, peer1, "a")
	endRun(t, r, peer2, "b")
	r.advance(2 * time.Second)
	ja, sa, sharedA, methodsA, _ := runGPU(r, "a", 0)
	jb, sb, sharedB, _, _ := runGPU(r, "b", 0)
	near(t, "a's GPU-s", sa, 1.3+1, 1e-9)
	near(t, "b's GPU-s", sb, 1, 1e-9)
	near(t, "a's energy", ja, 400*2.3, 1e-6)
	near(t, "b's energy", jb, 400, 1e-6)
	near(t, "shared GPU-s", sharedA+sharedB, 4, 1e-9)
	// The window where b joined is exclusive then equal: "equal", not mixed.
	if methodsA[ShareMixed] || !methodsA[ShareEqual] {
		t.Errorf("a's methods %v", methodsA)
	}
	checkConservation(t, r.batches, true)
}

// Random runs starting, joining GPUs, ending and sharing on three GPUs with
// random work: every GPU's every window is runs + idle, exactly.
func TestConservationWithRandomOverlappingRuns(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 16))
			r := newRig(t, []float64{300, 250, 120}, []float64{310, 240, 125}, 0)
			r.advance(time.Duration(rng.IntN(1000)) * time.Millisecond)
			type live struct {
				id string
				p  Peer
			}
			var running []live
			next := 0
			for i := 0; i < 40; i++ {
				switch x := rng.IntN(10); {
				case x < 4 || len(running) == 0:
					next++
					p := Peer{ConnID: uint64(next), PID: int32(1000 + next), UID: 1000}
					id := fmt.Sprintf("r%d", next)
					var gpus []string
					for g := range 3 {
						if rng.IntN(2) == 0 {
							gpus = append(gpus, fmt.Sprint(g))
						}
					}
					if len(gpus) == 0 {
						gpus = []string{fmt.Sprint(rng.IntN(3))}
					}
					startOn(t, r, p, id, gpus...)
					running = append(running, live{id, p})
				case x < 6:
					// Another rank joins a run with more GPUs.
					lr := running[rng.IntN(len(running))]
					next++
					p := Peer{ConnID: uint64(next), PID: int32(1000 + next), UID: 1000}
					if err := r.l.StartRun(r.now, p, &trainerproto.RunStart{Run: lr.id, GPUs: []string{fmt.Sprint(rng.IntN(3))}}); err != nil {
						t.Fatal(err)
					}
					running = append(running, live{lr.id, p})
				case x < 8:
					k := rng.IntN(len(running))
					if err := r.l.EndRun(r.now, running[k].p, &trainerproto.RunEnd{Run: running[k].id}); err != nil {
						t.Fatal(err)
					}
					running = append(running[:k], running[k+1:]...)
				default:
					g := rng.IntN(3)
					work := map[string]RunWork{}
					for _, lr := range running {
						if rng.IntN(4) > 0 {
							work[lr.id] = RunWork{SMPct: float64(rng.IntN(100)), SMOK: rng.IntN(3) > 0, MemMiB: float64(rng.IntN(8000)), MemOK: true}
						}
					}
					r.l.SetWork(g, work)
				}
				// Events land between ticks, at arbitrary instants.
				r.advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
				r.now = r.now.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
			}
			for _, lr := range running {
				if err := r.l.EndRun(r.now, lr.p, &trainerproto.RunEnd{Run: lr.id}); err != nil {
					t.Fatal(err)
				}
			}
			r.advance(3 * time.Second)
			checkConservation(t, r.batches, true)
			// And the GPU-seconds are the wall time covered, on every GPU.
			c := conserve(r.batches)
			first, last := r.batches[0].WindowStart.AsTime(), r.batches[len(r.batches)-1].WindowEnd.AsTime()
			for g := range 3 {
				near(t, "GPU-s = wall time", c[uint32(g)].gpuS, last.Sub(first).Seconds(), 1e-9)
			}
		})
	}
}

// An agent restarts while two runs share a GPU: the downtime is split
// between them, and over the whole period runs + idle = the GPU's counter.
// A third run on the other GPU never comes back: what was held for it goes
// back to idle.
func TestAgentRestartDuringSharing(t *testing.T) {
	r := newRig(t, []float64{300, 200}, []float64{300, 200}, 0)
	r.advance(time.Second)
	startOn(t, r, peer1, "a", "0")
	startOn(t, r, peer2, "b", "0")
	peer3 := Peer{ConnID: 3, PID: 300, UID: 1000}
	startOn(t, r, peer3, "c", "1")
	r.advance(2 * time.Second)
	for n0 := len(r.batches); len(r.batches) == n0; {
		r.advance(50 * time.Millisecond)
	}
	snap := r.l.Snapshot()
	r.skip(3 * time.Second)
	r.restart(snap, 5*time.Second)
	r.advance(1200 * time.Millisecond)
	pa, pb2 := Peer{ConnID: 11, PID: 100, UID: 1000}, Peer{ConnID: 12, PID: 200, UID: 1000}
	startOn(t, r, pa, "a", "0")
	startOn(t, r, pb2, "b", "0")
	r.advance(2 * time.Second)
	endRun(t, r, pa, "a")
	endRun(t, r, pb2, "b")
	r.advance(8 * time.Second) // c's grace runs out

	ja, _, _, _, _ := runGPU(r, "a", 0)
	jb, _, _, _, _ := runGPU(r, "b", 0)
	near(t, "a's share = b's share", ja, jb, 1e-9)
	c := conserve(r.batches)
	// GPU 0 ran from t0+1 s to the end with a and b on it all along, the
	// downtime included: the two runs got all of it but the idle tail.
	if c[0].downJ < 899 || c[0].downS < 2.99 {
		t.Fatalf("downtime on gpu 0: %.1f J, %.2f s", c[0].downJ, c[0].downS)
	}
	near(t, "a+b", ja+jb, c[0].gpuJ-c[0].idleJ, 1e-9)
	// c never rejoined: it keeps nothing after its checkpoint; its held
	// energy went to GPU 1's idle share.
	var reclaimed float64
	for _, b := range r.batches {
		for _, gw := range b.GpuWindows {
			reclaimed += gw.ReclaimedEnergyCounterJ
		}
	}
	if reclaimed < 599 { // at least the 3 s of downtime at 200 W
		t.Errorf("reclaimed %.1f J", reclaimed)
	}
	checkConservation(t, r.batches, false)
}

type loads map[int]float64

func (l loads) SetLoad(g int, v float64) { l[g] = v }

// On a simulated GPU each run's reported load (compute / (compute + data
// wait)) is its utilisation: a run computing 90 % of its steps and one
// computing 30 % split the GPU 3:1, and the GPU is as busy as both.
func TestSimulatedGPUSplitByReportedLoad(t *testing.T) {
	r := newRig(t, []float64{300}, []float64{300}, 0)
	ls := loads{}
	r.l.cfg.Load = ls
	r.advance(time.Second)
	startOn(t, r, peer1, "a", "0")
	startOn(t, r, peer2, "b", "0")
	for range 30 {
		if err := r.l.Step(r.now, peer1, &trainerproto.Step{Run: "a", Tokens: 1, ComputeS: ptr(0.09), DataWaitS: ptr(0.01)}); err != nil {
			t.Fatal(err)
		}
		if err := r.l.Step(r.now, peer2, &trainerproto.Step{Run: "b", Tokens: 1, ComputeS: ptr(0.03), DataWaitS: ptr(0.07)}); err != nil {
			t.Fatal(err)
		}
		r.advance(100 * time.Millisecond)
	}
	if math.Abs(ls[0]-1) > 1e-9 {
		t.Errorf("GPU load %v, want 1 (0.9 + 0.3, capped)", ls[0])
	}
	endRun(t, r, peer1, "a")
	endRun(t, r, peer2, "b")
	r.advance(2 * time.Second)
	ja, _, _, methods, _ := runGPU(r, "a", 0)
	jb, _, _, _, _ := runGPU(r, "b", 0)
	near(t, "a:b", ja/jb, 3, 1e-9)
	if !methods[ShareUtilization] {
		t.Errorf("methods %v", methods)
	}
	checkConservation(t, r.batches, true)
}
