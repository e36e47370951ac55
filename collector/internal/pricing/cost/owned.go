package cost

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
)

// HoursPerYear is the hours a purchase is spread over per year of its
// lifetime: every hour of the calendar, used or idle. Idle hours are not
// dropped from the denominator (that would need a utilisation guess); they
// are priced too, and show as idle time, so a year of GPU-hours of every
// run plus idle adds up to the year's depreciation.
const HoursPerYear = 8760

// OwnedHardware prices owned GPUs from their purchase (straight-line
// depreciation) and sets the PUE of the facility (facility energy / IT
// energy, >= 1): the file of `trainmeter serve --owned-hardware`
// (docs/costs.md, "Owned hardware"). A node's entry wins over its GPU
// model's (matched like the price catalog).
type OwnedHardware struct {
	PUE   float64             `yaml:"pue"`
	GPUs  []OwnedGPU          `yaml:"gpus"`
	Nodes map[string]OwnedGPU `yaml:"nodes"`

	match *prices.Matcher
}

// OwnedGPU is the purchase of one GPU.
type OwnedGPU struct {
	// Model is the GPU model (gpus list only): an NVML name or a catalog
	// name; "NVIDIA H100 80GB HBM3" matches "H100 SXM".
	Model         string  `yaml:"model"`
	PurchaseUSD   float64 `yaml:"purchase_usd"`
	LifetimeYears float64 `yaml:"lifetime_years"`
	ResidualUSD   float64 `yaml:"residual_usd"`
}

// USDPerGPUHour is (purchase − residual) / (lifetime_years × 8760 h).
func (g OwnedGPU) USDPerGPUHour() float64 {
	return (g.PurchaseUSD - g.ResidualUSD) / (g.LifetimeYears * HoursPerYear)
}

func (g OwnedGPU) validate(what string) error {
	var errs []error
	if badNumber(g.PurchaseUSD) || g.PurchaseUSD == 0 {
		errs = append(errs, fmt.Errorf("%s: purchase_usd must be a finite number > 0, got %v", what, g.PurchaseUSD))
	}
	if badNumber(g.LifetimeYears) || g.LifetimeYears == 0 {
		errs = append(errs, fmt.Errorf("%s: lifetime_years must be a finite number > 0, got %v", what, g.LifetimeYears))
	}
	if badNumber(g.ResidualUSD) {
		errs = append(errs, fmt.Errorf("%s: residual_usd must be a finite number >= 0, got %v", what, g.ResidualUSD))
	} else if g.ResidualUSD >= g.PurchaseUSD && g.PurchaseUSD > 0 {
		errs = append(errs, fmt.Errorf("%s: residual_usd %v must be below purchase_usd %v", what, g.ResidualUSD, g.PurchaseUSD))
	}
	return errors.Join(errs...)
}

// Validate checks the file's values and prepares the model matching.
func (o *OwnedHardware) Validate() error {
	var errs []error
	if o.PUE != 0 && (badNumber(o.PUE) || o.PUE < 1) {
		errs = append(errs, fmt.Errorf("pue must be a finite number >= 1 (facility energy / IT energy), got %v", o.PUE))
	}
	seen := map[string]bool{}
	names := make([]string, 0, len(o.GPUs))
	for i, g := range o.GPUs {
		what := fmt.Sprintf("gpus[%d] (%s)", i, g.Model)
		if strings.TrimSpace(g.Model) == "" {
			errs = append(errs, fmt.Errorf("gpus[%d]: model is empty", i))
			continue
		}
		if seen[g.Model] {
			errs = append(errs, fmt.Errorf("%s: model listed twice", what))
		}
		seen[g.Model] = true
		names = append(names, g.Model)
		errs = append(errs, g.validate(what))
	}
	for _, n := range slices.Sorted(maps.Keys(o.Nodes)) {
		g := o.Nodes[n]
		switch {
		case n == "":
			errs = append(errs, errors.New("nodes: empty node name"))
		case g.Model != "":
			errs = append(errs, fmt.Errorf("nodes[%s]: model is for the gpus list; a node's entry prices all its GPUs", n))
		default:
			errs = append(errs, g.validate("nodes["+n+"]"))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	o.match = prices.NewMatcher(names)
	return nil
}

// Price is the amortised $/GPU-hour of a GPU gpuName on node: the node's
// entry, else the entry of the model gpuName matches.
func (o *OwnedHardware) Price(node, gpuName string) (float64, bool) {
	if o == nil {
		return 0, false
	}
	if g, ok := o.Nodes[node]; ok {
		return g.USDPerGPUHour(), true
	}
	if o.match == nil || gpuName == "" {
		return 0, false
	}
	if i, ok := o.match.Match(gpuName); ok {
		return o.GPUs[i].USDPerGPUHour(), true
	}
	return 0, false
}

// ErrEmptyOwnedHardware: the file has no YAML document.
var ErrEmptyOwnedHardware = errors.New("owned hardware file is empty")

// ParseOwnedHardware decodes (unknown keys are errors) and validates.
func ParseOwnedHardware(b []byte) (*OwnedHardware, error) {
	return parseYAML[OwnedHardware](b, ErrEmptyOwnedHardware)
}

// LoadOwnedHardware reads and validates an owned hardware file (YAML).
func LoadOwnedHardware(path string) (*OwnedHardware, error) {
	return loadYAML[OwnedHardware](path, "owned hardware", ErrEmptyOwnedHardware)
}

// finiteOr1 is v, or 1 when v is unset.
func finiteOr1(v float64) float64 {
	if v == 0 || math.IsNaN(v) {
		return 1
	}
	return v
}
