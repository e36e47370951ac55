package budget

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/query/compare"
)

// DefaultForecastHistory is how many ended runs a forecast learns from.
const DefaultForecastHistory = 5

// Forecast is the expected cost of n more runs of a model.
type Forecast struct {
	Model   string
	Runs    int
	BasedOn []string
	// FailedLeftOut counts the model's ended runs that failed (error,
	// exit N, signal, lost) and so are not in BasedOn: a crashed run's cost
	// says nothing about what a run costs.
	FailedLeftOut int
	// Mean and sample standard deviation of one run's total cost.
	MeanUSD, StddevUSD float64
	// ExpectedUSD = n·mean; StddevSumUSD = √n·stddev (runs independent).
	ExpectedUSD, StddevSumUSD float64
	// The budget covering the model, if any, and what is left of it in its
	// current period after the projected spend of the runs it covers.
	Budget       *Budget
	RemainingUSD float64
	// OverageProbability = P(cost of the n runs > remaining), with the sum
	// taken as normal(n·mean, √n·stddev); with a zero spread it is 0 or 1.
	OverageProbability float64
}

// ErrNoHistory: the model has no ended run with a cost.
var ErrNoHistory = errors.New("no ended runs with a cost")

// Forecast estimates the cost of n more runs like the model's last k ended
// runs (k = 0: DefaultForecastHistory), against the tightest budget that
// covers the model (see below).
func (m *Manager) Forecast(model string, n, k int) (Forecast, error) {
	model = strings.TrimSpace(model)
	if model == "" || n <= 0 {
		return Forecast{}, fmt.Errorf("forecast needs a model and a number of runs > 0")
	}
	if k <= 0 {
		k = DefaultForecastHistory
	}
	m.evalMu.Lock()
	defer m.evalMu.Unlock()
	runs, err := m.runs()
	if err != nil {
		return Forecast{}, err
	}
	var hist []run
	failed := 0
	for _, x := range runs {
		// A cost is a GPU-hour price or an energy price (a run priced by
		// energy only has a total cost too).
		if x.r.GetEnded() && x.r.GetMetadata().GetModel() == model && x.r.TotalCostUsd != nil {
			if cost.Failed(x.r) {
				failed++
				continue
			}
			hist = append(hist, x)
		}
	}
	if len(hist) == 0 {
		if failed > 0 {
			return Forecast{}, fmt.Errorf("model %q: %w (%d failed run(s) left out)", model, ErrNoHistory, failed)
		}
		return Forecast{}, fmt.Errorf("model %q: %w", model, ErrNoHistory)
	}
	sort.Slice(hist, func(i, j int) bool { return hist[i].r.GetEnd().AsTime().After(hist[j].r.GetEnd().AsTime()) })
	hist = hist[:min(k, len(hist))]
	f := Forecast{Model: model, Runs: n, FailedLeftOut: failed}
	var costs []float64
	for _, x := range hist {
		f.BasedOn = append(f.BasedOn, x.r.GetRunId())
		costs = append(costs, x.r.GetTotalCostUsd())
	}
	sum := compare.Summarize(costs)
	f.MeanUSD, f.StddevUSD = sum.Mean, sum.SD
	f.ExpectedUSD = float64(n) * f.MeanUSD
	f.StddevSumUSD = math.Sqrt(float64(n)) * f.StddevUSD

	budgets, err := m.Budgets()
	if err != nil {
		return Forecast{}, err
	}
	// Of the budgets covering the model (model:NAME, or any scope matching
	// its latest run), the forecast is against the tightest: the one with
	// the least left in its current period.
	st := m.statuses(budgets, runs)
	for i, b := range budgets {
		if b.Scope != "model:"+model && !Matches(b.Scope, hist[0].r) {
			continue
		}
		if left := b.LimitUSD - st[i].cur.ProjectedUSD; f.Budget == nil || left < f.RemainingUSD {
			f.Budget, f.RemainingUSD = &budgets[i], left
		}
	}
	if f.Budget != nil {
		f.OverageProbability = overage(f.ExpectedUSD, f.StddevSumUSD, f.RemainingUSD)
	}
	return f, nil
}

// overage is P(X > remaining) for X ~ normal(mean, sd).
func overage(mean, sd, remaining float64) float64 {
	if sd <= 0 {
		if mean > remaining {
			return 1
		}
		return 0
	}
	return 0.5 * math.Erfc((remaining-mean)/(sd*math.Sqrt2))
}
