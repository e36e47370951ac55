// Package recommend holds the pure rules over run reports that say what to
// change to spend less, each with its estimated savings, a confidence 0..1,
// the risks and the evidence (docs/recommendations.md).
package recommend

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/internal/money"
)

// Kinds of recommendations.
const (
	KindBatchSize     = "batch_size"
	KindEarlyStopping = "early_stopping"
	KindEpochCount    = "epoch_count"
	KindDatasetSize   = "dataset_size"
	KindComputeTier   = "compute_tier"
	KindPower         = "power"
	KindDataloader    = "dataloader"
)

// Rule thresholds (docs/recommendations.md).
const (
	// DefaultPatience: evaluations without improvement before early stopping.
	DefaultPatience = 2
	// DefaultMinDelta: an improvement must lower val_loss by this share of
	// the best so far.
	DefaultMinDelta = 0.01
	// TierMinGap: a cheaper GPU model is recommended when its cost per unit
	// of throughput is at least this much lower.
	TierMinGap = 0.20
	// BatchMaxPeakShare: a doubled batch is suggested when twice the run's
	// VRAM peak stays under this share of the card (so at least 55 % of it
	// is free).
	BatchMaxPeakShare = 0.90
	// BatchAssumedSpeedup: throughput gain assumed for a doubled batch when
	// no run of the model measured one (a heuristic: low confidence).
	BatchAssumedSpeedup = 1.10
	// KneeShare: the epoch-count knee is the first epoch that reaches this
	// share of the accuracy gain of the whole curve.
	KneeShare = 0.95
	// DataSizeShare: the smallest dataset whose accuracy is within this
	// share of the best.
	DataSizeShare = 0.95
	// PowerMinSaving / PowerMaxSlowdown: a lower power level is worth it
	// when it saves at least 5 % J/token for at most 10 % less throughput.
	PowerMinSaving   = 0.05
	PowerMaxSlowdown = 0.10
	// Heuristic power cap (when no measured pair exists and the power limit
	// is known): GPUs averaging ≥ 85 % of their limit; capping at 80 % of
	// the limit is assumed to save 15 % energy for 5 % throughput.
	PowerBusyShare        = 0.85
	PowerHeuristicSaving  = 0.15
	PowerHeuristicSlowing = 0.05
)

// PriceCatalog gives current GPU-hour prices by GPU model (the price
// catalog of the collector; nil: only the runs' own prices are used).
type PriceCatalog = cost.PriceCatalog

// OfferCatalog is a PriceCatalog that also says where its current price
// of a GPU model is offered (the collector's catalog merges several
// providers): the compute-tier advice then names it.
type OfferCatalog interface {
	PriceCatalog
	// CurrentOffer describes the offer CurrentPrice is the price of:
	// its provider and, when known, its region ("lambda, us-east-1").
	CurrentOffer(gpuName string) (where string, ok bool)
}

// Run is one run as the rules see it.
type Run struct {
	Report                     *trainmeterv1.RunReport
	GPUMemoryMiB               float64 // of one of the run's cards (0: unknown)
	GPUPowerLimitW             float64 // of one card (0: unknown)
	PlannedEpochs, DatasetSize uint64
}

// Options tune the rules; zero values take the defaults.
type Options struct {
	Catalog  PriceCatalog
	Patience int
	MinDelta float64
	// Targets: when non-empty, only recommendations about these runs (cross-
	// run rules still read every run of the model).
	Targets []string
	// Schedule: the carbon schedule and tariff the "run it at" rule moves
	// repeated runs in (zero: the rule is off).
	Schedule ScheduleInputs
}

func (o Options) withDefaults() Options {
	if o.Patience <= 0 {
		o.Patience = DefaultPatience
	}
	if o.MinDelta <= 0 {
		o.MinDelta = DefaultMinDelta
	}
	return o
}

// Recommend runs every rule over runs and returns the recommendations,
// highest savings first.
func Recommend(runs []Run, o Options) []*trainmeterv1.Recommendation {
	o = o.withDefaults()
	var out []*trainmeterv1.Recommendation
	for _, r := range runs {
		if !o.target(r.Report.GetRunId()) {
			continue
		}
		for _, rec := range []*trainmeterv1.Recommendation{EarlyStopping(r, o.Patience, o.MinDelta), EpochCount(r), BatchSize(r, runs)} {
			if rec != nil {
				out = append(out, rec)
			}
		}
	}
	for _, recs := range [][]*trainmeterv1.Recommendation{ComputeTier(runs, o.Catalog), DatasetSize(runs), Power(runs), Schedule(runs, o.Schedule)} {
		for _, rec := range recs {
			if o.anyTarget(rec.RunIds) {
				out = append(out, rec)
			}
		}
	}
	Sort(out)
	return out
}

// Sort orders recommendations by savings (dollars, uncosted last, then
// joules), then kind.
func Sort(recs []*trainmeterv1.Recommendation) {
	sort.SliceStable(recs, func(i, j int) bool {
		a, b := recs[i], recs[j]
		if (a.SavingsUsd != nil) != (b.SavingsUsd != nil) {
			return a.SavingsUsd != nil
		}
		if a.GetSavingsUsd() != b.GetSavingsUsd() {
			return a.GetSavingsUsd() > b.GetSavingsUsd()
		}
		if a.SavingsJ != b.SavingsJ {
			return a.SavingsJ > b.SavingsJ
		}
		return a.Kind < b.Kind
	})
}

func (o Options) target(id string) bool { return len(o.Targets) == 0 || slices.Contains(o.Targets, id) }

func (o Options) anyTarget(ids []string) bool {
	return len(o.Targets) == 0 || slices.ContainsFunc(ids, func(id string) bool { return slices.Contains(o.Targets, id) })
}

// epochPoint is one epoch's mean val_loss / accuracy over the evals that
// reported it (several ranks may report the same epoch).
type epochPoint struct {
	epoch       int64
	loss, acc   float64
	nLoss, nAcc int
}

func epochs(r *trainmeterv1.RunReport) []epochPoint {
	by := map[int64]*epochPoint{}
	for _, e := range r.GetEvals() {
		p := by[e.GetEpoch()]
		if p == nil {
			p = &epochPoint{epoch: e.GetEpoch()}
			by[e.GetEpoch()] = p
		}
		if e.ValLoss != nil {
			p.loss += e.GetValLoss()
			p.nLoss++
		}
		if e.Accuracy != nil {
			p.acc += e.GetAccuracy()
			p.nAcc++
		}
	}
	out := make([]epochPoint, 0, len(by))
	for _, p := range by {
		if p.nLoss > 0 {
			p.loss /= float64(p.nLoss)
		}
		if p.nAcc > 0 {
			p.acc /= float64(p.nAcc)
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b epochPoint) int { return cmp.Compare(a.epoch, b.epoch) })
	return out
}

// costPerEpoch is the run's total cost and energy per completed epoch.
func costPerEpoch(r *trainmeterv1.RunReport, done int64) (usd, joules float64) {
	if done <= 0 {
		return 0, 0
	}
	return r.GetTotalCostUsd() / float64(done), r.GetEnergyTotalJ() / float64(done)
}

// costed is usd when the cost it was reached from is known, else absent: a
// saving that cannot be costed is not a zero saving.
func costed(cost *float64, usd float64) *float64 {
	if cost == nil {
		return nil
	}
	return proto.Float64(usd)
}

// lastEpoch is the epoch a run's spend counts to, which savings from fewer
// epochs count up to: an ended run's epochs done (it never spent unreached
// ones), a live run's max(planned, done).
func lastEpoch(r Run, done int64) (int64, string) {
	if r.Report.GetEnded() {
		return done, fmt.Sprintf("ended after %s", plural.N(done, "epoch"))
	}
	if int64(r.PlannedEpochs) > done {
		return int64(r.PlannedEpochs), fmt.Sprintf("live, %d of %s done", done, plural.N(r.PlannedEpochs, "planned epoch"))
	}
	return done, fmt.Sprintf("live, %s done", plural.N(done, "epoch"))
}

// EarlyStopping: validation loss has not improved by MinDelta (relative)
// for patience evaluations; the run could stop where patience ran out.
// Savings = (lastEpoch − stop epoch) × total cost ÷ epochs done.
func EarlyStopping(r Run, patience int, minDelta float64) *trainmeterv1.Recommendation {
	pts := slices.DeleteFunc(epochs(r.Report), func(p epochPoint) bool { return p.nLoss == 0 })
	if len(pts) < patience+1 {
		return nil
	}
	best, bestEpoch, since := pts[0].loss, pts[0].epoch, 0
	var stop int64 = -1
	for _, p := range pts[1:] {
		if p.loss < best*(1-minDelta) {
			best, bestEpoch, since = p.loss, p.epoch, 0
			continue
		}
		if p.loss < best {
			best = p.loss // a smaller improvement still moves the best, not the patience
		}
		since++
		if since >= patience {
			stop = p.epoch
			break
		}
	}
	if stop < 0 {
		return nil
	}
	done := pts[len(pts)-1].epoch
	total, how := lastEpoch(r, done)
	left := total - stop
	if left <= 0 {
		return nil
	}
	perUSD, perJ := costPerEpoch(r.Report, done)
	conf := math.Min(0.9, 0.5+0.1*float64(len(pts)-patience))
	id := r.Report.GetRunId()
	return &trainmeterv1.Recommendation{
		Kind:  KindEarlyStopping,
		Title: fmt.Sprintf("Stop %s at epoch %d: validation loss plateaued", id, stop),
		Action: fmt.Sprintf("Stop at epoch %d (best val_loss %.4g at epoch %d; no improvement ≥ %.0f%% for %s); use early stopping with patience %d",
			stop, best, bestEpoch, 100*minDelta, plural.N(patience, "evaluation"), patience),
		SavingsUsd: costed(r.Report.TotalCostUsd, float64(left)*perUSD), SavingsJ: float64(left) * perJ, Confidence: conf,
		Risks:  []string{"the loss may improve again later (a learning-rate schedule, double descent)", "validation set noise can hide slow progress"},
		RunIds: []string{id}, Model: r.Report.GetMetadata().GetModel(),
		Evidence: fmt.Sprintf("epochs %d–%d after the stop epoch (%s) = %d × %s/epoch (total %s ÷ %s done)",
			stop+1, total, how, left, money.Rate(perUSD), money.USD(r.Report.GetTotalCostUsd()), plural.N(done, "epoch")),
	}
}

// EpochCount: the knee of a run's accuracy curve is the first epoch that
// reaches KneeShare of the curve's total gain; the epochs after it bought
// little. Savings = (lastEpoch − knee) × cost per epoch.
func EpochCount(r Run) *trainmeterv1.Recommendation {
	pts := slices.DeleteFunc(epochs(r.Report), func(p epochPoint) bool { return p.nAcc == 0 })
	if len(pts) < 3 {
		return nil
	}
	first := pts[0].acc
	best := slices.MaxFunc(pts, func(a, b epochPoint) int { return cmp.Compare(a.acc, b.acc) }).acc
	gain := best - first
	if gain <= 0 {
		return nil
	}
	var knee epochPoint
	for _, p := range pts {
		if p.acc-first >= KneeShare*gain {
			knee = p
			break
		}
	}
	done := pts[len(pts)-1].epoch
	total, how := lastEpoch(r, done)
	left := total - knee.epoch
	if left <= 0 || knee.epoch >= done {
		return nil
	}
	perUSD, perJ := costPerEpoch(r.Report, done)
	id := r.Report.GetRunId()
	return &trainmeterv1.Recommendation{
		Kind:       KindEpochCount,
		Title:      fmt.Sprintf("Train %s for %s instead of %d", r.Report.GetMetadata().GetModel(), plural.N(knee.epoch, "epoch"), total),
		Action:     fmt.Sprintf("Set the epoch count to %d: it reached %.4g of the best accuracy %.4g (%.0f%% of the gain)", knee.epoch, knee.acc, best, 100*KneeShare),
		SavingsUsd: costed(r.Report.TotalCostUsd, float64(left)*perUSD), SavingsJ: float64(left) * perJ,
		Confidence: math.Min(0.8, 0.4+0.05*float64(len(pts))),
		Risks:      []string{fmt.Sprintf("gives up %.4g accuracy", best-knee.acc), "one run's curve; seeds differ"},
		RunIds:     []string{id}, Model: r.Report.GetMetadata().GetModel(),
		Evidence: fmt.Sprintf("epochs %d–%d after the knee (%s) = %d × %s/epoch", knee.epoch+1, total, how, left, money.Rate(perUSD)),
	}
}

func finalAccuracy(r *trainmeterv1.RunReport) (float64, bool) {
	pts := epochs(r)
	for i := len(pts) - 1; i >= 0; i-- {
		if pts[i].nAcc > 0 {
			return pts[i].acc, true
		}
	}
	return 0, false
}

// groupBy groups runs by key, leaving out those whose key is "".
func groupBy(runs []Run, key func(Run) string) map[string][]Run {
	out := map[string][]Run{}
	for _, r := range runs {
		if k := key(r); k != "" {
			out[k] = append(out[k], r)
		}
	}
	return out
}

func modelOf(r Run) string { return r.Report.GetMetadata().GetModel() }

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// DatasetSize: across the runs of one model on one dataset with a
// dataset_size and a final accuracy, the smallest size whose accuracy is
// within DataSizeShare of the best. Savings = cost of the largest-size run
// × (1 − small ÷ large). Runs on different datasets are never compared (a
// size means nothing across datasets).
func DatasetSize(runs []Run) []*trainmeterv1.Recommendation {
	var out []*trainmeterv1.Recommendation
	byModel := groupBy(runs, func(r Run) string {
		if modelOf(r) == "" {
			return ""
		}
		return modelOf(r) + "\x00" + r.Report.GetMetadata().GetDataset()
	})
	for _, key := range sortedKeys(byModel) {
		model, dataset, _ := strings.Cut(key, "\x00")
		of := ""
		if dataset != "" {
			of = " of " + dataset
		}
		type pt struct {
			size uint64
			acc  float64
			run  Run
		}
		var pts []pt
		for _, r := range byModel[key] {
			if acc, ok := finalAccuracy(r.Report); ok && r.DatasetSize > 0 {
				pts = append(pts, pt{r.DatasetSize, acc, r})
			}
		}
		if len(pts) < 2 {
			continue
		}
		slices.SortFunc(pts, func(a, b pt) int { return cmp.Compare(a.size, b.size) })
		best := max(0, slices.MaxFunc(pts, func(a, b pt) int { return cmp.Compare(a.acc, b.acc) }).acc)
		small := pts[max(0, slices.IndexFunc(pts, func(p pt) bool { return p.acc >= DataSizeShare*best }))]
		large := pts[len(pts)-1]
		if small.size >= large.size {
			continue
		}
		frac := 1 - float64(small.size)/float64(large.size)
		sizes := len(slices.CompactFunc(pts, func(a, b pt) bool { return a.size == b.size })) // pts is not read after this
		out = append(out, &trainmeterv1.Recommendation{
			Kind:       KindDatasetSize,
			Title:      fmt.Sprintf("Train %s on %d samples%s instead of %d", model, small.size, of, large.size),
			Action:     fmt.Sprintf("Use %d samples: accuracy %.4g is within %.0f%% of the best %.4g", small.size, small.acc, 100*DataSizeShare, best),
			SavingsUsd: costed(large.run.Report.TotalCostUsd, frac*large.run.Report.GetTotalCostUsd()), SavingsJ: frac * large.run.Report.GetEnergyTotalJ(),
			Confidence: math.Min(0.8, 0.4+0.1*float64(sizes-1)),
			Risks:      []string{"rare cases in the dropped data may matter more than the mean accuracy shows"},
			RunIds:     []string{small.run.Report.GetRunId(), large.run.Report.GetRunId()}, Model: model,
			Evidence: fmt.Sprintf("cost of run %s %s × (1 − %d/%d)", large.run.Report.GetRunId(), money.USD(large.run.Report.GetTotalCostUsd()), small.size, large.size),
		})
	}
	return out
}

// ComputeTier: per model and GPU model, the cost per unit of throughput is
// price per GPU-hour × GPUs ÷ tok/s (∝ $ per token), averaged over the
// runs. Two GPU models are compared on one price source: the catalog's when
// it prices both, else the runs' own. The cheapest GPU model at least
// TierMinGap cheaper is recommended to the runs on the dearer one; savings =
// their GPU cost × gap, and (J/token difference) × their measured tokens
// when both measured it and the cheaper takes less.
func ComputeTier(runs []Run, cat PriceCatalog) []*trainmeterv1.Recommendation {
	var out []*trainmeterv1.Recommendation
	byModel := groupBy(runs, modelOf)
	for _, model := range sortedKeys(byModel) {
		type tier struct {
			name     string
			runs     []string
			thr      float64 // Σ GPUs ÷ tok/s over the runs
			own      float64 // Σ own price × GPUs ÷ tok/s over the runs with a price
			ownN     int
			catPrice float64 // catalog's current price, 0: none
			costUSD  float64
			costed   bool    // some run has a cost
			energyJ  float64 // Σ J/token × measured tokens of the runs with J/token
			tokens   float64
		}
		tiers := map[string]*tier{}
		for _, r := range byModel[model] {
			rep := r.Report
			if rep.GetGpuName() == "" || rep.GetTokPerS() <= 0 || rep.GetGpus() == 0 {
				continue
			}
			t := tiers[rep.GetGpuName()]
			if t == nil {
				t = &tier{name: rep.GetGpuName()}
				if cat != nil {
					if p, ok := cat.CurrentPrice(t.name); ok && p > 0 && !math.IsInf(p, 0) {
						t.catPrice = p
					}
				}
				tiers[t.name] = t
			}
			perThr := float64(rep.GetGpus()) / rep.GetTokPerS()
			t.runs = append(t.runs, rep.GetRunId())
			t.thr += perThr
			if p := rep.GetGpuPricePerHour(); p > 0 {
				t.own += p * perThr
				t.ownN++
			}
			t.costUSD += rep.GetCostUsd()
			t.costed = t.costed || rep.CostUsd != nil
			if rep.GetJPerToken() > 0 && rep.GetTokensMeasured() > 0 {
				t.energyJ += rep.GetJPerToken() * float64(rep.GetTokensMeasured())
				t.tokens += float64(rep.GetTokensMeasured())
			}
		}
		// costOf is a tier's mean cost per unit of throughput on a source.
		costOf := func(t *tier, src string) (float64, bool) {
			switch {
			case src == "catalog" && t.catPrice > 0:
				return t.catPrice * t.thr / float64(len(t.runs)), true
			case src == "run" && t.ownN > 0:
				return t.own / float64(t.ownN), true
			}
			return 0, false
		}
		names := sortedKeys(tiers)
		for _, name := range names {
			t := tiers[name]
			var best *tier
			var bestGap, cur, alt float64
			var bestSrc string
			for _, other := range names {
				c := tiers[other]
				if c == t {
					continue
				}
				src := "catalog"
				if t.catPrice <= 0 || c.catPrice <= 0 {
					src = "run" // one source for both sides of a comparison
				}
				ct, ok1 := costOf(t, src)
				cc, ok2 := costOf(c, src)
				if !ok1 || !ok2 || ct <= 0 {
					continue
				}
				if gap := (ct - cc) / ct; gap >= TierMinGap && gap > bestGap {
					best, bestGap, cur, alt, bestSrc = c, gap, ct, cc, src
				}
			}
			if best == nil {
				continue
			}
			risks := []string{"throughput measured on other runs may not transfer (batch size, interconnect, memory)", "availability and price of the cheaper GPU can change"}
			savedJ, energy := 0.0, "energy per token not measured on both GPUs: joules not estimated"
			if t.tokens > 0 && best.tokens > 0 {
				jt, jc := t.energyJ/t.tokens, best.energyJ/best.tokens
				energy = fmt.Sprintf("J/token %.4g on %s vs %.4g on %s × %.0f tokens", jt, t.name, jc, best.name, t.tokens)
				if jc <= jt {
					savedJ = (jt - jc) * t.tokens
				} else {
					risks = append(risks, fmt.Sprintf("%s used %.0f%% more energy per token", best.name, 100*(jc/jt-1)))
				}
			}
			source := "the runs' own prices"
			if bestSrc == "catalog" {
				source = "the catalog's current prices"
			}
			where := ""
			if oc, ok := cat.(OfferCatalog); ok && bestSrc == "catalog" {
				if w, ok := oc.CurrentOffer(best.name); ok && w != "" {
					where = fmt.Sprintf("; %s at %s/GPU-h from %s", best.name, money.Rate(best.catPrice), w)
				}
			}
			var usd *float64 // the runs' GPU cost, when some run has one
			if t.costed {
				usd = proto.Float64(bestGap * t.costUSD)
			}
			out = append(out, &trainmeterv1.Recommendation{
				Kind:  KindComputeTier,
				Title: fmt.Sprintf("Run %s on %s instead of %s: %.0f%% cheaper per unit of throughput", model, best.name, t.name, 100*bestGap),
				Action: fmt.Sprintf("Move %s from %s to %s (%s vs %s per Mtok at measured throughput%s)",
					model, t.name, best.name, money.Rate(alt*1e6/3600), money.Rate(cur*1e6/3600), where),
				SavingsUsd: usd, SavingsJ: savedJ,
				Confidence: math.Min(0.9, 0.6+0.1*float64(min(len(t.runs), len(best.runs)))),
				Risks:      risks,
				RunIds:     t.runs, Model: model,
				Evidence: fmt.Sprintf("$/(tok/s) = price × GPUs ÷ tok/s on %s: %s %.4g (%s), %s %.4g (%s); gap %.1f%% × GPU cost %s; %s",
					source, t.name, cur, plural.N(len(t.runs), "run"), best.name, alt, plural.N(len(best.runs), "run"), 100*bestGap, money.USD(t.costUSD), energy),
			})
		}
	}
	return out
}

// BatchSize: twice the run's VRAM peak stays under BatchMaxPeakShare of
// the card, so a doubled batch fits (pessimistic: the weights and optimizer
// state do not double). The speedup is measured on another run of the model
// and GPU at that batch, else assumed (BatchAssumedSpeedup, low
// confidence). Savings = cost × (1 − 1/speedup).
func BatchSize(r Run, all []Run) *trainmeterv1.Recommendation {
	rep := r.Report
	md := rep.GetMetadata()
	if md.GetBatchSize() <= 0 || r.GPUMemoryMiB <= 0 || rep.GetVramPeakMb() <= 0 || rep.GetTokPerS() <= 0 {
		return nil
	}
	headroom := 1 - rep.GetVramPeakMb()/r.GPUMemoryMiB
	if 2*rep.GetVramPeakMb() > BatchMaxPeakShare*r.GPUMemoryMiB {
		return nil
	}
	newBatch := md.GetBatchSize() * 2
	speedup, conf, how := BatchAssumedSpeedup, 0.3, fmt.Sprintf("assumed %.0f%% faster (no run of the model measured batch %d)", 100*(BatchAssumedSpeedup-1), newBatch)
	for _, o := range all {
		om := o.Report.GetMetadata()
		if o.Report.GetRunId() == rep.GetRunId() || om.GetModel() != md.GetModel() || o.Report.GetGpuName() != rep.GetGpuName() ||
			om.GetBatchSize() != newBatch || o.Report.GetTokPerS() <= 0 || o.Report.GetGpus() == 0 || rep.GetGpus() == 0 {
			continue
		}
		speedup = (o.Report.GetTokPerS() / float64(o.Report.GetGpus())) / (rep.GetTokPerS() / float64(rep.GetGpus()))
		conf, how = 0.75, fmt.Sprintf("run %s measured %.4g tok/s per GPU at batch %d vs %.4g", o.Report.GetRunId(), o.Report.GetTokPerS()/float64(o.Report.GetGpus()), newBatch, rep.GetTokPerS()/float64(rep.GetGpus()))
		break
	}
	if speedup <= 1 {
		return nil
	}
	frac := 1 - 1/speedup
	return &trainmeterv1.Recommendation{
		Kind:       KindBatchSize,
		Title:      fmt.Sprintf("Double the batch size of %s (%d → %d): %.0f%% of VRAM is unused", md.GetModel(), md.GetBatchSize(), newBatch, 100*headroom),
		Action:     fmt.Sprintf("Set batch_size %d (peak %.0f MiB of %.0f MiB); scale the learning rate accordingly", newBatch, rep.GetVramPeakMb(), r.GPUMemoryMiB),
		SavingsUsd: costed(rep.TotalCostUsd, frac*rep.GetTotalCostUsd()), SavingsJ: frac * rep.GetEnergyTotalJ(), Confidence: conf,
		Risks:  []string{"a larger batch can change convergence (learning rate, generalisation)", "activation memory may grow faster than linearly"},
		RunIds: []string{rep.GetRunId()}, Model: md.GetModel(),
		Evidence: fmt.Sprintf("%s; savings = cost %s × (1 − 1/%.3f)", how, money.USD(rep.GetTotalCostUsd()), speedup),
	}
}

// Power: among like runs (likeKey; runs that differ in batch or world size
// would compare the setting, not the power), a run at a lower power per GPU
// whose J/token is at least PowerMinSaving lower for at most
// PowerMaxSlowdown less throughput shows that a lower power limit pays for
// the higher-power runs: savings_J = (J/token difference) × their tokens,
// savings_usd = energy saved × their $/kWh − the slowdown's extra GPU cost.
// Without such a pair, a heuristic (low confidence) for runs averaging ≥
// PowerBusyShare of a known power limit.
func Power(runs []Run) []*trainmeterv1.Recommendation {
	var out []*trainmeterv1.Recommendation
	covered := map[string]bool{}
	groups := groupBy(runs, func(r Run) string {
		if rep := r.Report; rep.GetJPerToken() <= 0 || rep.GetTokPerS() <= 0 || rep.GetGpus() == 0 || modelOf(r) == "" {
			return ""
		}
		return likeKey(r.Report)
	})
	perGPU := func(r Run) float64 { return r.Report.GetAvgPowerW() / float64(r.Report.GetGpus()) }
	for _, k := range sortedKeys(groups) {
		g := groups[k]
		best := lowerPowerPeers(g, perGPU)
		for j, hi := range g {
			if best[j] < 0 {
				continue
			}
			bestLo := &g[best[j]]
			h, l := hi.Report, bestLo.Report
			savedJ := (h.GetJPerToken() - l.GetJPerToken()) * float64(h.GetTokensMeasured())
			slow := 1 - (l.GetTokPerS()/float64(l.GetGpus()))/(h.GetTokPerS()/float64(h.GetGpus()))
			usd := savedJ/3.6e6*kwhPrice(h) - max(0, slow/(1-slow))*h.GetCostUsd()
			covered[h.GetRunId()] = true
			out = append(out, &trainmeterv1.Recommendation{
				Kind:  KindPower,
				Title: fmt.Sprintf("Run %s at a lower power limit (~%.0f W per GPU, as run %s)", h.GetMetadata().GetModel(), perGPU(*bestLo), l.GetRunId()),
				Action: fmt.Sprintf("Lower the GPU power limit towards %.0f W (nvidia-smi -pl); measured %.1f%% less J/token for %s",
					perGPU(*bestLo), 100*(1-l.GetJPerToken()/h.GetJPerToken()), throughputChange(slow)),
				SavingsUsd: costed(h.EnergyCostUsd, max(0, usd)), SavingsJ: savedJ, Confidence: 0.6,
				Risks:  []string{"longer wall time (GPU-hours cost more than the energy saved when energy is cheap)", "trainmeter reports this; it never changes a power limit"},
				RunIds: []string{h.GetRunId()}, Model: h.GetMetadata().GetModel(),
				Evidence: fmt.Sprintf("J/token %.4g vs %.4g × %d tokens; compared like runs %s (%s)", h.GetJPerToken(), l.GetJPerToken(), h.GetTokensMeasured(),
					strings.Join(runIDs(g), ", "), likeDescription(h)),
			})
		}
	}
	for _, r := range runs {
		h := r.Report
		if covered[h.GetRunId()] || r.GPUPowerLimitW <= 0 || h.GetGpus() == 0 || h.GetEnergyJ() <= 0 {
			continue
		}
		if perGPU(r) < PowerBusyShare*r.GPUPowerLimitW {
			continue
		}
		savedJ := PowerHeuristicSaving * h.GetEnergyJ()
		usd := savedJ/3.6e6*kwhPrice(h) - PowerHeuristicSlowing/(1-PowerHeuristicSlowing)*h.GetCostUsd()
		out = append(out, &trainmeterv1.Recommendation{
			Kind:  KindPower,
			Title: fmt.Sprintf("Try a lower power limit for %s (GPUs at %.0f%% of their %.0f W limit)", h.GetRunId(), 100*perGPU(r)/r.GPUPowerLimitW, r.GPUPowerLimitW),
			Action: fmt.Sprintf("Measure a run at %.0f W (80%% of the limit): training GPUs near their limit typically save ~%.0f%% energy for ~%.0f%% throughput (heuristic)",
				0.8*r.GPUPowerLimitW, 100*PowerHeuristicSaving, 100*PowerHeuristicSlowing),
			SavingsUsd: costed(h.EnergyCostUsd, max(0, usd)), SavingsJ: savedJ, Confidence: 0.3,
			Risks:  []string{"heuristic, not measured on this model", "trainmeter reports this; it never changes a power limit"},
			RunIds: []string{h.GetRunId()}, Model: h.GetMetadata().GetModel(),
			Evidence: fmt.Sprintf("avg %.0f W per GPU, limit %.0f W; %.0f%% of %.4g J", perGPU(r), r.GPUPowerLimitW, 100*PowerHeuristicSaving, h.GetEnergyJ()),
		})
	}
	return out
}

// lowerPowerPeers is, for each run hi of g, the index in g of the run
// that shows a lower power limit pays for it, or -1: of the runs at a
// lower power per GPU (perGPU) whose throughput per GPU is at most
// PowerMaxSlowdown lower and whose J/token is at least PowerMinSaving
// lower, the one of least J/token (the first in g of equals). Every run of
// g has J/token, tok/s and GPUs (Power's groups).
//
// It takes n log n, not n² (a like group can hold thousands of runs): the
// runs in order of power per GPU, each hi looks among those before it
// (strictly lower power) for the least J/token among the runs fast enough,
// a suffix of the runs in order of throughput per GPU (slow falls as the
// throughput grows), kept in a Fenwick tree of minima. The least J/token
// of those either saves enough or none of them does (the saving grows as
// J/token falls). Where a figure is NaN (no order), each pair is tried.
func lowerPowerPeers(g []Run, perGPU func(Run) float64) []int {
	n := len(g)
	best := make([]int, n)
	rate := func(r Run) float64 { return r.Report.GetTokPerS() / float64(r.Report.GetGpus()) }
	jpt := func(i int) float64 { return g[i].Report.GetJPerToken() }
	fits := func(lo, hi int) bool { // as slow enough and saving enough
		return 1-rate(g[lo])/rate(g[hi]) <= PowerMaxSlowdown && 1-jpt(lo)/jpt(hi) >= PowerMinSaving
	}
	if slices.ContainsFunc(g, func(r Run) bool {
		return math.IsNaN(perGPU(r)) || math.IsNaN(rate(r)) || math.IsNaN(r.Report.GetJPerToken())
	}) {
		for hi := range g {
			best[hi] = -1
			for lo := range g {
				if perGPU(g[lo]) < perGPU(g[hi]) && fits(lo, hi) && (best[hi] < 0 || jpt(lo) < jpt(best[hi])) {
					best[hi] = lo
				}
			}
		}
		return best
	}
	order := func(f func(Run) float64) []int {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(f(g[a]), f(g[b])) })
		return idx
	}
	byRate, byPower := order(rate), order(perGPU)
	// tree[p] (p from 1) is the best run among the rate ranks of its
	// span, counted from the fastest: a prefix of it is a suffix by rate.
	pos := make([]int, n)
	for k, i := range byRate {
		pos[i] = n - k
	}
	tree := make([]int, n+1)
	for p := range tree {
		tree[p] = -1
	}
	better := func(a, b int) bool { return b < 0 || jpt(a) < jpt(b) || (jpt(a) == jpt(b) && a < b) }
	for s := 0; s < n; {
		e := s
		for e < n && perGPU(g[byPower[e]]) == perGPU(g[byPower[s]]) {
			e++
		}
		for _, hi := range byPower[s:e] {
			// The first rate rank fast enough: the runs from it on are.
			k := sort.Search(n, func(k int) bool { return 1-rate(g[byRate[k]])/rate(g[hi]) <= PowerMaxSlowdown })
			lo := -1
			for p := n - k; p > 0; p -= p & -p {
				if t := tree[p]; t >= 0 && better(t, lo) {
					lo = t
				}
			}
			if lo >= 0 && !fits(lo, hi) {
				lo = -1
			}
			best[hi] = lo
		}
		for _, i := range byPower[s:e] {
			for p := pos[i]; p <= n; p += p & -p {
				if better(i, tree[p]) {
					tree[p] = i
				}
			}
		}
		s = e
	}
	return best
}

// likeKey is what two runs must share for the power rule to compare them:
// model, GPU model, batch size, sequence length, precision and world size
// (GPUs and nodes; the collector is not told the ranks, and the trainers
// run one rank per GPU). A field neither run reported matches (both
// unknown); one reported by only one of them does not.
func likeKey(r *trainmeterv1.RunReport) string {
	m := cmp.Or(r.GetMetadata(), &trainmeterv1.RunMetadata{})
	return strings.Join([]string{m.GetModel(), r.GetGpuName(), optInt(m.BatchSize, "?"),
		optInt(m.SeqLen, "?"), m.GetPrecision(), fmt.Sprint(r.GetGpus()), fmt.Sprint(r.GetNodes())}, "\x00")
}

// likeDescription says what the like runs share, for the evidence.
func likeDescription(r *trainmeterv1.RunReport) string {
	const unknown = "not reported"
	m := cmp.Or(r.GetMetadata(), &trainmeterv1.RunMetadata{})
	return fmt.Sprintf("model %s, GPU %s, batch size %s, seq len %s, precision %s, world size %s on %s",
		m.GetModel(), cmp.Or(r.GetGpuName(), unknown), optInt(m.BatchSize, unknown), optInt(m.SeqLen, unknown),
		cmp.Or(m.GetPrecision(), unknown), plural.N(r.GetGpus(), "GPU"), plural.N(r.GetNodes(), "node"))
}

// optInt is *v, or unknown when v is nil.
func optInt(v *int64, unknown string) string {
	if v == nil {
		return unknown
	}
	return fmt.Sprint(*v)
}

func runIDs(runs []Run) []string {
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.Report.GetRunId()
	}
	return ids
}

// throughputChange words a slowdown share; the lower-power run may also
// have been faster.
func throughputChange(slow float64) string {
	if slow < 0 {
		return fmt.Sprintf("%.1f%% more throughput", -100*slow)
	}
	return fmt.Sprintf("%.1f%% less throughput", 100*slow)
}

func kwhPrice(r *trainmeterv1.RunReport) float64 {
	if r.EnergyCostUsd != nil && r.GetEnergyKwh() > 0 {
		return r.GetEnergyCostUsd() / r.GetEnergyKwh()
	}
	return 0
}

// Filter keeps the recommendations with at least minConfidence and returns
// them with their total savings (Total over runs).
func Filter(recs []*trainmeterv1.Recommendation, minConfidence float64, runs []Run) (kept []*trainmeterv1.Recommendation, usd, joules float64) {
	for _, r := range recs {
		if r.GetConfidence() >= minConfidence {
			kept = append(kept, r)
		}
	}
	usd, joules = Total(kept, runs)
	return kept, usd, joules
}

// OverlapGroup names the spend a kind of recommendation claims. Kinds of one
// group claim the same spend and do not add up: training less (early
// stopping, epoch count, dataset size: all cut epochs or samples of the same
// run), faster steps (batch size, dataloader: both cut step time), a cheaper
// GPU-hour (compute tier), less energy (power).
func OverlapGroup(kind string) string {
	switch kind {
	case KindEarlyStopping, KindEpochCount, KindDatasetSize:
		return "work"
	case KindBatchSize, KindDataloader:
		return "step-time"
	case KindComputeTier:
		return "gpu-price"
	case KindPower:
		return "energy"
	}
	return kind
}

// Total is the savings of recs without double counting, in dollars and
// joules. Savings are booked to the runs they are about: a dataset-size
// one's to its largest-size run (the last of its run_ids), others in
// proportion to the runs' costs (energies). Per run, one OverlapGroup counts
// once, its largest; groups compound as independent cuts, spend × (1 − Π (1
// − group savings ÷ spend)), so a run's total never exceeds its spend.
// Runs not in runs are summed as they are.
func Total(recs []*trainmeterv1.Recommendation, runs []Run) (usd, joules float64) {
	type claims struct{ usd, j map[string]float64 }
	byRun := map[string]*claims{}
	cost := map[string][2]float64{}
	for _, r := range runs {
		cost[r.Report.GetRunId()] = spend(r.Report)
	}
	book := func(run, group string, u, j float64) {
		c := byRun[run]
		if c == nil {
			c = &claims{usd: map[string]float64{}, j: map[string]float64{}}
			byRun[run] = c
		}
		c.usd[group] = max(c.usd[group], u)
		c.j[group] = max(c.j[group], j)
	}
	for _, rec := range recs {
		ids, g := rec.GetRunIds(), OverlapGroup(rec.GetKind())
		switch {
		case len(ids) == 0:
			usd += rec.GetSavingsUsd()
			joules += rec.GetSavingsJ()
		case len(ids) == 1 || rec.GetKind() == KindDatasetSize:
			book(ids[len(ids)-1], g, rec.GetSavingsUsd(), rec.GetSavingsJ())
		default:
			var sumU, sumJ float64
			for _, id := range ids {
				sumU += cost[id][0]
				sumJ += cost[id][1]
			}
			for _, id := range ids {
				fu, fj := 1/float64(len(ids)), 1/float64(len(ids))
				if sumU > 0 {
					fu = cost[id][0] / sumU
				}
				if sumJ > 0 {
					fj = cost[id][1] / sumJ
				}
				book(id, g, fu*rec.GetSavingsUsd(), fj*rec.GetSavingsJ())
			}
		}
	}
	for _, id := range sortedKeys(byRun) { // a fixed order: the same total to the last bit
		c := byRun[id]
		cu, known := cost[id]
		usd += combine(c.usd, cu[0], known)
		joules += combine(c.j, cu[1], known)
	}
	return usd, joules
}

// spend is what a run's savings are capped by, in dollars and joules: an
// ended run's total cost and energy; a live run's projected cost (its
// forecast at completion, when higher) and its energy scaled alike.
func spend(r *trainmeterv1.RunReport) [2]float64 {
	usd, j := r.GetTotalCostUsd(), r.GetEnergyTotalJ()
	if p := r.GetProjectedCostUsd(); !r.GetEnded() && p > usd {
		if usd > 0 {
			j *= p / usd
		}
		usd = p
	}
	return [2]float64{usd, j}
}

// combine compounds one run's per-group savings within its total; an
// unknown run's are summed.
func combine(groups map[string]float64, total float64, known bool) float64 {
	if !known {
		var s float64
		for _, g := range sortedKeys(groups) {
			s += groups[g]
		}
		return s
	}
	if total <= 0 {
		return 0
	}
	left, largest := 1.0, 0.0
	for _, g := range sortedKeys(groups) {
		v := math.Min(total, math.Max(0, groups[g]))
		largest = max(largest, v)
		left *= 1 - v/total
	}
	// Never below the largest claim: total × (1 − (1 − v/total)) can round
	// to a hair under v.
	return max(largest, total*(1-left))
}
