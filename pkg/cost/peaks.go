package cost

import "strings"

// GPUPeak is one GPU model's peak dense (no sparsity) throughput, in TFLOPS,
// from the vendor's data sheet (docs/costs.md lists the sources). FP16 is the
// 16-bit tensor-core rate (bf16 where the GPU has it, fp16 otherwise).
type GPUPeak struct {
	Match string // case-insensitive substring of the NVML name
	Name  string
	FP16  float64 // bf16/fp16 tensor, dense
	TF32  float64 // tf32 tensor, dense (FP32 where the GPU has no TF32)
	FP32  float64 // fp32 non-tensor
}

// PeakTable is tried in order; the first entry whose Match is a substring of
// the GPU name wins (so the more specific names come first).
var PeakTable = []GPUPeak{
	{"H100 PCIe", "H100 PCIe", 756, 378, 51},
	{"H100 NVL", "H100 NVL", 835, 418, 60},
	{"H100", "H100 SXM (and the simulated H100)", 989, 494, 67},
	{"H200", "H200 SXM", 989, 494, 67},
	{"A100", "A100 (40 and 80 GB)", 312, 156, 19.5},
	{"L40S", "L40S", 362, 183, 91.6},
	{"A10", "A10", 125, 62.5, 31.2},
	{"T4", "T4", 65, 8.1, 8.1},
	{"V100", "V100 SXM2", 125, 15.7, 15.7},
	{"RTX 4090", "GeForce RTX 4090", 165, 82.6, 82.6},
}

// PeakTFLOPS is the peak of one GPU named gpuName at precision (the run's
// metadata): fp32 → FP32, tf32 → TF32, anything else (bf16, fp16, mixed,
// fp8, unknown) → FP16, since mixed 16-bit precision is how models train.
func PeakTFLOPS(gpuName, precision string) (float64, bool) {
	name := strings.ToLower(gpuName)
	for _, p := range PeakTable {
		if !strings.Contains(name, strings.ToLower(p.Match)) {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(precision)) {
		case "fp32", "float32", "32", "32-true":
			return p.FP32, true
		case "tf32":
			return p.TF32, true
		}
		return p.FP16, true
	}
	return 0, false
}
