package budget

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// TestFleetLeaderFiresFollowerStops: two collectors' managers over one
// store. The follower evaluates the batches it applied and tells its
// agents to stop an exceeded run, but fires no alert; the leader, told
// of no batch, fires the alerts within FleetReload.
func TestFleetLeaderFiresFollowerStops(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewFake(tu.Now())
	var leads atomic.Bool
	fSink, lSink := &collected{}, &collected{}
	adv := &advisor{refused: map[string]bool{}}
	follower := New(Config{Clock: clk, EvalInterval: time.Second, Leader: func() bool { return false }}, st, report, adv, fSink, quiet())
	lead := New(Config{Clock: clk, EvalInterval: time.Second, Leader: leads.Load}, st, report, nil, lSink, quiet())
	for _, m := range []*Manager{follower, lead} {
		if err := m.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := m.Shutdown(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	if _, err := follower.Set(Budget{Scope: "s", LimitUSD: 2, Policy: PolicyStop}); err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, st: st, m: follower}
	f.run("n1", "r", "m", "s", nil, 0, 3, false) // $3 of $2
	step := func(n int) {
		for range n {
			clk.Advance(time.Second)
		}
		clk.Advance(time.Second) // the last evaluation has finished
	}
	step(2 * int(FleetReload/time.Second))
	if k := fSink.keys(); len(k) != 0 {
		t.Errorf("the follower fired %v", k)
	}
	if k := lSink.keys(); len(k) != 0 {
		t.Errorf("a manager that does not lead fired %v", k)
	}
	// The advisor refuses the first try; the next evaluation retries.
	follower.MarkDirty()
	step(1)
	if s := adv.stops(); len(s) != 1 {
		t.Errorf("the follower's stops %v, want one for its agent", s)
	}
	leads.Store(true)
	step(int(FleetReload / time.Second))
	if k := lSink.keys(); len(k) != 8 {
		t.Errorf("the leader fired %v, want 8 (every threshold, actual and projected)", k)
	}
	if k := fSink.keys(); len(k) != 0 {
		t.Errorf("the follower fired %v", k)
	}
}
