package ledger

import (
	"slices"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func attributedRig(t *testing.T, canList bool) *rig {
	r := newRig(t, []float64{300, 200}, []float64{300, 200}, 0)
	cfg := r.l.cfg
	cfg.ProcessAttribution = canList
	r.l = New(cfg)
	return r
}

func TestAttributedRunStartsWithoutGPUsAndAddsThem(t *testing.T) {
	r := attributedRig(t, true)
	r.advance(time.Second)
	start := r.at(10 * time.Millisecond)
	if err := r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "a", AttributePID: ptr(uint64(4242)), WarmupS: ptr(0.0)}); err != nil {
		t.Fatal(err)
	}
	if got := r.l.AttributedRuns(); !slices.Equal(got, []AttributedRun{{ID: "a", PID: 4242}}) {
		t.Fatalf("AttributedRuns = %v", got)
	}
	// The script's client joins with no gpus: it must not add every GPU.
	peer2 := Peer{ConnID: 2, PID: 101, UID: 1000}
	if err := r.l.StartRun(r.at(20*time.Millisecond), peer2, &trainerproto.RunStart{Run: "a", ClientID: "c"}); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	added := r.at(30 * time.Millisecond)
	if got := r.l.AddGPUs(added, "a", []int{1, 7}); !slices.Equal(got, []int{1}) {
		t.Fatalf("AddGPUs = %v, want [1]", got)
	}
	if got := r.l.AddGPUs(added, "a", []int{1}); got != nil {
		t.Fatalf("AddGPUs again = %v, want nil", got)
	}
	r.advance(2 * time.Second)
	end := r.at(40 * time.Millisecond)
	for _, p := range []Peer{peer1, peer2} {
		if err := r.l.EndRun(end, p, &trainerproto.RunEnd{Run: "a", Status: "exit 0"}); err != nil {
			t.Fatal(err)
		}
	}
	r.advance(3 * time.Second)
	ws := r.windows("a")
	if len(ws) == 0 {
		t.Fatal("no windows")
	}
	var gpuS float64
	for _, w := range ws {
		if !w.CounterOk || w.EnergyEstimated {
			t.Errorf("segment %v-%v gpus %v: counter_ok %v estimated %v", w.Start.AsTime(), w.End.AsTime(), w.Gpus, w.CounterOk, w.EnergyEstimated)
		}
		if w.End.AsTime().After(added) && w.Start.AsTime().Before(added) {
			t.Errorf("segment %v-%v not cut at the GPU change %v", w.Start.AsTime(), w.End.AsTime(), added)
		}
		if w.Start.AsTime().Before(added) && (len(w.Gpus) != 0 || w.EnergyCounterJ != 0 || w.EnergyIntegratedJ != 0) {
			t.Errorf("segment before any GPU: gpus %v, %v J", w.Gpus, w.EnergyCounterJ)
		}
		if !w.Start.AsTime().Before(added) && !slices.Equal(w.Gpus, []uint32{1}) {
			t.Errorf("segment after the add: gpus %v, want [1]", w.Gpus)
		}
		gpuS += w.GpuSeconds
	}
	tot := sum(ws)
	d := end.Sub(added).Seconds()
	near(t, "counter energy", tot.counterJ, 200*d, 1e-6)
	near(t, "integrated energy", tot.integratedJ, 200*d, 1e-6)
	near(t, "gpu seconds", gpuS, d, 1e-9)
	if got := r.l.AttributedRuns(); len(got) != 0 {
		t.Fatalf("AttributedRuns after end = %v", got)
	}
	if got := r.l.AddGPUs(r.now, "a", []int{0}); got != nil {
		t.Fatalf("AddGPUs on an ended run = %v", got)
	}
	// The run_start event still names the GPU model.
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if s := e.GetRunStart(); s != nil && s.GpuName != "Test GPU" {
				t.Errorf("run_start gpu_name = %q", s.GpuName)
			}
		}
	}
}

func TestAttributedRunJoinWithExplicitGPUs(t *testing.T) {
	r := attributedRig(t, true)
	r.advance(time.Second)
	if err := r.l.StartRun(r.now, peer1, &trainerproto.RunStart{Run: "a", AttributePID: ptr(uint64(9))}); err != nil {
		t.Fatal(err)
	}
	peer2 := Peer{ConnID: 2, PID: 101, UID: 1000}
	if err := r.l.StartRun(r.now, peer2, &trainerproto.RunStart{Run: "a", GPUs: []string{"0"}}); err != nil {
		t.Fatal(err)
	}
	if got := r.l.runs["a"].gpusAt(r.now); !slices.Equal(got, []int{0}) {
		t.Fatalf("gpus = %v, want [0]", got)
	}
}

func TestAttributedRunFallsBackToAllGPUs(t *testing.T) {
	r := attributedRig(t, false)
	r.advance(time.Second)
	if err := r.l.StartRun(r.now, peer1, &trainerproto.RunStart{Run: "a", AttributePID: ptr(uint64(9))}); err != nil {
		t.Fatal(err)
	}
	if got := r.l.runs["a"].gpusAt(r.now); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("gpus = %v, want all", got)
	}
	if got := r.l.AttributedRuns(); got != nil {
		t.Fatalf("AttributedRuns = %v, want none without process listing", got)
	}
}

func TestAttributedRunTakesJoiningRanksWarmup(t *testing.T) {
	r := newRig(t, []float64{300}, []float64{300}, 60*time.Second)
	r.advance(time.Second)
	start := r.now
	if err := r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "a", AttributePID: ptr(uint64(9))}); err != nil {
		t.Fatal(err)
	}
	r.advance(time.Second)
	join := r.at(5 * time.Millisecond)
	peer2 := Peer{ConnID: 2, PID: 101, UID: 1000}
	if err := r.l.StartRun(join, peer2, &trainerproto.RunStart{Run: "a", WarmupS: ptr(1.0)}); err != nil {
		t.Fatal(err)
	}
	if got, want := r.l.runs["a"].warmupEnd, join.Add(time.Second); !got.Equal(want) {
		t.Fatalf("warmup end = %v, want %v", got, want)
	}
	// A second rank cannot move it again.
	peer3 := Peer{ConnID: 3, PID: 102, UID: 1000}
	if err := r.l.StartRun(join, peer3, &trainerproto.RunStart{Run: "a", WarmupS: ptr(5.0)}); err != nil {
		t.Fatal(err)
	}
	if got, want := r.l.runs["a"].warmupEnd, join.Add(time.Second); !got.Equal(want) {
		t.Fatalf("warmup end moved to %v", got)
	}
	// A run started with its own warmup, or without attribute_pid, keeps it.
	if err := r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "b", AttributePID: ptr(uint64(9)), WarmupS: ptr(10.0)}); err != nil {
		t.Fatal(err)
	}
	if err := r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "c"}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]time.Time{"b": start.Add(10 * time.Second), "c": start.Add(60 * time.Second)} {
		if err := r.l.StartRun(join, peer2, &trainerproto.RunStart{Run: id, WarmupS: ptr(1.0)}); err != nil {
			t.Fatal(err)
		}
		if got := r.l.runs[id].warmupEnd; !got.Equal(want) {
			t.Errorf("run %s warmup end = %v, want %v", id, got, want)
		}
	}
	r.advance(3 * time.Second)
	var measured bool
	for _, w := range r.windows("a") {
		if w.Phase == trainmeterv1.Phase_PHASE_MEASURED {
			measured = true
			if w.Start.AsTime().Before(join.Add(time.Second)) {
				t.Errorf("measured segment starts at %v, before the adopted warmup end", w.Start.AsTime())
			}
		}
	}
	if !measured {
		t.Error("run never left the adopted warmup")
	}
}

func TestAttributedRunWithoutGPUsSurvivesRestart(t *testing.T) {
	r := attributedRig(t, true)
	r.advance(time.Second)
	if err := r.l.StartRun(r.now, peer1, &trainerproto.RunStart{Run: "a", AttributePID: ptr(uint64(4242))}); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	snap := r.l.Snapshot()
	if len(snap.Runs) != 1 || snap.Runs[0].AttributePID != 4242 || len(snap.Runs[0].GPUs) != 0 {
		t.Fatalf("snapshot runs = %+v", snap.Runs)
	}
	l2 := New(r.l.cfg)
	if err := l2.Restore(r.now.Add(time.Second), snap, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := l2.AttributedRuns(); !slices.Equal(got, []AttributedRun{{ID: "a", PID: 4242}}) {
		t.Fatalf("restored AttributedRuns = %v", got)
	}
}
