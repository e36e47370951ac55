package cli

import (
	"strings"
	"testing"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The cost optimizer leaves a failed run out: the plateauing run of
// TestRecommend, ended by a crash (exit 1), gets no early-stopping advice
// and is no baseline; runs and report show how it ended.
func TestRecommendLeavesFailedRunsOut(t *testing.T) {
	addr := liveCollector(t)
	a := tu.Connect(t, tu.Dial(t, addr), "gpu-box-3", "boot")
	start := tu.Start("crashed", 10, "m")
	start.GetRunStart().PlannedEpochs = 10
	losses := []float64{2, 1.5, 1.5, 1.5, 1.5, 1.5}
	for i, l := range losses {
		sec := 10 + float64(i)
		evs := []*trainmeterv1.RunEvent{evalEv("crashed", sec+0.5, int64(i+1), l)}
		if i == 0 {
			evs = append([]*trainmeterv1.RunEvent{start}, evs...)
		}
		if i == len(losses)-1 {
			end := tu.End("crashed", sec+1)
			end.GetRunEnd().EndStatus = "exit 1"
			evs = append(evs, end)
		}
		a.MustAck(tu.Batch(uint64(i+1), sec, []*trainmeterv1.RunWindow{tu.Window("crashed", sec, 1000, 100)}, evs...))
	}
	out, err := run(t, nil, "recommend", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "early_stopping") || !strings.Contains(out, "no recommendations") {
		t.Errorf("recommend advises on a failed run:\n%s", out)
	}
	if out, err := run(t, nil, "runs", "--collector", addr); err != nil || !strings.Contains(out, "exit 1") {
		t.Errorf("runs: %v\n%s", err, out)
	}
	if out, err := run(t, nil, "report", "crashed", "--collector", addr); err != nil || !strings.Contains(out, "run crashed (ended: exit 1)") {
		t.Errorf("report: %v\n%s", err, out)
	}
	// runs --status takes end statuses: the liveCollector's run-a ended
	// without one (ended), run-b runs.
	for status, want := range map[string]string{"failed": "crashed", "exit": "crashed", "exit 1": "crashed", "exit 2": "",
		"ok": "", "ended": "run-a crashed", "running": "run-b", "signal": ""} {
		out, err := run(t, nil, "runs", "--json", "--status", status, "--collector", addr)
		if err != nil {
			t.Fatalf("runs --status %q: %v", status, err)
		}
		if got := strings.Join(runIDsOf(t, out), " "); got != want {
			t.Errorf("runs --status %q: %q, want %q", status, got, want)
		}
	}
	if _, err := run(t, nil, "runs", "--status", "crashed", "--collector", addr); err == nil || !strings.Contains(err.Error(), "want running, ended, failed") {
		t.Errorf("runs --status crashed: %v", err)
	}
}
