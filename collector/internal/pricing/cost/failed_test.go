package cost

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A failed run is paid for but is never the model's baseline or best.
func TestModelsLeaveFailedRunsOutOfBaselineAndBest(t *testing.T) {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	mk := func(id string, min int, status string, acc float64) *trainmeterv1.RunReport {
		return &trainmeterv1.RunReport{
			RunId: id, Metadata: &trainmeterv1.RunMetadata{Model: "m"}, Start: timestamppb.New(at.Add(time.Duration(min) * time.Minute)),
			Ended: true, EndStatus: status, TotalCostUsd: f(10), AccuracyPoints: &acc,
		}
	}
	m := Models([]*trainmeterv1.RunReport{mk("crashed", 0, "exit 1", 90), mk("a", 1, "ok", 60), mk("b", 2, "stopped: budget", 70)})[0]
	if m.Baseline != "a" || m.Best != "b" || m.FailedRuns != 1 || m.TotalCostUSD != 30 {
		t.Fatalf("baseline %q best %q failed %d total %v: want a, b, 1, 30", m.Baseline, m.Best, m.FailedRuns, m.TotalCostUSD)
	}
	if m.PerRun[0].GainPoints != nil {
		t.Errorf("the failed run has a gain: %v", *m.PerRun[0].GainPoints)
	}
}

// Of two equally accurate runs the cheaper is the best, whichever came
// first; a run whose cost is not known never wins a tie.
func TestModelsBestTieGoesToTheCheaperRun(t *testing.T) {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	mk := func(id string, min int, usd, acc float64) *trainmeterv1.RunReport {
		return &trainmeterv1.RunReport{
			RunId: id, Metadata: &trainmeterv1.RunMetadata{Model: "m"}, Start: timestamppb.New(at.Add(time.Duration(min) * time.Minute)),
			Ended: true, EndStatus: "ok", TotalCostUsd: priced(usd), AccuracyPoints: &acc,
		}
	}
	for _, tc := range []struct {
		name string
		runs []*trainmeterv1.RunReport
		best string
		usd  float64 // best run's $ per point
	}{
		{"costly first", []*trainmeterv1.RunReport{mk("base", 0, 5, 50), mk("costly", 1, 30, 80), mk("cheap", 2, 10, 80)}, "cheap", 10.0 / 80},
		{"cheap first", []*trainmeterv1.RunReport{mk("base", 0, 5, 50), mk("cheap", 1, 10, 80), mk("costly", 2, 30, 80)}, "cheap", 10.0 / 80},
		{"unknown cost first", []*trainmeterv1.RunReport{mk("base", 0, 5, 50), mk("unpriced", 1, 0, 80), mk("cheap", 2, 10, 80)}, "cheap", 10.0 / 80},
		{"more accurate wins at any cost", []*trainmeterv1.RunReport{mk("base", 0, 5, 50), mk("cheap", 1, 10, 80), mk("costly", 2, 30, 81)}, "costly", 30.0 / 81},
	} {
		m := Models(tc.runs)[0]
		if m.Best != tc.best || m.BestUSDPerPoint == nil || *m.BestUSDPerPoint != tc.usd {
			var got any = m.BestUSDPerPoint
			if m.BestUSDPerPoint != nil {
				got = *m.BestUSDPerPoint
			}
			t.Errorf("%s: best %q ($/point %v), want %q ($/point %v)", tc.name, m.Best, got, tc.best, tc.usd)
		}
	}
}

// TestFailed: an end in error, a non-zero exit, a signal or lost is a
// failure; an ok end, a stop on request and a live run are not.
func TestFailed(t *testing.T) {
	r := &trainmeterv1.RunReport{Ended: true, EndStatus: "signal SIGTERM"}
	if !Failed(r) {
		t.Errorf("Failed %v", Failed(r))
	}
	for st, failed := range map[string]bool{"ok": false, "ended": false, "": false, "stopped: budget": false, "error": true, "exit 2": true, "lost": true} {
		r.EndStatus = st
		if Failed(r) != failed {
			t.Errorf("%q: failed %v, want %v", st, Failed(r), failed)
		}
	}
	r.Ended = false
	if Failed(r) {
		t.Errorf("live run: failed %v", Failed(r))
	}
}
