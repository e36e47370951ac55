package cost

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
)

// GPUPeak is one GPU model's peak dense (no sparsity) throughput, in TFLOPS,
// from the vendor's data sheet (docs/costs.md lists the sources). FP16 is the
// 16-bit tensor-core rate (bf16 where the GPU has it, fp16 otherwise).
type GPUPeak struct {
	// Names the entry stands for, matched with a GPU's NVML name by
	// prices.Matcher: whole tokens, vendor words and memory ignored, the
	// form factor deciding between variants (an unstated one is SXM).
	Names []string
	Name  string
	FP16  float64 // bf16/fp16 tensor, dense
	TF32  float64 // tf32 tensor, dense (FP32 where the GPU has no TF32)
	FP32  float64 // fp32 non-tensor
}

// PeakTable lists the GPUs with known peaks. It is read once, at the first
// PeakTFLOPS.
var PeakTable = []GPUPeak{
	{[]string{"H100 PCIe"}, "H100 PCIe", 756, 378, 51},
	{[]string{"H100 NVL"}, "H100 NVL", 835, 418, 60},
	{[]string{"H100 SXM", "Simulated H100"}, "H100 SXM (and the simulated H100)", 989, 494, 67},
	{[]string{"H200 SXM"}, "H200 SXM", 989, 494, 67},
	{[]string{"A100 SXM", "A100 PCIe"}, "A100 (40 and 80 GB)", 312, 156, 19.5},
	{[]string{"L40S"}, "L40S", 362, 183, 91.6},
	{[]string{"A10"}, "A10", 125, 62.5, 31.2},
	{[]string{"T4"}, "T4", 65, 8.1, 8.1},
	{[]string{"V100 SXM2"}, "V100 SXM2", 125, 15.7, 15.7},
	{[]string{"RTX 4090"}, "GeForce RTX 4090", 165, 82.6, 82.6},
}

// peakMatcher matches PeakTable's names; entry is the PeakTable index of each.
var peakMatcher = sync.OnceValues(func() (match *prices.Matcher, entry []int) {
	var names []string
	for i, p := range PeakTable {
		for _, n := range p.Names {
			names = append(names, n)
			entry = append(entry, i)
		}
	}
	return prices.NewMatcher(names), entry
})

func peakFor(gpuName string) (GPUPeak, bool) {
	if i, ok := peakSeen.Load(gpuName); ok {
		if i := i.(int); i >= 0 {
			return PeakTable[i], true
		}
		return GPUPeak{}, false
	}
	match, entry := peakMatcher()
	i := -1
	if j, ok := match.Match(gpuName); ok {
		i = entry[j]
	}
	if peakSeenN.Add(1) <= maxPeakSeen {
		peakSeen.Store(gpuName, i)
	}
	if i < 0 {
		return GPUPeak{}, false
	}
	return PeakTable[i], true
}

// peakSeen is peakFor's answers by GPU name (the PeakTable index, -1 for
// none): a fleet has a few GPU models and every run's report asks, and
// matching a name is most of the work. It keeps the first maxPeakSeen names
// asked, so that odd names cannot grow it without bound.
var (
	peakSeen  sync.Map
	peakSeenN atomic.Int64
)

const maxPeakSeen = 1024

// PeakTFLOPS is the peak of one GPU named gpuName at precision (the run's
// metadata): fp32 → FP32, tf32 → TF32, anything else (bf16, fp16, mixed,
// fp8, unknown) → FP16, since mixed 16-bit precision is how models train.
// A GPU the table does not name has none (no peak rather than another
// GPU's).
func PeakTFLOPS(gpuName, precision string) (float64, bool) {
	p, ok := peakFor(gpuName)
	if !ok {
		return 0, false
	}
	switch strings.ToLower(strings.TrimSpace(precision)) {
	case "fp32", "float32", "32", "32-true":
		return p.FP32, true
	case "tf32":
		return p.TF32, true
	}
	return p.FP16, true
}
