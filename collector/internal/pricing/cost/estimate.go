package cost

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// EstimateRequest is what a run's estimate is asked for.
type EstimateRequest struct {
	Model  string
	Tokens uint64
	// GPU to price; "": the GPU the past runs ran on, priced as they were.
	GPU string
	// GPUs of the run; 0: the past runs' median.
	GPUs uint32
}

// ErrNoEstimateHistory: the model has no ended run to learn from.
var ErrNoEstimateHistory = errors.New("no ended runs with tokens and energy to estimate from")

// usable: an ended run of the model whose whole-run pace is known, not one
// that lost data (its figures miss the lost part) or failed.
func usable(r *trainmeterv1.RunReport, model string) bool {
	return r.GetEnded() && r.GetMetadata().GetModel() == model && !r.GetIncomplete() &&
		r.GetTokensProcessed() > 0 && r.GetGpuHours() > 0 && r.GetEnergyTotalJ() > 0 &&
		!Failed(r)
}

// Estimate gives the time, energy and cost of a run of req.Model over
// req.Tokens from the model's past runs in history (any runs; the model's
// ended ones are used). Per past run, whole run, warmup included:
//
//	tokens per GPU-second = tokens_processed / (gpu_hours × 3600)
//	joules per token      = energy_total_J / tokens_processed
//
// The estimate's mid is the median run's pace, low and high the best and
// worst run's: GPU-hours = tokens / (tokens per GPU-second) / 3600, wall
// time = GPU-hours × 3600 / GPUs (linear scaling in GPUs), energy =
// tokens × joules per token, cost = GPU-hours × $/GPU-hour + the energy
// priced like a run's (PUE included; a tariff's default band). With req.GPU
// set, only runs on that GPU are used when there are any; otherwise the
// pace of the other GPU stands (a GPU's speed is not modelled) and only the
// price is req.GPU's, which Notes says.
func (c Config) Estimate(history []*trainmeterv1.RunReport, req EstimateRequest) (*trainmeterv1.RunEstimate, error) {
	model := strings.TrimSpace(req.Model)
	if model == "" || req.Tokens == 0 {
		return nil, errors.New("an estimate needs a model and a number of tokens > 0")
	}
	var runs []*trainmeterv1.RunReport
	for _, r := range history {
		if usable(r, model) {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("model %q: %w (run it once, measured, first)", model, ErrNoEstimateHistory)
	}
	est := &trainmeterv1.RunEstimate{Model: model, Tokens: req.Tokens, Gpu: req.GPU, SameGpu: true, Pue: c.EffectivePUE()}
	if req.GPU != "" {
		m := prices.NewMatcher([]string{req.GPU})
		var on []*trainmeterv1.RunReport
		for _, r := range runs {
			if _, ok := m.Match(r.GetGpuName()); ok || r.GetGpuName() == req.GPU {
				on = append(on, r)
			}
		}
		if len(on) > 0 {
			runs = on
		} else {
			est.SameGpu = false
		}
	}
	slices.SortFunc(runs, func(a, b *trainmeterv1.RunReport) int { return strings.Compare(a.GetRunId(), b.GetRunId()) })
	var tpgs, jpt, gpus []float64
	names := map[string]bool{}
	for _, r := range runs {
		est.BasedOn = append(est.BasedOn, r.GetRunId())
		tpgs = append(tpgs, float64(r.GetTokensProcessed())/(r.GetGpuHours()*3600))
		jpt = append(jpt, r.GetEnergyTotalJ()/float64(r.GetTokensProcessed()))
		gpus = append(gpus, float64(max(1, r.GetGpus())))
		names[r.GetGpuName()] = true
	}
	est.MeasuredOn = strings.Join(slices.Sorted(maps.Keys(names)), ", ")
	_, midGPUs, _ := bandOf(gpus)
	est.Gpus = cmp.Or(req.GPUs, uint32(math.Round(midGPUs)))
	n := float64(req.Tokens)
	// The fastest run gives the fewest GPU-hours.
	lo, mid, hi := bandOf(tpgs)
	est.GpuHours = &trainmeterv1.Range{Low: n / hi / 3600, Mid: n / mid / 3600, High: n / lo / 3600}
	k := float64(est.Gpus)
	est.WallS = &trainmeterv1.Range{Low: est.GpuHours.Low * 3600 / k, Mid: est.GpuHours.Mid * 3600 / k, High: est.GpuHours.High * 3600 / k}
	lo, mid, hi = bandOf(jpt)
	est.EnergyKwh = &trainmeterv1.Range{Low: n * lo / 3.6e6, Mid: n * mid / 3.6e6, High: n * hi / 3.6e6}

	price, source, priced := c.estimatePrice(runs, req.GPU)
	est.PriceSource = source
	if priced {
		est.GpuPricePerHour = &price
	}
	if _, _, energyPriced := c.EnergyCost(nil, 0); priced || energyPriced {
		cost := func(gpuH, kwh float64) float64 {
			usd, _, _ := c.EnergyCost(nil, kwh*3.6e6)
			return gpuH*price + usd
		}
		est.CostUsd = &trainmeterv1.Range{Low: cost(est.GpuHours.Low, est.EnergyKwh.Low),
			Mid: cost(est.GpuHours.Mid, est.EnergyKwh.Mid), High: cost(est.GpuHours.High, est.EnergyKwh.High)}
	}

	if !est.SameGpu {
		est.Notes = append(est.Notes, fmt.Sprintf("no past runs of %s on %s: time and energy are as measured on %s (another GPU's speed is not modelled); only the price is %s's",
			model, req.GPU, est.MeasuredOn, req.GPU))
	}
	if len(runs) == 1 {
		est.Notes = append(est.Notes, "from 1 past run: no spread to show (low = mid = high)")
	}
	if est.CostUsd == nil {
		est.Notes = append(est.Notes, "no GPU or energy price configured: no cost")
	}
	return est, nil
}

// estimatePrice is the $/GPU-hour of the estimate: req.GPU's (priced for no
// node in particular) when given, else what the past runs' GPU time cost
// (GPU-time-weighted, as they are priced now).
func (c Config) estimatePrice(runs []*trainmeterv1.RunReport, gpu string) (float64, string, bool) {
	if gpu != "" {
		return c.GPUPrice(0, "", gpu)
	}
	var usd, hours float64
	source := ""
	for _, r := range runs {
		if r.CostUsd == nil {
			continue
		}
		usd += r.GetCostUsd()
		hours += r.GetGpuHours()
		switch src := r.GetPriceSource(); {
		case source == "":
			source = src
		case source != src:
			source = SourceMixed
		}
	}
	if hours <= 0 {
		return 0, "", false
	}
	return usd / hours, source, true
}

// bandOf is the min, median and max of xs (not empty).
func bandOf(xs []float64) (lo, mid, hi float64) {
	s := slices.Sorted(slices.Values(xs))
	return s[0], prices.Median(s), s[len(s)-1]
}
