package ledger

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// rig drives a ledger with synthetic GPUs whose power is constant per GPU and
// whose counter advances at counterW watts (it may disagree with the power),
// updating every 100 ms as NVML's does.
type rig struct {
	t        *testing.T
	l        *Ledger
	now      time.Time
	powerW   []float64
	counterW []float64
	counterJ []float64
	counterT []time.Time
	batches  []*trainmeterv1.Batch
	noUtil   map[int]bool // GPUs that report no utilisation (MIG)
	ticks    int
	garble   func(tick int, s *gpu.Sample) // optional: spoil a reading
}

func newRig(t *testing.T, powerW, counterW []float64, warmup time.Duration) *rig {
	devs := make([]gpu.Device, len(powerW))
	for i := range devs {
		devs[i] = gpu.Device{Index: i, UUID: "GPU-test-" + string(rune('a'+i)), Name: "Test GPU"}
	}
	r := &rig{t: t, now: t0, powerW: powerW, counterW: counterW,
		counterJ: make([]float64, len(powerW)), counterT: make([]time.Time, len(powerW))}
	r.l = New(Config{Devices: devs, DefaultWarmup: warmup})
	for i := range r.counterT {
		r.counterT[i] = t0
		r.counterJ[i] = 1e6
	}
	return r
}

// advance ticks every 50 ms until d has passed.
func (r *rig) advance(d time.Duration) {
	end := r.now.Add(d)
	for r.now.Before(end) {
		r.now = r.now.Add(50 * time.Millisecond)
		samples := make([]gpu.Sample, len(r.powerW))
		for i := range samples {
			for !r.counterT[i].Add(100 * time.Millisecond).After(r.now) {
				r.counterT[i] = r.counterT[i].Add(100 * time.Millisecond)
				r.counterJ[i] += r.counterW[i] * 0.1
			}
			samples[i] = gpu.Sample{Index: i, ReadAt: r.now,
				PowerW: r.powerW[i], PowerAt: r.now, PowerOK: true,
				EnergyJ: r.counterJ[i], EnergyAt: r.counterT[i], EnergyOK: true,
				MemUsedMiB: 1000 * float64(i+1), MemTotalMiB: 80000, MemOK: true,
				UtilPct: 90, UtilOK: !r.noUtil[i]}
			if r.garble != nil {
				r.garble(r.ticks, &samples[i])
			}
		}
		r.ticks++
		r.batches = append(r.batches, r.l.Tick(r.now, samples)...)
	}
}

// at moves the clock to exactly t without ticking (events between ticks).
func (r *rig) at(d time.Duration) time.Time { return r.now.Add(d) }

func (r *rig) windows(run string) []*trainmeterv1.RunWindow {
	var out []*trainmeterv1.RunWindow
	for _, b := range r.batches {
		for _, w := range b.RunWindows {
			if w.RunId == run {
				out = append(out, w)
			}
		}
	}
	return out
}

type totals struct {
	counterJ, integratedJ, measuredCounterJ, measuredIntegratedJ, measuredS, warmupS float64
	tokens, tokensMeasured                                                           uint64
	peak, vramPeak                                                                   float64
	allCounterOK, estimated                                                          bool
	firstMeasured                                                                    time.Time
}

func sum(ws []*trainmeterv1.RunWindow) totals {
	t := totals{allCounterOK: true}
	for _, w := range ws {
		d := w.End.AsTime().Sub(w.Start.AsTime()).Seconds()
		t.counterJ += w.EnergyCounterJ
		t.integratedJ += w.EnergyIntegratedJ
		t.tokens += w.Tokens
		t.tokensMeasured += w.TokensMeasured
		t.vramPeak = math.Max(t.vramPeak, w.VramPeakMib)
		t.allCounterOK = t.allCounterOK && w.CounterOk
		t.estimated = t.estimated || w.EnergyEstimated
		if w.Phase == trainmeterv1.Phase_PHASE_MEASURED {
			t.measuredCounterJ += w.EnergyCounterJ
			t.measuredIntegratedJ += w.EnergyIntegratedJ
			t.measuredS += d
			t.peak = math.Max(t.peak, w.PeakPowerW)
			if t.firstMeasured.IsZero() || w.Start.AsTime().Before(t.firstMeasured) {
				t.firstMeasured = w.Start.AsTime()
			}
		} else {
			t.warmupS += d
		}
	}
	return t
}

func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.9g, want %.9g", what, got, want)
	}
}

func ptr[T any](v T) *T { return &v }

var peer1 = Peer{ConnID: 1, PID: 100, UID: 1000}

func TestConstantPowerRunIsExactBetweenTicks(t *testing.T) {
	// Two GPUs at 300 W; counters agree with power. The run starts and ends
	// between ticks; energy must cover exactly [warmup end, run end].
	r := newRig(t, []float64{300, 300}, []float64{300, 300}, 0)
	r.advance(1 * time.Second)
	start := r.at(17 * time.Millisecond)
	if err := r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "r1", GPUs: []string{"0", "1"}, WarmupS: ptr(1.5)}); err != nil {
		t.Fatal(err)
	}
	r.advance(4 * time.Second)
	end := r.at(33 * time.Millisecond)
	if err := r.l.EndRun(end, peer1, &trainerproto.RunEnd{Run: "r1"}); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)

	got := sum(r.windows("r1"))
	measured := end.Sub(start).Seconds() - 1.5
	near(t, "measured seconds", got.measuredS, measured, 1e-9)
	near(t, "warmup seconds", got.warmupS, 1.5, 1e-9)
	near(t, "measured counter J", got.measuredCounterJ, 600*measured, 1e-6)
	near(t, "measured integrated J", got.measuredIntegratedJ, 600*measured, 1e-6)
	near(t, "total counter J", got.counterJ, 600*end.Sub(start).Seconds(), 1e-6)
	near(t, "peak W", got.peak, 600, 1e-9)
	near(t, "vram peak", got.vramPeak, 2000, 0)
	if !got.allCounterOK || got.estimated {
		t.Errorf("counter_ok=%v estimated=%v, want true,false", got.allCounterOK, got.estimated)
	}
	if !got.firstMeasured.Equal(start.Add(1500 * time.Millisecond)) {
		t.Errorf("first measured window starts %v, want warmup end %v", got.firstMeasured, start.Add(1500*time.Millisecond))
	}
	// The run's start and end travel as events; the end carries warmup end.
	var sawStart, sawEnd bool
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if s := e.GetRunStart(); s != nil {
				sawStart = true
				if !s.Time.AsTime().Equal(start) || s.GpuName != "Test GPU" || len(s.GpuUuids) != 2 {
					t.Errorf("run_start event %v", s)
				}
			}
			if e := e.GetRunEnd(); e != nil {
				sawEnd = true
				if !e.Time.AsTime().Equal(end) || !e.WarmupEnd.AsTime().Equal(start.Add(1500*time.Millisecond)) {
					t.Errorf("run_end event %v", e)
				}
			}
		}
	}
	if !sawStart || !sawEnd {
		t.Errorf("events: start=%v end=%v", sawStart, sawEnd)
	}
	if got := r.l.ActiveRuns(); len(got) != 0 {
		t.Errorf("active runs after close: %v", got)
	}
}

func TestCounterAndPowerDisagreeAreKeptApart(t *testing.T) {
	r := newRig(t, []float64{300}, []float64{330}, 0)
	r.advance(time.Second)
	start := r.at(0)
	_ = r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "r", GPUs: []string{"GPU-test-a"}, WarmupS: ptr(0.0)})
	r.advance(3 * time.Second)
	end := r.at(0)
	_ = r.l.EndRun(end, peer1, &trainerproto.RunEnd{Run: "r"})
	r.advance(2 * time.Second)
	got := sum(r.windows("r"))
	d := end.Sub(start).Seconds()
	near(t, "counter J", got.measuredCounterJ, 330*d, 1e-6)
	near(t, "integrated J", got.measuredIntegratedJ, 300*d, 1e-6)
}

func TestBatchesAreNumberedAlignedAndCarryGPUWindows(t *testing.T) {
	r := newRig(t, []float64{250, 100}, []float64{250, 100}, 0)
	r.advance(5 * time.Second)
	if len(r.batches) < 4 {
		t.Fatalf("got %d batches in 5 s, want >= 4", len(r.batches))
	}
	for i, b := range r.batches {
		if b.Seq != uint64(i+1) {
			t.Errorf("batch %d seq %d", i, b.Seq)
		}
		if i > 0 {
			if !b.WindowStart.AsTime().Equal(r.batches[i-1].WindowEnd.AsTime()) {
				t.Errorf("batch %d does not start where %d ended", i, i-1)
			}
			if b.WindowStart.AsTime().Nanosecond() != 0 {
				t.Errorf("batch %d window not aligned to the second: %v", i, b.WindowStart.AsTime())
			}
			// A full 1 s window at 250 W and 100 W.
			near(t, "gpu0 counter J", b.GpuWindows[0].EnergyCounterJ, 250, 1e-6)
			near(t, "gpu1 integrated J", b.GpuWindows[1].EnergyIntegratedJ, 100, 1e-6)
			if b.GpuWindows[0].Samples != 20 {
				t.Errorf("batch %d gpu0 samples %d, want 20", i, b.GpuWindows[0].Samples)
			}
			if b.GpuWindows[0].StaleSamples != 0 || !b.GpuWindows[0].CounterOk {
				t.Errorf("batch %d gpu0 %v", i, b.GpuWindows[0])
			}
		}
	}
}

func TestWarmupStepsAndMeasuredTokens(t *testing.T) {
	r := newRig(t, []float64{200}, []float64{200}, time.Hour)
	r.advance(time.Second)
	_ = r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "s", WarmupSteps: ptr(uint64(3))})
	var warmupEnd time.Time
	for i := uint64(1); i <= 10; i++ {
		r.advance(200 * time.Millisecond)
		if err := r.l.Step(r.at(0), peer1, &trainerproto.Step{Run: "s", Step: ptr(i), Tokens: 1000}); err != nil {
			t.Fatal(err)
		}
		if i == 3 {
			warmupEnd = r.at(0)
		}
	}
	end := r.at(0)
	_ = r.l.EndRun(end, peer1, &trainerproto.RunEnd{Run: "s"})
	r.advance(2 * time.Second)
	got := sum(r.windows("s"))
	if got.tokens != 10000 || got.tokensMeasured != 7000 {
		t.Errorf("tokens %d measured %d, want 10000 and 7000 (steps 1-3 are warmup)", got.tokens, got.tokensMeasured)
	}
	if !got.firstMeasured.Equal(warmupEnd) {
		t.Errorf("measured from %v, want end of step 3 at %v", got.firstMeasured, warmupEnd)
	}
	near(t, "measured J", got.measuredCounterJ, 200*end.Sub(warmupEnd).Seconds(), 1e-6)
}

func TestRankJoiningAddsItsGPUFromThen(t *testing.T) {
	r := newRig(t, []float64{100, 300}, []float64{100, 300}, 0)
	r.advance(time.Second)
	start := r.at(0)
	_ = r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "j", GPUs: []string{"0"}, WarmupS: ptr(0.0)})
	r.advance(2 * time.Second)
	join := r.at(10 * time.Millisecond)
	peer2 := Peer{ConnID: 2}
	if err := r.l.StartRun(join, peer2, &trainerproto.RunStart{Run: "j", GPUs: []string{"1"}}); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	_ = r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "j"})
	if len(r.l.ActiveRuns()) != 1 {
		t.Fatal("run ended while a rank was still in it")
	}
	end := r.at(0)
	r.l.Disconnected(end, peer2) // the second rank goes away without run_end
	r.advance(2 * time.Second)
	got := sum(r.windows("j"))
	want := 100*end.Sub(start).Seconds() + 300*end.Sub(join).Seconds()
	near(t, "energy with a joining GPU", got.measuredCounterJ, want, 1e-6)
	var reason string
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if e.GetRunEnd() != nil {
				reason = e.GetRunEnd().Reason
			}
		}
	}
	if !strings.Contains(reason, "disconnected") {
		t.Errorf("end reason %q, want the disconnect", reason)
	}
}

func TestEventErrorsAreClearAndChangeNothing(t *testing.T) {
	r := newRig(t, []float64{100, 100}, []float64{100, 100}, 0)
	r.advance(time.Second)
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"step for unknown run", r.l.Step(r.at(0), peer1, &trainerproto.Step{Run: "nope", Tokens: 5}), `step: unknown run_id "nope"`},
		{"run_end before run_start", r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "nope"}), `run_end: unknown run_id "nope"`},
		{"gpu index out of range", r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "x", GPUs: []string{"7"}}), "run_start: gpus: gpu 7: not on this node (it has 2 GPUs)"},
		{"unknown uuid", r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "x", GPUs: []string{"GPU-zzz"}}), "no GPU with this UUID"},
		{"eval for unknown run", r.l.Eval(r.at(0), peer1, &trainerproto.Eval{Run: "x"}), "eval: unknown run_id"},
	}
	for _, c := range cases {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.name, c.err, c.want)
		}
	}
	_ = r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "ok"})
	if err := r.l.EndRun(r.at(0), Peer{ConnID: 9}, &trainerproto.RunEnd{Run: "ok"}); err == nil || !strings.Contains(err.Error(), "did not join") {
		t.Errorf("run_end from a stranger connection: %v", err)
	}
	_ = r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "ok"})
	if err := r.l.Step(r.at(0), peer1, &trainerproto.Step{Run: "ok", Tokens: 1}); err == nil || !strings.Contains(err.Error(), "has ended") {
		t.Errorf("step after run_end: %v", err)
	}
	if got := r.l.ActiveRuns(); len(got) != 1 || got[0] != "ok" {
		t.Errorf("active runs %v, want only the valid one (until its window closes)", got)
	}
	// A run with no GPUs named gets all of the node's GPUs.
	r.advance(2 * time.Second)
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if s := e.GetRunStart(); s != nil && len(s.Gpus) != 2 {
				t.Errorf("run with no gpus named got %v, want all 2", s.Gpus)
			}
		}
	}
}

type loadRecorder struct{ load map[int]float64 }

func (l *loadRecorder) SetLoad(i int, v float64) { l.load[i] = v }

func TestSimulatedLoadFollowsSteps(t *testing.T) {
	rec := &loadRecorder{load: map[int]float64{}}
	l := New(Config{Devices: []gpu.Device{{Index: 0}, {Index: 1}}, Load: rec})
	now := t0
	l.Tick(now, make([]gpu.Sample, 2))
	_ = l.StartRun(now, peer1, &trainerproto.RunStart{Run: "r", GPUs: []string{"1"}})
	_ = l.Step(now, peer1, &trainerproto.Step{Run: "r", Tokens: 1, ComputeS: ptr(0.3), DataWaitS: ptr(0.1)})
	if math.Abs(rec.load[1]-0.75) > 1e-12 || rec.load[0] != 0 {
		t.Fatalf("load after a step %v, want GPU1 at 0.75", rec.load)
	}
	l.Tick(now.Add(3*time.Second), make([]gpu.Sample, 2))
	if rec.load[1] != 0 {
		t.Errorf("GPU1 still loaded 3 s after the last step: %v", rec.load)
	}
}

func TestRunStartedBeforeTheFirstTickKeepsItsSteps(t *testing.T) {
	l := New(Config{Devices: []gpu.Device{{Index: 0}}})
	_ = l.StartRun(t0, peer1, &trainerproto.RunStart{Run: "early", WarmupS: ptr(0.0)})
	_ = l.Step(t0.Add(10*time.Millisecond), peer1, &trainerproto.Step{Run: "early", Tokens: 42})
	var got uint64
	for now := t0.Add(50 * time.Millisecond); now.Before(t0.Add(3 * time.Second)); now = now.Add(50 * time.Millisecond) {
		if now.Equal(t0.Add(time.Second)) {
			_ = l.Step(now, peer1, &trainerproto.Step{Run: "early", Tokens: 8})
			_ = l.EndRun(now, peer1, &trainerproto.RunEnd{Run: "early"})
		}
		for _, b := range l.Tick(now, []gpu.Sample{{PowerW: 100, PowerOK: true, ReadAt: now}}) {
			for _, w := range b.RunWindows {
				got += w.Tokens
			}
		}
	}
	if got != 50 {
		t.Errorf("tokens %d, want 50: steps before the first tick were lost", got)
	}
}

func TestWindowWaitsForASlowCounter(t *testing.T) {
	// A counter that updates every 500 ms: the window must not close before
	// the counter has a point past its end, or the boundary would be guessed.
	r := newRig(t, []float64{300}, []float64{300}, 0)
	// Counter points at x.43 s and x.93 s: the first one past a window's end
	// arrives 430 ms after it, later than the usual settle delay.
	r.counterT[0] = t0.Add(-70 * time.Millisecond)
	slow := func(d time.Duration) {
		end := r.now.Add(d)
		for r.now.Before(end) {
			r.now = r.now.Add(50 * time.Millisecond)
			for !r.counterT[0].Add(500 * time.Millisecond).After(r.now) {
				r.counterT[0] = r.counterT[0].Add(500 * time.Millisecond)
				r.counterJ[0] += 300 * 0.5
			}
			s := []gpu.Sample{{ReadAt: r.now, PowerW: 300, PowerAt: r.now, PowerOK: true,
				EnergyJ: r.counterJ[0], EnergyAt: r.counterT[0], EnergyOK: true}}
			r.batches = append(r.batches, r.l.Tick(r.now, s)...)
		}
	}
	slow(6 * time.Second)
	if len(r.batches) < 4 {
		t.Fatalf("%d batches", len(r.batches))
	}
	for _, b := range r.batches[1:] {
		w := b.GpuWindows[0]
		if !w.CounterOk {
			t.Errorf("batch %d: counter not ok (boundary extrapolated)", b.Seq)
		}
		near(t, "1 s of counter energy", w.EnergyCounterJ, 300, 1e-6)
	}
}

func TestJoinWithConflictingMetadataIsRefusedAndChangesNothing(t *testing.T) {
	r := newRig(t, []float64{100, 100}, []float64{100, 100}, 0)
	r.advance(time.Second)
	if err := r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "m", GPUs: []string{"0"},
		Start: withMeta(&trainmeterv1.RunMetadata{Model: "a", Backend: "torch", BatchSize: ptr(int64(8))})}); err != nil {
		t.Fatal(err)
	}
	peer2 := Peer{ConnID: 2}
	cases := []struct {
		ev   *trainerproto.RunStart
		want string
	}{
		{&trainerproto.RunStart{Run: "m", Start: withMeta(&trainmeterv1.RunMetadata{Model: "b"}), GPUs: []string{"1"}}, `run_start: metadata conflicts with run "m": model "b" != "a"`},
		{&trainerproto.RunStart{Run: "m", Start: withMeta(&trainmeterv1.RunMetadata{Backend: "jax"})}, `backend "jax" != "torch"`},
		{&trainerproto.RunStart{Run: "m", Start: withMeta(&trainmeterv1.RunMetadata{Model: "a", BatchSize: ptr(int64(16))})}, "batch_size 16 != 8"},
	}
	for _, c := range cases {
		if err := r.l.StartRun(r.at(0), peer2, c.ev); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("join %+v: err %v, want %q", c.ev, err, c.want)
		}
	}
	// The refused rank did not join: it may not end the run, and GPU 1 was
	// not added.
	if err := r.l.EndRun(r.at(0), peer2, &trainerproto.RunEnd{Run: "m"}); err == nil || !strings.Contains(err.Error(), "did not join") {
		t.Errorf("run_end from the refused rank: %v", err)
	}
	// A rank that agrees, or leaves the fields out, joins.
	if err := r.l.StartRun(r.at(0), Peer{ConnID: 3}, &trainerproto.RunStart{Run: "m", Start: withMeta(&trainmeterv1.RunMetadata{Model: "a", Dataset: "any", Notes: "rank 1", Seed: ptr(int64(7))})}); err != nil {
		t.Errorf("agreeing join refused: %v", err)
	}
	_ = r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "m"})
	_ = r.l.EndRun(r.at(0), Peer{ConnID: 3}, &trainerproto.RunEnd{Run: "m"})
	r.advance(2 * time.Second)
	var starts int
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if s := e.GetRunStart(); s != nil {
				starts++
				if s.Metadata.Model != "a" || len(s.Gpus) != 1 {
					t.Errorf("run_start shipped %v", s)
				}
			}
		}
	}
	if starts != 1 {
		t.Errorf("%d run_start events shipped, want 1", starts)
	}
	for _, w := range r.windows("m") {
		if len(w.Gpus) != 1 || w.Gpus[0] != 0 {
			t.Errorf("window on GPUs %v, want only GPU 0 (the refused join must not add GPU 1)", w.Gpus)
		}
	}
}

func TestEvalSaysWhetherItHasAnEpoch(t *testing.T) {
	r := newRig(t, []float64{100}, []float64{100}, 0)
	r.advance(time.Second)
	_ = r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "e"})
	if err := r.l.Eval(r.at(0), peer1, &trainerproto.Eval{Run: "e", Epoch: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	if err := r.l.Eval(r.at(0), peer1, &trainerproto.Eval{Run: "e"}); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	var got []*trainmeterv1.Eval
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if e.GetEval() != nil {
				got = append(got, e.GetEval())
			}
		}
	}
	if len(got) != 2 || got[0].Epoch == nil || got[0].GetEpoch() != 0 || got[1].Epoch != nil {
		t.Fatalf("evals %v, want epoch 0 given, then none", got)
	}
}

// An eval says which loader settings its epoch ran with; 0 workers is a
// setting, and a loader without prefetch (no workers) leaves it 0.
func TestEvalCarriesTheLoaderSettings(t *testing.T) {
	r := newRig(t, []float64{100}, []float64{100}, 0)
	r.advance(time.Second)
	_ = r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "e"})
	for _, ev := range []*trainerproto.Eval{
		{Run: "e", Epoch: ptr(int64(1)), NumWorkers: ptr(int64(0))},
		{Run: "e", Epoch: ptr(int64(2)), NumWorkers: ptr(int64(1)), PrefetchFactor: ptr(int64(4))},
		{Run: "e", Epoch: ptr(int64(3))},
	} {
		if err := r.l.Eval(r.at(0), peer1, ev); err != nil {
			t.Fatal(err)
		}
	}
	r.advance(2 * time.Second)
	var got []string
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if ev := e.GetEval(); ev != nil {
				got = append(got, fmt.Sprintf("%v %d %d", ev.LoaderNumWorkers != nil, ev.GetLoaderNumWorkers(), ev.LoaderPrefetchFactor))
			}
		}
	}
	if want := []string{"true 0 0", "true 1 4", "false 0 0"}; !slices.Equal(got, want) {
		t.Errorf("evals' loader settings %q, want %q", got, want)
	}
}

func TestWindowsCountTheRanksThatStep(t *testing.T) {
	r := newRig(t, []float64{100, 100}, []float64{100, 100}, 0)
	r.advance(time.Second)
	peer2 := Peer{ConnID: 2, PID: 101, UID: 1000}
	launcher := Peer{ConnID: 3, PID: 99, UID: 1000} // joins, never steps (like `trainmeter run`)
	_ = r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "dp", GPUs: []string{"0"}, WarmupS: ptr(0.0)})
	_ = r.l.StartRun(r.at(0), peer2, &trainerproto.RunStart{Run: "dp", GPUs: []string{"1"}})
	_ = r.l.StartRun(r.at(0), launcher, &trainerproto.RunStart{Run: "dp"})
	for i := uint64(1); i <= 4; i++ {
		r.advance(100 * time.Millisecond)
		for _, p := range []Peer{peer1, peer2} {
			if err := r.l.Step(r.at(0), p, &trainerproto.Step{Run: "dp", Step: ptr(i), Tokens: 10}); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.advance(1500 * time.Millisecond)
	// Only rank 0 steps in this window; rank 1 is still in the run.
	r.advance(100 * time.Millisecond)
	_ = r.l.Step(r.at(0), peer1, &trainerproto.Step{Run: "dp", Step: ptr(uint64(5)), Tokens: 10})
	r.advance(1500 * time.Millisecond)
	// Rank 1 steps, then leaves within the same window.
	_ = r.l.Step(r.at(0), peer2, &trainerproto.Step{Run: "dp", Step: ptr(uint64(5)), Tokens: 10})
	_ = r.l.EndRun(r.at(0), peer2, &trainerproto.RunEnd{Run: "dp"})
	r.advance(1500 * time.Millisecond)
	var got []string
	for _, w := range r.windows("dp") {
		if w.Steps > 0 {
			got = append(got, fmt.Sprintf("%d/%d", w.Steps, w.StepRanks))
		}
	}
	if strings.Join(got, " ") != "8/2 1/2 1/2" {
		t.Errorf("steps/step_ranks of the windows with steps: %v, want [8/2 1/2 1/2]", got)
	}
}

func TestWindowsCountTheUtilisationReadings(t *testing.T) {
	r := newRig(t, []float64{100, 100}, []float64{100, 100}, 0)
	r.noUtil = map[int]bool{1: true}
	r.advance(time.Second)
	_ = r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "u", GPUs: []string{"0", "1"}, WarmupS: ptr(0.0)})
	r.advance(3 * time.Second)
	var sum float64
	var n, vram uint64
	for _, w := range r.windows("u") {
		sum += w.UtilizationSumPct
		n += w.UtilizationSamples
		vram += w.VramSamples
	}
	if n == 0 || vram != 2*n || sum/float64(n) != 90 {
		t.Errorf("utilisation %v over %d readings (%d memory readings), want a mean of 90 over half the readings", sum, n, vram)
	}
}

// TestDefaultWarmupEndsAtTheEarlierOfItsTimeAndItsSteps: the agent's
// default warmup (a run naming none) ends at the N-th step when that comes
// before the default time, and at the time when the steps are slow.
func TestDefaultWarmupEndsAtTheEarlierOfItsTimeAndItsSteps(t *testing.T) {
	for _, tc := range []struct {
		name      string
		every     time.Duration
		wantEndAt int // step whose report ends the warmup; 0: the 2 s default
	}{
		{"fast steps end it at step 5", 100 * time.Millisecond, 5},
		{"slow steps leave it to the 2 s", 700 * time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, []float64{200}, []float64{200}, 2*time.Second)
			r.l = New(Config{Devices: r.l.cfg.Devices, DefaultWarmup: 2 * time.Second, DefaultWarmupSteps: 5})
			r.advance(time.Second)
			start := r.at(0)
			if err := r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "d"}); err != nil {
				t.Fatal(err)
			}
			want := start.Add(2 * time.Second)
			for i := uint64(1); i <= 8; i++ {
				r.advance(tc.every)
				if err := r.l.Step(r.at(0), peer1, &trainerproto.Step{Run: "d", Step: ptr(i), Tokens: 100}); err != nil {
					t.Fatal(err)
				}
				if int(i) == tc.wantEndAt {
					want = r.at(0)
				}
			}
			_ = r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "d"})
			r.advance(2 * time.Second)
			if got := sum(r.windows("d")); !got.firstMeasured.Equal(want) {
				t.Errorf("measured from %v, want %v (%.2fs after start)", got.firstMeasured, want, want.Sub(start).Seconds())
			}
		})
	}
}
