package dataloadersvc

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	"github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is the advisory sink (in production: ingest.Server.Advise).
type recorder struct {
	mu   sync.Mutex
	sent []*trainmeterv1.Advisory
	// refuse: this many advisories are refused (node not connected, queue
	// full) before the recorder accepts again.
	refuse int
}

func (r *recorder) Advise(node string, adv *trainmeterv1.Advisory) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse > 0 {
		r.refuse--
		return false
	}
	r.sent = append(r.sent, adv)
	return true
}

func (r *recorder) all() []*trainmeterv1.Advisory {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*trainmeterv1.Advisory(nil), r.sent...)
}

type rig struct {
	t   *testing.T
	st  *store.Store
	rec *recorder
	a   *Advisor
	seq map[string]uint64 // per node
}

func newRig(t *testing.T) *rig {
	st, err := store.Open(t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, st: st, rec: &recorder{}, seq: map[string]uint64{}}
	r.a = New(st, r.rec, nil)
	r.a.processed = make(chan struct{}, 1)
	if err := r.a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.a.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		st.Close()
	})
	return r
}

// apply stores a batch and hands it to the advisor as the ingest hook
// would, and waits until the advisor has processed it.
func (r *rig) apply(sec float64, w *trainmeterv1.RunWindow, host *trainmeterv1.HostWindow, events ...*trainmeterv1.RunEvent) {
	r.t.Helper()
	r.applyOn("n1", sec, w, host, events...)
}

// applyOn is apply for a batch of node.
func (r *rig) applyOn(node string, sec float64, w *trainmeterv1.RunWindow, host *trainmeterv1.HostWindow, events ...*trainmeterv1.RunEvent) {
	r.t.Helper()
	r.seq[node]++
	var ws []*trainmeterv1.RunWindow
	if w != nil {
		ws = append(ws, w)
	}
	b := testutil.Batch(r.seq[node], sec, ws, events...)
	if host != nil {
		b.Host = host
	}
	if _, err := r.st.ApplyBatch(node, "boot", b); err != nil {
		r.t.Fatal(err)
	}
	r.a.Observe(node, b)
	<-r.a.processed
}

func start(run string, workers, prefetch uint32, interval uint64) *trainmeterv1.RunEvent {
	ev := testutil.Start(run, 0, "m")
	rs := ev.GetRunStart()
	rs.PrefetchFactor, rs.AdjustmentInterval = prefetch, interval
	if workers > 0 {
		rs.NumWorkers = proto.Uint32(workers)
	}
	rs.GpuPricePerHour = 3.6
	return ev
}

// window: steps steps of which half the time is data wait, at util %.
func window(run string, sec float64, steps uint64, wait, compute, util float64) *trainmeterv1.RunWindow {
	w := testutil.Window(run, sec, 1000, 100)
	w.Steps, w.DataWaitS, w.ComputeS = steps, wait, compute
	w.UtilizationSumPct, w.UtilizationSamples = util*float64(w.VramSamples), w.VramSamples
	return w
}

func host(usedShare float64) *trainmeterv1.HostWindow {
	return &trainmeterv1.HostWindow{MemoryUsedMib: usedShare * 64000, MemoryTotalMib: 64000, CpuCount: 16, CpuPct: 30}
}

func eval(run string, sec float64, epoch int64) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{RunId: run, Time: testutil.TS(sec), Epoch: proto.Int64(epoch), ValLoss: proto.Float64(1)}}}
}

// evalNoEpoch is an eval event whose trainer sent no epoch.
func evalNoEpoch(run string, sec float64) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{RunId: run, Time: testutil.TS(sec), ValLoss: proto.Float64(1)}}}
}

func TestDataBoundRunIsAdvisedAndHistoryKept(t *testing.T) {
	r := newRig(t)
	r.apply(0, window("r", 0, 10, 0.5, 0.5, 50), host(0.3), start("r", 2, 2, 10))
	if n := len(r.rec.all()); n != 0 {
		t.Fatalf("advised after one evaluation: %d", n)
	}
	r.apply(1, window("r", 1, 10, 0.5, 0.5, 50), host(0.3), eval("r", 1.5, 1))
	sent := r.rec.all()
	if len(sent) != 1 {
		t.Fatalf("sent %d advisories, want 1", len(sent))
	}
	d := sent[0].GetDataloader()
	// 16 CPUs, 1 rank: bound 15; workers 2→3, prefetch 2→3 (wait = compute).
	if sent[0].GetRunId() != "r" || d.GetNumWorkers() != 3 || d.GetPrefetchFactor() != 3 || d.GetClassification() != "data-bound" {
		t.Fatalf("advice %v", sent[0])
	}
	if d.GetDataWaitShare() != 0.5 || d.GetGpuUtilization() != 0.5 || d.GetRamUsage() != 0.3 || d.GetExpectedGain() != 0.5 || d.GetMaxWorkers() != 15 {
		t.Errorf("figures %v", d)
	}
	if d.GetFromNumWorkers() != 2 || d.GetFromPrefetchFactor() != 2 {
		t.Errorf("baseline %d/%d, want the run_start's 2/2", d.GetFromNumWorkers(), d.GetFromPrefetchFactor())
	}
	r.apply(2, window("r", 2, 5, 0.1, 0.5, 50), host(0.3), testutil.End("r", 3))

	h, err := History(r.st, "r")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Evaluations) != 2 || h.Evaluations[0].Changed || !h.Evaluations[1].Changed || h.Evaluations[1].Step != 20 {
		t.Fatalf("evaluations %v", h.Evaluations)
	}
	if len(h.Epochs) != 2 {
		t.Fatalf("epochs %v", h.Epochs)
	}
	e1, e2 := h.Epochs[0], h.Epochs[1]
	if e1.Epoch != 1 || e1.Partial || e1.Adjustments != 1 || e1.NumWorkers != 3 || e1.Steps != 20 || e1.AvgGpuUtilization != 0.5 || e1.AvgRamUsage != 0.3 {
		t.Errorf("epoch 1 %v", e1)
	}
	if e2.Epoch != 2 || !e2.Partial || e2.Adjustments != 0 || e2.Steps != 5 {
		t.Errorf("epoch 2 %v", e2)
	}
	// The RecommendService (package recommendsvc) turns this history into the
	// run's next-start recommendation.
	st, err := r.st.GetRun("r")
	if err != nil {
		t.Fatal(err)
	}
	dl := DataloaderRecommendation(st.Report(aggregate.Pricing{}), h)
	if dl == nil || dl.Kind != "dataloader" || !strings.Contains(dl.Action, "num_workers=3, prefetch_factor=3") {
		t.Fatalf("recommendation %v", dl)
	}
}

func TestGPUBoundRunGetsNoAdvice(t *testing.T) {
	r := newRig(t)
	r.apply(0, window("g", 0, 10, 0.01, 1, 98), host(0.3), start("g", 4, 2, 10))
	for i := 1; i < 6; i++ {
		r.apply(float64(i), window("g", float64(i), 10, 0.01, 1, 98), host(0.3))
	}
	if n := len(r.rec.all()); n != 0 {
		t.Fatalf("GPU-bound run got %d advisories", n)
	}
	h, err := History(r.st, "g")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Evaluations) != 6 {
		t.Fatalf("%d evaluations, want 6", len(h.Evaluations))
	}
	for _, e := range h.Evaluations {
		if e.Classification != "gpu-bound" || !strings.Contains(e.Reason, "no change") {
			t.Errorf("%v", e)
		}
	}
}

func TestRAMOverTheLimitLowersPrefetchAtOnce(t *testing.T) {
	r := newRig(t)
	r.apply(0, window("m", 0, 10, 0.5, 0.5, 50), host(0.9), start("m", 4, 4, 10))
	sent := r.rec.all()
	if len(sent) != 1 || sent[0].GetDataloader().GetPrefetchFactor() != 3 || sent[0].GetDataloader().GetNumWorkers() != 4 ||
		sent[0].GetDataloader().GetClassification() != "memory-bound" {
		t.Fatalf("sent %v", sent)
	}
}

func TestObserveNeverBlocks(t *testing.T) {
	st, err := store.Open(t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a := New(st, &recorder{}, nil) // not started: nothing drains the queue
	b := testutil.Batch(1, 0, []*trainmeterv1.RunWindow{window("x", 0, 1, 0, 1, 90)})
	for range queueLen + 10 {
		a.Observe("n", b)
	}
	if got := a.skipped.Load(); got != 10 {
		t.Errorf("skipped %d, want 10", got)
	}
	if err := a.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestIdleRunsAreForgotten(t *testing.T) {
	r := newRig(t)
	r.apply(0, window("old", 0, 1, 0, 1, 90), host(0.3), start("old", 2, 2, 10))
	r.apply(1800, window("live", 1800, 1, 0, 1, 90), host(0.3), start("live", 2, 2, 10))
	if len(r.a.runs) != 2 {
		t.Fatalf("%d run states, want 2", len(r.a.runs))
	}
	// Past idleAfter of batch time since "old" was last seen, and a sweep
	// period since the last sweep: "old" goes, "live" (seen 30 min ago) stays.
	r.apply(3700, window("live", 3700, 1, 0, 1, 90), host(0.3))
	if _, ok := r.a.runs[key{"old", "n1"}]; ok {
		t.Error("a run idle for over an hour is still kept")
	}
	if _, ok := r.a.runs[key{"live", "n1"}]; !ok {
		t.Error("a live run was forgotten")
	}
}

func TestUndeliveredAdviceIsNotCountedAndIsSentAgain(t *testing.T) {
	r := newRig(t)
	r.rec.refuse = 1
	r.apply(0, window("u", 0, 10, 0.5, 0.5, 50), host(0.3), start("u", 2, 2, 10))
	r.apply(1, window("u", 1, 10, 0.5, 0.5, 50), host(0.3)) // change proposed, refused
	if n := len(r.rec.all()); n != 0 {
		t.Fatalf("%d advisories accepted, want 0", n)
	}
	s := r.a.runs[key{"u", "n1"}]
	if w, p := s.adv.Current(); w != 2 || p != 2 || s.adv.Adjustments() != 0 || s.epoch.adjustments != 0 {
		t.Fatalf("after a refused advice: current %d/%d, %d adjustments (%d this epoch); want 2/2 and none",
			w, p, s.adv.Adjustments(), s.epoch.adjustments)
	}
	// The next evaluation sends it again, from the same baseline.
	r.apply(2, window("u", 2, 10, 0.5, 0.5, 50), host(0.3), eval("u", 2.5, 1))
	sent := r.rec.all()
	if len(sent) != 1 || sent[0].GetDataloader().GetNumWorkers() != 3 || sent[0].GetDataloader().GetPrefetchFactor() != 3 {
		t.Fatalf("sent %v, want one advice 2→3 / 2→3", sent)
	}
	h, err := History(r.st, "u")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Evaluations) != 3 || !h.Evaluations[1].Changed || h.Evaluations[1].Delivered ||
		!strings.Contains(h.Evaluations[1].Reason, "not delivered") || !h.Evaluations[2].Delivered {
		t.Fatalf("evaluations %v", h.Evaluations)
	}
	if len(h.Epochs) != 1 || h.Epochs[0].Adjustments != 1 || h.Epochs[0].NumWorkers != 3 {
		t.Fatalf("epochs %v, want one epoch with 1 adjustment at 3 workers", h.Epochs)
	}
}

func TestIntervalMeasuredBeforeAnAppliedChangeIsDropped(t *testing.T) {
	r := newRig(t)
	r.apply(0, window("b", 0, 10, 0.5, 0.5, 50), host(0.3), start("b", 2, 2, 10))
	r.apply(1, window("b", 1, 10, 0.5, 0.5, 50), host(0.3)) // advice 2→3 / 2→3
	if n := len(r.rec.all()); n != 1 {
		t.Fatalf("%d advisories, want 1", n)
	}
	// Half an interval on the old settings, then the epoch boundary at which
	// the trainer applies the advice.
	r.apply(2, window("b", 2, 5, 0.9, 0.1, 20), host(0.3), eval("b", 2.5, 1))
	// Five steps on the new settings do not complete an interval: the five
	// before the boundary were dropped.
	r.apply(3, window("b", 3, 5, 0.1, 0.9, 90), host(0.3))
	h, err := History(r.st, "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Evaluations) != 2 {
		t.Fatalf("%d evaluations, want 2 (the interval spanning the boundary must restart): %v", len(h.Evaluations), h.Evaluations)
	}
	r.apply(4, window("b", 4, 5, 0.1, 0.9, 90), host(0.3))
	h, err = History(r.st, "b")
	if err != nil {
		t.Fatal(err)
	}
	// The third evaluation sees only steps after the boundary.
	if len(h.Evaluations) != 3 || h.Evaluations[2].DataWaitShare != 0.1 || h.Evaluations[2].GpuUtilization != 0.9 {
		t.Fatalf("evaluations %v, want a third one on the new settings only (wait 10%%, GPU 90%%)", h.Evaluations)
	}
}

func TestEpochBoundaryReachesEveryNodeOfTheRun(t *testing.T) {
	r := newRig(t)
	// Two nodes, one rank each; only rank 0 (on n1) reports evals.
	r.applyOn("n1", 0, window("d", 0, 10, 0.5, 0.5, 50), host(0.3), start("d", 2, 2, 10))
	r.applyOn("n2", 0, window("d", 0, 10, 0.5, 0.5, 50), host(0.3), start("d", 2, 2, 10))
	r.applyOn("n1", 1, window("d", 1, 10, 0.5, 0.5, 50), host(0.3))
	r.applyOn("n2", 1, window("d", 1, 10, 0.5, 0.5, 50), host(0.3))
	if n := len(r.rec.all()); n != 2 {
		t.Fatalf("%d advisories, want one per node", n)
	}
	r.applyOn("n1", 2, window("d", 2, 4, 0.5, 0.5, 50), host(0.3), eval("d", 2.5, 1))
	for _, node := range []string{"n1", "n2"} {
		s := r.a.runs[key{"d", node}]
		if open := s.step - s.closedSteps; s.lastEval != 1 || open != 0 {
			t.Errorf("%s: last boundary %d, %v steps in the open epoch; want epoch 1 closed", node, s.lastEval, open)
		}
	}
	h, err := History(r.st, "d")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*trainmeterv1.DataloaderEpoch{}
	for _, e := range h.Epochs {
		got[e.Node] = e
	}
	if len(h.Epochs) != 2 || got["n1"] == nil || got["n2"] == nil || got["n2"].Epoch != 1 || got["n2"].Adjustments != 1 || got["n2"].NumWorkers != 3 {
		t.Fatalf("epochs %v, want epoch 1 closed on n1 and on n2", h.Epochs)
	}
	// The boundary applied n2's advice too: its next change needs fresh
	// evidence, and no cooldown holds it.
	r.applyOn("n2", 3, window("d", 3, 10, 0.5, 0.5, 50), host(0.3))
	r.applyOn("n2", 4, window("d", 4, 10, 0.5, 0.5, 50), host(0.3))
	if n := len(r.rec.all()); n != 3 {
		t.Fatalf("%d advisories, want a second change on n2 right after its boundary", n)
	}
}

func TestEvalsWithoutEpochAreEachABoundary(t *testing.T) {
	r := newRig(t)
	r.apply(0, window("x", 0, 4, 0.5, 0.5, 50), host(0.3), start("x", 2, 2, 10), evalNoEpoch("x", 0.5))
	r.apply(1, window("x", 1, 4, 0.5, 0.5, 50), host(0.3), evalNoEpoch("x", 1.5))
	r.apply(2, window("x", 2, 4, 0.5, 0.5, 50), host(0.3), evalNoEpoch("x", 2.5))
	// An epoch given twice (two ranks report epoch 4) is one boundary.
	r.apply(3, window("x", 3, 4, 0.5, 0.5, 50), host(0.3), eval("x", 3.4, 4), eval("x", 3.5, 4))
	h, err := History(r.st, "x")
	if err != nil {
		t.Fatal(err)
	}
	var epochs []int64
	for _, e := range h.Epochs {
		epochs = append(epochs, e.Epoch)
	}
	if len(epochs) != 4 || epochs[0] != 1 || epochs[1] != 2 || epochs[2] != 3 || epochs[3] != 4 {
		t.Fatalf("epochs %v, want [1 2 3 4]: evals without an epoch are numbered in turn, not merged", epochs)
	}
}

func TestIntervalCountsStepsPerRank(t *testing.T) {
	r := newRig(t)
	// Two ranks on the node, 5 optimizer steps each per window: 10 step
	// events. adjustment_interval 10 is 10 optimizer steps: every second
	// window, not every window.
	w := func(sec float64) *trainmeterv1.RunWindow {
		w := window("two", sec, 10, 0.5, 0.5, 50)
		w.Gpus, w.StepRanks = []uint32{0, 1}, 2
		return w
	}
	r.apply(0, w(0), host(0.3), start("two", 2, 2, 10))
	for i := 1; i < 4; i++ {
		r.apply(float64(i), w(float64(i)), host(0.3))
	}
	h, err := History(r.st, "two")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Evaluations) != 2 || h.Evaluations[0].Step != 10 || h.Evaluations[1].Step != 20 {
		t.Fatalf("evaluations %v, want 2, at optimizer steps 10 and 20", h.Evaluations)
	}
	// 16 CPUs, 2 ranks: 7 workers per rank at most.
	r.apply(4, w(4), host(0.3), testutil.End("two", 4.5))
	h, _ = History(r.st, "two")
	if len(h.Epochs) != 1 || h.Epochs[0].Steps != 25 {
		t.Errorf("epochs %v, want one partial epoch of 25 optimizer steps", h.Epochs)
	}
	if sent := r.rec.all(); len(sent) != 1 || sent[0].GetDataloader().GetMaxWorkers() != 7 {
		t.Errorf("sent %v, want one advice with max_workers 7 (16 CPUs / 2 ranks − 1)", sent)
	}
}

func TestUtilisationIsAveragedOverTheReadingsThatHaveOne(t *testing.T) {
	r := newRig(t)
	// Two GPUs, 100 ticks: one reads 95 %, the other (a MIG slice) no
	// utilisation at all. The mean is 95 %, not 47.5 %: with 10 % data wait
	// and the wait shorter than compute, the run is GPU-bound.
	w := func(sec float64) *trainmeterv1.RunWindow {
		w := window("mig", sec, 10, 0.1, 0.9, 0)
		w.Gpus, w.VramSamples = []uint32{0, 1}, 200
		w.UtilizationSumPct, w.UtilizationSamples = 95*100, 100
		return w
	}
	r.apply(0, w(0), host(0.3), start("mig", 4, 2, 10))
	for i := 1; i < 4; i++ {
		r.apply(float64(i), w(float64(i)), host(0.3))
	}
	if sent := r.rec.all(); len(sent) != 0 {
		t.Fatalf("advised %v: the GPU readings without utilisation were counted as 0 %%", sent)
	}
	h, _ := History(r.st, "mig")
	for _, e := range h.Evaluations {
		if e.Classification != "gpu-bound" || e.GpuUtilization != 0.95 {
			t.Errorf("evaluation %v, want gpu-bound at 95 %%", e)
		}
	}
}

func TestUnknownUtilisationIsNotZero(t *testing.T) {
	r := newRig(t)
	w := func(sec float64) *trainmeterv1.RunWindow {
		w := window("nou", sec, 10, 0.5, 0.5, 0) // no utilisation readings
		w.UtilizationSumPct, w.UtilizationSamples = 0, 0
		return w
	}
	r.apply(0, w(0), host(0.3), start("nou", 2, 2, 10))
	r.apply(1, w(1), host(0.3), eval("nou", 1.5, 1))
	sent := r.rec.all()
	if len(sent) != 1 || sent[0].GetDataloader().GetClassification() != "data-bound" || sent[0].GetDataloader().GetGpuUtilization() != -1 {
		t.Fatalf("sent %v, want data-bound advice (on the wait share alone) with the utilisation unknown (-1)", sent)
	}
	h, _ := History(r.st, "nou")
	if len(h.Epochs) != 1 || h.Epochs[0].AvgGpuUtilization != -1 {
		t.Errorf("epochs %v, want the epoch's GPU utilisation unknown (-1)", h.Epochs)
	}
	for _, e := range h.Evaluations {
		if e.GpuUtilization != -1 || strings.Contains(e.Reason, "GPU 0%") {
			t.Errorf("evaluation %v, want the utilisation unknown", e)
		}
	}
}

// TestEpochStepsComeFromTheEvalsRankSteps: the eval of epoch 1 arrives
// with a window that also holds steps of epoch 2 (the window counts 30,
// the rank had reported 20 when it sent the eval); each epoch gets its own
// steps, and the partial epoch at run end the rest.
func TestEpochStepsComeFromTheEvalsRankSteps(t *testing.T) {
	r := newRig(t)
	ev := func(sec float64, epoch int64, rankSteps uint64) *trainmeterv1.RunEvent {
		e := eval("s", sec, epoch)
		e.GetEval().RankSteps = rankSteps
		return e
	}
	r.apply(0, window("s", 0, 15, 0.1, 0.9, 90), host(0.3), start("s", 2, 2, 1000))
	r.apply(1, window("s", 1, 15, 0.1, 0.9, 90), host(0.3), ev(1.3, 1, 20))
	r.apply(2, window("s", 2, 15, 0.1, 0.9, 90), host(0.3), ev(2.6, 2, 40))
	r.apply(3, window("s", 3, 3, 0.1, 0.9, 90), host(0.3), testutil.End("s", 3.2))
	h, err := History(r.st, "s")
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, e := range h.Epochs {
		got = append(got, e.Steps)
	}
	if !slices.Equal(got, []uint64{20, 20, 8}) {
		t.Errorf("epoch steps %v, want [20 20 8] (8 partial)", got)
	}
}

// A loader started with num_workers=0 on a 2-CPU host is advised 0→1 (the
// CPU bound), applied at the first epoch boundary; the epochs' throughput
// comes from the windows wholly inside each (the one the eval falls in
// counts in neither), and the history and the next-run recommendation
// show the measured speedup beside the expected gain.
func TestZeroWorkersRunGetsOneWorkerAndTheMeasuredGain(t *testing.T) {
	r := newRig(t)
	twoCPUs := &trainmeterv1.HostWindow{MemoryUsedMib: 0.3 * 64000, MemoryTotalMib: 64000, CpuCount: 2}
	slow := func(sec float64) *trainmeterv1.RunWindow { return window("z", sec, 10, 0.5, 0.5, 50) }
	fast := func(sec float64) *trainmeterv1.RunWindow {
		w := window("z", sec, 20, 0.1, 0.9, 90)
		w.Tokens, w.TokensMeasured = 2000, 2000
		return w
	}
	st := start("z", 0, 2, 10)
	st.GetRunStart().NumWorkers = proto.Uint32(0)
	r.apply(0, slow(0), twoCPUs, st)
	r.apply(1, slow(1), twoCPUs)
	sent := r.rec.all()
	if len(sent) != 1 {
		t.Fatalf("sent %d advisories, want 1", len(sent))
	}
	if d := sent[0].GetDataloader(); d.FromNumWorkers != 0 || d.NumWorkers != 1 || d.MaxWorkers != 1 {
		t.Fatalf("advice %v, want num_workers 0→1 (bound 1 on 2 CPUs)", d)
	}
	// The trainer's evals say what each epoch ran with (the Python client
	// adds it); the partial epoch at run_end ran with epoch 2's settings,
	// no change having been applied since.
	e1 := eval("z", 2.5, 1) // in [2, 3): that window straddles the boundary
	e1.GetEval().LoaderNumWorkers = proto.Uint32(0)
	e2 := eval("z", 4.5, 2)
	e2.GetEval().LoaderNumWorkers, e2.GetEval().LoaderPrefetchFactor = proto.Uint32(1), 3
	r.apply(2, slow(2), twoCPUs, e1)
	r.apply(3, fast(3), twoCPUs)
	r.apply(4, fast(4), twoCPUs, e2)
	r.apply(5, fast(5), twoCPUs)
	r.apply(6, fast(6), twoCPUs, testutil.End("z", 7))

	h, err := History(r.st, "z")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Epochs) != 3 {
		t.Fatalf("epochs %v", h.Epochs)
	}
	ep1, ep2, ep3 := h.Epochs[0], h.Epochs[1], h.Epochs[2]
	if !ep1.RanReported || ep1.RanNumWorkers != 0 || ep1.RanPrefetchFactor != 2 || ep1.NumWorkers != 1 ||
		ep1.MeasuredTokens != 2000 || ep1.MeasuredS != 2 || ep1.TokensPerS != 1000 {
		t.Errorf("epoch 1 %v: want run with 0 workers (1 at its end), 2000 tokens in 2 s", ep1)
	}
	if !ep2.RanReported || ep2.RanNumWorkers != 1 || ep2.MeasuredTokens != 2000 || ep2.MeasuredS != 1 || ep2.TokensPerS != 2000 {
		t.Errorf("epoch 2 %v: want run with 1 worker, 2000 tokens in 1 s (the windows of its evals straddle)", ep2)
	}
	if !ep3.RanReported || !ep3.Partial || ep3.RanNumWorkers != 1 || ep3.MeasuredTokens != 4000 || ep3.MeasuredS != 2 {
		t.Errorf("partial epoch 3 %v: want run with epoch 2's reported loader, 4000 tokens in 2 s", ep3)
	}
	if len(h.Changes) != 1 {
		t.Fatalf("changes %v, want one", h.Changes)
	}
	c := h.Changes[0]
	if c.AppliedAfterEpoch != 1 || !c.AppliedAt.AsTime().Equal(testutil.TS(2.5).AsTime()) || c.FromNumWorkers != 0 || c.NumWorkers != 1 ||
		c.TokensPerSBefore != 1000 || c.TokensPerSAfter != 2000 || c.MeasuredSpeedup != 2 || !c.Reported || c.MeasuredSAfter != 3 ||
		c.Classification != "data-bound" || c.ExpectedGain != 0.5 || !slices.Equal(c.Nodes, []string{"n1"}) {
		t.Errorf("change %v", c)
	}
	run, err := r.st.GetRun("z")
	if err != nil {
		t.Fatal(err)
	}
	rep := run.Report(aggregate.Pricing{})
	dl := DataloaderRecommendation(rep, h)
	if dl == nil || dl.Confidence != 0.8 || !strings.Contains(dl.Evidence, "1000 tok/s with num_workers 0") ||
		!strings.Contains(dl.Evidence, "2000 tok/s with 1") || !strings.Contains(dl.Evidence, "×2.00") {
		t.Fatalf("recommendation %v, want the measured speedup", dl)
	}
	if want := 0.5 * rep.GetTotalCostUsd(); rep.GetTotalCostUsd() <= 0 || dl.GetSavingsUsd() != want {
		t.Errorf("savings $%v, want half of the run's $%v (twice as fast)", dl.GetSavingsUsd(), rep.GetTotalCostUsd())
	}
}

// After a collector restart the advisor rebuilds a live run's state from
// the stored plan: num_workers 0 given stays 0, not the default 2.
func TestZeroWorkersSurvivesTheStoredPlan(t *testing.T) {
	r := newRig(t)
	st := start("p", 0, 2, 10)
	st.GetRunStart().NumWorkers = proto.Uint32(0)
	// The start is in the store but this advisor never saw it.
	if _, err := r.st.ApplyBatch("n1", "boot", testutil.Batch(100, 0, nil, st)); err != nil {
		t.Fatal(err)
	}
	twoCPUs := &trainmeterv1.HostWindow{MemoryUsedMib: 0.3 * 64000, MemoryTotalMib: 64000, CpuCount: 2}
	r.apply(1, window("p", 1, 10, 0.5, 0.5, 50), twoCPUs)
	r.apply(2, window("p", 2, 10, 0.5, 0.5, 50), twoCPUs)
	sent := r.rec.all()
	if len(sent) != 1 || sent[0].GetDataloader().GetFromNumWorkers() != 0 || sent[0].GetDataloader().GetNumWorkers() != 1 {
		t.Fatalf("advice %v, want num_workers 0→1", sent)
	}
}

// What the trainer reports its epochs ran with wins over the advisor's
// belief: a run that sent no num_workers (assumed 2) but whose eval says
// its first epoch ran with 0 workers is measured and advised from 0.
func TestReportedLoaderSettingsWin(t *testing.T) {
	r := newRig(t)
	twoCPUs := &trainmeterv1.HostWindow{MemoryUsedMib: 0.3 * 64000, MemoryTotalMib: 64000, CpuCount: 2}
	gpuBound := func(sec float64) *trainmeterv1.RunWindow { return window("b", sec, 10, 0.01, 1, 98) }
	st := start("b", 0, 0, 10)
	st.GetRunStart().PlannedEpochs = 3
	r.apply(0, gpuBound(0), twoCPUs, st)
	r.apply(1, gpuBound(1), twoCPUs)
	ev := eval("b", 2.5, 1)
	ev.GetEval().LoaderNumWorkers = proto.Uint32(0) // num_workers 0, no prefetch (no workers)
	r.apply(2, gpuBound(2), twoCPUs, ev)
	r.apply(3, window("b", 3, 10, 0.5, 0.5, 50), twoCPUs)
	r.apply(4, window("b", 4, 10, 0.5, 0.5, 50), twoCPUs)
	sent := r.rec.all()
	if len(sent) != 1 || sent[0].GetDataloader().GetFromNumWorkers() != 0 || sent[0].GetDataloader().GetNumWorkers() != 1 {
		t.Fatalf("advice %v, want num_workers 0→1 from the reported loader", sent)
	}
	h, err := History(r.st, "b")
	if err != nil {
		t.Fatal(err)
	}
	if e := h.Epochs[0]; !e.RanReported || e.RanNumWorkers != 0 || e.RanPrefetchFactor != 2 || e.TokensPerS != 1000 {
		t.Errorf("epoch 1 %v: want reported 0 workers (believed prefetch 2), 1000 tok/s", e)
	}
}

// TestHistoriesIsEachRunsHistory: the histories of every run, read in one
// scan, are each run's own History (a run whose id starts with another's
// included), and only runs with a history are in them.
func TestHistoriesIsEachRunsHistory(t *testing.T) {
	r := newRig(t)
	for _, run := range []string{"r", "r2"} {
		r.applyOn(run, 0, window(run, 0, 10, 0.5, 0.5, 50), host(0.3), start(run, 2, 2, 10))
		r.applyOn(run, 1, window(run, 1, 10, 0.5, 0.5, 50), host(0.3), eval(run, 1.5, 1))
		r.applyOn(run, 2, window(run, 2, 5, 0.1, 0.5, 50), host(0.3), testutil.End(run, 3))
	}
	hs, err := Histories(r.st)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 2 {
		t.Fatalf("histories of %d runs, want r and r2", len(hs))
	}
	for _, run := range []string{"r", "r2"} {
		h, err := History(r.st, run)
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Evaluations) != 2 || len(h.Epochs) != 2 || !proto.Equal(hs[run], h) {
			t.Errorf("run %s: Histories has %v, History %v", run, hs[run], h)
		}
	}
}
