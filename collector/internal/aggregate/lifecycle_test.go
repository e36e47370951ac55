package aggregate

import (
	"math"
	"testing"
)

func endWith(node string, at float64, status string) ev {
	e := end(node, at)
	e.e.EndStatus = status
	return e
}

// A run that ends and is resumed 300 s later: the pause counts in no rate,
// neither in wall_s nor in the measured time (tok/s, W, steps/s).
func TestResumePauseExcludedFromRates(t *testing.T) {
	var evs []ev
	evs = append(evs, start("a", 0, "m", 0))
	for s := 0.0; s < 10; s++ {
		evs = append(evs, win("a", s, s+1, s >= 2, 300, 300, 300, 1000, 0))
	}
	evs = append(evs, endWith("a", 10, "ok"))
	before := fold(evs).Report(Pricing{})

	resumed := start("a", 310, "m", 0)
	resumed.s.Resume = true
	evs = append(evs, resumed)
	for s := 310.0; s < 320; s++ {
		evs = append(evs, win("a", s, s+1, true, 300, 300, 300, 1000, 0))
	}
	evs = append(evs, endWith("a", 320, "ok"))
	s := fold(evs)
	r := s.Report(Pricing{})

	if r.WallS != 20 || r.PausedS != 300 || r.Resumes != 1 || r.WarmupS != 2 {
		t.Fatalf("wall %v paused %v resumes %v warmup %v, want 20, 300, 1, 2", r.WallS, r.PausedS, r.Resumes, r.WarmupS)
	}
	if math.Abs(r.GetTokPerS()-before.GetTokPerS()) > 1e-9 || math.Abs(r.GetAvgPowerW()-300) > 1e-9 {
		t.Fatalf("tok/s %v (before the resume %v), avg W %v (want 300)", r.GetTokPerS(), before.GetTokPerS(), r.GetAvgPowerW())
	}
	if r.GetStepsPerS() != 1 || r.GpuHours*3600 != 20 {
		t.Fatalf("steps/s %v, GPU-s %v: want 1 and 20", r.GetStepsPerS(), r.GpuHours*3600)
	}
	// The pause survives the store's encoding.
	back, err := Unmarshal(mustEncode(t, s))
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Report(Pricing{}); got.WallS != 20 || got.EndStatus != "ok" {
		t.Fatalf("decoded: wall %v status %q", got.WallS, got.EndStatus)
	}
}

// A run that ended inside its warmup and was resumed: the first part is its
// warmup, the pause is in neither.
func TestResumeAfterEndInWarmup(t *testing.T) {
	resumed := start("a", 100, "m", 0)
	resumed.s.Resume = true
	after := win("a", 100, 110, true, 100, 100, 10, 100, 0)
	after.w.Steps = 10 // a rate needs 2 steps after warmup
	r := fold([]ev{
		start("a", 0, "m", 0), win("a", 0, 5, false, 50, 50, 10, 10, 0), end("a", 5),
		resumed, after, end("a", 110),
	}).Report(Pricing{})
	if r.WallS != 15 || r.WarmupS != 5 || r.GetTokPerS() != 10 || r.GetAvgPowerW() != 10 {
		t.Fatalf("wall %v warmup %v tok/s %v W %v: want 15, 5, 10, 10", r.WallS, r.WarmupS, r.GetTokPerS(), r.GetAvgPowerW())
	}
}

func TestEndStatusAcrossNodes(t *testing.T) {
	for _, c := range []struct {
		evs  []ev
		want string
	}{
		{[]ev{start("a", 0, "m", 0)}, ""},
		{[]ev{start("a", 0, "m", 0), end("a", 1)}, "ended"},
		{[]ev{start("a", 0, "m", 0), endWith("a", 1, "exit 3")}, "exit 3"},
		{[]ev{start("a", 0, "m", 0), start("b", 0, "m", 0), endWith("a", 1, "ok"), endWith("b", 2, "signal SIGTERM")}, "signal SIGTERM"},
		{[]ev{start("a", 0, "m", 0), start("b", 0, "m", 0), endWith("a", 1, "ok"), endWith("b", 2, "ok")}, "ok"},
		{[]ev{start("a", 0, "m", 0), endWith("a", 1, "stopped: budget")}, "stopped: budget"},
		// A resume that ends well replaces the first part's status.
		{[]ev{start("a", 0, "m", 0), endWith("a", 1, "error"), start("a", 5, "m", 0), endWith("a", 6, "ok")}, "ok"},
	} {
		if got := fold(c.evs).Report(Pricing{}).EndStatus; got != c.want {
			t.Errorf("%d events: end status %q, want %q", len(c.evs), got, c.want)
		}
	}
}

func mustEncode(t *testing.T, s *State) []byte {
	t.Helper()
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
