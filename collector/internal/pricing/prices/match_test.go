package prices

import "testing"

// vastNames are gpu_name values as vast.ai's offers give them.
var vastNames = []string{
	"H100 SXM", "H100 PCIE", "H100 NVL", "H200", "H200 NVL", "GH200 SXM", "A100 SXM4", "A100 PCIE", "A100X",
	"RTX 4090", "RTX 3080", "RTX 3090", "Tesla V100", "Tesla T4", "L40S", "L40", "L4", "A10", "Q RTX 8000", "RTX A6000",
}

// TestMatchNVMLNames: NVML's names of real GPUs find their vast.ai model,
// and never another GPU's.
func TestMatchNVMLNames(t *testing.T) {
	m := NewMatcher(vastNames)
	for _, tc := range []struct{ name, want string }{
		{"NVIDIA H100 80GB HBM3", "H100 SXM"}, // NVML leaves out SXM
		{"NVIDIA H100 PCIe", "H100 PCIE"},
		{"NVIDIA H100 NVL", "H100 NVL"},
		{"NVIDIA H200", "H200"},
		{"NVIDIA H200 NVL", "H200 NVL"},
		{"NVIDIA GH200 480GB", "GH200 SXM"},
		{"NVIDIA GeForce RTX 4090", "RTX 4090"},
		{"NVIDIA A100-SXM4-80GB", "A100 SXM4"},
		{"NVIDIA A100-SXM4-40GB", "A100 SXM4"},
		{"NVIDIA A100 80GB PCIe", "A100 PCIE"},
		{"NVIDIA A100-PCIE-40GB", "A100 PCIE"},
		{"Tesla V100-SXM2-16GB", "Tesla V100"},
		{"Tesla T4", "Tesla T4"},
		{"NVIDIA L40S", "L40S"},
		{"NVIDIA L40", "L40"},
		{"NVIDIA L4", "L4"},
		{"NVIDIA A10", "A10"},
		{"NVIDIA RTX A6000", "RTX A6000"},
		{"Quadro RTX 8000", "Q RTX 8000"},
		{"rtx-4090", "RTX 4090"}, // by Key
		{"h100", "H100 SXM"},
		// No match rather than a wrong one.
		{"NVIDIA A10G", ""},                // not A10, not A100
		{"NVIDIA RTX A1000", ""},           // not A100
		{"NVIDIA T400", ""},                // not T4
		{"Quadro T4000", ""},               // not T4
		{"NVIDIA GeForce RTX 3080 Ti", ""}, // not RTX 3080
		{"Tesla V100-PCIE-16GB", ""},       // vast.ai's "Tesla V100" states no form: SXM
		{"NVIDIA RTX 6000 Ada Generation", ""},
		{"Simulated H100 80GB HBM3", ""},
		{"NVIDIA", ""},
		{"", ""},
	} {
		got, ok := m.MatchName(tc.name)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("Match(%q) = %q %v, want %q", tc.name, got, ok, tc.want)
		}
	}
}

// TestMatchPrefersStatedAttributes: the form factor and the memory size
// decide between variants when both names state them, and exclude a
// variant that states another.
func TestMatchPrefersStatedAttributes(t *testing.T) {
	m := NewMatcher([]string{"A100 40GB", "A100 80 GB", "H100", "H100 PCIe 80GB"})
	for _, tc := range []struct{ name, want string }{
		{"NVIDIA A100-SXM4-80GB", "A100 80 GB"},
		{"NVIDIA A100-SXM4-40GB", "A100 40GB"},
		{"NVIDIA A100 80GB PCIe", ""}, // the list's A100s state no form: SXM
		{"NVIDIA H100 PCIe", "H100 PCIe 80GB"},
		{"NVIDIA H100 80GB HBM3", "H100"},
		{"NVIDIA H100 NVL", ""},
	} {
		got, ok := m.MatchName(tc.name)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("Match(%q) = %q %v, want %q", tc.name, got, ok, tc.want)
		}
	}
	if g := ParseGPUModel("NVIDIA A100-SXM4-80GB HBM2e"); len(g.Tokens) != 1 || g.Tokens[0] != "a100" || g.Form != "sxm" || g.MemGB != 80 {
		t.Errorf("parsed %+v", g)
	}
}

// TestCanonicalGPUName: the providers' spellings of one GPU model are one
// name, and models that differ stay apart.
func TestCanonicalGPUName(t *testing.T) {
	for name, want := range map[string]string{
		"H100 SXM":                "H100 SXM",
		"H100 (80 GB SXM5)":       "H100 SXM",
		"NVIDIA H100 80GB HBM3":   "H100 SXM",
		"h100":                    "H100 SXM",
		"H100 PCIe":               "H100 PCIE",
		"NVIDIA H100 NVL":         "H100 NVL",
		"A100 SXM4":               "A100 SXM",
		"A100 (40 GB SXM4)":       "A100 SXM",
		"NVIDIA A100 80GB PCIe":   "A100 PCIE",
		"A10 (24 GB PCIe)":        "A10",
		"NVIDIA A10":              "A10",
		"NVIDIA GeForce RTX 4090": "RTX 4090",
		"Tesla V100 (16 GB)":      "V100 SXM",
		"Tesla V100-PCIE-16GB":    "V100 PCIE",
		"RTX 6000 Ada Generation": "RTX 6000 ADA",
		"GH200 (96 GB)":           "GH200",
		"L40S":                    "L40S",
		"NVIDIA A10G":             "A10G",
		"Q RTX 8000":              "RTX 8000",
		"NVIDIA":                  "NVIDIA",
		" MI300X ":                "MI300X",
	} {
		if got := CanonicalGPUName(name); got != want {
			t.Errorf("CanonicalGPUName(%q) = %q, want %q", name, got, want)
		}
		if got := CanonicalGPUName(want); got != want {
			t.Errorf("CanonicalGPUName(%q) = %q: not idempotent", want, got)
		}
	}
}
