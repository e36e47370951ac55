// Package dataloader holds the rules that turn a run's measured data wait,
// compute time, GPU utilisation and host RAM into advice on a PyTorch
// DataLoader's num_workers and prefetch_factor (docs/recommendations.md).
//
// It is pure: the caller feeds one Interval of measurements per evaluation
// (every Config.Interval steps) to an Advisor, which classifies it, applies
// the strategy for that class and the hysteresis, and says whether to send
// new settings. The caller tells it with Commit when a change reached the
// trainer; until then the advisor's settings stay as they were. No I/O, no
// clock.
package dataloader

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/trainmeter/trainmeter/internal/plural"
)

// Defaults used when the run_start does not set the targets.
const (
	DefaultTargetGPUUtilization = 0.85
	DefaultMaxRAMUsage          = 0.80
	DefaultInterval             = 50
	// DefaultNumWorkers / DefaultPrefetchFactor are assumed when the
	// run_start does not say what the loader started with (PyTorch's
	// prefetch_factor default is 2; 2 workers is a common starting point).
	DefaultNumWorkers     = 2
	DefaultPrefetchFactor = 2
)

// Rule constants (documented in docs/recommendations.md).
const (
	// MinDataWaitShare: below this share of step time spent waiting for
	// data, the loader is not what holds the GPU back.
	MinDataWaitShare = 0.05
	// RAMHeadroom: "RAM to spare" means usage below MaxRAMUsage minus this,
	// so that an increase cannot immediately trip the memory rule (a band).
	RAMHeadroom = 0.05
	// MaxPrefetchFactor bounds prefetch advice.
	MaxPrefetchFactor = 8
	// ConfirmEvaluations: a class must hold for this many consecutive
	// evaluations before it changes the settings (memory-bound: 1, it is a
	// safety rule).
	ConfirmEvaluations = 2
	// NoReverseEvaluations: after a change in one direction, no change in
	// the other direction for this many evaluations (memory-bound excepted).
	NoReverseEvaluations = 3
	// CooldownEvaluations: after a change, the trainer applies it at its
	// next epoch; until an epoch boundary has passed (or this many
	// evaluations, for runs that report no epochs) no further change is
	// advised, so the advisor does not stack changes on figures that do not
	// reflect the last one yet. Exception: a memory-bound reduction replaces
	// a pending increase at once (it protects the host).
	CooldownEvaluations = 5
	// MinRelativeWorkerChange: a worker change smaller than this share of
	// the current count, with the same prefetch, is not worth a rebuild.
	MinRelativeWorkerChange = 0.10
)

// Class is what limits the run.
type Class string

// Classes.
const (
	Unknown     Class = "unknown"
	DataBound   Class = "data-bound"
	GPUBound    Class = "gpu-bound"
	MemoryBound Class = "memory-bound"
)

// Config is one run's targets (from run_start; zero = default).
type Config struct {
	TargetGPUUtilization float64 // 0..1
	MaxRAMUsage          float64 // 0..1
	Interval             uint64  // steps between evaluations
	NumWorkers           int     // what the loader starts with
	PrefetchFactor       int
	// HasNumWorkers: NumWorkers was given, so 0 is a setting (loading in the
	// training process, the loader most in need of workers), not "unset".
	HasNumWorkers bool
	// Epochs: the run has epochs (it announced planned_epochs): its trainer
	// applies advice only at an epoch boundary, so a change stays pending
	// until one, however many evaluations pass. A run that has reported a
	// boundary is treated so too.
	Epochs bool
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.TargetGPUUtilization <= 0 {
		c.TargetGPUUtilization = DefaultTargetGPUUtilization
	}
	if c.MaxRAMUsage <= 0 {
		c.MaxRAMUsage = DefaultMaxRAMUsage
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.NumWorkers < 0 || (c.NumWorkers == 0 && !c.HasNumWorkers) {
		c.NumWorkers = DefaultNumWorkers
	}
	if c.PrefetchFactor <= 0 {
		c.PrefetchFactor = DefaultPrefetchFactor
	}
	return c
}

// Validate checks a config after WithDefaults.
func (c Config) Validate() error {
	var errs []error
	if !(c.TargetGPUUtilization > 0 && c.TargetGPUUtilization <= 1) {
		errs = append(errs, fmt.Errorf("target_gpu_utilization %v: want (0, 1]", c.TargetGPUUtilization))
	}
	if !(c.MaxRAMUsage > 0 && c.MaxRAMUsage <= 1) {
		errs = append(errs, fmt.Errorf("max_ram_usage %v: want (0, 1]", c.MaxRAMUsage))
	}
	if c.Interval == 0 {
		errs = append(errs, errors.New("adjustment_interval must be positive"))
	}
	return errors.Join(errs...)
}

// Interval is what was measured over one evaluation interval on one node.
type Interval struct {
	Steps     uint64
	DataWaitS float64 // sum over the steps
	ComputeS  float64 // sum over the steps
	// GPUUtilization is the mean utilisation of the run's GPUs, 0..1;
	// HasGPUUtilization false when no GPU sample had one.
	GPUUtilization    float64
	HasGPUUtilization bool
	// RAMUsage is the highest host memory used / total seen, 0..1;
	// HasRAM false when the host was not sampled.
	RAMUsage float64
	HasRAM   bool
	CPUCount int // logical CPUs of the host (0 = unknown)
	// LocalRanks is the number of the run's ranks (GPUs) on the node; the
	// worker bound is the CPUs per rank.
	LocalRanks int
}

// DataWaitShare is data wait ÷ (data wait + compute): the share of step
// time the GPU waited for data, which is also the most a faster loader can
// gain.
func (iv Interval) DataWaitShare() float64 {
	if t := iv.DataWaitS + iv.ComputeS; t > 0 {
		return iv.DataWaitS / t
	}
	return 0
}

// MaxWorkers is the bound on num_workers: CPUs per local rank minus one for
// the rank's own process, at least 1. 0 CPUs (unknown) gives no bound
// beyond 4× the current count.
func MaxWorkers(cpus, ranks, current int) int {
	if cpus <= 0 {
		return max(current*4, 1)
	}
	return max(cpus/max(ranks, 1)-1, 1)
}

// Advice is the outcome of one evaluation.
type Advice struct {
	Class          Class
	NumWorkers     int // recommended (== current when Changed is false)
	PrefetchFactor int
	// FromNumWorkers / FromPrefetchFactor are the settings the change was
	// computed from: the loader's settings as the advisor believes them
	// (the run_start's, then the last delivered advice's, or the ones before
	// a pending increase that a memory-bound reduction replaces).
	FromNumWorkers     int
	FromPrefetchFactor int
	// Changed: the settings differ from the current ones and the hysteresis
	// let the change through: send it to the trainer.
	Changed bool
	Reason  string
	// The figures that led to it.
	DataWaitShare     float64
	GPUUtilization    float64
	HasGPUUtilization bool
	RAMUsage          float64
	HasRAM            bool
	MaxWorkers        int
	// ExpectedGain is the share of step time spent waiting for data, which
	// the change aims to win back (0 when nothing changes).
	ExpectedGain float64
}

// Advisor keeps one run's (on one node) classification history and
// current settings.
type Advisor struct {
	cfg      Config
	workers  int // settings in force once the trainer applied the last change
	prefetch int
	// prevWorkers / prevPrefetch: the settings before the last change, still
	// in force while it is pending (not yet applied by the trainer).
	prevWorkers    int
	prevPrefetch   int
	evaluations    int
	lastClass      Class
	streak         int // consecutive evaluations with lastClass
	lastDirection  int // +1 increase, -1 decrease, 0 none yet
	lastChangeEval int
	adjustments    int
	boundarySince  bool // an epoch boundary passed since the last change
	sawBoundary    bool // the run has reported an epoch boundary
}

// EpochBoundary tells the advisor the run finished an epoch (an eval
// event): a trainer that applies advice at epoch boundaries has now applied
// the last one. On the first boundary after a change it returns true and
// forgets the evidence gathered so far (the class streak): it was measured
// on the settings before the change. The caller should then drop the
// interval it is accumulating, for the same reason.
func (a *Advisor) EpochBoundary() (applied bool) {
	if a.adjustments > 0 && !a.boundarySince {
		a.lastClass, a.streak = Unknown, 0
		applied = true
	}
	a.boundarySince, a.sawBoundary = true, true
	return applied
}

// Rebase takes the loader settings the trainer reported as the advisor's
// own (the baseline of the next change), where they differ from what it
// believed: a loader whose advice was applied relative to settings other
// than the run_start's, or not at all. prefetchFactor 0 (not reported, a
// loader without workers) keeps the believed prefetch. A change still
// pending is left alone: the report predates it.
func (a *Advisor) Rebase(numWorkers, prefetchFactor int) {
	pending := a.adjustments > 0 && !a.boundarySince
	if pending || numWorkers < 0 {
		return
	}
	a.workers, a.prevWorkers = numWorkers, numWorkers
	if prefetchFactor > 0 {
		a.prefetch, a.prevPrefetch = prefetchFactor, prefetchFactor
	}
}

// NewAdvisor returns an advisor for a run with cfg (defaults applied).
func NewAdvisor(cfg Config) *Advisor {
	cfg = cfg.WithDefaults()
	return &Advisor{cfg: cfg, workers: cfg.NumWorkers, prefetch: cfg.PrefetchFactor, prevWorkers: cfg.NumWorkers, prevPrefetch: cfg.PrefetchFactor}
}

// Config returns the advisor's config (defaults applied).
func (a *Advisor) Config() Config { return a.cfg }

// Current returns the settings the advisor believes the loader has: the
// run_start's, then the last advice committed (delivered; it assumes the
// trainer applies it at its next epoch).
func (a *Advisor) Current() (numWorkers, prefetchFactor int) { return a.workers, a.prefetch }

// InForce returns the settings the loader runs with now: those before the
// last change while it is pending (delivered, but the trainer applies it
// at its next epoch boundary), else Current. Call it before EpochBoundary
// to learn what the epoch that boundary ends ran with.
func (a *Advisor) InForce() (numWorkers, prefetchFactor int) {
	if a.adjustments > 0 && !a.boundarySince {
		return a.prevWorkers, a.prevPrefetch
	}
	return a.workers, a.prefetch
}

// Adjustments is how many changes were committed (delivered) so far.
func (a *Advisor) Adjustments() int { return a.adjustments }

// Classify says what limits the run over iv.
func Classify(cfg Config, iv Interval) Class {
	if iv.Steps == 0 {
		return Unknown
	}
	if iv.HasRAM && iv.RAMUsage > cfg.MaxRAMUsage {
		return MemoryBound
	}
	share := iv.DataWaitShare()
	lowUtil := iv.HasGPUUtilization && iv.GPUUtilization < cfg.TargetGPUUtilization
	if share >= MinDataWaitShare && (lowUtil || iv.DataWaitS > iv.ComputeS || !iv.HasGPUUtilization) {
		return DataBound
	}
	return GPUBound
}

// Evaluate classifies one interval and returns the advice. A change
// (Changed) is only a proposal: the advisor's settings, adjustment count and
// cooldown move when the caller Commits it, i.e. once the advice reached the
// trainer. An advice that could not be delivered is not committed; the
// evidence keeps counting, so the next evaluation proposes it again with
// fresh figures.
func (a *Advisor) Evaluate(iv Interval) Advice {
	a.evaluations++
	class := Classify(a.cfg, iv)
	if class == a.lastClass {
		a.streak++
	} else {
		a.lastClass, a.streak = class, 1
	}
	// The last change is pending while the trainer has not passed an epoch
	// boundary (nor the cooldown) since it was sent.
	pending := a.adjustments > 0 && !a.boundarySince &&
		(a.cfg.Epochs || a.sawBoundary || a.evaluations-a.lastChangeEval < CooldownEvaluations)
	// A memory-bound reduction does not wait for a pending increase to be
	// applied: it replaces it, so it starts from the settings still in force.
	replacing := class == MemoryBound && pending && a.lastDirection > 0
	bw, bp := a.workers, a.prefetch // the baseline of this evaluation
	if replacing {
		bw, bp = a.prevWorkers, a.prevPrefetch
	}
	adv := Advice{
		Class: class, NumWorkers: a.workers, PrefetchFactor: a.prefetch, FromNumWorkers: bw, FromPrefetchFactor: bp,
		DataWaitShare: iv.DataWaitShare(), GPUUtilization: iv.GPUUtilization, HasGPUUtilization: iv.HasGPUUtilization,
		RAMUsage: iv.RAMUsage, HasRAM: iv.HasRAM,
		MaxWorkers: MaxWorkers(iv.CPUCount, iv.LocalRanks, bw),
	}
	figures := a.figures(iv)
	w, p := bw, bp
	dir := 0
	switch class {
	case Unknown:
		adv.Reason = "no steps in the interval: nothing to judge"
		return adv
	case GPUBound:
		adv.Reason = "GPU-bound (" + figures + "): the loader keeps up; no change"
		return adv
	case MemoryBound:
		dir = -1
		switch {
		case p > 1:
			p--
			adv.Reason = fmt.Sprintf("memory-bound (%s, limit %.0f%%): lower prefetch_factor %d→%d first", figures, 100*a.cfg.MaxRAMUsage, bp, p)
		case w > 0:
			w = max(0, w-max(1, w/4))
			adv.Reason = fmt.Sprintf("memory-bound (%s, limit %.0f%%): prefetch_factor already 1; fewer workers %d→%d", figures, 100*a.cfg.MaxRAMUsage, bw, w)
		case replacing:
			adv.Reason = fmt.Sprintf("memory-bound (%s, limit %.0f%%): loader already minimal; keep num_workers %d, prefetch_factor %d", figures, 100*a.cfg.MaxRAMUsage, bw, bp)
		default:
			adv.Reason = fmt.Sprintf("memory-bound (%s, limit %.0f%%): loader already minimal; the RAM is used elsewhere", figures, 100*a.cfg.MaxRAMUsage)
			return adv
		}
		if replacing {
			adv.Reason += fmt.Sprintf(" (replaces the pending increase to num_workers %d, prefetch_factor %d)", a.workers, a.prefetch)
		}
	case DataBound:
		dir = +1
		ramSpare := !iv.HasRAM || iv.RAMUsage < a.cfg.MaxRAMUsage-RAMHeadroom
		if !ramSpare {
			adv.Reason = fmt.Sprintf("data-bound (%s) but RAM is within %.0f%% of the %.0f%% limit: no increase", figures, 100*RAMHeadroom, 100*a.cfg.MaxRAMUsage)
			return adv
		}
		var what []string
		lowUtil := !iv.HasGPUUtilization || iv.GPUUtilization < a.cfg.TargetGPUUtilization
		if lowUtil && w < adv.MaxWorkers {
			w = min(adv.MaxWorkers, max(w+1, int(math.Ceil(float64(w)*1.5))))
			what = append(what, fmt.Sprintf("num_workers %d→%d", bw, w))
		}
		if p < MaxPrefetchFactor {
			if iv.DataWaitS > iv.ComputeS {
				p = min(MaxPrefetchFactor, p*2)
			} else {
				p++
			}
			what = append(what, fmt.Sprintf("prefetch_factor %d→%d", bp, p))
		}
		if len(what) == 0 {
			adv.Reason = fmt.Sprintf("data-bound (%s) but num_workers is at the bound of %d (CPUs per local rank) and prefetch_factor at %d: speed up the dataset itself", figures, adv.MaxWorkers, MaxPrefetchFactor)
			return adv
		}
		adv.Reason = fmt.Sprintf("data-bound (%s): %s", figures, strings.Join(what, " and "))
	}
	// Hysteresis.
	need := ConfirmEvaluations
	if class == MemoryBound {
		need = 1
	}
	if a.streak < need {
		adv.Reason += fmt.Sprintf(" — waiting for %d consecutive %s evaluations before changing", need, class)
		return adv
	}
	if pending && !replacing {
		adv.Reason += " — held: the last advice is not applied yet (waiting for an epoch boundary)"
		return adv
	}
	if class != MemoryBound && a.lastDirection != 0 && dir != a.lastDirection && a.evaluations-a.lastChangeEval <= NoReverseEvaluations {
		adv.Reason += fmt.Sprintf(" — held: the last change went the other way %s ago", plural.N(a.evaluations-a.lastChangeEval, "evaluation"))
		return adv
	}
	if !replacing && p == bp && math.Abs(float64(w-bw)) < MinRelativeWorkerChange*float64(bw) {
		adv.Reason += " — held: change too small to be worth a rebuild"
		return adv
	}
	adv.Changed = true
	adv.NumWorkers, adv.PrefetchFactor = w, p
	if dir > 0 {
		adv.ExpectedGain = adv.DataWaitShare
	}
	return adv
}

// Commit records that adv, the change the latest Evaluate proposed, reached
// the trainer: its settings become the advisor's current ones, and the
// cooldown and no-reversal rules start from this evaluation. Call it right
// after that Evaluate, and only for a delivered change; anything else is
// ignored.
func (a *Advisor) Commit(adv Advice) {
	if !adv.Changed {
		return
	}
	dir := +1
	if adv.Class == MemoryBound {
		dir = -1
	}
	a.prevWorkers, a.prevPrefetch = adv.FromNumWorkers, adv.FromPrefetchFactor
	a.workers, a.prefetch = adv.NumWorkers, adv.PrefetchFactor
	a.lastDirection, a.lastChangeEval = dir, a.evaluations
	a.adjustments++
	a.boundarySince = false
	// A new setting starts a new streak: the next change needs fresh evidence.
	a.streak = 0
}

func (a *Advisor) figures(iv Interval) string {
	s := fmt.Sprintf("data wait %.0f%% of step time", 100*iv.DataWaitShare())
	if iv.HasGPUUtilization {
		s += fmt.Sprintf(", GPU %.0f%% (target %.0f%%)", 100*iv.GPUUtilization, 100*a.cfg.TargetGPUUtilization)
	}
	if iv.HasRAM {
		s += fmt.Sprintf(", RAM %.0f%%", 100*iv.RAMUsage)
	}
	return s
}
