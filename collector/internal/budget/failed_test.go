package budget

import (
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A failed run's cost says nothing about what a run costs: the forecast
// leaves it out and says so.
func TestForecastLeavesFailedRunsOut(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	status := map[string]string{"a": "ok", "crash": "exit 1", "stop": "stopped: budget", "y1": "lost", "y2": "signal SIGKILL"}
	withStatus := func(s *aggregate.State) *trainmeterv1.RunReport {
		r := report(s)
		r.EndStatus = status[r.GetRunId()]
		return r
	}
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, withStatus, nil, nil, quiet())
	f := &feeder{t: t, st: st, m: m}
	f.run("n1", "a", "m", "", nil, 0, 10, true)
	f.run("n1", "crash", "m", "", nil, 0, 2, true)
	f.run("n1", "stop", "m", "", nil, 0, 14, true)
	f.run("n1", "y1", "y", "", nil, 0, 3, true)
	f.run("n1", "y2", "y", "", nil, 0, 3, true)
	fc, err := m.Forecast("m", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fc.FailedLeftOut != 1 || fc.MeanRunUsd != 12 || strings.Contains(strings.Join(fc.BasedOn, ","), "crash") {
		t.Errorf("forecast %+v: want the crash left out, mean $12 of a and stop", fc)
	}
	if _, err := m.Forecast("y", 1, 0); err == nil || !strings.Contains(err.Error(), "2 failed run(s) left out") {
		t.Errorf("only failed runs: %v", err)
	}
}
