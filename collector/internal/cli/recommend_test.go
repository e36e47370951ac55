package cli

import (
	"encoding/json"
	"strings"
	"testing"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// evalEv is an eval event with a validation loss.
func evalEv(run string, sec float64, epoch int64, loss float64) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{
		RunId: run, Time: tu.TS(sec), Epoch: epoch, ValLoss: loss, HasValLoss: true}}}
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
	for _, want := range []string{"[early_stopping] Stop plateau at epoch 4", "savings:    $0.00, 200 J", "confidence: 0.90", "total potential savings"} {
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
