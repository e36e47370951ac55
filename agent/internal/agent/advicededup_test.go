package agent

import (
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func stopAdv(run, reason string) *trainmeterv1.Advisory {
	return &trainmeterv1.Advisory{RunId: run, Advice: &trainmeterv1.Advisory_Stop{Stop: &trainmeterv1.Stop{Reason: reason}}}
}

func loaderAdv(run string, workers uint32, share float64) *trainmeterv1.Advisory {
	return &trainmeterv1.Advisory{RunId: run, Advice: &trainmeterv1.Advisory_Dataloader{Dataloader: &trainmeterv1.DataloaderAdvice{
		NumWorkers: workers, PrefetchFactor: 2, Classification: "data-bound", DataWaitShare: share}}}
}

func TestAdviceFromAPairReachesTheTrainerOnce(t *testing.T) {
	fake := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	d := newAdviceDedup(fake)
	type step struct {
		from int
		adv  *trainmeterv1.Advisory
		want bool
	}
	for i, s := range []step{
		// Both collectors stop the run; their figures differ a little.
		{0, stopAdv("r", "budget team:nlp exceeded (101%)"), true},
		{1, stopAdv("r", "budget team:nlp exceeded (102%)"), false},
		// Another run is another decision.
		{1, stopAdv("r2", "budget"), true},
		{0, stopAdv("r2", "budget"), false},
		// Dataloader advice: 4 workers, then 8, then back to 4, from both.
		{0, loaderAdv("r", 4, 0.31), true},
		{1, loaderAdv("r", 4, 0.30), false},
		{1, loaderAdv("r", 8, 0.2), true},
		{0, loaderAdv("r", 8, 0.2), false},
		{0, loaderAdv("r", 4, 0.1), true},
		{1, loaderAdv("r", 4, 0.1), false},
	} {
		if got := d.first(s.from, s.adv); got != s.want {
			t.Errorf("step %d: from collector %d %v: delivered %v, want %v", i, s.from, s.adv, got, s.want)
		}
		fake.Advance(time.Second)
	}
}

func TestAdviceFromOneCollectorIsNeverHeldBack(t *testing.T) {
	d := newAdviceDedup(clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)))
	for i := range 3 {
		if !d.first(0, stopAdv("r", "budget")) {
			t.Errorf("sending %d from the only collector was dropped", i+1)
		}
	}
}

func TestAdviceDedupForgetsAfterItsWindow(t *testing.T) {
	fake := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	d := newAdviceDedup(fake)
	d.first(0, stopAdv("r", "budget"))
	fake.Advance(adviceDedupWindow + time.Second)
	if !d.first(1, stopAdv("r", "budget")) {
		t.Error("a stop from the other collector long after the window was dropped")
	}
	if len(d.keys) != 1 {
		t.Errorf("%d keys remembered, want the expired one gone", len(d.keys))
	}
}
