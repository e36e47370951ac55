package recommend

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func report(id, model, gpu string, cost, energyJ, tokPerS float64) *trainmeterv1.RunReport {
	return &trainmeterv1.RunReport{RunId: id, Metadata: &trainmeterv1.RunMetadata{Model: model}, GpuName: gpu, Gpus: 1,
		TotalCostUsd: proto.Float64(cost), CostUsd: proto.Float64(cost), EnergyTotalJ: energyJ, EnergyJ: energyJ, TokPerS: proto.Float64(tokPerS), GpuPricePerHour: proto.Float64(2)}
}

func withEvals(r *trainmeterv1.RunReport, loss, acc []float64) *trainmeterv1.RunReport {
	for i := range max(len(loss), len(acc)) {
		e := &trainmeterv1.Eval{RunId: r.RunId, Epoch: proto.Int64(int64(i + 1))}
		if i < len(loss) {
			e.ValLoss = proto.Float64(loss[i])
		}
		if i < len(acc) {
			e.Accuracy = proto.Float64(acc[i])
		}
		r.Evals = append(r.Evals, e)
	}
	return r
}

func approx(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func TestEarlyStopping(t *testing.T) {
	r := Run{Report: withEvals(report("r", "m", "g", 10, 1000, 1), []float64{2, 1.5, 1.2, 1.199, 1.205}, nil), PlannedEpochs: 12}
	rec := EarlyStopping(r, 2, 0.01)
	if rec == nil {
		t.Fatal("no recommendation")
	}
	approx(t, "savings $", rec.GetSavingsUsd(), 7*10.0/5)
	approx(t, "savings J", rec.SavingsJ, 7*1000.0/5)
	// Still improving: nothing.
	r.Report = withEvals(report("r", "m", "g", 10, 1000, 1), []float64{2, 1.5, 1.2, 1.0, 0.9}, nil)
	if rec := EarlyStopping(r, 2, 0.01); rec != nil {
		t.Errorf("improving loss: %v", rec)
	}
	// Plateau at the very last planned epoch: nothing left to save.
	r.Report = withEvals(report("r", "m", "g", 10, 1000, 1), []float64{2, 1.5, 1.5, 1.5}, nil)
	r.PlannedEpochs = 4
	if rec := EarlyStopping(r, 2, 0.01); rec != nil {
		t.Errorf("plateau at the end: %v", rec)
	}
}

func TestEarlyStoppingOfAnEndedRunCountsOnlyWhatItSpent(t *testing.T) {
	// Ended at epoch 5, where patience ran out, of 12 planned: it never
	// spent epochs 6–12, so early stopping would have saved nothing.
	ended := func(loss []float64) Run {
		rep := withEvals(report("r", "m", "g", 10, 1000, 1), loss, nil)
		rep.Ended = true
		return Run{Report: rep, PlannedEpochs: 12}
	}
	if rec := EarlyStopping(ended([]float64{2, 1.5, 1.2, 1.199, 1.205}), 2, 0.01); rec != nil {
		t.Errorf("ended at its stop epoch: %v (savings $%v), want none", rec.Title, rec.GetSavingsUsd())
	}
	// Ended at epoch 7, two epochs past the stop epoch 5: those two.
	rec := EarlyStopping(ended([]float64{2, 1.5, 1.2, 1.199, 1.205, 1.21, 1.22}), 2, 0.01)
	if rec == nil || !strings.Contains(rec.Title, "epoch 5") {
		t.Fatalf("%v", rec)
	}
	approx(t, "savings $", rec.GetSavingsUsd(), 2*10.0/7)
	approx(t, "savings J", rec.SavingsJ, 2*1000.0/7)
	if !strings.Contains(rec.Evidence, "epochs 6–7") || !strings.Contains(rec.Evidence, "ended after 7 epochs") {
		t.Errorf("evidence %q", rec.Evidence)
	}
}

func TestEpochCountOfAnEndedRunCountsOnlyWhatItSpent(t *testing.T) {
	acc := []float64{0.5, 0.8, 0.87, 0.89, 0.895, 0.898, 0.9, 0.9}
	r := Run{Report: withEvals(report("r", "m", "g", 8, 800, 1), nil, acc), PlannedEpochs: 20}
	live := EpochCount(r)
	approx(t, "live savings $", live.GetSavingsUsd(), (20-4)*8.0/8)
	r.Report.Ended = true
	approx(t, "ended savings $", EpochCount(r).GetSavingsUsd(), (8-4)*8.0/8)
}

func TestEpochCountKnee(t *testing.T) {
	// Gain 0.5→0.9 = 0.4; 95 % of it (0.38) is reached at epoch 4 (0.89).
	r := Run{Report: withEvals(report("r", "m", "g", 8, 800, 1), nil, []float64{0.5, 0.8, 0.87, 0.89, 0.895, 0.898, 0.9, 0.9})}
	rec := EpochCount(r)
	if rec == nil || !strings.Contains(rec.Title, "for 4 epochs instead of 8") {
		t.Fatalf("%v", rec)
	}
	approx(t, "savings $", rec.GetSavingsUsd(), 4*8.0/8)
}

func TestDatasetSize(t *testing.T) {
	mk := func(id string, size uint64, acc, cost float64) Run {
		return Run{Report: withEvals(report(id, "m", "g", cost, 100*cost, 1), nil, []float64{acc}), DatasetSize: size}
	}
	runs := []Run{mk("a", 10000, 0.70, 1), mk("b", 50000, 0.86, 5), mk("c", 100000, 0.88, 10)}
	recs := DatasetSize(runs)
	if len(recs) != 1 {
		t.Fatalf("%v", recs)
	}
	// 0.86 ≥ 0.95 × 0.88 = 0.836; 0.70 is not.
	if !strings.Contains(recs[0].Title, "on 50000 samples instead of 100000") {
		t.Errorf("%v", recs[0].Title)
	}
	approx(t, "savings $", recs[0].GetSavingsUsd(), 10*(1-0.5))
}

func TestDatasetSizeComparesRunsOfOneDatasetOnly(t *testing.T) {
	mk := func(id, dataset string, size uint64, acc, cost float64) Run {
		r := Run{Report: withEvals(report(id, "m", "g", cost, 100*cost, 1), nil, []float64{acc}), DatasetSize: size}
		r.Report.Metadata.Dataset = dataset
		return r
	}
	// Same model, two datasets: 10k samples of one are no evidence about
	// 100k samples of the other.
	if recs := DatasetSize([]Run{mk("a", "sft", 10000, 0.88, 1), mk("b", "pretrain", 100000, 0.88, 10)}); len(recs) != 0 {
		t.Errorf("compared across datasets: %v", recs)
	}
	recs := DatasetSize([]Run{mk("a", "sft", 10000, 0.88, 1), mk("b", "pretrain", 100000, 0.88, 10), mk("c", "sft", 50000, 0.89, 5)})
	if len(recs) != 1 || !strings.Contains(recs[0].Title, "on 10000 samples of sft instead of 50000") {
		t.Errorf("%v", recs)
	}
}

type catalog map[string]float64

func (c catalog) CurrentPrice(g string) (float64, bool) { p, ok := c[g]; return p, ok }

func TestComputeTierGapAndCatalog(t *testing.T) {
	a := report("a", "m", "A100", 10, 0, 1000) // $2/h / 1000 tok/s
	b := report("b", "m", "H100", 10, 0, 2000)
	b.GpuPricePerHour = proto.Float64(3) // $3/h / 2000 tok/s: 25 % cheaper per throughput
	runs := []Run{{Report: a}, {Report: b}}
	recs := ComputeTier(runs, nil)
	if len(recs) != 1 || !strings.Contains(recs[0].Title, "on H100 instead of A100") {
		t.Fatalf("%v", recs)
	}
	approx(t, "savings $", recs[0].GetSavingsUsd(), 0.25*10)
	// The catalog has both: A100 $2/h, H100 now $3.6/h: 10 % cheaper, below
	// the 20 % bar.
	if recs := ComputeTier(runs, catalog{"A100": 2, "H100": 3.6}); len(recs) != 0 {
		t.Errorf("with catalog: %v", recs)
	}
	// A catalog that knows only the H100 is not set against the A100 run's
	// own price: both sides use the runs' own prices (25 %).
	recs = ComputeTier(runs, catalog{"H100": 3.6})
	if len(recs) != 1 || !strings.Contains(recs[0].Evidence, "runs' own prices") {
		t.Fatalf("catalog with one GPU model: %v, want the runs' own prices on both sides", recs)
	}
	approx(t, "savings $ on own prices", recs[0].GetSavingsUsd(), 0.25*10)
	// One GPU model only: nothing to compare.
	if recs := ComputeTier(runs[:1], nil); len(recs) != 0 {
		t.Errorf("%v", recs)
	}
}

func TestComputeTierEnergy(t *testing.T) {
	a := report("a", "m", "A100", 10, 0, 1000)
	b := report("b", "m", "H100", 10, 0, 2000)
	b.GpuPricePerHour = proto.Float64(3)
	a.JPerToken, a.TokensMeasured = proto.Float64(0.5), 1e6
	b.JPerToken, b.TokensMeasured = proto.Float64(0.3), 2e6
	recs := ComputeTier([]Run{{Report: a}, {Report: b}}, nil)
	if len(recs) != 1 {
		t.Fatalf("%v", recs)
	}
	approx(t, "savings J", recs[0].SavingsJ, (0.5-0.3)*1e6)
	// The cheaper GPU takes more energy per token: no joules saved, and the
	// risks say so.
	b.JPerToken = proto.Float64(0.6)
	recs = ComputeTier([]Run{{Report: a}, {Report: b}}, nil)
	if len(recs) != 1 || recs[0].SavingsJ != 0 || !strings.Contains(strings.Join(recs[0].Risks, ";"), "20% more energy per token") {
		t.Errorf("%v", recs)
	}
}

func TestBatchSize(t *testing.T) {
	r := report("r", "m", "g", 10, 1000, 1000)
	r.Metadata.BatchSize = proto.Int64(8)
	r.VramPeakMb = 20000
	run := Run{Report: r, GPUMemoryMiB: 80000}
	rec := BatchSize(run, []Run{run})
	if rec == nil || rec.Confidence != 0.3 {
		t.Fatalf("heuristic: %v", rec)
	}
	approx(t, "heuristic savings", rec.GetSavingsUsd(), 10*(1-1/BatchAssumedSpeedup))
	big := report("big", "m", "g", 10, 1000, 1250)
	big.Metadata.BatchSize = proto.Int64(16)
	rec = BatchSize(run, []Run{run, {Report: big}})
	if rec == nil || rec.Confidence != 0.75 {
		t.Fatalf("measured: %v", rec)
	}
	approx(t, "measured savings", rec.GetSavingsUsd(), 10*(1-1/1.25))
	// Little headroom: nothing.
	r.VramPeakMb = 60000
	if rec := BatchSize(run, nil); rec != nil {
		t.Errorf("%v", rec)
	}
}

func TestPowerFromMeasuredPair(t *testing.T) {
	hi := report("hi", "m", "g", 10, 0, 1000)
	hi.AvgPowerW, hi.JPerToken, hi.TokensMeasured = proto.Float64(700), proto.Float64(0.7), 1e6
	hi.EnergyKwh, hi.EnergyCostUsd = 1, proto.Float64(0.2)
	lo := report("lo", "m", "g", 10, 0, 950)
	lo.AvgPowerW, lo.JPerToken = proto.Float64(560), proto.Float64(0.59)
	recs := Power([]Run{{Report: hi}, {Report: lo}})
	if len(recs) != 1 || recs[0].RunIds[0] != "hi" || recs[0].Confidence != 0.6 {
		t.Fatalf("%v", recs)
	}
	approx(t, "savings J", recs[0].SavingsJ, (0.7-0.59)*1e6)
	// The heuristic needs a known power limit and a busy GPU.
	h := report("h", "m2", "g", 10, 3.6e6, 1000)
	h.AvgPowerW, h.JPerToken = proto.Float64(650), proto.Float64(1)
	recs = Power([]Run{{Report: h, GPUPowerLimitW: 700}})
	if len(recs) != 1 || recs[0].Confidence != 0.3 {
		t.Fatalf("heuristic: %v", recs)
	}
	approx(t, "heuristic J", recs[0].SavingsJ, 0.15*3.6e6)
	if recs := Power([]Run{{Report: h}}); len(recs) != 0 {
		t.Errorf("no limit known: %v", recs)
	}
}

func TestFilterAndTargets(t *testing.T) {
	// Live runs, 4 of 10 epochs done: projected to cost 2.5 × as much.
	runs := []Run{
		{Report: withEvals(report("r1", "m", "g", 10, 1000, 1), []float64{2, 2, 2, 2}, nil), PlannedEpochs: 10},
		{Report: withEvals(report("r2", "m", "g", 20, 1000, 1), []float64{2, 2, 2, 2}, nil), PlannedEpochs: 10},
	}
	runs[0].Report.ProjectedCostUsd, runs[1].Report.ProjectedCostUsd = proto.Float64(25), proto.Float64(50)
	all := Recommend(runs, Options{})
	if len(all) != 2 || all[0].RunIds[0] != "r2" {
		t.Fatalf("sorted by savings: %v", all)
	}
	only := Recommend(runs, Options{Targets: []string{"r1"}})
	if len(only) != 1 || only[0].RunIds[0] != "r1" {
		t.Fatalf("targets: %v", only)
	}
	kept, usd, _ := Filter(all, 0.99, runs)
	if len(kept) != 0 || usd != 0 {
		t.Errorf("filter 0.99: %v", kept)
	}
	kept, usd, _ = Filter(all, 0, runs)
	approx(t, "total", usd, all[0].GetSavingsUsd()+all[1].GetSavingsUsd()) // two runs: they add up
	if len(kept) != 2 {
		t.Errorf("%v", kept)
	}
}

func TestTotalCountsOverlappingSavingsOnceAndNeverExceedsTheCost(t *testing.T) {
	// The $10 run of the audit: early stopping, epoch count and dataset size
	// each claim most of its epochs; a bigger batch and a cheaper GPU claim
	// part of what is left.
	run := Run{Report: report("r", "m", "g", 10, 1000, 1)}
	small := Run{Report: report("s", "m", "g", 2, 200, 1)}
	rec := func(kind string, usd, j float64, ids ...string) *trainmeterv1.Recommendation {
		return &trainmeterv1.Recommendation{Kind: kind, SavingsUsd: proto.Float64(usd), SavingsJ: j, RunIds: ids, Confidence: 0.9}
	}
	recs := []*trainmeterv1.Recommendation{
		rec(KindEarlyStopping, 5.83, 583, "r"),
		rec(KindEpochCount, 4, 400, "r"),
		rec(KindDatasetSize, 5, 500, "s", "r"), // booked to r, the larger run
		rec(KindBatchSize, 0.91, 91, "r"),
		rec(KindDataloader, 0.5, 50, "r"),
	}
	usd, j := Total(recs, []Run{run, small})
	// work: max 5.83 → 58.3 %; step time: max 0.91 → 9.1 % of the rest.
	approx(t, "total $", usd, 10*(1-(1-0.583)*(1-0.091)))
	approx(t, "total J", j, 1000*(1-(1-0.583)*(1-0.091)))
	naive := 0.0
	for _, r := range recs {
		naive += r.GetSavingsUsd()
	}
	if naive <= 10 || usd > 10 {
		t.Fatalf("naive sum $%v, total $%v: want the naive sum over the cost and the total under it", naive, usd)
	}
	// Claims larger than the run: the total stops at its cost.
	usd, _ = Total([]*trainmeterv1.Recommendation{rec(KindEarlyStopping, 12, 0, "r"), rec(KindComputeTier, 4, 0, "r")}, []Run{run})
	approx(t, "capped total $", usd, 10)
	// A live run is capped by its projected cost.
	live := Run{Report: report("l", "m", "g", 10, 1000, 1)}
	live.Report.ProjectedCostUsd = proto.Float64(40)
	usd, j = Total([]*trainmeterv1.Recommendation{rec(KindEarlyStopping, 30, 3000, "l"), rec(KindComputeTier, 20, 0, "l")}, []Run{live})
	approx(t, "live total $", usd, 40*(1-(1-0.75)*(1-0.5)))
	approx(t, "live total J", j, 3000)
	// A compute-tier recommendation about two runs is shared by their costs.
	usd, _ = Total([]*trainmeterv1.Recommendation{rec(KindComputeTier, 2.4, 0, "r", "s"), rec(KindEarlyStopping, 1, 0, "s")}, []Run{run, small})
	approx(t, "shared total $", usd, 2+2*(1-(1-0.4/2)*(1-1.0/2)))
	// One recommendation alone: exactly its saving, never a rounding under
	// it (the e2e run's $0.0008005103142857144 once totalled ...143).
	const one = 0.0008005103142857144
	tiny := Run{Report: report("t", "m", "g", 0.0028017861, 1, 1)}
	if usd, _ := Total([]*trainmeterv1.Recommendation{rec(KindEarlyStopping, one, 0, "t")}, []Run{tiny}); usd != one {
		t.Fatalf("a single saving of $%v totals $%v", one, usd)
	}
}

// The case: the lower-power run differed in batch size and world
// size (and was faster), so its lower J/token says nothing about a power
// limit. Only runs alike in model, GPU, batch size, sequence length,
// precision and world size are compared, and the evidence names them.
func TestPowerComparesOnlyLikeRuns(t *testing.T) {
	like := func(id string, powerPerGPU, jPerToken, tokPerS float64) *trainmeterv1.RunReport {
		r := report(id, "llama", "H100", 10, 0, tokPerS)
		r.Gpus, r.Nodes = 2, 1
		r.Metadata.BatchSize = proto.Int64(32)
		r.Metadata.SeqLen = proto.Int64(2048)
		r.Metadata.Precision = "bf16"
		r.AvgPowerW, r.JPerToken, r.TokensMeasured = proto.Float64(2*powerPerGPU), proto.Float64(jPerToken), 1e6
		return r
	}
	hi := like("hi", 700, 0.7, 2000)
	for name, change := range map[string]func(r *trainmeterv1.RunReport){
		"batch size": func(r *trainmeterv1.RunReport) { r.Metadata.BatchSize = proto.Int64(64) },
		"world size": func(r *trainmeterv1.RunReport) {
			r.Gpus, r.TokPerS, r.AvgPowerW = 4, proto.Float64(4000), proto.Float64(4*560)
		},
		"nodes":     func(r *trainmeterv1.RunReport) { r.Nodes = 2 },
		"seq len":   func(r *trainmeterv1.RunReport) { r.Metadata.SeqLen = nil },
		"precision": func(r *trainmeterv1.RunReport) { r.Metadata.Precision = "fp16" },
		"model":     func(r *trainmeterv1.RunReport) { r.Metadata.Model = "llama-2" },
		"GPU model": func(r *trainmeterv1.RunReport) { r.GpuName = "A100" },
		"both (issue)": func(r *trainmeterv1.RunReport) {
			r.Metadata.BatchSize, r.Gpus, r.TokPerS, r.AvgPowerW = proto.Int64(64), 4, proto.Float64(4400), proto.Float64(4*560)
		},
	} {
		lo := like("lo", 560, 0.59, 2100) // lower power and faster
		change(lo)
		if recs := Power([]Run{{Report: hi}, {Report: lo}}); len(recs) != 0 {
			t.Errorf("%s differs: recommended %v", name, recs)
		}
	}
	other := like("other", 690, 0.71, 1990)
	lo := like("lo", 560, 0.59, 1950)
	unlike := like("unlike", 500, 0.5, 2500)
	unlike.Metadata.BatchSize = proto.Int64(128)
	recs := Power([]Run{{Report: hi}, {Report: lo}, {Report: other}, {Report: unlike}})
	if len(recs) != 2 {
		t.Fatalf("want hi and other told to lower their limit, got %v", recs)
	}
	for _, rec := range recs {
		if !strings.Contains(rec.Title, "as run lo") {
			t.Errorf("compared with the wrong run: %s", rec.Title)
		}
		want := "compared like runs hi, lo, other (model llama, GPU H100, batch size 32, seq len 2048, precision bf16, world size 2 GPUs on 1 node)"
		if !strings.Contains(rec.Evidence, want) {
			t.Errorf("evidence %q does not say %q", rec.Evidence, want)
		}
		if strings.Contains(rec.Evidence, "unlike") {
			t.Errorf("evidence names the unlike run: %q", rec.Evidence)
		}
	}
}

func TestAnUncostedSavingIsAbsentNotZero(t *testing.T) {
	rep := withEvals(report("r", "m", "g", 10, 1000, 1), []float64{2, 1.5, 1.2, 1.199, 1.205}, nil)
	rep.TotalCostUsd, rep.CostUsd = nil, nil // no price: the run has no cost
	rec := EarlyStopping(Run{Report: rep, PlannedEpochs: 12}, 2, 0.01)
	if rec == nil {
		t.Fatal("no recommendation")
	}
	if rec.SavingsUsd != nil {
		t.Errorf("savings_usd %v for a run without a cost, want absent", rec.GetSavingsUsd())
	}
	approx(t, "savings J", rec.SavingsJ, 7*1000.0/5) // the energy is still measured
	if rec.SavingsCo2Kg != nil {
		t.Errorf("savings_co2_kg %v from a rule that does not estimate CO2, want absent", rec.GetSavingsCo2Kg())
	}
	// A costed recommendation sorts before an uncosted one.
	costed := &trainmeterv1.Recommendation{Kind: KindPower, SavingsUsd: proto.Float64(0)}
	recs := []*trainmeterv1.Recommendation{rec, costed}
	Sort(recs)
	if recs[0] != costed {
		t.Errorf("sorted %v first, want the costed one", recs[0].GetKind())
	}
}

// TestLowerPowerPeersIsEveryPair: for random like groups (ties in power,
// throughput and J/token included, NaN in some), the n log n search picks
// the run that trying every pair picks.
func TestLowerPowerPeersIsEveryPair(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	perGPU := func(r Run) float64 { return r.Report.GetAvgPowerW() / float64(r.Report.GetGpus()) }
	for trial := range 2000 {
		g := make([]Run, 1+rnd.IntN(40))
		for i := range g {
			gpus := uint32(1 + rnd.IntN(2))
			g[i] = Run{Report: &trainmeterv1.RunReport{Gpus: gpus,
				AvgPowerW: proto.Float64(float64(200+25*rnd.IntN(8)) * float64(gpus)),
				TokPerS:   proto.Float64(float64(900+10*rnd.IntN(15)) * float64(gpus)),
				JPerToken: proto.Float64(0.2 + 0.01*float64(rnd.IntN(12)))}}
			if trial%10 == 0 && rnd.IntN(20) == 0 {
				g[i].Report.JPerToken = proto.Float64(math.NaN())
			}
		}
		got := lowerPowerPeers(g, perGPU)
		for hi := range g {
			want := -1
			for lo := range g {
				h, l := g[hi].Report, g[lo].Report
				if perGPU(g[lo]) >= perGPU(g[hi]) {
					continue
				}
				saving := 1 - l.GetJPerToken()/h.GetJPerToken()
				slow := 1 - (l.GetTokPerS()/float64(l.GetGpus()))/(h.GetTokPerS()/float64(h.GetGpus()))
				if saving >= PowerMinSaving && slow <= PowerMaxSlowdown && (want < 0 || l.GetJPerToken() < g[want].Report.GetJPerToken()) {
					want = lo
				}
			}
			if got[hi] != want {
				t.Fatalf("trial %d, run %d of %d: picked %d, every pair picks %d", trial, hi, len(g), got[hi], want)
			}
		}
	}
}
