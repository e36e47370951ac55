package aggregate

import (
	"math"
	"math/rand"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func ts(sec float64) *timestamppb.Timestamp {
	return timestamppb.New(t0.Add(time.Duration(sec * float64(time.Second))))
}

type ev struct {
	node string
	w    *trainmeterv1.RunWindow
	s    *trainmeterv1.RunStart
	e    *trainmeterv1.RunEnd
	ev   *trainmeterv1.Eval
}

func start(node string, at float64, model string, price float64) ev {
	return ev{node: node, s: &trainmeterv1.RunStart{
		RunId: "r1", Time: ts(at), GpuName: "H100-" + model, GpuPricePerHour: price,
		Metadata: &trainmeterv1.RunMetadata{Model: model, BatchSize: proto.Int64(8)},
	}}
}

func end(node string, at float64) ev {
	return ev{node: node, e: &trainmeterv1.RunEnd{RunId: "r1", Time: ts(at)}}
}

// win builds a 1-GPU-second window: counter energy c (ok if c >= 0),
// integrated energy i, peak p, tokens tok (all measured when measured).
func win(node string, from, to float64, measured bool, c, i, p float64, tok uint64, gpus ...uint32) ev {
	w := &trainmeterv1.RunWindow{
		RunId: "r1", Start: ts(from), End: ts(to), Phase: trainmeterv1.Phase_PHASE_WARMUP,
		EnergyIntegratedJ: i, PeakPowerW: p, Tokens: tok, Steps: 1,
		GpuSeconds: (to - from) * float64(len(gpus)), Gpus: gpus,
		VramPeakMib: 1000 + p, VramSumMib: 2000, VramSamples: 2,
	}
	if c >= 0 {
		w.EnergyCounterJ, w.CounterOk = c, true
	}
	if measured {
		w.Phase = trainmeterv1.Phase_PHASE_MEASURED
		w.TokensMeasured = tok
	}
	return ev{node: node, w: w}
}

func fold(evs []ev) *State {
	s := New("r1")
	for _, e := range evs {
		switch {
		case e.w != nil:
			s.AddWindow(e.node, e.w)
		case e.s != nil:
			s.AddStart(e.node, e.s)
		case e.e != nil:
			s.AddEnd(e.node, e.e)
		case e.ev != nil:
			s.AddEval(e.node, e.ev)
		}
	}
	return s
}

func TestReport(t *testing.T) {
	type want struct {
		wall, warmup, energy, total, integ, avgP, peak, tokS, jpt, disagree float64
		method                                                              string
		tokens, tokensMeasured                                              uint64
		gpus, nodes                                                         uint32
		ended, hasCost                                                      bool
		cost, gpuHours                                                      float64
		model                                                               string
	}
	cases := []struct {
		name    string
		evs     []ev
		pricing Pricing
		want    want
	}{
		{
			name: "single node warmup split counter",
			evs: []ev{
				start("a", 0, "m", 0),
				win("a", 0, 1, false, 100, 90, 150, 10, 0),
				win("a", 1, 2, false, 100, 90, 160, 10, 0),
				win("a", 2, 3, true, 200, 180, 210, 20, 0),
				win("a", 3, 4, true, 200, 180, 220, 20, 0),
				end("a", 4),
			},
			pricing: Pricing{GPUPricePerHour: 3.6},
			want: want{
				wall: 4, warmup: 2, energy: 400, total: 600, integ: 360, avgP: 200, peak: 220,
				tokS: 20, jpt: 10, disagree: 10, method: "counter", tokens: 60, tokensMeasured: 40,
				gpus: 1, nodes: 1, ended: true, hasCost: true, gpuHours: 4.0 / 3600, cost: 0.004, model: "m",
			},
		},
		{
			name: "two nodes sum tokens energy and peak per second",
			evs: []ev{
				start("b", 0.5, "late", 0),
				start("a", 0, "early", 2),
				win("a", 0, 1, true, 100, 100, 300, 100, 0, 1),
				win("b", 0.5, 1.5, true, 50, 50, 200, 50, 0),
				win("a", 1, 2, true, 100, 100, 250, 100, 0, 1),
				win("b", 1.5, 2.5, true, 50, 50, 210, 50, 0),
				end("a", 2),
				end("b", 2.5),
			},
			want: want{
				// peak buckets: second 0: a 300 + b 200 = 500; second 1: a 250 + b 210 = 460.
				wall: 2.5, warmup: 0, energy: 300, total: 300, integ: 300, avgP: 120, peak: 500,
				tokS: 120, jpt: 1, method: "counter", tokens: 300, tokensMeasured: 300,
				gpus: 3, nodes: 2, ended: true, hasCost: true, gpuHours: 6.0 / 3600, cost: 2 * 6.0 / 3600, model: "early",
			},
		},
		{
			name: "mixed counter and integrated, not ended",
			evs: []ev{
				start("a", 0, "m", 0),
				start("b", 0, "m", 0),
				win("a", 0, 1, true, 100, 80, 100, 10, 0),
				win("b", 0, 1, true, -1, 70, 90, 10, 0),
				end("a", 1),
			},
			want: want{
				wall: 1, energy: 170, total: 170, integ: 150, avgP: 170, peak: 190, tokS: 20, jpt: 8.5,
				disagree: 20, method: "mixed", tokens: 20, tokensMeasured: 20, gpus: 2, nodes: 2, model: "m",
				gpuHours: 2.0 / 3600,
			},
		},
		{
			name: "only warmup: no measured figures",
			evs: []ev{
				start("a", 0, "m", 0),
				win("a", 0, 1, false, -1, 80, 100, 10, 0),
				end("a", 1),
			},
			want: want{wall: 1, warmup: 1, total: 80, tokens: 10, gpus: 1, nodes: 1, ended: true, model: "m", gpuHours: 1.0 / 3600},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := fold(tc.evs).Report(tc.pricing)
			w := tc.want
			checkF := func(name string, got, want float64) {
				t.Helper()
				if d := got - want; d > 1e-9 || d < -1e-9 {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			checkF("wall", r.WallS, w.wall)
			checkF("warmup", r.WarmupS, w.warmup)
			checkF("energy", r.EnergyJ, w.energy)
			checkF("energy_total", r.EnergyTotalJ, w.total)
			checkF("energy_integrated", r.EnergyJIntegrated, w.integ)
			checkF("avg_power", r.GetAvgPowerW(), w.avgP)
			checkF("peak", r.PeakPowerW, w.peak)
			checkF("tok_per_s", r.GetTokPerS(), w.tokS)
			checkF("J_per_token", r.GetJPerToken(), w.jpt)
			checkF("disagreement", r.EnergyDisagreementPct, w.disagree)
			checkF("gpu_hours", r.GpuHours, w.gpuHours)
			checkF("cost", r.GetCostUsd(), w.cost)
			if r.EnergyMethod != w.method {
				t.Errorf("method = %q, want %q", r.EnergyMethod, w.method)
			}
			if r.TokensProcessed != w.tokens || r.TokensMeasured != w.tokensMeasured {
				t.Errorf("tokens = %d/%d, want %d/%d", r.TokensProcessed, r.TokensMeasured, w.tokens, w.tokensMeasured)
			}
			if r.Gpus != w.gpus || r.Nodes != w.nodes {
				t.Errorf("gpus/nodes = %d/%d, want %d/%d", r.Gpus, r.Nodes, w.gpus, w.nodes)
			}
			if r.Ended != w.ended || (r.CostUsd != nil) != w.hasCost {
				t.Errorf("ended/cost = %v/%v, want %v/has cost %v", r.Ended, r.CostUsd, w.ended, w.hasCost)
			}
			if r.GetMetadata().GetModel() != w.model {
				t.Errorf("model = %q, want %q", r.GetMetadata().GetModel(), w.model)
			}
		})
	}
}

func TestCostEnergyCO2(t *testing.T) {
	s := fold([]ev{
		start("a", 0, "m", 0),
		win("a", 0, 3600, true, 3.6e6, 3.6e6, 1000, 1_000_000, 0, 1), // 1 kWh, 2 GPU-hours
		end("a", 3600),
	})
	r := s.Report(Pricing{GPUPricePerHour: 2, EnergyPricePerKWh: 0.25, GridGCO2PerKWh: 400})
	if r.CostUsd == nil || r.GetCostUsd() != 4 || r.GpuHours != 2 || r.GetGpuPricePerHour() != 2 {
		t.Errorf("cost = %v %v %v", r.CostUsd, r.GpuHours, r.GpuPricePerHour)
	}
	if r.EnergyCostUsd == nil || r.EnergyKwh != 1 || r.GetEnergyCostUsd() != 0.25 {
		t.Errorf("energy cost = %v %v", r.EnergyKwh, r.EnergyCostUsd)
	}
	if r.GetUsdPerMtok() != 4.25 {
		t.Errorf("usd_per_mtok = %v, want 4.25", r.GetUsdPerMtok())
	}
	if r.Co2Kg == nil || r.GetCo2Kg() != 0.4 {
		t.Errorf("co2 = %v", r.Co2Kg)
	}
	// run_start price wins over the configured default.
	s.RunStart.GpuPricePerHour = 3
	if r := s.Report(Pricing{GPUPricePerHour: 2}); r.GetCostUsd() != 6 || r.EnergyCostUsd != nil || r.Co2Kg != nil {
		t.Errorf("run_start price: cost = %v", r.CostUsd)
	}
	// No price anywhere: unknown.
	s.RunStart.GpuPricePerHour = 0
	if r := s.Report(Pricing{}); r.CostUsd != nil || r.UsdPerMtok != nil {
		t.Errorf("no price: %v %v", r.CostUsd, r.GetUsdPerMtok())
	}
}

func TestOrderIndependentAndSerialisable(t *testing.T) {
	var evs []ev
	evs = append(evs, start("a", 0, "m", 1), start("b", 0.2, "m", 1))
	for i := 0; i < 30; i++ {
		f := float64(i)
		evs = append(evs,
			win("a", f, f+1, i >= 5, 100+f, 99+f, 300+f, 1000, 0),
			win("b", f+0.2, f+1.2, i >= 5, 50, 51, 200-f, 500, 0, 1))
	}
	evs = append(evs, ev{node: "a", ev: &trainmeterv1.Eval{RunId: "r1", Time: ts(10), Epoch: proto.Int64(1)}},
		ev{node: "b", ev: &trainmeterv1.Eval{RunId: "r1", Time: ts(20), Epoch: proto.Int64(2)}})
	evs = append(evs, end("a", 30), end("b", 30.2))
	want := fold(evs).Report(Pricing{})
	if want.TokensProcessed != 45000 || want.PeakPowerW != 300+29+200-29 || !want.Ended || len(want.Evals) != 2 {
		t.Fatalf("baseline: tokens %d peak %v ended %v evals %d", want.TokensProcessed, want.PeakPowerW, want.Ended, len(want.Evals))
	}
	rng := rand.New(rand.NewSource(1))
	for trial := 0; trial < 20; trial++ {
		// Interleave the two nodes' streams randomly, keeping each node's order,
		// and round-trip the state through JSON after every event.
		var a, b []ev
		for _, e := range evs {
			if e.node == "a" {
				a = append(a, e)
			} else {
				b = append(b, e)
			}
		}
		s := New("r1")
		for len(a)+len(b) > 0 {
			var e ev
			if len(b) == 0 || (len(a) > 0 && rng.Intn(2) == 0) {
				e, a = a[0], a[1:]
			} else {
				e, b = b[0], b[1:]
			}
			s = fold2(s, e)
			buf, err := s.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if s, err = Unmarshal(buf); err != nil {
				t.Fatal(err)
			}
		}
		got := s.Report(Pricing{})
		got.EnergyJ, want.EnergyJ = round9(got.EnergyJ), round9(want.EnergyJ)
		got.EnergyTotalJ, want.EnergyTotalJ = round9(got.EnergyTotalJ), round9(want.EnergyTotalJ)
		got.EnergyJIntegrated, want.EnergyJIntegrated = round9(got.EnergyJIntegrated), round9(want.EnergyJIntegrated)
		got.AvgPowerW, want.AvgPowerW = round9p(got.AvgPowerW), round9p(want.AvgPowerW)
		got.JPerToken, want.JPerToken = round9p(got.JPerToken), round9p(want.JPerToken)
		got.EnergyDisagreementPct, want.EnergyDisagreementPct = round9(got.EnergyDisagreementPct), round9(want.EnergyDisagreementPct)
		if !proto.Equal(got, want) {
			t.Fatalf("trial %d: report differs:\n got %v\nwant %v", trial, got, want)
		}
	}
}

func round9(v float64) float64 { return float64(int64(v*1e6+0.5)) / 1e6 }

func round9p(v *float64) *float64 {
	if v == nil {
		return nil
	}
	r := round9(*v)
	return &r
}

func fold2(s *State, e ev) *State {
	switch {
	case e.w != nil:
		s.AddWindow(e.node, e.w)
	case e.s != nil:
		s.AddStart(e.node, e.s)
	case e.e != nil:
		s.AddEnd(e.node, e.e)
	case e.ev != nil:
		s.AddEval(e.node, e.ev)
	}
	return s
}

func TestLiveReportAndResume(t *testing.T) {
	s := fold([]ev{start("a", 0, "m", 0), win("a", 0, 5, true, 10, 10, 1, 1, 0)})
	r := s.Report(Pricing{})
	if r.Ended || r.WallS != 5 {
		t.Fatalf("live: ended %v wall %v", r.Ended, r.WallS)
	}
	s.AddEnd("a", &trainmeterv1.RunEnd{RunId: "r1", Time: ts(6)})
	if r := s.Report(Pricing{}); !r.Ended || r.WallS != 6 {
		t.Fatalf("ended: %v wall %v", r.Ended, r.WallS)
	}
	// The run resumes on the same node: open again.
	s.AddStart("a", &trainmeterv1.RunStart{RunId: "r1", Time: ts(100)})
	if r := s.Report(Pricing{}); r.Ended || r.WallS != 5 {
		t.Fatalf("resumed: %v wall %v (start keeps the first RunStart)", r.Ended, r.WallS)
	}
}

func TestWindowsBeforeStart(t *testing.T) {
	s := fold([]ev{win("a", 10, 11, true, 10, 10, 1, 1, 0)})
	r := s.Report(Pricing{})
	if r.Start.AsTime() != t0.Add(10*time.Second) || r.WallS != 1 || r.WarmupS != 0 {
		t.Fatalf("start %v wall %v warmup %v", r.Start.AsTime(), r.WallS, r.WarmupS)
	}
}

func TestPeakBucketsStayBounded(t *testing.T) {
	s := New("r1")
	s.AddStart("a", &trainmeterv1.RunStart{RunId: "r1", Time: ts(0)})
	for i := 0; i < 5000; i++ {
		p := 100.0
		if i == 42 {
			p = 999
		}
		s.AddWindow("a", win("a", float64(i), float64(i+1), true, 1, 1, p, 1, 0).w)
	}
	if n := s.openPeakBuckets(); n > PeakHorizon+2 {
		t.Fatalf("%d open buckets, want <= %d", n, PeakHorizon+2)
	}
	if s.Peak() != 999 {
		t.Fatalf("peak = %v, want 999", s.Peak())
	}
}

func TestEndedRunFoldsEveryBucket(t *testing.T) {
	s := New("r1")
	for _, n := range []string{"a", "b"} {
		s.AddStart(n, &trainmeterv1.RunStart{RunId: "r1", Time: ts(0)})
	}
	for i := 0; i < 20; i++ {
		s.AddWindow("a", win("a", float64(i), float64(i+1), true, 1, 1, 100, 1, 0).w)
		s.AddWindow("b", win("b", float64(i), float64(i+1), true, 1, 1, 50+float64(i), 1, 0).w)
	}
	s.AddEnd("a", &trainmeterv1.RunEnd{RunId: "r1", Time: ts(20)})
	if s.openPeakBuckets() == 0 {
		t.Fatal("buckets folded while node b is still running")
	}
	s.AddEnd("b", &trainmeterv1.RunEnd{RunId: "r1", Time: ts(20)})
	if n := s.openPeakBuckets(); n != 0 {
		t.Fatalf("%d open buckets after every node ended, want 0", n)
	}
	if s.Peak() != 169 {
		t.Fatalf("peak = %v, want 169 (100 + 69 in the last second)", s.Peak())
	}
	// Resumed on a: later seconds are open buckets again and still sum.
	s.AddStart("a", &trainmeterv1.RunStart{RunId: "r1", Time: ts(100)})
	s.AddStart("b", &trainmeterv1.RunStart{RunId: "r1", Time: ts(100)})
	s.AddWindow("a", win("a", 100, 101, true, 1, 1, 100, 1, 0).w)
	s.AddWindow("b", win("b", 100, 101, true, 1, 1, 90, 1, 0).w)
	if s.Peak() != 190 {
		t.Fatalf("peak after resume = %v, want 190", s.Peak())
	}
}

func TestLastLossAndVRAM(t *testing.T) {
	w1 := win("a", 0, 1, true, 1, 1, 1, 1, 0).w
	w1.LastLoss = proto.Float64(2.5)
	w2 := win("a", 1, 2, true, 1, 1, 1, 1, 0).w
	w2.LastLoss = proto.Float64(2.0)
	w2.VramPeakMib, w2.VramSumMib, w2.VramSamples = 5000, 7000, 2
	s := New("r1")
	s.AddWindow("a", w2)
	s.AddWindow("a", w1)
	r := s.Report(Pricing{})
	if r.LastLoss == nil || r.GetLastLoss() != 2.0 {
		t.Errorf("last loss = %v", r.LastLoss)
	}
	if r.VramPeakMb != 5000 || r.VramAvgMb != 9000.0/4 {
		t.Errorf("vram = %v %v", r.VramPeakMb, r.VramAvgMb)
	}
}

func TestPlanComesFromTheWinningStartAndSurvivesSerialisation(t *testing.T) {
	s := New("r1")
	late := &trainmeterv1.RunStart{RunId: "r1", Time: ts(5), BudgetScope: "late", PlannedTokens: 1,
		Labels: map[string]string{"team": "other"}}
	early := &trainmeterv1.RunStart{RunId: "r1", Time: ts(1), BudgetScope: "llama", PlannedSteps: 5000,
		PlannedTokens: 1 << 30, PlannedEpochs: 3, Params: 8e9, DatasetSize: 50000, NumWorkers: proto.Uint32(6),
		PrefetchFactor: 2, TargetGpuUtilization: 0.9, MaxRamUsage: 0.7, AdjustmentInterval: 25,
		Labels: map[string]string{"team": "nlp", "priority": "high"}}
	s.AddStart("b", late)
	s.AddStart("a", early)
	s.AddStart("c", late) // joins; must not overwrite
	early.Labels["team"] = "mutated after the fact"
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	want := &trainmeterv1.RunStart{RunId: "r1", Time: ts(1), BudgetScope: "llama", PlannedSteps: 5000, PlannedTokens: 1 << 30, PlannedEpochs: 3,
		Params: 8e9, DatasetSize: 50000, NumWorkers: proto.Uint32(6), PrefetchFactor: 2, TargetGpuUtilization: 0.9,
		MaxRamUsage: 0.7, AdjustmentInterval: 25, Labels: map[string]string{"team": "nlp", "priority": "high"}}
	if !proto.Equal(got.RunStart, want) {
		t.Fatalf("plan\n got %v\nwant %v", got.RunStart, want)
	}
}

// num_workers 0 given (the loader loads in the training process) is a
// setting the advisor must start from: it survives the store, and a
// repeated start that gives it fills a run that lacked it, 0 included.
func TestZeroNumWorkersGivenIsKept(t *testing.T) {
	s := New("r1")
	s.AddStart("a", &trainmeterv1.RunStart{RunId: "r1", Time: ts(0), NumWorkers: proto.Uint32(0), PrefetchFactor: 2})
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.RunStart.NumWorkers == nil || got.RunStart.GetNumWorkers() != 0 {
		t.Errorf("after the store: num_workers %v, want 0 given", got.RunStart.NumWorkers)
	}

	filled := New("r2")
	filled.AddStart("a", &trainmeterv1.RunStart{RunId: "r2", Time: ts(0)})
	if filled.RunStart.NumWorkers != nil {
		t.Fatal("a start without num_workers gave it")
	}
	filled.AddStart("a", &trainmeterv1.RunStart{RunId: "r2", Time: ts(0), NumWorkers: proto.Uint32(0)})
	filled.AddStart("a", &trainmeterv1.RunStart{RunId: "r2", Time: ts(0), NumWorkers: proto.Uint32(4)})
	if filled.RunStart.NumWorkers == nil || filled.RunStart.GetNumWorkers() != 0 {
		t.Errorf("filled: num_workers %v, want the first copy's 0", filled.RunStart.NumWorkers)
	}
}

// The peak over nodes whose windows arrive interleaved, each node in its
// own order and at most lag seconds behind the others, equals the
// brute-force max over seconds of the summed per-node maxima, whatever
// buckets were folded on the way.
func TestPeakMatchesBruteForceUnderInterleaving(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	for trial := 0; trial < 50; trial++ {
		nodes := []string{"a", "b", "c"}[:1+rng.Intn(3)]
		const secs = 400
		lag := rng.Intn(PeakHorizon / 2)
		peaks := map[string][]float64{}
		for _, n := range nodes {
			for range secs {
				peaks[n] = append(peaks[n], float64(rng.Intn(1000)))
			}
		}
		want := 0.0
		for i := range secs {
			sum := 0.0
			for _, n := range nodes {
				sum += peaks[n][i]
			}
			want = max(want, sum)
		}
		s := New("r1")
		for _, n := range nodes {
			s.AddStart(n, &trainmeterv1.RunStart{RunId: "r1", Time: ts(0)})
		}
		next := map[string]int{}
		for done := 0; done < secs*len(nodes); {
			n := nodes[rng.Intn(len(nodes))]
			lowest := secs
			for _, m := range nodes {
				lowest = min(lowest, next[m])
			}
			if next[n] >= secs || next[n] > lowest+lag {
				continue
			}
			i := next[n]
			s.AddWindow(n, win(n, float64(i), float64(i)+1, true, 1, 1, peaks[n][i], 1, 0).w)
			next[n]++
			done++
		}
		if got := s.Peak(); got != want {
			t.Fatalf("trial %d (%d nodes, lag %d): peak %v, want %v", trial, len(nodes), lag, got, want)
		}
		if n := s.openPeakBuckets(); n > PeakHorizon+lag+2 {
			t.Fatalf("trial %d: %d open buckets", trial, n)
		}
	}
}

// BenchmarkAddWindowManyNodes folds one window per node per second into a
// run of 1,000 nodes for its first 40 seconds (younger than PeakHorizon, so
// nothing folds yet), as ingest does for a large job.
func BenchmarkAddWindowManyNodes(b *testing.B) {
	const nodes, secs = 1000, 40
	names := make([]string, nodes)
	for i := range names {
		names[i] = "node-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	for b.Loop() {
		s := New("r1")
		for _, n := range names {
			s.AddStart(n, &trainmeterv1.RunStart{RunId: "r1", Time: ts(0)})
		}
		for sec := range secs {
			for _, n := range names {
				s.AddWindow(n, win(n, float64(sec), float64(sec)+1, true, 1, 1, 300, 1, 0).w)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*nodes*secs), "ns/window")
}

// The agent re-sends a `trainmeter run` run's start (same node, same time)
// with the fields the wrapped script's client filled in: they fill what the
// run lacks and overwrite nothing; the same start from another node, or a
// later one, changes nothing.
func TestRepeatedStartFillsMissingMetadata(t *testing.T) {
	s := New("r1")
	s.AddStart("a", &trainmeterv1.RunStart{RunId: "r1", Time: ts(0), Metadata: &trainmeterv1.RunMetadata{Model: "cli-model"},
		Labels: map[string]string{"team": "nlp"}})
	s.AddWindow("a", &trainmeterv1.RunWindow{RunId: "r1", Start: ts(0), End: ts(1), CounterOk: true, EnergyCounterJ: 10})
	s.AddStart("b", &trainmeterv1.RunStart{RunId: "r1", Time: ts(0), Metadata: &trainmeterv1.RunMetadata{Dataset: "from-b"}})
	s.AddStart("a", &trainmeterv1.RunStart{RunId: "r1", Time: ts(5), Metadata: &trainmeterv1.RunMetadata{Dataset: "later"}})
	s.AddStart("a", &trainmeterv1.RunStart{RunId: "r1", Time: ts(0), Params: 7e9, GpuName: "H100",
		Metadata: &trainmeterv1.RunMetadata{Model: "sim-model", Dataset: "synthetic", BatchSize: proto.Int64(4)},
		Labels:   map[string]string{"team": "vision", "exp": "7"}})
	m := s.RunStart.Metadata
	if m.Model != "cli-model" || m.Dataset != "synthetic" || m.BatchSize == nil || m.GetBatchSize() != 4 {
		t.Errorf("metadata %+v: want the first start's model, the filled dataset and batch size", m)
	}
	if s.RunStart.Params != 7e9 || s.GetRunStart().GetGpuName() != "H100" || s.RunStart.Labels["team"] != "nlp" || s.RunStart.Labels["exp"] != "7" {
		t.Errorf("params %d gpu %q labels %v", s.RunStart.Params, s.GetRunStart().GetGpuName(), s.RunStart.Labels)
	}
	if r := s.Report(Pricing{}); r.Ended || r.WallS != 1 {
		t.Errorf("the repeated start moved the run: ended %v wall %v", r.Ended, r.WallS)
	}
}

// openPeakBuckets counts the distinct open buckets.
func (s *State) openPeakBuckets() int {
	n := 0
	s.eachBucketSum(math.MaxInt64, func(float64) { n++ })
	return n
}
