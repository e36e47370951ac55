package energy

import (
	"math"
	"strings"
)

// partTimeSensor reports whether gpuName is an NVIDIA generation whose power
// sensor averages only part of each 100 ms period (Ampere and later: Yang et
// al., SC24; docs/accuracy.md). Unknown names count as part-time, the
// cautious side.
func partTimeSensor(gpuName string) bool {
	n := strings.ToUpper(gpuName)
	for _, older := range []string{"V100", "T4", "P100", "P40", "P4", "K80", "TITAN V", "QUADRO RTX", "RTX 20"} {
		if strings.Contains(n, older) {
			return false
		}
	}
	return true
}

// counterUpdateS is the energy counter's update period (docs/accuracy.md).
const counterUpdateS = 0.1

// UncertaintyPct is the stated uncertainty (±, %) of a run's energy after
// warmup, from the method that measured it ("counter", "integrated" or
// "mixed"), the GPU generation's sensor and the measured seconds. It covers
// the method's error in at least 95 % of the simulated cases of the accuracy
// study (TestUncertaintyCoverage), not the board's gain, which no software
// can correct (about ±5 % between boards). NaN when unknown (no measured
// window).
func UncertaintyPct(method, gpuName string, measuredS float64) float64 {
	if measuredS <= 0 || method == "" {
		return math.NaN()
	}
	// The counter is exact between its updates; each of the two cuts
	// interpolates inside one update, which misses at most about half an
	// update's worth of the difference from the mean power.
	counter := 100*2*(counterUpdateS/2)/measuredS + 0.05
	// Integrated power aliases with a periodic load, whatever the run's
	// length: up to ~45 % on a part-time sensor and ~28 % with 50 ms reads of
	// a full-period one in the study.
	integrated := 50.0
	if !partTimeSensor(gpuName) {
		integrated = 30
	}
	switch method {
	case "counter":
		return counter
	case "integrated":
		return integrated
	default: // mixed: bounded by the worse of the two
		return math.Max(counter, integrated)
	}
}
