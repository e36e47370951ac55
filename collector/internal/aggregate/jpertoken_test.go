package aggregate

import (
	"math"
	"testing"
)

// TestJPerTokenAfterWarmupByHand: J/token after warmup from a fixture worked
// by hand, whose warmup costs far more per token than the measured phase,
// so any mix-up of the two phases' energy or tokens shows.
//
//	warmup   0–2 s: 2 windows × 300 J, 10 tokens each  (30 J/token)
//	measured 2–5 s: 3 windows × 100 J, 50 tokens each  ( 2 J/token)
//
// J/token after warmup = 300 J / 150 tokens = 2; the whole run's
// 900 J / 170 tokens (5.29), the measured energy over all tokens (1.76) and
// all energy over the measured tokens (6) are each wrong.
func TestJPerTokenAfterWarmupByHand(t *testing.T) {
	evs := []ev{start("a", 0, "m", 0)}
	for s := 0.0; s < 2; s++ {
		evs = append(evs, win("a", s, s+1, false, 300, 300, 300, 10, 0))
	}
	for s := 2.0; s < 5; s++ {
		evs = append(evs, win("a", s, s+1, true, 100, 100, 100, 50, 0))
	}
	evs = append(evs, end("a", 5))
	r := fold(evs).Report(Pricing{})
	if r.EnergyTotalJ != 900 || r.EnergyJ != 300 || r.TokensProcessed != 170 || r.TokensMeasured != 150 || r.WarmupS != 2 {
		t.Fatalf("fixture folded to total %v J, measured %v J, %d tokens (%d measured), warmup %v s; want 900, 300, 170 (150), 2",
			r.EnergyTotalJ, r.EnergyJ, r.TokensProcessed, r.TokensMeasured, r.WarmupS)
	}
	if r.JPerToken == nil {
		t.Fatalf("J/token after warmup unknown (%s), want 2", r.GetRatesUnavailable())
	}
	if math.Abs(r.GetJPerToken()-2) > 1e-12 {
		t.Errorf("J/token after warmup = %v, want 300 J / 150 tokens = 2", r.GetJPerToken())
	}
}
