package aggregate

import (
	"maps"
	"math"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Locked prices (docs/costs.md): the collector books the cost of each
// window as it folds it, at the prices in force then (the run_start price,
// the node's, owned hardware's, the catalog's as it was, the flag; the
// energy tariff band of the window's time; the priority multiplier of the
// run's labels), and reports the sums. A price list imported later, or a
// collector restarted with other prices, books later windows at the new
// prices and leaves what was booked as it was. Only Reprice, an explicit
// act, changes booked GPU cost.

// Pricer gives the prices in force when a window is booked (cost.Config).
type Pricer interface {
	GPUPrice(runStartPrice float64, node, gpuName string) (price float64, source string, ok bool)
	EnergyRate(start, end time.Time, add func(band string, joules, usd float64)) (included, ok bool)
	PriorityMultiplier(labels map[string]string) float64
}

// booked is the run's booking, made on first use.
func (s *State) booked() *storev1.Booking {
	if s.Booked == nil {
		s.Booked = &storev1.Booking{}
	}
	return s.Booked
}

// WindowPrice is what a window was booked at, for its stored record
// (RunWindow.locked_*), which usage rows are priced from.
type WindowPrice struct {
	HasGPUPrice    bool
	USDPerGPUHour  float64
	Source         string
	HasEnergyPrice bool
	USDPerJoule    float64 // 0 when the GPU price includes energy
}

// Stamp writes p into w's locked_* fields.
func (p WindowPrice) Stamp(w *trainmeterv1.RunWindow) {
	w.PriceLocked = true
	w.LockedUsdPerGpuHour, w.LockedPriceSource, w.LockedUsdPerJoule = nil, "", nil
	if p.HasGPUPrice {
		w.LockedUsdPerGpuHour, w.LockedPriceSource = &p.USDPerGPUHour, p.Source
	}
	if p.HasEnergyPrice {
		w.LockedUsdPerJoule = &p.USDPerJoule
	}
}

// windowSpan is the window's [start, end) for booking by time, a window
// longer than MaxBandedWindow booked whole at its start (ingest never lets
// one through).
func windowSpan(w *trainmeterv1.RunWindow) (time.Time, time.Time) {
	from, to := time.Unix(0, nanos(w.GetStart())), time.Unix(0, nanos(w.GetEnd()))
	if to.Sub(from) > MaxBandedWindow {
		to = from
	}
	return from, to
}

// BookPrice books the cost of a window of node folded just before
// (AddWindowBooked), at p's prices now, and returns them. nodeGPU names the
// node's GPU for a run whose run_start named none.
func (s *State) BookPrice(node string, w *trainmeterv1.RunWindow, p Pricer, nodeGPU string) WindowPrice {
	b := s.booked()
	var wp WindowPrice
	if b.PriorityMultiplier == 0 && s.HasStart {
		b.PriorityMultiplier = p.PriorityMultiplier(s.GetRunStart().GetLabels())
	}
	gpuName := s.GetRunStart().GetGpuName()
	if gpuName == "" {
		gpuName = nodeGPU
	}
	gs := w.GetGpuSeconds()
	b.GpuSeconds += gs
	if price, src, ok := p.GPUPrice(s.GetRunStart().GetGpuPricePerHour(), node, gpuName); ok {
		wp.HasGPUPrice, wp.USDPerGPUHour, wp.Source = true, price, src
		b.ComputeUsd += gs / 3600 * price
		if gs > 0 {
			addSource(b, src)
		}
	} else {
		b.UnpricedGpuSeconds += gs
	}

	energy := windowEnergy(w)
	b.EnergyJ += energy
	from, to := windowSpan(w)
	var perJ float64
	included, ok := p.EnergyRate(from, to, func(band string, j, usd float64) {
		perJ += usd
		if energy > 0 {
			if b.BandJ == nil {
				b.BandJ, b.BandUsd = map[string]float64{}, map[string]float64{}
			}
			b.BandJ[band] += j * energy
			b.BandUsd[band] += usd * energy
		}
	})
	switch {
	case !ok:
		b.UnpricedEnergyJ += energy
	case included:
		wp.HasEnergyPrice = true
		b.IncludedEnergyJ += energy
	default:
		wp.HasEnergyPrice, wp.USDPerJoule = true, perJ
		b.EnergyUsd += energy * perJ
	}
	return wp
}

func addSource(b *storev1.Booking, src string) {
	if i, found := slices.BinarySearch(b.PriceSources, src); !found {
		b.PriceSources = slices.Insert(b.PriceSources, i, src)
	}
}

// tiny is the GPU-seconds or joules below which a remainder is rounding.
func tiny(part, whole float64) bool { return part <= 1e-9*math.Max(1, whole) }

// bookedCompute sets cost_usd from the booked GPU cost; false when nothing
// was booked (a run with no GPU time yet, or folded without a Pricer),
// whose cost is priced now (priceCompute).
func (s *State) bookedCompute(p Pricing, r *trainmeterv1.RunReport) bool {
	b := s.GetBooked()
	if b == nil || (b.GpuSeconds == 0 && !b.Repriced) {
		return false
	}
	if !tiny(b.UnpricedGpuSeconds, s.GpuSeconds) {
		return true // some GPU time had no price when it was booked
	}
	usd := b.ComputeUsd
	sources := slices.Clone(b.PriceSources)
	if rest := s.GpuSeconds - b.GpuSeconds; !tiny(rest, s.GpuSeconds) {
		// Folded before the store priced windows: priced now.
		price, src, ok := p.GPUPrice(s.GetRunStart().GetGpuPricePerHour(), s.StartNode, s.GetRunStart().GetGpuName())
		if !ok {
			return true
		}
		usd += rest / 3600 * price
		if i, found := slices.BinarySearch(sources, src); !found {
			sources = slices.Insert(sources, i, src)
		}
	}
	r.CostUsd = &usd
	switch len(sources) {
	case 0:
	case 1:
		r.PriceSource = sources[0]
	default:
		r.PriceSource = cost.SourceMixed
	}
	if r.GpuHours > 0 {
		r.GpuPricePerHour = ptr(usd / r.GpuHours) // the GPU-time-weighted mean
	}
	return true
}

// bookedEnergy sets the energy cost from the booked energy cost; false when
// no energy was booked (priced now by the caller).
func (s *State) bookedEnergy(p Pricing, r *trainmeterv1.RunReport) bool {
	b := s.GetBooked()
	if b == nil || b.EnergyJ == 0 {
		return false
	}
	if !tiny(b.UnpricedEnergyJ, s.EnergyTotal) {
		return true
	}
	usd := b.EnergyUsd
	bandJ, bandUSD := b.BandJ, b.BandUsd
	if rest := s.EnergyTotal - b.EnergyJ; !tiny(rest, s.EnergyTotal) {
		// Folded before the store priced windows: priced now.
		restUSD, bands, ok := p.EnergyCost(nil, rest)
		if !ok {
			return true
		}
		usd += restUSD
		bandJ, bandUSD = maps2(bandJ), maps2(bandUSD)
		for _, bc := range bands {
			bandJ[bc.Band] += bc.KWh * 3.6e6
			bandUSD[bc.Band] += bc.USD
		}
	}
	r.EnergyCostUsd = &usd
	r.EnergyIncluded = b.IncludedEnergyJ > 0 && len(bandJ) == 0
	for _, n := range slices.Sorted(maps.Keys(bandJ)) {
		kwh := bandJ[n] / 3.6e6
		bc := &trainmeterv1.EnergyBandCost{Band: n, Kwh: kwh, CostUsd: bandUSD[n]}
		if kwh > 0 {
			bc.UsdPerKwh = bandUSD[n] / kwh // the mean, should the band's price have changed
		}
		r.EnergyBands = append(r.EnergyBands, bc)
	}
	return true
}

func maps2(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// reprice sets the report's reprice fields.
func (s *State) reprice(r *trainmeterv1.RunReport) {
	b := s.GetBooked()
	if !b.GetRepriced() {
		return
	}
	r.RepricedAt = timestamppb.New(time.Unix(0, b.RepricedAt).UTC())
	if v := b.PreviousCostUsd; v != nil {
		r.PreviousCostUsd = ptr(*v)
	}
	if v := b.PreviousTotalCostUsd; v != nil {
		r.PreviousTotalCostUsd = ptr(*v)
	}
	r.RepriceReason = b.RepriceReason
}

// Repricing is a change of booked GPU cost (Reprice): the GPU-seconds the
// new price applies to, what they cost when booked, and how many of them
// had no price then. Whole: all of the run's GPU time.
type Repricing struct {
	At            int64 // Unix ns
	USDPerGPUHour float64
	Reason        string
	Whole         bool
	GPUSeconds    float64
	BookedUSD     float64
	UnpricedS     float64
	UnbookedS     float64 // GPU-seconds folded without a Pricer
}

// Reprice books r's GPU time at its price. previous is the run's report
// just before (its cost_usd and total_cost_usd are kept as the previous
// cost).
func (s *State) Reprice(previous *trainmeterv1.RunReport, r Repricing) {
	b := s.booked()
	if r.Whole {
		b.GpuSeconds, b.UnpricedGpuSeconds = s.GpuSeconds, 0
		b.ComputeUsd = s.GpuSeconds / 3600 * r.USDPerGPUHour
		b.PriceSources = []string{cost.SourceRepriced}
	} else {
		b.GpuSeconds += r.UnbookedS
		b.UnpricedGpuSeconds = max(0, b.UnpricedGpuSeconds-r.UnpricedS)
		b.ComputeUsd += r.GPUSeconds/3600*r.USDPerGPUHour - r.BookedUSD
		if r.GPUSeconds > 0 {
			addSource(b, cost.SourceRepriced)
		}
	}
	b.Repriced, b.RepricedAt, b.RepriceReason = true, r.At, r.Reason
	b.PreviousCostUsd, b.PreviousTotalCostUsd = nil, nil
	if previous.CostUsd != nil {
		b.PreviousCostUsd = ptr(previous.GetCostUsd())
	}
	if previous.TotalCostUsd != nil {
		b.PreviousTotalCostUsd = ptr(previous.GetTotalCostUsd())
	}
}
