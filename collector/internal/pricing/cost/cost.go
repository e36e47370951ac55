// Package cost is trainmeter's cost model: GPU-hour prices and where they
// come from, the priority multiplier, energy cost at a flat or time-of-use
// tariff, CO2, the forecast of a live run's cost, per-unit costs, the
// efficiency score and ROI across a model's runs, and the compute report
// (FLOPs, MFU against a table of peaks). The formulas are documented in
// docs/costs.md; this package is pure (no I/O but LoadTariff, no clock).
package cost

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// PriceCatalog knows the current market price of a GPU model (the budget
// side's price store implements it).
type PriceCatalog interface {
	CurrentPrice(gpuName string) (usdPerHour float64, ok bool)
}

// Price sources, as RunReport.price_source names them (docs/costs.md).
const (
	SourceRunStart  = "run_start"
	SourceNode      = "node"
	SourceAmortized = "amortized"
	SourceCatalog   = "catalog"
	SourceFlag      = "flag"
	SourceMixed     = "mixed"
)

// Failed reports whether the run ended in failure (error, a non-zero exit,
// a signal, lost): its figures describe a partial run, so forecasts, ROI,
// the optimizer and baselines leave it out. A run stopped on request
// (stopped: budget) did what it was asked and is not failed.
func Failed(r *trainmeterv1.RunReport) bool {
	if !r.GetEnded() {
		return false
	}
	switch st := r.GetEndStatus(); {
	case st == "", st == "ok", st == "ended", strings.HasPrefix(st, "stopped"):
		return false
	}
	return true
}

// PriorityLabel is the run_start key whose value selects the multiplier.
const PriorityLabel = "priority"

// Config is the collector's cost configuration. Zero values mean unknown
// (no price, no tariff, no carbon intensity).
type Config struct {
	// GPUPricePerHour is the last-resort $/GPU-hour for runs whose price
	// comes from neither run_start, nor the node, nor the catalog.
	GPUPricePerHour     float64
	NodeGPUPricePerHour map[string]float64 // $/GPU-hour per node name
	Catalog             PriceCatalog       // a GPU model's current price; nil = none
	EnergyPricePerKWh   float64            // a flat tariff; ignored when Tariff is set
	// Tariff is a time-of-use tariff (energy is booked per band at ingest).
	Tariff *Tariff
	// EnergyIncluded: the GPU price includes power (cloud rentals), so
	// energy costs nothing extra.
	EnergyIncluded bool
	// GridGCO2PerKWh is the carbon intensity of the grid: the flat factor,
	// and the fallback for energy no carbon source covers.
	GridGCO2PerKWh float64
	// Carbon by the hour (docs/costs.md, "CO2"): Carbon gives the
	// intensity where and when energy was consumed (the file, a live
	// source, or both chained); CarbonFile is the file alone (the
	// optimizer's schedule); a node's zone is CarbonNodeZones[node], else
	// CarbonZone, else the file's only zone.
	Carbon          CarbonSource
	CarbonFile      *CarbonFile
	CarbonZone      string
	CarbonNodeZones map[string]string
	// CarbonLive: Carbon includes a live source, which can answer for any
	// zone (without one, a zone must be in the file).
	CarbonLive bool
	Owned      *OwnedHardware // prices owned GPUs from their purchase; nil: none
	// PUE multiplies the measured GPU energy into the facility energy that
	// is priced and turned into CO2; 0 means 1 (no overhead).
	PUE float64
	// PriorityMultipliers maps a run's priority label to its compute cost
	// multiplier; runs without one, or with an unlisted one, pay 1×.
	PriorityMultipliers map[string]float64
}

func badNumber(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) || v < 0 }

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"gpu price per hour", c.GPUPricePerHour}, {"energy price per kWh", c.EnergyPricePerKWh}, {"grid gCO2 per kWh", c.GridGCO2PerKWh}} {
		if badNumber(f.v) {
			errs = append(errs, fmt.Errorf("%s must be a finite number >= 0, got %v", f.name, f.v))
		}
	}
	for n, p := range c.NodeGPUPricePerHour {
		if n == "" || badNumber(p) {
			errs = append(errs, fmt.Errorf("node gpu price %q=%v: want a node name and a finite price >= 0", n, p))
		}
	}
	for k, m := range c.PriorityMultipliers {
		if k == "" || badNumber(m) || m == 0 {
			errs = append(errs, fmt.Errorf("priority multiplier %q=%v: want a priority name and a finite multiplier > 0", k, m))
		}
	}
	if c.PUE != 0 && (badNumber(c.PUE) || c.PUE < 1) {
		errs = append(errs, fmt.Errorf("pue must be a finite number >= 1 (facility energy / IT energy), got %v", c.PUE))
	}
	if c.Owned != nil && c.Owned.match == nil {
		if err := c.Owned.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("owned hardware: %w", err))
		}
	}
	if c.Tariff != nil && c.EnergyPricePerKWh > 0 {
		errs = append(errs, errors.New("give either a flat energy price or a tariff file, not both"))
	}
	if c.EnergyIncluded && (c.Tariff != nil || c.EnergyPricePerKWh > 0) {
		errs = append(errs, errors.New("energy is included in the GPU price: an energy price or tariff makes no sense with it"))
	}
	errs = append(errs, c.validateCarbon()...)
	if c.Tariff != nil && c.Tariff.loc == nil {
		if err := c.Tariff.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("tariff: %w", err))
		}
	}
	return errors.Join(errs...)
}

// ParseKeyFloat parses "KEY=NUMBER" (flag values like high=1.5).
func ParseKeyFloat(s string) (string, float64, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return "", 0, fmt.Errorf("%q: want NAME=NUMBER", s)
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || badNumber(f) {
		return "", 0, fmt.Errorf("%q: %q is not a finite number >= 0", s, v)
	}
	return k, f, nil
}

// GPUPrice resolves the $/GPU-hour of a GPU named gpuName on node, for a
// run whose run_start gave runStartPrice (0: none), and says where it came
// from: the run_start price, else the node's configured price, else the
// amortised purchase of an owned GPU (the node's entry, else its model's),
// else the catalog's current price for gpuName, else --gpu-price-per-hour.
// node or gpuName may be empty (a GPU model priced for no node in
// particular). ok is false when none is known. Runs, usage rows and
// estimates all price GPU time through this one function.
func (c Config) GPUPrice(runStartPrice float64, node, gpuName string) (price float64, source string, ok bool) {
	if runStartPrice > 0 {
		return runStartPrice, SourceRunStart, true
	}
	if p, found := c.NodeGPUPricePerHour[node]; found && p > 0 {
		return p, SourceNode, true
	}
	if p, found := c.Owned.Price(node, gpuName); found && p > 0 && !badNumber(p) {
		return p, SourceAmortized, true
	}
	if c.Catalog != nil && gpuName != "" {
		if p, found := c.Catalog.CurrentPrice(gpuName); found && p > 0 && !badNumber(p) {
			return p, SourceCatalog, true
		}
	}
	if c.GPUPricePerHour > 0 {
		return c.GPUPricePerHour, SourceFlag, true
	}
	return 0, "", false
}

// PriorityMultiplier is the compute cost multiplier for a run's labels.
func (c Config) PriorityMultiplier(labels map[string]string) float64 {
	if m, ok := c.PriorityMultipliers[labels[PriorityLabel]]; ok && m > 0 {
		return m
	}
	return 1
}

// BandCost is the energy of one tariff band and its price.
type BandCost struct {
	Band                string
	KWh, USDPerKWh, USD float64
}

// EnergyCost prices a run's energy. byBand is the energy (J) booked per
// band at ingest; the rest of totalJ (energy folded while no tariff was
// configured, or booked to a band the tariff no longer has) is priced at
// the default band. Without a tariff, totalJ is priced flat. ok is false
// when no energy price is configured.
func (c Config) EnergyCost(byBand map[string]float64, totalJ float64) (usd float64, bands []BandCost, ok bool) {
	// The facility draws PUE × what the GPUs drew: that is what is billed.
	pue := c.EffectivePUE()
	totalJ *= pue
	switch {
	case c.EnergyIncluded:
		return 0, nil, true
	case c.Tariff != nil:
		t := c.Tariff
		perBand := map[string]float64{}
		booked := 0.0
		for b, j := range byBand {
			if _, known := t.Bands[b]; known {
				perBand[b] += j * pue
				booked += j * pue
			}
		}
		if rest := totalJ - booked; rest > 1e-9*math.Max(1, totalJ) {
			perBand[t.Default] += rest
		}
		for _, b := range slices.Sorted(maps.Keys(perBand)) {
			kwh := perBand[b] / 3.6e6
			p := t.Bands[b]
			bands = append(bands, BandCost{Band: b, KWh: kwh, USDPerKWh: p, USD: kwh * p})
			usd += kwh * p
		}
		return usd, bands, true
	case c.EnergyPricePerKWh > 0:
		kwh := totalJ / 3.6e6
		usd = kwh * c.EnergyPricePerKWh
		return usd, []BandCost{{Band: "flat", KWh: kwh, USDPerKWh: c.EnergyPricePerKWh, USD: usd}}, true
	}
	return 0, nil, false
}

func (c Config) validateCarbon() []error {
	var errs []error
	if c.CarbonFile != nil && c.CarbonFile.compiled == nil {
		if err := c.CarbonFile.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("carbon file: %w", err))
		}
	}
	zones := map[string]string{}
	if c.CarbonZone != "" {
		zones["default carbon zone"] = c.CarbonZone
	}
	for n, z := range c.CarbonNodeZones {
		if n == "" {
			errs = append(errs, fmt.Errorf("carbon zone %q of an empty node name", z))
		}
		zones[fmt.Sprintf("node %s's carbon zone", n)] = z
	}
	for _, what := range slices.Sorted(maps.Keys(zones)) {
		z := zones[what]
		if err := ValidZoneName(z); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			continue
		}
		if c.Carbon == nil {
			errs = append(errs, fmt.Errorf("%s %q: no carbon source (give --carbon-file or --carbon-api)", what, z))
			continue
		}
		if !c.CarbonLive && c.CarbonFile != nil {
			if _, ok := c.CarbonFile.Zones[z]; !ok {
				errs = append(errs, fmt.Errorf("%s %q is not in the carbon file (zones: %s)", what, z, strings.Join(c.CarbonFile.ZoneNames(), ", ")))
			}
		}
	}
	return errs
}

// CO2Kg is the CO2 of energyKWh of GPU energy at the configured grid
// intensity, the facility overhead (PUE) included.
func (c Config) CO2Kg(energyKWh float64) (float64, bool) {
	if c.GridGCO2PerKWh <= 0 {
		return 0, false
	}
	return energyKWh * c.EffectivePUE() * c.GridGCO2PerKWh / 1000, true
}

// EffectivePUE is the configured PUE, 1 when none is.
func (c Config) EffectivePUE() float64 { return finiteOr1(c.PUE) }

// AccuracyPoints reads an accuracy as points (0-100): values up to 1 are
// taken as fractions (0.71 = 71 points), larger ones as percentages.
func AccuracyPoints(acc float64) float64 {
	if acc <= 1 {
		return acc * 100
	}
	return acc
}

// TrainingFLOPs is the usual dense-transformer estimate of training compute:
// 6 × parameters × tokens (forward 2, backward 4 FLOPs per parameter and token).
func TrainingFLOPs(params, tokens float64) float64 { return 6 * params * tokens }

// Progress is how far a run is through its plan.
type Progress struct {
	Basis   string  // tokens, steps or epochs
	Done    float64 // work done so far, in Basis units
	Planned float64
}

// Fraction is Done / Planned, capped at 1.
func (p Progress) Fraction() float64 {
	if p.Planned <= 0 {
		return 0
	}
	return math.Min(1, p.Done/p.Planned)
}

// PlanProgress picks the forecast basis: planned tokens if the run reports
// tokens, else planned steps, else planned epochs (with epochsDone known).
func PlanProgress(tokens, plannedTokens, steps, plannedSteps uint64, epochsDone float64, plannedEpochs uint64) (Progress, bool) {
	switch {
	case plannedTokens > 0 && tokens > 0:
		return Progress{"tokens", float64(tokens), float64(plannedTokens)}, true
	case plannedSteps > 0 && steps > 0:
		return Progress{"steps", float64(steps), float64(plannedSteps)}, true
	case plannedEpochs > 0 && epochsDone > 0:
		return Progress{"epochs", epochsDone, float64(plannedEpochs)}, true
	}
	return Progress{}, false
}

// Forecast projects a live run to the end of its plan. The work left takes
// remainingS at rate (work per second measured after warmup; when it is not
// known, the average so far, done / wall), and costs the run's average spend
// per second so far (total / wall, warmup included). An ended run, or one at
// or past its plan, has nothing left.
func Forecast(p Progress, rate, wallS, totalUSD float64, ended bool) (projectedUSD, remainingS float64) {
	if ended || wallS <= 0 || p.Done <= 0 || p.Done >= p.Planned {
		return totalUSD, 0
	}
	if rate <= 0 || badNumber(rate) {
		rate = p.Done / wallS
	}
	remainingS = (p.Planned - p.Done) / rate
	return totalUSD + remainingS*totalUSD/wallS, remainingS
}
