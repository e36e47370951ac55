package dataloader

import (
	"strings"
	"testing"
)

func dataBound() Interval {
	return Interval{Steps: 50, DataWaitS: 2.5, ComputeS: 2.5, GPUUtilization: 0.5, HasGPUUtilization: true,
		RAMUsage: 0.4, HasRAM: true, CPUCount: 32, LocalRanks: 2}
}

// evaluate is Evaluate followed by Commit of a change, as when every advice
// reaches the trainer.
func evaluate(a *Advisor, iv Interval) Advice {
	adv := a.Evaluate(iv)
	a.Commit(adv)
	return adv
}

func TestDataBoundRunGetsMoreWorkersAndPrefetchAfterConfirmation(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 4, PrefetchFactor: 2})
	first := evaluate(a, dataBound())
	if first.Class != DataBound || first.Changed {
		t.Fatalf("first evaluation: %+v, want data-bound, held for confirmation", first)
	}
	second := evaluate(a, dataBound())
	if !second.Changed || second.NumWorkers != 6 || second.PrefetchFactor != 3 {
		t.Fatalf("second evaluation: %+v, want 4→6 workers, 2→3 prefetch", second)
	}
	if second.ExpectedGain != 0.5 || second.MaxWorkers != 15 {
		t.Errorf("expected gain %v, max workers %v", second.ExpectedGain, second.MaxWorkers)
	}
	if w, p := a.Current(); w != 6 || p != 3 {
		t.Errorf("current %d/%d", w, p)
	}
}

func TestWorkersStayWithinCPUsPerRank(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 2, PrefetchFactor: 2})
	iv := dataBound()
	iv.CPUCount, iv.LocalRanks = 8, 2 // bound 3
	iv.DataWaitS, iv.ComputeS = 3, 1  // wait > compute: prefetch doubles
	var last Advice
	for range 20 {
		if adv := evaluate(a, iv); adv.Changed {
			last = adv
		}
		a.EpochBoundary()
	}
	if last.NumWorkers != 3 || last.PrefetchFactor != MaxPrefetchFactor {
		t.Fatalf("final %+v, want 3 workers (bound) and prefetch %d", last, MaxPrefetchFactor)
	}
	adv := evaluate(a, iv)
	if adv.Changed || !strings.Contains(adv.Reason, "bound of 3") {
		t.Errorf("at the bounds: %+v", adv)
	}
}

// A loader started with num_workers=0 (loading in the training process)
// on a 2-CPU host: the bound is 1 worker, and 0→1 is the change that pays.
// The same run without num_workers is assumed at 2 workers, over the bound.
func TestZeroWorkersGivenIsASettingNotTheDefault(t *testing.T) {
	iv := dataBound()
	iv.CPUCount, iv.LocalRanks = 2, 1
	a := NewAdvisor(Config{NumWorkers: 0, HasNumWorkers: true, PrefetchFactor: 2})
	if w, _ := a.Current(); w != 0 {
		t.Fatalf("current workers %d, want the 0 given", w)
	}
	evaluate(a, iv)
	adv := evaluate(a, iv)
	if !adv.Changed || adv.FromNumWorkers != 0 || adv.NumWorkers != 1 || adv.MaxWorkers != 1 {
		t.Fatalf("%+v, want num_workers 0→1 (bound 1)", adv)
	}
	if w, p := a.InForce(); w != 0 || p != 2 {
		t.Errorf("in force before the epoch boundary: %d/%d, want 0/2 (the change is pending)", w, p)
	}
	a.EpochBoundary()
	if w, p := a.InForce(); w != 1 || p != adv.PrefetchFactor {
		t.Errorf("in force after the epoch boundary: %d/%d, want 1/%d", w, p, adv.PrefetchFactor)
	}

	unset := NewAdvisor(Config{PrefetchFactor: 2})
	evaluate(unset, iv)
	if adv := evaluate(unset, iv); adv.FromNumWorkers != DefaultNumWorkers || adv.NumWorkers != DefaultNumWorkers {
		t.Errorf("num_workers not given: %+v, want the default %d kept (over the bound)", adv, DefaultNumWorkers)
	}
}

func TestGPUBoundRunIsLeftAlone(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 4, PrefetchFactor: 2})
	iv := Interval{Steps: 50, DataWaitS: 0.05, ComputeS: 5, GPUUtilization: 0.98, HasGPUUtilization: true, RAMUsage: 0.4, HasRAM: true, CPUCount: 32, LocalRanks: 1}
	for range 10 {
		adv := evaluate(a, iv)
		if adv.Class != GPUBound || adv.Changed || !strings.Contains(adv.Reason, "no change") {
			t.Fatalf("%+v", adv)
		}
	}
}

func TestRAMOverLimitLowersPrefetchFirstThenWorkers(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 8, PrefetchFactor: 2, MaxRAMUsage: 0.8})
	iv := dataBound()
	iv.RAMUsage = 0.9
	adv := evaluate(a, iv)
	if adv.Class != MemoryBound || !adv.Changed || adv.PrefetchFactor != 1 || adv.NumWorkers != 8 {
		t.Fatalf("first: %+v, want prefetch 2→1 at once", adv)
	}
	if adv = evaluate(a, iv); adv.Changed {
		t.Fatalf("changed again before the trainer could apply the advice: %+v", adv)
	}
	a.EpochBoundary()
	adv = evaluate(a, iv)
	if !adv.Changed || adv.PrefetchFactor != 1 || adv.NumWorkers != 6 {
		t.Fatalf("second: %+v, want workers 8→6", adv)
	}
}

func TestChangesWaitForTheEpochBoundaryOrTheCooldown(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 2, PrefetchFactor: 2})
	var changedAt []int
	for i := 1; i <= 12; i++ {
		if evaluate(a, dataBound()).Changed {
			changedAt = append(changedAt, i)
		}
	}
	// 2 (confirmed), then 5 evaluations of cooldown: 7, 12.
	if len(changedAt) != 3 || changedAt[0] != 2 || changedAt[1] != 7 || changedAt[2] != 12 {
		t.Errorf("changes at evaluations %v, want [2 7 12]", changedAt)
	}
}

func TestNoFlappingBetweenIncreaseAndDecrease(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 4, PrefetchFactor: 2})
	db := dataBound()
	gb := Interval{Steps: 50, DataWaitS: 0.01, ComputeS: 5, GPUUtilization: 0.97, HasGPUUtilization: true, CPUCount: 32, LocalRanks: 1}
	changes := 0
	// Alternating evidence never confirms a class: no change at all.
	for i := range 20 {
		iv := db
		if i%2 == 1 {
			iv = gb
		}
		if evaluate(a, iv).Changed {
			changes++
		}
	}
	if changes != 0 {
		t.Errorf("alternating classes gave %d changes, want 0", changes)
	}
}

func TestRAMNearTheLimitBlocksIncrease(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 4, PrefetchFactor: 2, MaxRAMUsage: 0.8})
	iv := dataBound()
	iv.RAMUsage = 0.78 // within the 5 % band under the limit
	for range 4 {
		if adv := evaluate(a, iv); adv.Changed {
			t.Fatalf("%+v", adv)
		}
	}
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.TargetGPUUtilization != 0.85 || c.MaxRAMUsage != 0.8 || c.Interval != 50 {
		t.Errorf("%+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	if err := (Config{TargetGPUUtilization: 1.5, MaxRAMUsage: 0.5, Interval: 1}).Validate(); err == nil {
		t.Error("target 1.5 accepted")
	}
}

func TestUndeliveredAdviceIsNotCountedAndIsProposedAgain(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 4, PrefetchFactor: 2})
	a.Evaluate(dataBound())
	lost := a.Evaluate(dataBound())
	if !lost.Changed || lost.NumWorkers != 6 {
		t.Fatalf("second evaluation: %+v, want a change to 6 workers", lost)
	}
	// Not committed: the stream was down or its queue full.
	if w, p := a.Current(); w != 4 || p != 2 || a.Adjustments() != 0 {
		t.Fatalf("after an undelivered advice: current %d/%d, %d adjustments; want 4/2, 0", w, p, a.Adjustments())
	}
	// The next evaluation proposes the same change again (no cooldown held
	// it: nothing was sent), from the same baseline.
	again := a.Evaluate(dataBound())
	if !again.Changed || again.NumWorkers != 6 || again.PrefetchFactor != 3 {
		t.Fatalf("third evaluation: %+v, want the change proposed again", again)
	}
	a.Commit(again)
	if w, p := a.Current(); w != 6 || p != 3 || a.Adjustments() != 1 {
		t.Errorf("after commit: current %d/%d, %d adjustments", w, p, a.Adjustments())
	}
}

func TestMemoryBoundReductionReplacesAPendingIncreaseAtOnce(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 4, PrefetchFactor: 2, MaxRAMUsage: 0.8})
	evaluate(a, dataBound())
	if inc := evaluate(a, dataBound()); !inc.Changed || inc.NumWorkers != 6 || inc.PrefetchFactor != 3 {
		t.Fatalf("increase: %+v", inc)
	}
	// Before the trainer reached an epoch boundary (the increase is still
	// pending), RAM crosses the limit: the reduction does not wait out the
	// cooldown, and it starts from the 4/2 still in force.
	hot := dataBound()
	hot.RAMUsage = 0.9
	dec := evaluate(a, hot)
	if dec.Class != MemoryBound || !dec.Changed {
		t.Fatalf("memory-bound during the cooldown of an increase: %+v, want a change at once", dec)
	}
	if dec.NumWorkers != 4 || dec.PrefetchFactor != 1 || dec.FromNumWorkers != 4 || dec.FromPrefetchFactor != 2 {
		t.Errorf("reduction %d/%d from %d/%d, want 4/1 from 4/2 (the pending 6/3 is replaced)",
			dec.NumWorkers, dec.PrefetchFactor, dec.FromNumWorkers, dec.FromPrefetchFactor)
	}
	if !strings.Contains(dec.Reason, "replaces the pending increase") {
		t.Errorf("reason %q", dec.Reason)
	}
	// A reduction is not stacked on a pending reduction.
	if again := evaluate(a, hot); again.Changed {
		t.Errorf("second reduction before the first was applied: %+v", again)
	}
}

func TestEvidenceFromBeforeAnAppliedChangeIsForgotten(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 2, PrefetchFactor: 2})
	evaluate(a, dataBound())
	if !evaluate(a, dataBound()).Changed { // 2→3 workers, 2→3 prefetch
		t.Fatal("no first change")
	}
	// Measured before the trainer applied the change: still data-bound.
	if adv := evaluate(a, dataBound()); adv.Changed {
		t.Fatalf("changed during the cooldown: %+v", adv)
	}
	if !a.EpochBoundary() {
		t.Error("the first boundary after a change did not report the change applied")
	}
	if a.EpochBoundary() {
		t.Error("a second boundary reported a change applied again")
	}
	// The evaluation before the boundary described the old settings: the
	// next change needs two fresh data-bound evaluations, not one.
	if adv := evaluate(a, dataBound()); adv.Changed {
		t.Fatalf("changed on one evaluation after the boundary (stale streak): %+v", adv)
	}
	if adv := evaluate(a, dataBound()); !adv.Changed || adv.FromNumWorkers != 3 || adv.NumWorkers != 5 {
		t.Fatalf("second fresh evaluation: %+v, want 3→5 workers", adv)
	}
}

func TestWaitAboveThresholdAtTargetUtilisationIsGPUBound(t *testing.T) {
	// 10 % of step time waiting (over the 5 % threshold), but the GPU is at
	// 90 % ≥ the 85 % target and the wait is shorter than compute: the
	// loader is not what holds the GPU back.
	iv := Interval{Steps: 50, DataWaitS: 0.5, ComputeS: 4.5, GPUUtilization: 0.90, HasGPUUtilization: true,
		RAMUsage: 0.4, HasRAM: true, CPUCount: 32, LocalRanks: 1}
	if c := Classify(Config{}.WithDefaults(), iv); c != GPUBound {
		t.Fatalf("class %s, want gpu-bound", c)
	}
	a := NewAdvisor(Config{NumWorkers: 4, PrefetchFactor: 2})
	for range 4 {
		if adv := evaluate(a, iv); adv.Class != GPUBound || adv.Changed || !strings.Contains(adv.Reason, "no change") {
			t.Fatalf("%+v", adv)
		}
	}
	// The same wait with the GPU under target is data-bound.
	iv.GPUUtilization = 0.80
	if c := Classify(Config{}.WithDefaults(), iv); c != DataBound {
		t.Errorf("at 80 %% utilisation: class %s, want data-bound", c)
	}
}

func TestWaitLongerThanComputeAtHighUtilisationGetsMorePrefetchOnly(t *testing.T) {
	// The GPU is at 95 % (above target) yet steps wait longer for data than
	// they compute: data-bound through the wait, so more prefetch — doubled —
	// but no more workers (utilisation is not what is short).
	iv := Interval{Steps: 50, DataWaitS: 3, ComputeS: 2, GPUUtilization: 0.95, HasGPUUtilization: true,
		RAMUsage: 0.4, HasRAM: true, CPUCount: 32, LocalRanks: 1}
	a := NewAdvisor(Config{NumWorkers: 4, PrefetchFactor: 2})
	if first := evaluate(a, iv); first.Class != DataBound || first.Changed {
		t.Fatalf("first: %+v", first)
	}
	adv := evaluate(a, iv)
	if !adv.Changed || adv.NumWorkers != 4 || adv.PrefetchFactor != 4 {
		t.Fatalf("%+v, want workers 4 (unchanged) and prefetch 2→4", adv)
	}
	if !strings.Contains(adv.Reason, "prefetch_factor 2→4") || strings.Contains(adv.Reason, "num_workers") {
		t.Errorf("reason %q", adv.Reason)
	}
}

// A run that announced epochs applies advice only at an epoch boundary: a
// change stays pending however many evaluations pass, so a second advice
// never supersedes a first that the trainer has not applied. A run that
// announced none falls back to the cooldown of evaluations.
func TestRunWithEpochsHoldsAChangeUntilTheBoundary(t *testing.T) {
	held := NewAdvisor(Config{NumWorkers: 2, PrefetchFactor: 2, Epochs: true})
	fallback := NewAdvisor(Config{NumWorkers: 2, PrefetchFactor: 2})
	var heldChanges, fallbackChanges int
	for range 3 * CooldownEvaluations {
		if evaluate(held, dataBound()).Changed {
			heldChanges++
		}
		if evaluate(fallback, dataBound()).Changed {
			fallbackChanges++
		}
	}
	if heldChanges != 1 || fallbackChanges < 2 {
		t.Fatalf("changes without a boundary: %d with epochs (want 1), %d without (want the cooldown's)", heldChanges, fallbackChanges)
	}
	held.EpochBoundary()
	evaluate(held, dataBound())
	if !evaluate(held, dataBound()).Changed {
		t.Error("no change after the boundary and two fresh evaluations")
	}
}

// The trainer's report of its loader corrects the advisor's baseline, but
// not while a change is pending (the report predates it).
func TestRebaseTakesTheReportedLoader(t *testing.T) {
	a := NewAdvisor(Config{NumWorkers: 2, PrefetchFactor: 2, Epochs: true})
	a.Rebase(8, 4)
	if w, p := a.Current(); w != 8 || p != 4 {
		t.Fatalf("current %d/%d, want the reported 8/4", w, p)
	}
	evaluate(a, dataBound())
	adv := evaluate(a, dataBound())
	if !adv.Changed || adv.FromNumWorkers != 8 || adv.NumWorkers != 12 {
		t.Fatalf("%+v, want 8→12 from the reported loader", adv)
	}
	a.Rebase(8, 4) // the epoch that ends now ran with 8/4: the change is pending
	if w, _ := a.Current(); w != 12 {
		t.Errorf("a report before the pending change moved the baseline to %d", w)
	}
	a.EpochBoundary()
	a.Rebase(10, 0) // applied relative to something else; no prefetch reported
	if w, p := a.Current(); w != 10 || p != adv.PrefetchFactor {
		t.Errorf("current %d/%d, want 10 workers and the believed prefetch %d", w, p, adv.PrefetchFactor)
	}
}
