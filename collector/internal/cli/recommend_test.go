package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// evalEv is an eval event with a validation loss.
func evalEv(run string, sec float64, epoch int64, loss float64) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{
		RunId: run, Time: tu.TS(sec), Epoch: proto.Int64(epoch), ValLoss: proto.Float64(loss)}}}
}

func TestRecommend(t *testing.T) {
	addr := liveCollector(t)
	// A plateauing run of 10 planned epochs that ended after 6: patience ran
	// out at epoch 4, and it trained epochs 5 and 6 for nothing.
	a := tu.Connect(t, tu.Dial(t, addr), "gpu-box-2", "boot")
	start := tu.Start("plateau", 10, "m")
	start.GetRunStart().PlannedEpochs = 10
	losses := []float64{2, 1.5, 1.5, 1.5, 1.5, 1.5}
	for i, l := range losses {
		sec := 10 + float64(i)
		evs := []*trainmeterv1.RunEvent{evalEv("plateau", sec+0.5, int64(i+1), l)}
		if i == 0 {
			evs = append([]*trainmeterv1.RunEvent{start}, evs...)
		}
		if i == len(losses)-1 {
			evs = append(evs, tu.End("plateau", sec+1))
		}
		a.MustAck(tu.Batch(uint64(i+1), sec, []*trainmeterv1.RunWindow{tu.Window("plateau", sec, 1000, 100)}, evs...))
	}

	out, err := run(t, nil, "recommend", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	// $2/GPU-hour × 6 s = $0.003333 and 6 × 100 J; 2 epochs after the stop
	// epoch × cost/6 (the planned epochs 7–10 were never spent).
	for _, want := range []string{"[early_stopping] Stop plateau at epoch 4", "savings:    $0.00111, 200 J", "confidence: 0.90", "total potential savings"} {
		if !strings.Contains(out, want) {
			t.Errorf("recommend lacks %q:\n%s", want, out)
		}
	}
	out, err = run(t, nil, "recommend", "plateau", "--json", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Recommendations []struct {
			Kind       string  `json:"kind"`
			SavingsUsd float64 `json:"savings_usd"`
		} `json:"recommendations"`
		TotalSavingsUsd float64 `json:"total_savings_usd"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if len(resp.Recommendations) != 1 || resp.Recommendations[0].Kind != "early_stopping" {
		t.Fatalf("--json: %s", out)
	}
	if want := 2 * (2.0 * 6 / 3600) / 6; abs(resp.TotalSavingsUsd-want) > 1e-12 {
		t.Errorf("total savings %v, want %v", resp.TotalSavingsUsd, want)
	}
	if out, err = run(t, nil, "recommend", "--min-confidence", "0.95", "--collector", addr); err != nil || !strings.Contains(out, "no recommendations") {
		t.Errorf("--min-confidence 0.95: %v\n%s", err, out)
	}
	if _, err = run(t, nil, "recommend", "--min-confidence", "1.5", "--collector", addr); err == nil {
		t.Error("--min-confidence 1.5 accepted")
	}
	if _, err = run(t, nil, "recommend", "nope", "--collector", addr); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown run: %v", err)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func TestRecommendRunPrintsItsDataloaderEpochs(t *testing.T) {
	addr := liveCollector(t)
	a := tu.Connect(t, tu.Dial(t, addr), "gpu-box-3", "boot")
	start := tu.Start("loader", 20, "m")
	rs := start.GetRunStart()
	rs.NumWorkers, rs.PrefetchFactor, rs.AdjustmentInterval = proto.Uint32(2), 2, 10
	// Six epochs of one batch each: 10 steps waiting as long as they
	// compute, the GPU at 50 %, 16 CPUs, RAM at 1000 of 64000 MiB. Each
	// second evaluation changes the settings; the first epoch boundary after
	// a change makes the next one wait for two fresh evaluations.
	for i := range 6 {
		sec := 20 + float64(i)
		w := tu.Window("loader", sec, 1000, 100)
		w.Steps, w.DataWaitS, w.ComputeS, w.StepRanks = 10, 0.5, 0.5, 1
		w.UtilizationSumPct, w.UtilizationSamples = 50*20, 20
		evs := []*trainmeterv1.RunEvent{evalEv("loader", sec+0.5, int64(i+1), 1)}
		if i == 0 {
			evs = append([]*trainmeterv1.RunEvent{start}, evs...)
		}
		if i == 5 {
			evs = append(evs, tu.End("loader", sec+1))
		}
		// Acked, with the advisories the collector sends down the stream
		// in between.
		b := tu.Batch(uint64(i+1), sec, []*trainmeterv1.RunWindow{w}, evs...)
		if err := a.Stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Batch{Batch: b}}); err != nil {
			t.Fatal(err)
		}
		for {
			resp, err := a.Stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetAck().GetSeq() == b.GetSeq() {
				break
			}
			if resp.GetAdvisory() == nil {
				t.Fatalf("batch %d: want ack or advisory, got %v", b.GetSeq(), resp)
			}
		}
	}
	// The advisor works behind ingestion: wait for its sixth epoch.
	var out string
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if out, err = run(t, nil, "recommend", "loader", "--collector", addr); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "6 evaluations") && strings.Count(out, "gpu-box-3  ") >= 9 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(out, "dataloader advice (loader):") || !strings.Contains(out, "6 evaluations, 3 adjustments") {
		t.Fatalf("recommend loader:\n%s", out)
	}
	// The per-epoch table: node, epoch, steps, adjustments, workers,
	// prefetch (in force at its end), avg GPU, avg RAM, data wait, the
	// loader it ran with (a change applies after the epoch it was
	// delivered in), tok/s. Every window here holds
	// an epoch boundary, so no epoch has a whole window to measure.
	want := [][]string{
		{"gpu-box-3", "1", "10", "0", "2", "2", "50%", "2%", "50%", "2/2", "-"},
		{"gpu-box-3", "2", "10", "1", "3", "3", "50%", "2%", "50%", "2/2", "-"},
		{"gpu-box-3", "3", "10", "0", "3", "3", "50%", "2%", "50%", "3/3", "-"},
		{"gpu-box-3", "4", "10", "1", "5", "4", "50%", "2%", "50%", "3/3", "-"},
		{"gpu-box-3", "5", "10", "0", "5", "4", "50%", "2%", "50%", "5/4", "-"},
		{"gpu-box-3", "6", "10", "1", "8", "5", "50%", "2%", "50%", "5/4", "-"},
	}
	lines := strings.Split(out, "\n")
	at := -1
	for i, l := range lines {
		if strings.Fields(l) != nil && strings.Join(strings.Fields(l), " ") == "node epoch steps adjustments workers prefetch avg GPU avg RAM data wait ran with tok/s (node, after warmup)" {
			at = i
		}
	}
	if at < 0 || len(lines) < at+1+len(want) {
		t.Fatalf("no per-epoch table in:\n%s", out)
	}
	for i, w := range want {
		if got := strings.Fields(lines[at+1+i]); strings.Join(got, " ") != strings.Join(w, " ") {
			t.Errorf("epoch row %d: %q, want %q", i+1, got, w)
		}
	}
	// The changes applied (at the boundary after each delivered advice; the
	// last one came with the run's last epoch and was never applied), with
	// the advice's expected gain; no throughput was measured.
	for _, row := range []string{
		"2 2025-03-01T12:00:21Z 2→3 2→3 - - - up to ×2.00 (data wait 50%) (assumed applied: the trainer reports no loader settings)",
		"4 2025-03-01T12:00:23Z 3→5 3→4 - - - up to ×2.00 (data wait 50%) (assumed applied: the trainer reports no loader settings)",
	} {
		found := false
		for _, l := range lines {
			found = found || strings.Join(strings.Fields(l), " ") == row
		}
		if !found {
			t.Errorf("no applied change %q in:\n%s", row, out)
		}
	}
}

func TestRecommendationsShowAnUncostedSavingAsADash(t *testing.T) {
	var b strings.Builder
	writeRecommendations(&b, &trainmeterv1.RecommendResponse{Recommendations: []*trainmeterv1.Recommendation{
		{Kind: "schedule", Title: "t", SavingsJ: 0, SavingsCo2Kg: proto.Float64(1.5)},
		{Kind: "early_stopping", Title: "u", SavingsUsd: proto.Float64(0), SavingsJ: 10},
	}}, 0)
	out := b.String()
	if !strings.Contains(out, "savings:    -, 0 J, 1.5 kg CO2\n") || !strings.Contains(out, "savings:    $0.00, 10 J\n") {
		t.Errorf("an uncosted saving is \"-\", a costed zero is $0.00:\n%s", out)
	}
}
