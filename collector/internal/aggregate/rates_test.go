package aggregate

import (
	"math"
	"strconv"
	"testing"
)

// steady is a trainer at 1,000 tok/s in 0.1 s steps on one 500 W GPU:
// windows of 0.1 s from 0 to until, warmup ending at warmup.
func steady(warmup, until float64) []ev {
	evs := []ev{start("n", 0, "m", 2)}
	for k := 0; float64(k)*0.1 < until-1e-9; k++ {
		a, b := float64(k)*0.1, math.Min(float64(k+1)*0.1, until)
		evs = append(evs, win("n", a, b, a >= warmup-1e-9, 500*(b-a), 500*(b-a), 500, uint64(math.Round(1000*(b-a))), 0))
	}
	return append(evs, end("n", until))
}

// A rate needs at least 1 s and 2 steps after warmup; otherwise it is
// unknown, with the reason, never 0 or a figure from a sliver of time.
func TestRatesNeedASecondAndTwoStepsAfterWarmup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		evs    []ev
		reason string
	}{
		{"shorter than its warmup", steady(5, 3), RatesInWarmup},
		{"0.1 s past its warmup", steady(3, 3.1), RatesTooShort},
		{"0.9 s past its warmup", steady(3, 3.9), RatesTooShort},
		{"one step after warmup", func() []ev {
			evs := []ev{start("n", 0, "m", 2), win("n", 0, 3, false, 1500, 1500, 500, 3000, 0),
				win("n", 3, 5, true, 1000, 1000, 500, 2000, 0), end("n", 5)}
			return evs
		}(), RatesTooFewSteps},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := fold(tc.evs).Report(Pricing{})
			if r.TokPerS != nil || r.JPerToken != nil || r.AvgPowerW != nil || r.StepsPerS != nil {
				t.Errorf("tok/s %v, J/token %v, avg power %v, steps/s %v: want all unknown (null)",
					ptrStr(r.TokPerS), ptrStr(r.JPerToken), ptrStr(r.AvgPowerW), ptrStr(r.StepsPerS))
			}
			if r.GetRatesUnavailable() != tc.reason {
				t.Errorf("rates_unavailable %q, want %q", r.GetRatesUnavailable(), tc.reason)
			}
		})
	}
	r := fold(steady(3, 4.2)).Report(Pricing{})
	if r.GetRatesUnavailable() != "" || r.TokPerS == nil || math.Abs(r.GetTokPerS()-1000) > 1e-6 ||
		r.JPerToken == nil || math.Abs(r.GetJPerToken()-0.5) > 1e-9 || math.Abs(r.GetAvgPowerW()-500) > 1e-6 {
		t.Errorf("1.2 s after warmup: rates_unavailable %q, tok/s %v, J/token %v, avg power %v; want 1000, 0.5, 500",
			r.GetRatesUnavailable(), ptrStr(r.TokPerS), ptrStr(r.JPerToken), ptrStr(r.AvgPowerW))
	}
}

func ptrStr(p *float64) string {
	if p == nil {
		return "null"
	}
	return strconv.FormatFloat(*p, 'g', -1, 64)
}

// After an agent restart without a counter to bridge it, the downtime's
// window has no energy, yet the rank's tokens_total credits the downtime's
// tokens to the first window after the rejoin. J/token must not divide all
// the tokens by part of the energy: it is taken over the windows with
// energy, and energy_coverage says how much of the time after warmup that is.
func TestJPerTokenOverAnEnergyGap(t *testing.T) {
	// 1,000 tok/s, 500 W on one GPU; warmup [0, 2); the agent is down over
	// [10, 17): its bridge window has no energy (no counter), its tokens
	// (7,000) come back in [17, 18) as tokens_recovered.
	evs := []ev{start("n", 0, "m", 2), win("n", 0, 2, false, 1000, 1000, 500, 2000, 0)}
	for a := 2.0; a < 10; a++ {
		evs = append(evs, win("n", a, a+1, true, 500, 500, 500, 1000, 0))
	}
	gap := win("n", 10, 17, true, -1, 0, 0, 0, 0)
	gap.w.Steps, gap.w.GapS, gap.w.EnergyEstimated, gap.w.RestartBridge = 0, 7, true, true
	evs = append(evs, gap)
	rejoin := win("n", 17, 18, true, 500, 500, 500, 8000, 0)
	rejoin.w.TokensRecovered = 7000
	evs = append(evs, rejoin)
	for a := 18.0; a < 30; a++ {
		evs = append(evs, win("n", a, a+1, true, 500, 500, 500, 1000, 0))
	}
	evs = append(evs, end("n", 30))
	r := fold(evs).Report(Pricing{})
	if r.JPerToken == nil || math.Abs(r.GetJPerToken()-0.5)/0.5 > 0.01 {
		t.Errorf("J/token after warmup %s, want 0.5 (500 W at 1,000 tok/s) within 1 %%", ptrStr(r.JPerToken))
	}
	if r.AvgPowerW == nil || math.Abs(r.GetAvgPowerW()-500)/500 > 0.01 {
		t.Errorf("avg power after warmup %s W, want 500 W (over the time with energy)", ptrStr(r.AvgPowerW))
	}
	if math.Abs(r.GetTokPerS()-1000) > 1e-6 {
		t.Errorf("tok/s %v, want 1000 (every token is credited)", r.GetTokPerS())
	}
	if c := r.EnergyCoverage; c == nil || math.Abs(*c-21.0/28) > 1e-9 {
		t.Errorf("energy_coverage %s, want %v (21 of 28 s after warmup had energy)", ptrStr(c), 21.0/28)
	}

	// Stored and read back, the aggregate gives the same figures.
	s := fold(evs)
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	r2 := back.Report(Pricing{})
	if ptrStr(r2.JPerToken) != ptrStr(r.JPerToken) || ptrStr(r2.EnergyCoverage) != ptrStr(r.EnergyCoverage) {
		t.Errorf("after a round trip: J/token %s, coverage %s; want %s, %s",
			ptrStr(r2.JPerToken), ptrStr(r2.EnergyCoverage), ptrStr(r.JPerToken), ptrStr(r.EnergyCoverage))
	}

	// Where the counter bridged the downtime (its energy known), every
	// token counts and the coverage is whole.
	evs[10] = func() ev {
		w := win("n", 10, 17, true, 3500, 0, 0, 0, 0)
		w.w.Steps, w.w.GapS, w.w.RestartBridge = 0, 7, true
		return w
	}()
	r = fold(evs).Report(Pricing{})
	if r.JPerToken == nil || math.Abs(r.GetJPerToken()-0.5) > 1e-9 || r.GetEnergyCoverage() != 1 {
		t.Errorf("bridged: J/token %s, coverage %s; want 0.5 and 1", ptrStr(r.JPerToken), ptrStr(r.EnergyCoverage))
	}
}
