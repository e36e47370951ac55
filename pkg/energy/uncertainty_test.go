package energy

import (
	"math"
	"testing"
)

func TestUncertaintyPct(t *testing.T) {
	for _, c := range []struct {
		method, gpu string
		s, want     float64
	}{
		{"counter", "NVIDIA H100 80GB HBM3", 60, 100*2*0.05/60 + 0.05},
		{"counter", "NVIDIA H100 80GB HBM3", 4, 2.55},
		{"integrated", "NVIDIA A100-SXM4-80GB", 600, 50},
		{"integrated", "Tesla V100-SXM2-32GB", 600, 30},
		{"mixed", "NVIDIA H100 80GB HBM3", 60, 50},
		{"integrated", "some future GPU", 60, 50}, // unknown: the cautious side
	} {
		if got := UncertaintyPct(c.method, c.gpu, c.s); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("UncertaintyPct(%q, %q, %v) = %v, want %v", c.method, c.gpu, c.s, got, c.want)
		}
	}
	if !math.IsNaN(UncertaintyPct("", "x", 60)) || !math.IsNaN(UncertaintyPct("counter", "x", 0)) {
		t.Error("no measured window must be unknown (NaN)")
	}
}
